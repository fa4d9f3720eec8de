"""GPU health end to end on the sandbox (a real sshd; the fake nvidia-smi and dmesg answer
the health fields, docs/gpu-health.md): check shows each GPU; deploy is refused on a bad GPU
with nothing started, and placed there with --allow-unhealthy-gpu; status reports a GPU that
turned bad; watch sends gpu_unhealthy to the on_event hook when a GPU of the run turns bad,
and its migrate skips a spare with a bad GPU.

The tests wait for events, states and records, never for a time."""

from __future__ import annotations

import io
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import tests.integration.test_watch as watch_tests
from outrig.console import Reporter
from outrig.errors import RemoteError
from outrig.journal import Journal, read_json
from outrig.ops.check import check
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import deploy
from outrig.ops.placement import placement_on, placement_summary
from outrig.ops.status import status
from outrig.ops.watch import watch
from outrig.ops.watch_record import WatchOptions, watch_file
from outrig.playbook import load_job
from outrig.sandbox.box import SandboxBox
from outrig.sandbox.dmesg import write_kernel_log, xid_line
from outrig.sandbox.nvidia_smi import bus_id, make_inventory, set_gpu_health, write_inventory
from outrig.sandbox.proxy import LatencyProxy
from outrig.session import Project, host_session
from outrig.watching.notify import Notifier
from tests.support.runs import box_workdir, write_playbook

pytestmark = [pytest.mark.integration,
              pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")]
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)


def gpu_playbook(tmp_path: Path, gpus: list[int]) -> Path:
    return write_playbook(tmp_path, {"processes": {"worker": {
        "command": [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"],
        "gpus": gpus, "stop": {"grace": 5}}}}, "sick")


def test_check_deploy_and_status_on_a_box_with_a_bad_gpu(
        box_host: Path, tmp_path: Path, teardown_runs: None) -> None:
    gpu_dir = tmp_path / "gpu"
    journal = Journal(tmp_path / "state")
    set_gpu_health(gpu_dir, 1, "remap_pending")
    set_gpu_health(gpu_dir, 4, "pcie_x4")
    out, err = io.StringIO(), io.StringIO()
    checked = check(PROJECT, str(box_host), Reporter(out=out, err=err), journal)
    verdicts = {v["index"]: v["verdict"] for v in checked["gpu_health"]}
    assert verdicts == {0: "ok", 1: "bad", 2: "ok", 3: "ok", 4: "warn", 5: "ok", 6: "ok",
                        7: "ok"}
    shown = out.getvalue() + err.getvalue()
    assert "GPU health: 0,2-3,5-7 ok, 4 warn, 1 bad" in shown
    assert "GPU 1 bad: remapped_rows.pending = Yes" in shown and "nvidia-smi -r -i 1" in shown
    assert "x4 of the card's x16" in shown

    book = gpu_playbook(tmp_path, [0, 1])
    with host_session(PROJECT, str(box_host), Reporter(quiet=True), journal) as session:
        placed_here = placement_on(session, load_job(book))  # plan --host GROUP's row
    assert 1 not in placed_here["free"] and placed_here["unhealthy"] == {
        "1": "bad (remapped_rows.pending)"}
    assert placed_here["fits"] is False
    assert placed_here["why"] == "unhealthy: GPU 1 bad (remapped_rows.pending)"
    assert "GPU 1 bad (remapped_rows.pending)" in placement_summary(placed_here)

    with pytest.raises(RemoteError) as refused:
        deploy(PROJECT, str(box_host), str(book), Reporter(quiet=True), journal=journal)
    assert refused.value.kind == "gpu_unhealthy"
    message = str(refused.value)
    for words in ("GPU 1 bad", "remapped_rows.pending", "reset the GPU", "given to worker",
                  "Nothing was stopped or started", "--allow-unhealthy-gpu"):
        assert words in message, message
    workdir = box_workdir(box_host)
    runs = workdir / "runs"
    assert not runs.exists() or not list(runs.iterdir()), "no run was made"
    assert not (workdir / ".outrig" / "current" / "sick").exists(), "nothing was recorded"

    placed = deploy(PROJECT, str(box_host), str(book), Reporter(quiet=True), journal=journal,
                    allow_unhealthy_gpu=True)
    assert placed.status == "running"

    # GPU 0, which the run was given, gets a fatal Xid: news at the next status, once
    write_kernel_log(gpu_dir, [xid_line(bus_id(0), 79, 4321.0)])
    err = io.StringIO()
    seen = status(PROJECT, str(box_host), Reporter(out=io.StringIO(), err=err),
                  journal=journal)
    health = {g["index"]: g["health"]["verdict"] for g in seen["gpus"]}
    assert health[0] == "bad" and health[1] == "bad" and health[4] == "warn"
    assert [e["gpu"] for e in seen["gpu_events"]] == [0], "GPU 1 was already known bad"
    event = seen["gpu_events"][0]
    assert event["event"] == "gpu_unhealthy" and event["field"] == "dmesg"
    assert "Xid 79" in event["why"] and "reboot the box" in str(event["fix"])
    assert "gpu_unhealthy: GPU 0 bad" in err.getvalue()
    again = status(PROJECT, str(box_host), Reporter(quiet=True), journal=journal)
    assert again["gpu_events"] == [], "reported once"


def test_watch_reports_a_gpu_turning_bad_and_skips_a_spare_with_a_bad_gpu(
        box_a: SandboxBox, host_b: Path, sandbox: SandboxBox, tmp_path: Path,
        make_proxy: Callable[..., LatencyProxy], monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = make_proxy(box_a.port, one_way_delay=0.01)
    project, journal, a, first = watch_tests.start_job(box_a, tmp_path, monkeypatch, proxy)
    b_gpus = Path(yaml.safe_load(host_b.read_text())["env"]["OUTRIG_FAKE_GPU_DIR"])
    set_gpu_health(b_gpus, 6, "remap_failure")  # the first spare: skipped
    c_gpus = tmp_path / "gpu-c"
    write_inventory(c_gpus, make_inventory(8, 98304, "NVIDIA H100 NVL", seed="c"))
    (tmp_path / "workdir-c").mkdir()
    host_c = sandbox.write_host_file(tmp_path / "hosts" / "c.yaml",
                                     workdir=tmp_path / "workdir-c", gpu_dir=c_gpus,
                                     known_hosts=tmp_path / "known_hosts_c")
    hook_out = tmp_path / "hook.jsonl"
    hook = [sys.executable, "-c", "import sys\nwith open(sys.argv[1], 'a') as f: "
            "f.write(sys.stdin.read().strip() + '\\n')", str(hook_out)]
    notifier = Notifier(hook)
    stop = threading.Event()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = watch(project, str(a), "mig-4gpu", Reporter(quiet=True),
                                  options=WatchOptions(spares=[str(host_b), str(host_c)],
                                                       threshold=watch_tests.THRESHOLD,
                                                       period=watch_tests.PERIOD),
                                  journal=journal, notifier=notifier, stop=stop)
        except BaseException as exc:  # handed to the test
            box["error"] = exc

    thread = threading.Thread(target=target, name="test-watch", daemon=True)
    thread.start()
    record_path = watch_file(journal, str(a), "mig-4gpu")

    def wait_for(check: Callable[[], Any], what: str, timeout: float = 180) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            if not thread.is_alive():
                break
            time.sleep(0.1)
        raise AssertionError(f"{what} never came (sent: "
                             f"{[e['event'] for e in notifier.sent]}; {box.get('error')})")

    def sent(name: str) -> list[dict[str, Any]]:
        return [e for e in notifier.sent if e["event"] == name]

    try:
        wait_for(lambda: (read_json(record_path) or {}).get("mirrored") is not None,
                 "a mirrored checkpoint")
        assert sent("gpu_unhealthy") == [], "healthy GPUs are no news"
        set_gpu_health(box_a.gpu_dir, 3, "remap_pending")  # the trainer's GPU (2-3)
        event = wait_for(lambda: sent("gpu_unhealthy"), "gpu_unhealthy")[0]
        assert event["gpu"] == 3 and event["in_use"] is True and event["host"] == str(a)
        assert event["run_id"] == first.plan.run_id
        assert event["field"] == "remapped_rows.pending" and "reset the GPU" in event["fix"]
        delivered = wait_for(lambda: hook_out.exists() and hook_out.read_text().strip(),
                             "the hook's stdin")
        assert json.loads(delivered.splitlines()[0])["event"] == "gpu_unhealthy"
        wait_for(lambda: (read_json(record_path) or {}).get("gpu_bad"), "gpu_bad recorded")
        assert len(sent("gpu_unhealthy")) == 1, "once per GPU, not per heartbeat"
        assert "dead" not in [e["event"] for e in notifier.sent], "a sick GPU is not a death"

        box_a.stop()  # the node dies
        proxy.cut_all()
        watch_tests.kill_run(box_a.workdir, first.plan.run_id)
        migrating = wait_for(lambda: sent("migrating"), "migrating")[0]
        assert migrating["to"] == str(host_c)
        assert len(migrating["skipped"]) == 1
        skipped = migrating["skipped"][0]
        assert skipped.startswith(f"{host_b}: unhealthy GPU: GPU 6 bad")
        assert "remapped_rows.failure" in skipped
        wait_for(lambda: sent("resumed"), "resumed")
        assert (read_json(record_path) or {}).get("host") == str(host_c)
    finally:
        stop.set()
        thread.join(60)
        notifier.close(timeout=30)
        cleanup(project, str(host_c), Reporter(quiet=True), all_runs=True, journal=journal)
    assert "error" not in box, box.get("error")
