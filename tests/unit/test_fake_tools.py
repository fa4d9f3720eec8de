"""The fakes must behave like the real tools where outrig depends on them, or integration tests
prove nothing: nvidia-smi's formats (checked against real H200 captures), GPU memory that is
held only by live processes, vLLM's failure and orphan behaviour, speculators' checkpoints and
resume, and the demo's tiny trainer."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from outrig.sandbox import nvidia_smi
from tests.support.network import free_port
from tests.support.processes import ProcessTracker

REPO = Path(__file__).resolve().parents[2]
# Real outputs captured on an H200 (driver 580.159.04; tests/fixtures/h200-1gpu/), embedded so
# a reader sees them here; test_embedded_captures_match_the_files checks them against the files.
CAPTURE = REPO / "tests" / "fixtures" / "h200-1gpu"
CAPTURED = {
    "idle-gpu.csv": "0, GPU-77a30507-495f-090f-c8dd-b62546cd0a77, NVIDIA H200, 143771, 0, "
                    "143156, 0, 00000000:00:06.0, 580.159.04\n",
    "idle-apps.csv": "",
    "busy-gpu.csv": "0, GPU-77a30507-495f-090f-c8dd-b62546cd0a77, NVIDIA H200, 143771, 12090, "
                    "131066, 0, 00000000:00:06.0, 580.159.04\n",
    "busy-apps.csv": "786, 1634, GPU-77a30507-495f-090f-c8dd-b62546cd0a77, python3\n"
                     "794, 6754, GPU-77a30507-495f-090f-c8dd-b62546cd0a77, "
                     "/opt/torch/.venv/bin/python3\n"
                     "795, 3682, GPU-77a30507-495f-090f-c8dd-b62546cd0a77, "
                     "/opt/torch/.venv/bin/python3\n",
    "idle-nvidia-smi.txt": "Mon Nov 30 03:04:50 2026" + " " * 7 + """
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA H200                    On  |   00000000:00:06.0 Off |                    0 |
| N/A   37C    P0             79W /  700W |       0MiB / 143771MiB |      0%      Default |
|                                         |                        |             Disabled |
+-----------------------------------------+------------------------+----------------------+

+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|  No running processes found                                                             |
+-----------------------------------------------------------------------------------------+
""",
}
FULL_GPU_QUERY = ("index,uuid,name,memory.total,memory.used,memory.free,utilization.gpu,"
                  "pci.bus_id,driver_version")
APPS_QUERY = "pid,used_memory,gpu_uuid,process_name"
H200_UUID = "GPU-77a30507-495f-090f-c8dd-b62546cd0a77"
METRIC = re.compile(r"train/loss=\d+\.\d{3}, .*epoch=\d+, .*global_step=\d+")


def wait_until(pred: Callable[[], Any], timeout: float = 10.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(every)




def smi(gpu_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the fake as the box does: a script, state dir from the environment."""
    return subprocess.run(
        [sys.executable, str(Path(nvidia_smi.__file__)), *args], capture_output=True, text=True,
        env={**os.environ, nvidia_smi.STATE_ENV: str(gpu_dir)}, timeout=30, check=False)


@pytest.fixture
def h200_dir(tmp_path: Path) -> Path:
    """State matching the captured one-GPU H200 box."""
    inv = nvidia_smi.make_inventory(1, 143771, "NVIDIA H200")
    inv["gpus"][0]["uuid"] = H200_UUID
    nvidia_smi.write_inventory(tmp_path / "h200", inv)
    return tmp_path / "h200"


@pytest.fixture
def sleepers(procs: ProcessTracker) -> Callable[[int], list[subprocess.Popen[Any]]]:
    def make(n: int) -> list[subprocess.Popen[Any]]:
        return [procs.spawn([sys.executable, "-c", "import time; time.sleep(600)"])
                for _ in range(n)]
    return make


# ------------------------------------------------------------------ fake nvidia-smi
def test_embedded_captures_match_the_files() -> None:
    for name, text in CAPTURED.items():
        assert (CAPTURE / name).read_text() == text, name


def test_idle_query_gpu_equals_the_real_capture(h200_dir: Path) -> None:
    res = smi(h200_dir, f"--query-gpu={FULL_GPU_QUERY}", "--format=csv,noheader,nounits")
    assert res.returncode == 0, res.stderr
    assert res.stdout == CAPTURED["idle-gpu.csv"]
    apps = smi(h200_dir, f"--query-compute-apps={APPS_QUERY}", "--format=csv,noheader,nounits")
    assert apps.returncode == 0 and apps.stdout == CAPTURED["idle-apps.csv"] == ""


def test_busy_outputs_have_the_captured_shape(
        h200_dir: Path, sleepers: Callable[[int], list[subprocess.Popen[Any]]]) -> None:
    captured_apps = CAPTURED["busy-apps.csv"].splitlines()
    mibs = [int(line.split(", ")[1]) for line in captured_apps]
    for proc, mib in zip(sleepers(len(mibs)), mibs, strict=True):
        nvidia_smi.register_holder(h200_dir, proc.pid, 0, mib)

    gpu = smi(h200_dir, f"--query-gpu={FULL_GPU_QUERY}", "--format=csv,noheader,nounits")
    real = CAPTURED["busy-gpu.csv"].strip().split(", ")
    ours = gpu.stdout.strip().split(", ")
    assert len(ours) == len(real)
    used, free = int(ours[4]), int(ours[5])
    assert used == sum(mibs)
    assert used + free == int(real[4]) + int(real[5])  # same driver reserve as the real box
    assert [ours[i] for i in (0, 1, 2, 3, 6, 7, 8)] == [real[i] for i in (0, 1, 2, 3, 6, 7, 8)]

    apps = smi(h200_dir, f"--query-compute-apps={APPS_QUERY}", "--format=csv,noheader,nounits")
    lines = apps.stdout.splitlines()
    shape = re.compile(r"\d+, \d+, GPU-[0-9a-f-]{36}, \S+")
    assert all(shape.fullmatch(line) for line in captured_apps)
    assert len(lines) == 3 and all(shape.fullmatch(line) for line in lines)
    assert [int(line.split(", ")[1]) for line in lines] == mibs
    # process_name is argv[0], as the capture shows ("python3" for `python3 x.py`), not comm
    assert {line.split(", ")[3] for line in lines} == {sys.executable}


def test_units_headers_and_field_subsets(tmp_path: Path, sandbox_inventory: dict[str, Any]) -> None:
    nvidia_smi.write_inventory(tmp_path, sandbox_inventory)
    res = smi(tmp_path, "--query-gpu=memory.total,utilization.gpu,index", "--format=csv")
    lines = res.stdout.splitlines()
    assert lines[0] == "memory.total [MiB], utilization.gpu [%], index"
    assert lines[1] == "49152 MiB, 0 %, 0" and len(lines) == 9
    res = smi(tmp_path, "--query-gpu=index,memory.used", "--format=csv,noheader")
    assert res.stdout.splitlines()[7] == "7, 0 MiB"
    res = smi(tmp_path, "--query-compute-apps=pid,used_memory", "--format=csv")
    assert res.stdout == "pid, used_gpu_memory [MiB]\n"
    res = smi(tmp_path, "--query-gpu=index,name", "--format=csv,noheader", "-i", "3")
    assert res.stdout == "3, NVIDIA L40S\n"


def test_unknown_field_exits_2_like_the_real_tool(h200_dir: Path) -> None:
    res = smi(h200_dir, "--query-gpu=index,bogus.field", "--format=csv,noheader")
    assert res.returncode == 2
    assert 'Field "bogus.field" is not a valid field to query.' in res.stdout
    res = smi(h200_dir, "--query-compute-apps=pid,colour", "--format=csv")
    assert res.returncode == 2 and '"colour"' in res.stdout


def test_table_matches_the_real_layout(h200_dir: Path) -> None:
    res = smi(h200_dir)
    ours = res.stdout.splitlines()
    real = CAPTURED["idle-nvidia-smi.txt"].splitlines()
    assert res.returncode == 0
    assert len(ours) == len(real)
    assert ours[1:] == real[1:]  # line 0 is the date
    assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4} {7}", ours[0])


def test_holders_count_only_while_alive_and_not_zombie(
        tmp_path: Path, sandbox_inventory: dict[str, Any],
        sleepers: Callable[[int], list[subprocess.Popen[Any]]]) -> None:
    gpu_dir = tmp_path / "g"
    nvidia_smi.write_inventory(gpu_dir, sandbox_inventory)
    a, b = sleepers(2)
    nvidia_smi.register_holder(gpu_dir, a.pid, 2, 1000)
    nvidia_smi.register_holder(gpu_dir, b.pid, 2, 500)
    used = {r["index"]: r["memory.used"] for r in nvidia_smi.gpu_rows(gpu_dir)}
    assert used[2] == 1500 and sum(used.values()) == 1500

    os.kill(a.pid, signal.SIGKILL)  # not reaped yet: a zombie holds nothing
    assert wait_until(lambda: not nvidia_smi.pid_alive(a.pid))
    assert Path(f"/proc/{a.pid}").exists(), "still a zombie at this point"
    assert [r["memory.used"] for r in nvidia_smi.gpu_rows(gpu_dir)][2] == 500
    a.wait()
    b.kill()
    b.wait()
    assert all(r["memory.used"] == 0 for r in nvidia_smi.gpu_rows(gpu_dir))
    assert nvidia_smi.app_rows(gpu_dir) == []


def test_holder_file_of_a_reused_pid_does_not_count(tmp_path: Path,
                                                    sandbox_inventory: dict[str, Any]) -> None:
    nvidia_smi.write_inventory(tmp_path, sandbox_inventory)
    # Our own (live) pid, but a start time that is not ours: a leftover from a dead process.
    (tmp_path / "holders" / f"{os.getpid()}.json").write_text(json.dumps(
        {"pid": os.getpid(), "gpu": 0, "mib": 100, "start_ticks": 1}))
    assert nvidia_smi.live_holders(tmp_path) == []
    nvidia_smi.register_holder(tmp_path, os.getpid(), 0, 100)
    assert [h["mib"] for h in nvidia_smi.live_holders(tmp_path)] == [100]


# ------------------------------------------------------------------ fake vLLM
def group_members(pgid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry))
    return out


def comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def is_resource_tracker(pid: int) -> bool:
    return b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()


@pytest.fixture
def vllm(procs: ProcessTracker, standin: Callable[[str], Path], fake_gpu_dir: Path,
         tmp_path: Path) -> Iterator[Callable[..., tuple[subprocess.Popen[Any], Path, int]]]:
    """Start fake_vllm in its own session with output to a file; returns (proc, log, port)."""
    def start(*args: str, cvd: str = "0,1", env: dict[str, str] | None = None,
              delay: float = 0.3) -> tuple[subprocess.Popen[Any], Path, int]:
        port = free_port()
        log = tmp_path / f"vllm-{port}.log"
        proc = procs.spawn(
            [sys.executable, str(standin("fake_vllm")), "serve", "org/model",
             "--port", str(port), "--host", "127.0.0.1", "--fake-startup-delay", str(delay),
             *args],
            env={"CUDA_VISIBLE_DEVICES": cvd, nvidia_smi.STATE_ENV: str(fake_gpu_dir),
                 **(env or {})},
            stdout=log.open("w"), stderr=subprocess.STDOUT)
        return proc, log, port
    yield start


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status, resp.read()
    except OSError:
        return 0, b""


def test_vllm_dp_supervisor_ranks_leave_its_group_and_stop_on_term(
        vllm: Callable[..., tuple[subprocess.Popen[Any], Path, int]], fake_gpu_dir: Path) -> None:
    # vllm entrypoints/launchers/dp_supervisor.py (tests/standins/README.md): one API server
    # per local rank, each in a process group of its own (os.setpgrp), in the same session
    sup = free_port()
    proc, log, port = vllm("--data-parallel-multi-port-external-lb", "--data-parallel-size", "2",
                           "--data-parallel-size-local", "2", "--fake-mib", "1000",
                           "--data-parallel-supervisor-port", str(sup), cvd="2,3")
    assert wait_until(lambda: get(f"http://127.0.0.1:{sup}/health")[0] == 200, 120), \
        log.read_text()
    assert [get(f"http://127.0.0.1:{port + r}/health")[0] for r in (0, 1)] == [200, 200]
    assert f"Started DPSupervisor on 127.0.0.1:{sup}" in log.read_text()
    session = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != proc.pid:
            try:
                raw = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = raw[raw.rfind(")") + 2:].split()
            if int(fields[3]) == proc.pid and fields[0] != "Z":
                session[int(entry)] = (int(fields[2]), comm(int(entry)))
    ranks = sorted(p for p, (_, c) in session.items() if c.startswith("VLLM::APIServer"))
    engines = sorted(p for p, (_, c) in session.items() if c.startswith("VLLM::EngineCor"))
    assert len(ranks) == 2 and len(engines) == 2, session
    assert all(session[r][0] == r for r in ranks)  # a group of its own, not the supervisor's
    assert sorted(session[e][0] for e in engines) == ranks  # each engine in its rank's group
    assert sorted(h["gpu"] for h in nvidia_smi.live_holders(fake_gpu_dir)) == [2, 3]
    proc.send_signal(signal.SIGTERM)  # forwarded to each rank by pid
    assert proc.wait(60) == 0
    assert wait_until(lambda: nvidia_smi.live_holders(fake_gpu_dir) == [], 30)
    assert "DPSupervisor forwarding SIGTERM to DP Servers." in log.read_text()


def test_vllm_tp_times_dp_over_visible_gpus_fails_with_the_real_assertion(
        vllm: Callable[..., tuple[subprocess.Popen[Any], Path, int]], fake_gpu_dir: Path) -> None:
    proc, log, _ = vllm("--tensor-parallel-size", "2", "--data-parallel-size", "2", cvd="0,1")
    assert proc.wait(120) == 1
    text = log.read_text()
    assert re.search(r"AssertionError: DP adjusted local rank \d+ is out of bounds", text)
    assert "DP adjusted local rank 3 is out of bounds" in text  # as in the real failed run
    assert "Engine core initialization failed" in text
    assert "Application startup complete" not in text
    # rank 0's engine grabbed GPUs 0 and 1 first; the failed start killed it again
    assert "holds" in text and "on GPU 1" in text
    assert wait_until(lambda: nvidia_smi.live_holders(fake_gpu_dir) == [], 120)


def test_vllm_tp_over_visible_fails_at_config_time(
        vllm: Callable[..., tuple[subprocess.Popen[Any], Path, int]]) -> None:
    proc, log, _ = vllm("--tensor-parallel-size", "4", cvd="0,1")
    assert proc.wait(120) == 1
    assert "World size (4) is larger than the number of available GPUs (2)" in log.read_text()


def test_vllm_healthy_start_serves_and_renames_children_then_stops_on_term(
        vllm: Callable[..., tuple[subprocess.Popen[Any], Path, int]], fake_gpu_dir: Path) -> None:
    proc, log, port = vllm("--data-parallel-size", "2", "--served-model-name", "served-id",
                           "--enable-scale-out", cvd="4,5")
    base = f"http://127.0.0.1:{port}"
    assert wait_until(lambda: get(base + "/health")[0] == 200, 120), log.read_text()
    status, body = get(base + "/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == "served-id"
    req = urllib.request.Request(base + "/v1/chat/completions/render", method="POST",
                                 data=json.dumps({"messages": [{"role": "user",
                                                                "content": "hi"}]}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=2) as resp:
        assert resp.status == 200 and json.loads(resp.read())["model"] == "served-id"
    text = log.read_text()
    for line in (f"Starting vLLM server on http://127.0.0.1:{port}",  # vllm 0.32 / 0.33
                 "Route: /v1/chat/completions/render, Methods: POST",
                 "INFO:     Application startup complete."):
        assert line in text

    holders = nvidia_smi.live_holders(fake_gpu_dir)
    assert sorted(h["gpu"] for h in holders) == [4, 5]
    children = [p for p in group_members(proc.pid) if p != proc.pid and not is_resource_tracker(p)]
    assert sorted(comm(p) for p in children) == ["VLLM::EngineCor", "VLLM::EngineCor"]
    assert {h["pid"] for h in holders} == set(children)
    assert all(os.getsid(p) == proc.pid for p in children)
    # renamed the way setproctitle does: title-only cmdline, environ cleared of the marker
    for pid in children:
        assert Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").startswith(
            b"VLLM::EngineCore_DP")
        assert b"OUTRIG_TEST_MARK=" not in Path(f"/proc/{pid}/environ").read_bytes()

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 0
    assert wait_until(lambda: nvidia_smi.live_holders(fake_gpu_dir) == [], 120)
    assert wait_until(lambda: group_members(proc.pid) == [], 120)


def test_vllm_render_route_is_refused_without_enable_scale_out(
        vllm: Callable[..., tuple[subprocess.Popen[Any], Path, int]]) -> None:
    """vllm 0.33 scale_out/factories.py: 403 PermissionDeniedError unless --enable-scale-out;
    speculators' prepare-data then drops every conversation."""
    proc, log, port = vllm()
    base = f"http://127.0.0.1:{port}"
    assert wait_until(lambda: get(base + "/health")[0] == 200, 120), log.read_text()
    req = urllib.request.Request(base + "/v1/chat/completions/render", method="POST",
                                 data=b'{"messages": []}',
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=5)
    assert refused.value.code == 403
    error = json.loads(refused.value.read())["error"]
    assert error["type"] == "PermissionDeniedError" and error["code"] == 403
    assert error["message"].startswith("Scale-out endpoints are disabled. Restart vllm serve "
                                       "with --enable-scale-out")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 0


def test_vllm_sigkill_of_parent_leaves_children_holding_gpus(
        vllm: Callable[..., tuple[subprocess.Popen[Any], Path, int]], fake_gpu_dir: Path) -> None:
    proc, log, port = vllm("--tensor-parallel-size", "2", cvd="0,1")
    assert wait_until(lambda: get(f"http://127.0.0.1:{port}/health")[0] == 200, 120), \
        log.read_text()
    before = nvidia_smi.live_holders(fake_gpu_dir)
    assert sorted(h["gpu"] for h in before) == [0, 1]  # the two TP workers
    proc.kill()
    proc.wait()
    time.sleep(0.3)
    survivors = group_members(proc.pid)
    worker_pids = {h["pid"] for h in before}
    assert worker_pids <= set(survivors), "vLLM #55510: orphans keep running"
    assert sorted(comm(p) for p in worker_pids) == ["VLLM::Worker_TP", "VLLM::Worker_TP"]
    assert {h["pid"] for h in nvidia_smi.live_holders(fake_gpu_dir)} == worker_pids
    used = [r["memory.used"] for r in nvidia_smi.gpu_rows(fake_gpu_dir)]
    assert used[0] > 0 and used[1] > 0

    os.killpg(proc.pid, signal.SIGKILL)  # the recorded group: this is what frees the GPUs
    assert wait_until(lambda: nvidia_smi.live_holders(fake_gpu_dir) == [], 120)


def test_vllm_straggler_options_leave_what_cleanup_must_find(
        vllm: Callable[..., tuple[subprocess.Popen[Any], Path, int]], fake_gpu_dir: Path,
        procs: ProcessTracker) -> None:
    proc, log, port = vllm(cvd="0", env={"FAKE_VLLM_SETSID_CHILD": "1",
                                         "FAKE_VLLM_IGNORE_TERM_CHILD": "1"})
    assert wait_until(lambda: get(f"http://127.0.0.1:{port}/health")[0] == 200, 120), \
        log.read_text()
    assert wait_until(lambda: len(nvidia_smi.live_holders(fake_gpu_dir)) == 2, 120)
    for holder in nvidia_smi.live_holders(fake_gpu_dir):
        procs.track_pid(holder["pid"])  # ended at teardown whatever happens below
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 0
    left = {h["pid"]: h for h in nvidia_smi.live_holders(fake_gpu_dir)}
    assert len(left) == 2, "the TERM-ignoring engine and the setsid child both survive"
    escaped = [p for p in left if os.getpgid(p) != proc.pid]
    in_group = [p for p in left if os.getpgid(p) == proc.pid]
    assert len(escaped) == 1 and len(in_group) == 1
    assert os.getsid(escaped[0]) == escaped[0] != proc.pid
    # renamed the way setproctitle does: no marker is left in their environ, so cleanup must
    # know them from an earlier look (docs/cleanup.md), not from the environment
    assert not set(left) & set(procs.marked_pids())
    for pid in left:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"OUTRIG_TEST_MARK=" not in environ and environ.startswith(b"\0")


def test_vllm_fatal_env_and_stale_memory(
        vllm: Callable[..., tuple[subprocess.Popen[Any], Path, int]], fake_gpu_dir: Path,
        sleepers: Callable[[int], list[subprocess.Popen[Any]]]) -> None:
    proc, log, _ = vllm(cvd="0", env={"FAKE_VLLM_FATAL": "CUSTOM FATAL: boom"}, delay=0.1)
    assert proc.wait(120) == 1
    assert "CUSTOM FATAL: boom" in log.read_text()
    (stale,) = sleepers(1)
    nvidia_smi.register_holder(fake_gpu_dir, stale.pid, 3, 30000)
    proc, log, _ = vllm(cvd="3")
    assert proc.wait(120) == 1
    assert re.search(r"Free memory on device cuda:0 \([\d.]+/48\.00 GiB\) on startup is less "
                     r"than desired GPU memory utilization", log.read_text())


# ------------------------------------------------------------------ fake trainer
def run_trainer(standin: Callable[[str], Path], *args: str,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(standin("fake_trainer")), *args],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, **(env or {})})


def test_trainer_writes_complete_checkpoints_and_resumes(
        standin: Callable[[str], Path], tmp_path: Path) -> None:
    save = tmp_path / "ckpt"
    common = ["--verifier-name-or-path", "org/model", "--speculator-type", "dflash",
              "--save-path", str(save), "--fake-steps-per-epoch", "3",
              "--fake-step-seconds", "0.01", "--block-size", "4"]
    first = run_trainer(standin, *common, "--epochs", "2")
    assert first.returncode == 0, first.stderr
    out = first.stdout
    assert f"No previous training checkpoint found in '{save}'. Starting fresh training run." in out
    assert "Training epoch 1/2 started" in out and "Training epoch 2/2 completed" in out
    assert f"Saving checkpoint to {save}/1" in out and f"Checkpoint saved to {save}/1" in out
    metric_lines = [line for line in out.splitlines() if "train/loss=" in line]
    assert len(metric_lines) == 6 and all(METRIC.search(line) for line in metric_lines)
    assert "train/position_3_acc=" in metric_lines[0] and "lr/Muon=1.00e-03" in metric_lines[0]
    assert metric_lines[-1].endswith("global_step=5")  # logged before the increment
    for epoch in ("0", "1"):
        assert sorted(os.listdir(save / epoch)) == [
            "config.json", "config.py", "model.safetensors", "optimizer_state_dict.pt",
            "scheduler_state_dict.pt", "train_command.txt", "training_state.json"]
    assert os.readlink(save / "epoch1_end") == "1" and os.readlink(save / "checkpoint_best") == "1"
    assert (save / "run.yaml").is_file() and (save / "train_command.txt").is_file()
    assert not [n for n in os.listdir(save) if n.startswith(".tmp")]

    second = run_trainer(standin, *common, "--epochs", "3")
    assert second.returncode == 0, second.stderr
    assert f"Found checkpoint at {save}/1" in second.stdout
    assert "Resuming training on epoch 2." in second.stdout
    assert "Training epoch 3/3 started" in second.stdout
    assert "global_step=7" in second.stdout and (save / "2" / "training_state.json").is_file()


def test_trainer_sigterm_saves_interrupted_and_holds_its_gpus(
        standin: Callable[[str], Path], procs: ProcessTracker, fake_gpu_dir: Path,
        tmp_path: Path) -> None:
    save, log = tmp_path / "ckpt", tmp_path / "train.log"
    proc = procs.spawn([sys.executable, str(standin("fake_trainer")),
                        "--verifier-name-or-path", "m", "--save-path", str(save),
                        "--epochs", "50", "--fake-step-seconds", "0.05"],
                       env={"CUDA_VISIBLE_DEVICES": "2,3",
                            nvidia_smi.STATE_ENV: str(fake_gpu_dir)},
                       stdout=log.open("w"), stderr=subprocess.STDOUT)
    assert wait_until(lambda: "global_step=2" in log.read_text(), 120)
    assert sorted(h["gpu"] for h in nvidia_smi.live_holders(fake_gpu_dir)) == [2, 3]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 0
    text = log.read_text()
    assert "Received SIGTERM — interrupting training to save checkpoint" in text
    # speculators saves interrupted/ with a string label: no training_state.json is written
    assert (save / "interrupted" / "model.safetensors").is_file()
    assert not (save / "interrupted" / "training_state.json").exists()
    assert wait_until(lambda: nvidia_smi.live_holders(fake_gpu_dir) == [], 120)


def test_trainer_saves_within_the_epoch_in_place_and_resumes_mid_epoch(
        standin: Callable[[str], Path], tmp_path: Path) -> None:
    """--checkpoint-freq 0.25 over 8 steps: folder 0 rewritten at steps 2, 4, 6, then 0_end."""
    save = tmp_path / "ckpt"
    common = ["--verifier-name-or-path", "m", "--save-path", str(save), "--epochs", "2",
              "--fake-steps-per-epoch", "8", "--fake-step-seconds", "0.01",
              "--checkpoint-freq", "0.25"]
    first = run_trainer(standin, *common, "--max-steps", "5")
    assert first.returncode == 0, first.stderr
    assert f"Checkpoint saved to {save}/0" in first.stdout
    state = json.loads((save / "0" / "training_state.json").read_text())
    # --max-steps 5 ends epoch 0 early, and speculators saves it as the end of the epoch
    assert state == {"epoch": 0, "local_step": 0, "global_step": 5}
    (save / "0" / "training_state.json").write_text(
        json.dumps({"epoch": 0, "local_step": 4, "global_step": 4}))
    second = run_trainer(standin, *common)
    assert "Resuming mid-epoch from epoch=0 local_step=4 global_step=4." in second.stdout
    assert "global_step=4," not in second.stdout.split("Resuming")[0]
    assert os.readlink(save / "epoch1_end") == "1"


def test_trainer_resumes_from_a_half_written_folder_like_speculators(
        standin: Callable[[str], Path], tmp_path: Path) -> None:
    """The reason outrig quarantines: speculators takes the highest folder unchecked."""
    save = tmp_path / "ckpt"
    (save / "3").mkdir(parents=True)
    (save / "3" / "model.safetensors").write_bytes(b"half")
    out = run_trainer(standin, "--verifier-name-or-path", "m", "--save-path", str(save),
                      "--epochs", "5", "--fake-steps-per-epoch", "1",
                      "--fake-step-seconds", "0.01").stdout
    assert f"Found checkpoint at {save}/3." in out and "Resuming training on epoch 4." in out


class _Models(BaseHTTPRequestHandler):
    served = "the-served-id"

    def do_GET(self) -> None:
        body = json.dumps({"object": "list", "data": [{"id": self.served}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_trainer_rejects_a_verifier_vllm_does_not_serve(standin: Callable[[str], Path],
                                                        tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1"
        bad = run_trainer(standin, "--verifier-name-or-path", "Qwen/Qwen3-8B",
                          "--save-path", str(tmp_path / "c"), "--vllm-endpoint", endpoint)
        good = run_trainer(standin, "--verifier-name-or-path", "the-served-id", "--epochs", "1",
                           "--save-path", str(tmp_path / "d"), "--vllm-endpoint", endpoint,
                           "--fake-steps-per-epoch", "1", "--fake-step-seconds", "0")
    finally:
        server.shutdown()
        server.server_close()
    assert bad.returncode == 1
    assert ("ValueError: An explicit model name was passed (Qwen/Qwen3-8B) which doesn't match "
            "found model_id the-served-id") in bad.stdout
    assert good.returncode == 0, good.stdout


# ------------------------------------------------------------------ demo trainer (product)
TINY = REPO / "remote" / "examples" / "train_tiny.py"


def losses(text: str) -> list[float]:
    return [float(m) for m in re.findall(r"train/loss=([\d.]+)", text)]


def verdicts(save: Path) -> dict[str, tuple[bool, str]]:
    """outrig's own verdict (the agent's checkpoint rule) on every folder the trainer wrote."""
    from outrig._box.agent.checkpoints import checkpoint_entry

    return {name: (entry["complete"], entry["why"]) for name in sorted(os.listdir(save))
            for entry in [checkpoint_entry(str(save / name), True, None)]}


def test_train_tiny_learns_checkpoints_and_resumes(tmp_path: Path) -> None:
    """The demo's trainer wrote only training_state.json, so status never saw a complete
    checkpoint and the demo could show neither resume nor migrate. It writes speculators'
    layout, which outrig's rule (the agent's, as status, stage and migrate apply it) deems
    complete: each epoch's folder, rewritten by a mid-epoch save, whole at the end."""
    save = tmp_path / "ck"
    cmd = [sys.executable, str(TINY), "--save-path", str(save), "--step-seconds", "0",
           "--checkpoint-every", "10"]
    first = subprocess.run([*cmd, "--steps", "40"], capture_output=True, text=True, timeout=60,
                           check=True)
    got = losses(first.stdout)
    assert len(got) == 40
    assert sum(got[-5:]) / 5 < sum(got[:5]) / 5 / 10, "the loss must really fall"
    # 16 steps an epoch: epochs 0 and 1 ended (steps 16, 32), epoch 2 saved at step 40
    assert verdicts(save) == {
        "0": (True, "complete (end of epoch 0, global step 16)"),
        "1": (True, "complete (end of epoch 1, global step 32)"),
        "2": (True, "complete (epoch 2, step 8, global step 40)")}
    weights = (save / "2" / "model.safetensors").read_bytes()
    header = json.loads(weights[8:8 + int.from_bytes(weights[:8], "little")])
    assert header["w"]["dtype"] == "F32" and header["b"]["shape"] == [1]
    state = json.loads((save / "2" / "training_state.json").read_text())
    assert (state["epoch"], state["local_step"], state["global_step"]) == (2, 8, 40)
    assert METRIC.search(first.stdout)
    assert "Training epoch 3/3 started" in first.stdout

    second = subprocess.run([*cmd, "--steps", "45"], capture_output=True, text=True,
                            timeout=60, check=True)
    assert f"Resuming from checkpoint {save}/2 at step 40." in second.stdout
    assert re.search(r"global_step=41\b", second.stdout)
    assert not re.search(r"global_step=1$", second.stdout, re.M), "must not start over"
    assert verdicts(save)["2"] == (True, "complete (epoch 2, step 13, global step 45)")


def test_train_tiny_skips_a_torn_save_as_outrig_does(tmp_path: Path) -> None:
    """A save cut short leaves files newer than the folder's old training_state.json: outrig
    calls that folder incomplete, and the trainer must not resume from it either."""
    save = tmp_path / "ck"
    cmd = [sys.executable, str(TINY), "--save-path", str(save), "--step-seconds", "0"]
    subprocess.run([*cmd, "--steps", "40"], capture_output=True, text=True, timeout=60,
                   check=True)
    later = (save / "2" / "training_state.json").stat().st_mtime + 5
    os.utime(save / "2" / "model.safetensors", (later, later))  # a new save began, no state
    assert verdicts(save)["2"] == (False, "model.safetensors newer than training_state.json: "
                                   "a save into this folder started and did not finish")
    again = subprocess.run([*cmd, "--steps", "40"], capture_output=True, text=True,
                           timeout=60, check=True)
    assert f"Resuming from checkpoint {save}/1 at step 32." in again.stdout
    assert f"Skipping checkpoint {save}/2" in again.stdout


def test_train_tiny_saves_and_exits_0_on_sigterm(procs: ProcessTracker, tmp_path: Path) -> None:
    save, log = tmp_path / "ck", tmp_path / "tiny.log"
    proc = procs.spawn([sys.executable, str(TINY), "--save-path", str(save), "--steps", "100000",
                        "--step-seconds", "0.01", "--checkpoint-every", "100000"],
                       stdout=log.open("w"), stderr=subprocess.STDOUT,
                       env={"PYTHONUNBUFFERED": "1"})
    assert wait_until(lambda: "global_step=5\n" in log.read_text(), 120)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 0
    text = log.read_text()
    step = int(re.findall(r"global_step=(\d+)", text)[-1])
    assert "Received SIGTERM: " in text
    newest = max(os.listdir(save), key=int)  # the step's epoch: saved now, or at its end
    assert json.loads((save / newest / "training_state.json").read_text())["global_step"] == step
    assert verdicts(save)[newest][0] is True


# ------------------------------------------------------------------ fake torchrun
def torchrun_job(standin: Callable[[str], Path], procs: ProcessTracker, tmp_path: Path,
                 *launcher: str) -> tuple[subprocess.Popen[Any], Path, Path]:
    save, log = tmp_path / "ckpt", tmp_path / "train.log"
    env = {"FAKE_TORCHRUN_MODULES": json.dumps({"speculators.train":
                                                str(standin("fake_trainer"))})}
    proc = procs.spawn([sys.executable, str(standin("fake_torchrun")), "--standalone",
                        "--nproc_per_node", "2", *launcher, "-m", "speculators.train",
                        "--verifier-name-or-path", "m", "--save-path", str(save),
                        "--epochs", "50", "--fake-step-seconds", "0.05",
                        "--fake-dataloader-workers", "1", "--fake-save-seconds", "1"],
                       env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    assert wait_until(lambda: "global_step=2" in log.read_text(), 120), log.read_text()
    return proc, save, log


def ranks_of(launcher: int) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and ppid(int(p)) == launcher]


def ppid(pid: int) -> int:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(raw[raw.rfind(")") + 2:].split()[1])


def test_torchrun_term_kills_the_dataloader_workers_and_the_interrupt_save_fails(
        standin: Callable[[str], Path], procs: ProcessTracker, tmp_path: Path) -> None:
    """torchrun forwards SIGTERM to each rank's whole group: the workers die, the save fails
    (what was seen on the real H200: "DataLoader worker ... killed by signal" then "Failed to
    save interrupt checkpoint")."""
    proc, save, log = torchrun_job(standin, procs, tmp_path)
    ranks = ranks_of(proc.pid)
    assert len(ranks) == 2 and all(os.getsid(r) == r for r in ranks)  # own sessions
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)
    text = log.read_text()
    assert "Sending process" in text and "closing signal SIGTERM" in text
    # the worker's death raises in the rank during the save (or just before it)
    assert "is killed by signal: Terminated." in text
    assert "Interrupt checkpoint saved" not in text
    assert not (save / "interrupted" / "scheduler_state_dict.pt").exists()


def test_term_to_the_ranks_themselves_lets_the_interrupt_save_finish(
        standin: Callable[[str], Path], procs: ProcessTracker, tmp_path: Path) -> None:
    proc, save, log = torchrun_job(standin, procs, tmp_path)
    for rank in ranks_of(proc.pid):
        os.kill(rank, signal.SIGTERM)
    assert proc.wait(120) == 0  # every worker ended with 0, so torchrun does
    text = log.read_text()
    assert f"Interrupt checkpoint saved to '{save}/interrupted'" in text
    assert "Failed to save" not in text
    assert sorted(os.listdir(save / "interrupted")) == [
        "config.json", "config.py", "model.safetensors", "optimizer_state_dict.pt",
        "scheduler_state_dict.pt", "train_command.txt"]


def test_torchrun_without_shutdown_timeout_refuses_the_flag(
        standin: Callable[[str], Path], tmp_path: Path) -> None:
    """torch 2.11's torchrun has no --shutdown-timeout: a usage error, exit 2."""
    run = subprocess.run([sys.executable, str(standin("fake_torchrun")), "--standalone",
                          "--shutdown-timeout", "150", "-m", "speculators.train"],
                         capture_output=True, text=True, timeout=60, check=False,
                         env={**os.environ, "FAKE_TORCHRUN_NO_SHUTDOWN_TIMEOUT": "1"})
    assert run.returncode == 2 and "unrecognized arguments: --shutdown-timeout" in run.stderr
