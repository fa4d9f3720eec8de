"""``deploy`` end to end: a real OpenSSH sshd on 127.0.0.1, through a latency proxy where the
link's slowness matters, with the fake GPU box and the vLLM stand-in."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.errors import (
    AuthenticationError,
    ConnectError,
    HostKeyError,
    PlanError,
    RemoteError,
)
from outrig.journal import Journal
from outrig.ops.deploy import deploy
from outrig.ops.status import status
from outrig.session import Project
from tests.support.network import free_port
from tests.support.processes import alive, wait_gone
from tests.support.runs import box_workdir, write_playbook

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)


def run_json(host_file: Path, run_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((box_workdir(host_file) / "runs" / run_id / "run.json")
                                      .read_text())
    return data


def http_server_playbook(tmp_path: Path, *, extra: dict[str, Any] | None = None,
                         name: str = "web") -> tuple[Path, int]:
    port = free_port()
    body: dict[str, Any] = {
        "params": {"port": port},
        "processes": {
            "server": {
                "command": f"{sys.executable} -m http.server ${{port}} --bind 127.0.0.1",
                "ready": {"http": "http://127.0.0.1:${port}/", "timeout": 30},
                "stop": {"grace": 5},
            },
            "worker": {
                "after": "server",
                "command": [sys.executable, "-u", "-c",
                            "import time\nfor i in range(10**6):\n print('step', i, flush=True)"
                            "\n time.sleep(0.2)"],
                "ready": {"log": r"step 1\b", "timeout": 30},
                "stop": {"grace": 5},
            },
        },
        **(extra or {}),
    }
    return write_playbook(tmp_path, body, name), port


@pytest.fixture
def reporter() -> Reporter:
    return Reporter(quiet=True)


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "state")


def test_deploy_through_240ms_link_launches_records_and_waits(
        box_host: Path, make_proxy: Any, tmp_path: Path, reporter: Reporter, journal: Journal,
        teardown_runs: None) -> None:
    config = yaml.safe_load(box_host.read_text())
    proxy = make_proxy(config["port"], one_way_delay=0.12)
    config["port"] = proxy.port
    slow_host = tmp_path / "slow.yaml"
    slow_host.write_text(yaml.safe_dump(config))
    playbook, port = http_server_playbook(tmp_path)

    result = deploy(PROJECT, str(slow_host), str(playbook), reporter, journal=journal)

    assert result.launched and [p["name"] for p in result.processes] == ["server", "worker"]
    assert result.rtt is not None and result.rtt >= 0.24
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass  # the server really is up
    manifest = run_json(box_host, result.plan.run_id)
    assert manifest["status"] == "running"
    for record in manifest["processes"]:
        assert record["pid"] == record["pgid"] == record["sid"], "own session and group"
        assert alive(record["pid"])
        environ = Path(f"/proc/{record['pid']}/environ").read_bytes().split(b"\0")
        assert f"OUTRIG_RUN={result.plan.run_id}".encode() in environ
        assert Path(record["log"]).is_file()
    current = box_workdir(box_host) / ".outrig" / "current" / "web"
    assert current.read_text().strip() == result.plan.run_id
    recorded = journal.run(result.plan.run_id)
    assert recorded is not None and recorded["status"] == "running"
    assert recorded["host"] == "slow" and len(recorded["processes"]) == 2
    assert journal.host_facts("slow")["gpu_count"] == 8
    known = Path(config["known_hosts"]).read_text()
    assert f"[127.0.0.1]:{proxy.port}" in known


def test_no_wait_returns_after_launch(box_host: Path, tmp_path: Path, reporter: Reporter,
                                      journal: Journal, teardown_runs: None) -> None:
    port = free_port()
    playbook = write_playbook(tmp_path, {"processes": {"slow": {
        "command": [sys.executable, "-c", "import time; time.sleep(30); print('up', flush=True);"
                    " time.sleep(600)"],
        "ready": {"log": "^up$", "timeout": 60}, "stop": {"grace": 1}}},
        "params": {"port": port}})
    started = time.monotonic()
    result = deploy(PROJECT, str(box_host), str(playbook), reporter, wait=False, journal=journal)
    assert time.monotonic() - started < 20, "must not wait for the 30 s readiness"
    assert journal.run(result.plan.run_id)["status"] == "launched"  # type: ignore[index]
    assert alive(result.processes[0]["pid"])


def test_redeploy_stops_the_previous_run_exactly(box_host: Path, tmp_path: Path,
                                                 reporter: Reporter, journal: Journal,
                                                 teardown_runs: None) -> None:
    playbook, _ = http_server_playbook(tmp_path)
    first = deploy(PROJECT, str(box_host), str(playbook), reporter, journal=journal)
    old_pids = [p["pid"] for p in first.processes]
    # A look-alike that outrig did not start must survive (same command line as the worker).
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 start_new_session=True)
    try:
        second = deploy(PROJECT, str(box_host), str(playbook), reporter, journal=journal)
        assert second.plan.run_id != first.plan.run_id
        assert wait_gone(old_pids) == []
        assert alive(bystander.pid)
        assert all(alive(p["pid"]) for p in second.processes)
    finally:
        bystander.kill()
        bystander.wait()


def test_fatal_log_line_aborts_with_excerpt_and_leaves_nothing(box_host: Path, tmp_path: Path,
                                                               reporter: Reporter,
                                                               journal: Journal,
                                                               teardown_runs: None) -> None:
    playbook = write_playbook(tmp_path, {"processes": {"server": {
        "command": [sys.executable, "-u", "-c",
                    "import time; print('loading'); time.sleep(0.5);"
                    "print('ValueError: max_num_batched_tokens (2048) is smaller than "
                    "max_model_len (8193)'); time.sleep(600)"],
        "ready": {"port": free_port(), "timeout": 30},
        "fatal": ["is smaller than max_model_len"], "stop": {"grace": 1}}}})
    with pytest.raises(RemoteError) as info:
        deploy(PROJECT, str(box_host), str(playbook), reporter, journal=journal)
    err = info.value
    assert err.kind == "fatal_log" and err.process == "server"
    assert any("is smaller than max_model_len" in line for line in err.excerpt)
    assert "loading" in str(err)
    runs = sorted((box_workdir(box_host) / "runs").iterdir())
    manifest = json.loads((runs[-1] / "run.json").read_text())
    assert manifest["status"] == "failed"
    assert wait_gone([p["pid"] for p in manifest["processes"]]) == []
    recorded = journal.runs(playbook="job")[0]
    assert recorded["status"] == "failed"


def test_vllm_standin_with_too_few_gpus_fails_fast_with_the_real_error(
        box_host: Path, tmp_path: Path, reporter: Reporter, journal: Journal, standin: Any,
        teardown_runs: None) -> None:
    # parallel: is not declared here, so the planner cannot catch it; the fatal pattern must.
    port = free_port()
    playbook = write_playbook(tmp_path, {"processes": {"server": {
        "command": [sys.executable, str(standin("fake_vllm")), "serve", "m",
                    "--tensor-parallel-size", "2", "--data-parallel-size", "2",
                    "--port", str(port), "--host", "127.0.0.1"],
        "gpus": [0, 1],
        "ready": {"http": f"http://127.0.0.1:{port}/health", "timeout": 60},
        "fatal": [r"DP adjusted local rank \d+ is out of bounds"], "stop": {"grace": 2}}}})
    started = time.monotonic()
    with pytest.raises(RemoteError) as info:
        deploy(PROJECT, str(box_host), str(playbook), reporter, journal=journal)
    assert time.monotonic() - started < 30
    assert info.value.kind in {"fatal_log", "exited"}
    assert any("out of bounds" in line for line in info.value.excerpt)


def test_vllm_standin_ready_on_health(box_host: Path, tmp_path: Path, reporter: Reporter,
                                      journal: Journal, standin: Any,
                                      teardown_runs: None) -> None:
    port = free_port()
    playbook = write_playbook(tmp_path, {"processes": {"server": {
        "command": [sys.executable, str(standin("fake_vllm")), "serve", "m",
                    "--tensor-parallel-size", "1", "--data-parallel-size", "2",
                    "--port", str(port), "--host", "127.0.0.1"],
        "gpus": [2, 3], "parallel": {"tensor": 1, "data": 2},
        "ready": {"http": f"http://127.0.0.1:{port}/health", "timeout": 60},
        "stop": {"grace": 5}}}})
    result = deploy(PROJECT, str(box_host), str(playbook), reporter, journal=journal)
    report = status(PROJECT, str(box_host), reporter, journal=journal)
    gpus = {g["index"]: g for g in report["facts"]["gpus"]}
    assert gpus[2]["memory_used_mib"] > 0 and gpus[3]["memory_used_mib"] > 0
    assert gpus[0]["memory_used_mib"] == 0
    proc = report["runs"][0]["processes"][0]
    assert proc["state"] == "running" and proc["ready"] is True
    assert proc["pid"] == result.processes[0]["pid"]


# ------------------------------------------------------------------ bad input: nothing started


def test_plan_problem_sends_nothing(tmp_path: Path, reporter: Reporter, journal: Journal) -> None:
    # A host that would hang if contacted: the plan error must come first.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    host = tmp_path / "h.yaml"
    host.write_text(yaml.safe_dump({"hostname": "127.0.0.1", "port": listener.getsockname()[1],
                                    "workdir": str(tmp_path / "w"), "gpus": 2}))
    playbook = write_playbook(tmp_path, {"processes": {"server": {
        "command": "vllm serve m", "gpus": [0, 1], "parallel": {"tensor": 2, "data": 2}}}})
    try:
        with pytest.raises(PlanError, match=r"tensor 2 × data 2 = 4 GPUs"):
            deploy(PROJECT, str(host), str(playbook), reporter, journal=journal)
        listener.settimeout(0.2)
        with pytest.raises(socket.timeout):
            listener.accept()  # nobody connected
    finally:
        listener.close()
    assert not (tmp_path / "w").exists()


def test_unreachable_host_times_out_naming_the_limit(tmp_path: Path, reporter: Reporter,
                                                     journal: Journal) -> None:
    # Accepts TCP but never speaks SSH: the classic dead box behind a live NAT.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    host = tmp_path / "dead.yaml"
    host.write_text(yaml.safe_dump({"hostname": "127.0.0.1", "port": listener.getsockname()[1],
                                    "workdir": "/tmp/x", "connect_timeout": 1.5}))
    playbook, _ = http_server_playbook(tmp_path)
    try:
        with pytest.raises(ConnectError) as info:
            deploy(PROJECT, str(host), str(playbook), reporter, journal=journal)
    finally:
        stop.set()
        thread.join()
        listener.close()
        for conn in conns:
            conn.close()
    text = str(info.value)
    assert "connect timeout of 1.5 s" in text and "connect_timeout in the host file" in text
    assert journal.runs()[0]["status"] in {"unknown", "failed"}


def test_auth_failure_is_explained(box_host: Path, tmp_path: Path, reporter: Reporter,
                                   journal: Journal) -> None:
    wrong_key = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)],
                   check=True)
    config = yaml.safe_load(box_host.read_text())
    config["identity_file"] = str(wrong_key)
    host = tmp_path / "wrongkey.yaml"
    host.write_text(yaml.safe_dump(config))
    playbook, _ = http_server_playbook(tmp_path)
    with pytest.raises(AuthenticationError, match="authentication failed .* tried .*wrong_key"):
        deploy(PROJECT, str(host), str(playbook), reporter, journal=journal)
    assert not (box_workdir(host) / "runs").exists()


def test_changed_host_key_is_refused_with_the_fix(box_host: Path, tmp_path: Path,
                                                  reporter: Reporter, journal: Journal) -> None:
    config = yaml.safe_load(box_host.read_text())
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known = Path(config["known_hosts"])
    known.parent.mkdir(parents=True, exist_ok=True)
    public = (tmp_path / "other_key.pub").read_text().split()
    known.write_text(f"[127.0.0.1]:{config['port']} {public[0]} {public[1]}\n")
    playbook, _ = http_server_playbook(tmp_path)
    with pytest.raises(HostKeyError) as info:
        deploy(PROJECT, str(box_host), str(playbook), reporter, journal=journal)
    text = str(info.value)
    assert "CHANGED" in text and f"ssh-keygen -R '[127.0.0.1]:{config['port']}' -f" in text
    assert not (box_workdir(box_host) / "runs").exists()


def test_remote_without_python_is_explained(box_host: Path, tmp_path: Path, reporter: Reporter,
                                            journal: Journal) -> None:
    config = yaml.safe_load(box_host.read_text())
    config["python"] = "python3-not-installed"
    host = tmp_path / "nopy.yaml"
    host.write_text(yaml.safe_dump(config))
    playbook, _ = http_server_playbook(tmp_path)
    with pytest.raises(RemoteError) as info:
        deploy(PROJECT, str(host), str(playbook), reporter, journal=journal)
    assert info.value.kind == "no_python"
    assert "no Python interpreter 'python3-not-installed'" in str(info.value)


def test_workdir_not_writable_is_explained(box_host: Path, tmp_path: Path, reporter: Reporter,
                                           journal: Journal) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    config = yaml.safe_load(box_host.read_text())
    config["workdir"] = str(blocker / "workdir")
    host = tmp_path / "ro.yaml"
    host.write_text(yaml.safe_dump(config))
    playbook, _ = http_server_playbook(tmp_path)
    with pytest.raises(RemoteError) as info:
        deploy(PROJECT, str(host), str(playbook), reporter, journal=journal)
    assert info.value.kind == "workdir"
    assert str(blocker) in str(info.value)


def test_gpu_index_missing_on_box_starts_nothing(box_host: Path, tmp_path: Path,
                                                 reporter: Reporter, journal: Journal) -> None:
    # gpus: auto and nothing cached: only the box can tell; it must refuse before launching.
    playbook = write_playbook(tmp_path, {"processes": {"a": {
        "command": [sys.executable, "-c", "import time; time.sleep(600)"], "gpus": [9]}}})
    with pytest.raises(RemoteError) as info:
        deploy(PROJECT, str(box_host), str(playbook), reporter, journal=journal)
    assert info.value.kind == "gpu" and "9" in str(info.value)
    assert not (box_workdir(box_host) / "runs").exists()
    # Now the box's GPU count is cached, so the next plan refuses without connecting.
    with pytest.raises(PlanError, match="GPU 9 does not exist"):
        deploy(PROJECT, str(box_host), str(playbook), reporter, journal=journal)


def test_shell_metacharacters_reach_the_process_literally(box_host: Path, tmp_path: Path,
                                                          reporter: Reporter, journal: Journal,
                                                          teardown_runs: None) -> None:
    canary = tmp_path / "pwned"
    evil = f"x'; touch {canary}; echo \"$(touch {canary})\" `touch {canary}` $HOME"
    out = tmp_path / "argv.json"
    playbook = write_playbook(tmp_path, {
        "params": {"evil": evil, "out": str(out)},
        "processes": {"a": {
            "command": [sys.executable, "-c",
                        "import json,sys; json.dump(sys.argv[1:], open(sys.argv[1], 'w'))",
                        "${out}", "${evil}"],
            "ready": {"exit": True, "timeout": 20}}}})
    deploy(PROJECT, str(box_host), str(playbook), reporter, journal=journal)
    assert json.loads(out.read_text()) == [str(out), evil]
    assert not canary.exists()


def test_secrets_reach_the_process_but_not_argv_logs_or_journal(
        box_host: Path, tmp_path: Path, reporter: Reporter, journal: Journal,
        monkeypatch: pytest.MonkeyPatch, teardown_runs: None) -> None:
    secret = "hf_SECRETSECRET123"
    monkeypatch.setenv("HF_TOKEN", secret)
    out = tmp_path / "seen"
    playbook = write_playbook(tmp_path, {"secrets": ["HF_TOKEN"], "processes": {"a": {
        "command": [sys.executable, "-c",
                    f"import os; open({str(out)!r}, 'w').write(os.environ['HF_TOKEN'])"],
        "ready": {"exit": True, "timeout": 20}}}})
    result = deploy(PROJECT, str(box_host), str(playbook), reporter, journal=journal)
    assert out.read_text() == secret
    workdir = box_workdir(box_host)
    for path in [*workdir.rglob("*"), *journal.root.rglob("*")]:
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path
    assert secret not in json.dumps(result.processes)


def test_missing_secret_is_a_config_error_before_connecting(tmp_path: Path, reporter: Reporter,
                                                            journal: Journal,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    from outrig.errors import ConfigError

    monkeypatch.delenv("HF_TOKEN", raising=False)
    host = tmp_path / "h.yaml"
    host.write_text(yaml.safe_dump({"hostname": "127.0.0.1", "port": 9, "workdir": "/tmp/x"}))
    playbook = write_playbook(tmp_path, {"secrets": ["HF_TOKEN"],
                                         "processes": {"a": {"command": "echo"}}})
    with pytest.raises(ConfigError, match="HF_TOKEN .* not set in this shell"):
        deploy(PROJECT, str(host), str(playbook), reporter, journal=journal)


def test_inv_deploy_json_and_exit_codes(box_host: Path, tmp_path: Path,
                                        teardown_runs: None) -> None:
    playbook, _ = http_server_playbook(tmp_path)
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    inv = [sys.executable, "-m", "invoke", "--search-root", str(REPO)]
    done = subprocess.run([*inv, "deploy", "--host", str(box_host), "--playbook", str(playbook),
                           "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    kinds = [e.get("event") for e in events]
    assert "launched" in kinds and "ready" in kinds and kinds[-1] == "deployed"
    bad = write_playbook(tmp_path, {"processes": {"a": {"command": "echo ${nope}"}}}, "bad")
    failed = subprocess.run([*inv, "deploy", "--host", str(box_host), "--playbook", str(bad)],
                            capture_output=True, text=True, env=env, timeout=60)
    assert failed.returncode == 2
    assert "${nope} is not defined" in failed.stderr and "Traceback" not in failed.stderr


def test_port_taken_by_a_stale_server_is_refused(box_host: Path, tmp_path: Path,
                                                 reporter: Reporter, journal: Journal,
                                                 teardown_runs: None) -> None:
    """A leftover server on the port would answer the readiness check for the new one."""
    playbook, port = http_server_playbook(tmp_path)
    stale = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                              "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        with pytest.raises(RemoteError) as info:
            deploy(PROJECT, str(box_host), str(playbook), reporter, journal=journal)
        assert info.value.kind == "port_busy"
        assert f"port {port}" in str(info.value) and f"pid {stale.pid}" in str(info.value)
        assert "--force-foreign" in str(info.value)
        assert not (box_workdir(box_host) / "runs").exists()
    finally:
        stale.kill()
        stale.wait()


def test_two_identical_deploys_at_once_never_report_two_live_runs(
        box_host: Path, tmp_path: Path, teardown_runs: None) -> None:
    """Two ``deploy``s of one playbook started at the same moment run one after the other
    (the box's workdir lock). The first said ``✓ ready`` (exit 0) for a run the second
    replaced two seconds later. Now the first sees the second waiting for the box and fails,
    naming the run that replaces its own; the second says which run it replaced; afterwards
    the box and the journal have one live run.

    Its server is ready only once the test says so (a file), after the second deploy has
    announced itself on the box: the order comes from events, not from timing."""
    import io

    from outrig.ops.deploy import DeploySuperseded

    go = tmp_path / "go"
    playbook = write_playbook(tmp_path, {"processes": {"server": {
        "command": [sys.executable, "-c", "import os, time\n"
                    f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
                    "print('up', flush=True); time.sleep(600)"],
        "ready": {"log": "^up$", "timeout": 120}}}})
    state = tmp_path / "state"
    start = threading.Barrier(2)
    done: list[tuple[Any, str]] = []

    def one() -> None:
        err = io.StringIO()
        start.wait()
        try:
            result: Any = deploy(PROJECT, str(box_host), str(playbook), Reporter(err=err),
                                 journal=Journal(state))
        except DeploySuperseded as exc:
            result = exc
        done.append((result, err.getvalue()))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    waiting = box_workdir(box_host) / ".outrig" / "waiting" / "job"
    runs = box_workdir(box_host) / "runs"

    def behind() -> list[str]:
        """The deploy waiting behind the one that holds the lock and has made its run."""
        made = {d.name for d in runs.iterdir()} if runs.is_dir() else set()
        return [p.stem for p in waiting.glob("*.json") if p.stem not in made] if made else []

    deadline = time.monotonic() + 120
    while not behind() and time.monotonic() < deadline:
        time.sleep(0.05)
    (announced,) = behind()
    go.write_text("")
    for thread in threads:
        thread.join(180)
    assert len(done) == 2
    failed = [r for r, _ in done if isinstance(r, DeploySuperseded)]
    assert len(failed) == 1, [text for _, text in done]
    (second, text) = next((r, text) for r, text in done if not isinstance(r, DeploySuperseded))
    assert second.plan.run_id == announced
    first_run = second.replaced["run_id"]
    assert second.replaced["concurrent"], second.replaced
    assert f"replaces that run now: run {announced}" in str(failed[0]), failed[0]
    assert f"as run {first_run}" in str(failed[0]) and failed[0].exit_code == 1
    assert f"this deploy replaced run {first_run} of job, started" in text, text
    assert f"only {announced} runs now" in text
    assert Journal(state).run(first_run)["replaced_by"] == announced
    assert list(waiting.glob("*.json")) == []  # each deploy took its note away
    shown = status(PROJECT, str(box_host), Reporter(quiet=True), journal=Journal(state))
    assert [(r["run_id"], r["status"]) for r in shown["runs"]] == [(announced, "running")]
    live = [r["run_id"] for r in Journal(state).runs() if r.get("status") == "running"]
    assert live == [announced]
