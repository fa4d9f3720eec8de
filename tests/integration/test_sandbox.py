"""The sandbox box itself: real sshd with throwaway keys, the latency proxy, the fake nvidia-smi
over SSH. Everything outrig's integration tests rely on is checked here with plain paramiko,
so a failure points at the sandbox and not at outrig."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest
import yaml

from outrig.sandbox.box import SandboxBox
from outrig.sandbox.proxy import LatencyProxy
from tests.support.network import EchoServer
from tests.support.processes import alive, wait_gone

# One line of tests/fixtures/h200-1gpu/idle-gpu.csv (real H200, driver 580.159.04).
CAPTURED_GPU_LINE = ("0, GPU-77a30507-495f-090f-c8dd-b62546cd0a77, NVIDIA H200, 143771, 0, 143156, "
                     "0, 00000000:00:06.0, 580.159.04")
GPU_QUERY = ("index,uuid,name,memory.total,memory.used,memory.free,utilization.gpu,"
             "pci.bus_id,driver_version")


def connect(box: SandboxBox, port: int | None = None, key: Path | None = None,
            timeout: float = 10.0) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect(box.host, port or box.port, username=box.user,
                   key_filename=str(key or box.identity_file), look_for_keys=False,
                   allow_agent=False, timeout=timeout, banner_timeout=timeout,
                   auth_timeout=timeout)
    return client


def run(client: paramiko.SSHClient, command: str, timeout: float = 10.0) -> tuple[int, str, str]:
    _, out, err = client.exec_command(command, timeout=timeout)
    code = out.channel.recv_exit_status()
    return code, out.read().decode(), err.read().decode()


@pytest.fixture
def client(sandbox: SandboxBox) -> Iterator[paramiko.SSHClient]:
    if not sandbox.is_running():
        sandbox.start()
    c = connect(sandbox)
    try:
        yield c
    finally:
        c.close()


@pytest.mark.integration
def test_client_key_logs_in_and_execs(client: paramiko.SSHClient, sandbox: SandboxBox) -> None:
    code, out, err = run(client, "echo ok; id -un")
    assert (code, out.split()) == (0, ["ok", sandbox.user]), err
    assert sandbox.host == "127.0.0.1"


@pytest.mark.integration
def test_other_key_is_refused(sandbox: SandboxBox, tmp_path: Path, ssh_keygen: str) -> None:
    other = tmp_path / "other_key"
    subprocess.run([ssh_keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    with pytest.raises(paramiko.AuthenticationException):
        connect(sandbox, key=other).close()


@pytest.mark.integration
def test_host_file_is_valid_for_outrig(box_host: Path, sandbox: SandboxBox) -> None:
    from outrig.hosts.file_model import HostFile

    data = yaml.safe_load(box_host.read_text())
    spec = HostFile(**data)
    assert spec.hostname == "127.0.0.1" and spec.port == sandbox.port
    assert spec.env["PATH"] == f"{sandbox.bin_dir}:$PATH"
    assert spec.env["OUTRIG_FAKE_GPU_DIR"] == str(box_host.parent.parent / "gpu")
    assert Path(spec.workdir).is_dir() and not Path(str(spec.known_hosts)).exists()


@pytest.mark.integration
def test_exec_round_trip_through_proxy_pays_the_rtt(
        sandbox: SandboxBox, client: paramiko.SSHClient,
        make_proxy: Callable[..., LatencyProxy]) -> None:
    def exec_time(c: paramiko.SSHClient) -> float:
        started = time.monotonic()
        code, out, _ = run(c, "echo ok")
        assert (code, out) == (0, "ok\n")
        return time.monotonic() - started

    direct = min(exec_time(client) for _ in range(2))
    proxy = make_proxy(sandbox.port, one_way_delay=0.12)
    slow = connect(sandbox, port=proxy.port)
    try:
        through = min(exec_time(slow) for _ in range(2))
        assert proxy.connections == 1
    finally:
        slow.close()
    # An exec is a channel open plus the exec reply: at least one full RTT (0.24 s) each way.
    # (Lower bounds only: a loaded machine may be slow, never faster than the delay.)
    assert through >= 0.24, f"exec through a 240 ms RTT link took only {through:.3f}s"
    assert through > direct


@pytest.mark.integration
def test_cut_all_breaks_live_connection_and_new_ones_work(
        sandbox: SandboxBox, make_proxy: Callable[..., LatencyProxy]) -> None:
    proxy = make_proxy(sandbox.port, one_way_delay=0.0)
    live = connect(sandbox, port=proxy.port)
    try:
        assert run(live, "echo before")[1] == "before\n"
        transport = live.get_transport()
        assert transport is not None
        assert proxy.cut_all() == 1
        deadline = time.monotonic() + 5
        while transport.is_active() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not transport.is_active(), "the cut connection must be seen as dead"
        with pytest.raises((paramiko.SSHException, EOFError, OSError)):
            run(live, "echo after", timeout=3)
    finally:
        live.close()
    assert proxy.connections == 0
    fresh = connect(sandbox, port=proxy.port)
    try:
        assert run(fresh, "echo again")[1] == "again\n"
        assert proxy.accepted == 2
    finally:
        fresh.close()


@pytest.mark.integration
def test_fake_nvidia_smi_over_ssh_with_host_env(box_host: Path, sandbox: SandboxBox,
                                                client: paramiko.SSHClient) -> None:
    env = yaml.safe_load(box_host.read_text())["env"]
    # What outrig does with the host file's env: expand against the box's environment
    # (double quotes: $PATH expands, the paths themselves have nothing special in them).
    prefix = " ".join(f'{k}="{v}"' for k, v in env.items())
    code, out, err = run(client, f"{prefix} nvidia-smi --query-gpu={GPU_QUERY} "
                                 "--format=csv,noheader,nounits")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 8
    captured = CAPTURED_GPU_LINE.split(", ")
    for i, line in enumerate(lines):
        fields = line.split(", ")
        assert len(fields) == len(captured) == 9
        assert fields[0] == str(i)
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                            fields[1])
        assert fields[2] == "NVIDIA L40S"
        total, used, free = (int(x) for x in fields[3:6])
        assert (total, used) == (49152, 0) and 0 < free < total
        assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.\d", fields[7])
        assert fields[8] == captured[8] == "580.159.04"
    # Without the host env the box has no nvidia-smi: it is the PATH entry that provides it.
    code, _, _ = run(client, "command -v nvidia-smi")
    assert code != 0


@pytest.mark.integration
def test_stop_and_start_keep_the_port(sandbox: SandboxBox) -> None:
    port = sandbox.port
    survivor = connect(sandbox)
    try:
        sandbox.stop()
        sandbox.stop()  # idempotent
        assert not sandbox.is_running()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        transport = survivor.get_transport()
        assert transport is not None
        deadline = time.monotonic() + 5
        while transport.is_active() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not transport.is_active(), "stop() drops live sessions like a dead box"
    finally:
        survivor.close()
        sandbox.start()
    assert sandbox.port == port and sandbox.is_running()
    c = connect(sandbox)
    try:
        assert run(c, "echo back")[1] == "back\n"
    finally:
        c.close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


def test_proxy_preserves_bytes_and_order_without_throttling(
        echo: EchoServer, make_proxy: Callable[..., LatencyProxy]) -> None:
    proxy = make_proxy(echo.port, one_way_delay=0.05)
    payload = bytes(range(256)) * 16384  # 4 MiB
    received = bytearray()
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        def reader() -> None:
            while True:
                chunk = s.recv(1 << 16)
                if not chunk:
                    return
                received.extend(chunk)

        t = threading.Thread(target=reader)
        t.start()
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        t.join(20)
    elapsed = time.monotonic() - started
    assert bytes(received) == payload
    assert elapsed >= 0.1, f"4 MiB echo took only {elapsed:.2f}s through a delaying proxy"


def test_proxy_delay_is_one_way_and_adjustable(
        echo: EchoServer, make_proxy: Callable[..., LatencyProxy]) -> None:
    proxy = make_proxy(echo.port, one_way_delay=0.1)

    def rtt(s: socket.socket) -> float:
        started = time.monotonic()
        s.sendall(b"x")
        assert s.recv(1) == b"x"
        return time.monotonic() - started

    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
        assert 0.2 <= rtt(s) < 0.5
        proxy.set_delay(0.0)
        assert rtt(s) < 0.15


def test_proxy_refuses_non_loopback_targets() -> None:
    for target in ("10.0.0.1", "203.0.113.5", "example.com", "2001:db8::2"):
        with pytest.raises(ValueError):
            LatencyProxy(target, 22)
    LatencyProxy("::1", 22)  # constructing is fine; nothing is started
    LatencyProxy("127.0.0.2", 22)


def test_proxy_close_is_prompt_and_idempotent(echo: EchoServer) -> None:
    proxy = LatencyProxy("127.0.0.1", echo.port, one_way_delay=0.5).start()
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    s.sendall(b"pending")  # still queued in the proxy when it closes
    deadline = time.monotonic() + 2
    while proxy.connections == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    before = threading.active_count()
    started = time.monotonic()
    proxy.close()
    proxy.close()
    assert time.monotonic() - started < 5, "close() must not hang on live connections"
    assert proxy.connections == 0
    assert threading.active_count() < before
    s.settimeout(2)
    with pytest.raises((ConnectionResetError, OSError)):
        data = s.recv(10)
        if data == b"":
            raise ConnectionResetError("closed")
    s.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()


# ------------------------------------------------------------- sandbox-up / sandbox-down


def outrig_cli(args: list[str], cwd: Path,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The installed ``outrig`` of this environment, as a separate process."""
    binary = Path(sys.executable).parent / "outrig"
    return subprocess.run([str(binary), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def sandbox_project(tmp_path: Path) -> Iterator[Path]:
    """An empty project; whatever sandbox-up recorded for it, runs kept by
    ``sandbox-down --keep-runs`` included, is stopped afterwards."""
    from outrig.console import Reporter
    from outrig.ops.sandbox import sandbox_down
    from outrig.session import Project

    root = tmp_path / "proj"
    (root / "hosts").mkdir(parents=True)
    yield root
    sandbox_down(Project(root), "sandbox", Reporter(quiet=True))


def test_sandbox_up_outlives_the_command_and_down_stops_exactly_it(
        sandbox_project: Path) -> None:
    up = outrig_cli(["sandbox-up", "--delay", "20", "--json"], sandbox_project)
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout)
    server, sshd = state["server"]["pid"], state["sshd"]["pid"]
    host_file = sandbox_project / "hosts" / "sandbox.yaml"
    assert state["host_file"] == str(host_file) and state["already_up"] is False
    # the host file points at the proxy, which lives in the server, not in `up`'s process
    assert yaml.safe_load(host_file.read_text())["port"] == state["port"] != state["sshd_port"]
    assert alive(server) and alive(sshd)

    status = outrig_cli(["status", "--host", "sandbox", "--json"], sandbox_project)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["runs"] == []

    again = outrig_cli(["sandbox-up", "--json"], sandbox_project)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["already_up"] is True
    assert json.loads(again.stdout)["server"]["pid"] == server
    told = outrig_cli(["sandbox-up"], sandbox_project)  # for people: how to use and stop it
    assert told.returncode == 0, told.stderr
    assert "sandbox sandbox already up" in told.stdout and f"server pid {server}" in told.stdout
    assert "outrig check --host sandbox" in told.stdout and "stop it: outrig sandbox-down" in \
        told.stdout
    assert [ln for ln in told.stdout.splitlines() if len(ln) > 80 and " " in ln.strip()] == []

    down = outrig_cli(["sandbox-down"], sandbox_project)
    assert down.returncode == 0, down.stderr
    # both processes it stops (it named only the server, whose stop takes the sshd along)
    assert f"pids {server}, {sshd}" in down.stderr and "removed" in down.stderr
    assert wait_gone([server, sshd]) == []
    assert not host_file.exists()
    twice = outrig_cli(["sandbox-down"], sandbox_project)
    assert twice.returncode == 0, twice.stderr
    assert "sandbox sandbox is not up: nothing to stop" in twice.stderr


def test_sandbox_down_keep_runs_leaves_the_runs_findable(sandbox_project: Path,
                                                         tmp_path: Path) -> None:
    """`sandbox-down --keep-runs` deleted the box's workdir, run records and logs while the
    runs went on: processes no command could find. The runs stay reachable (the host file
    now reaches the kept workdir on this machine), `sandbox-up` serves the same box again,
    and a plain `sandbox-down` stops them."""
    from tests.support.processes import marked

    up = outrig_cli(["sandbox-up", "--json"], sandbox_project)
    assert up.returncode == 0, up.stderr
    sshd = json.loads(up.stdout)["sshd"]["pid"]
    playbook = tmp_path / "long.yaml"
    playbook.write_text(yaml.safe_dump({"name": "long", "processes": {"sleeper": {
        "command": [sys.executable, "-c", "import time; print('up', flush=True); "
                    "time.sleep(600)"], "gpus": []}}}))
    deployed = outrig_cli(["deploy", "--host", "sandbox", "--playbook", str(playbook),
                           "--json"], sandbox_project)
    assert deployed.returncode == 0, deployed.stderr
    run_id = json.loads(deployed.stdout.splitlines()[-1])["run_id"]
    pids = marked(run_id)
    assert pids

    kept = outrig_cli(["sandbox-down", "--keep-runs", "--json"], sandbox_project)
    assert kept.returncode == 0, kept.stderr
    report = json.loads(kept.stdout)
    assert report["kept"] is True and report["kept_runs"] == [run_id]
    assert wait_gone([sshd]) == []
    assert all(alive(pid) for pid in pids)
    host_file = sandbox_project / "hosts" / "sandbox.yaml"
    assert yaml.safe_load(host_file.read_text())["hostname"] == "local"
    found = outrig_cli(["status", "--host", "sandbox", "--json"], sandbox_project)
    assert found.returncode == 0, found.stderr
    (run,) = json.loads(found.stdout)["runs"]
    assert run["run_id"] == run_id and run["processes"][0]["state"] == "running"
    told = outrig_cli(["sandbox-down", "--keep-runs"], sandbox_project)  # for people
    said = " ".join(told.stderr.split())  # the report wraps at the width, wherever it falls
    assert f"its runs keep running: {run_id}" in said, told.stderr
    assert "outrig status --host sandbox" in said

    again = outrig_cli(["sandbox-up", "--json"], sandbox_project)  # the same box, over SSH
    assert again.returncode == 0, again.stderr
    assert yaml.safe_load(host_file.read_text())["hostname"] == "127.0.0.1"
    over_ssh = outrig_cli(["status", "--host", "sandbox", "--json"], sandbox_project)
    assert over_ssh.returncode == 0, over_ssh.stderr
    assert [r["run_id"] for r in json.loads(over_ssh.stdout)["runs"]] == [run_id]

    down = outrig_cli(["sandbox-down"], sandbox_project)
    assert down.returncode == 0, down.stderr
    assert wait_gone(pids) == [] and marked(run_id) == []
    assert f"and its run(s) {run_id}" in " ".join(down.stderr.split()), down.stderr
    assert not host_file.exists()


def test_sandbox_up_leaves_a_host_file_it_did_not_write_alone(sandbox_project: Path) -> None:
    mine = sandbox_project / "hosts" / "sandbox.yaml"
    mine.write_text("hostname: 127.0.0.1\nworkdir: /w\n")
    up = outrig_cli(["sandbox-up"], sandbox_project)
    assert up.returncode == 2 and "was not written by outrig's sandbox" in up.stderr
    assert mine.read_text() == "hostname: 127.0.0.1\nworkdir: /w\n"
    from outrig.sandbox.service import read_state
    assert read_state("sandbox") is None  # nothing was started


def test_sandbox_down_stops_the_recorded_sshd_when_its_server_died(
        sandbox_project: Path) -> None:
    up = outrig_cli(["sandbox-up", "--json"], sandbox_project)
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout)
    os.kill(state["server"]["pid"], signal.SIGKILL)  # the server crashed; its sshd lives on
    assert wait_gone([state["server"]["pid"]]) == []
    assert alive(state["sshd"]["pid"])
    down = outrig_cli(["sandbox-down", "--json"], sandbox_project)
    assert down.returncode == 0, down.stderr
    result = json.loads(down.stdout)
    assert result["stopped"] == [state["sshd"]["pid"]] and result["host_file_removed"]
    assert wait_gone([state["sshd"]["pid"]]) == []


def test_a_burst_of_sigterms_ends_the_sandbox_server_and_its_sshd(
        sandbox_project: Path) -> None:
    """The server's handlers take no lock: a second SIGTERM arriving while the first was being
    handled used to run the handler again on the same thread and hang on the Event's lock."""
    up = outrig_cli(["sandbox-up", "--json"], sandbox_project)
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout)
    server, sshd = state["server"]["pid"], state["sshd"]["pid"]
    from outrig.sandbox.service import is_recorded_process
    for _ in range(200):
        if not is_recorded_process(state["server"]):
            break
        os.kill(server, signal.SIGTERM)
    assert wait_gone([server, sshd]) == []


def test_demo_keep_leaves_a_reachable_sandbox_and_run_that_sandbox_down_stops(
        sandbox_project: Path) -> None:
    """The walkthrough's bug: `demo --keep --delay 120` wrote a host file pointing at a proxy
    that closed with the command, and cleaned up the processes it said it kept."""
    from tests.support.processes import marked

    repo = Path(__file__).resolve().parents[2]
    (sandbox_project / "playbooks").mkdir()
    shutil.copyfile(repo / "playbooks" / "smoke.yaml", sandbox_project / "playbooks" / "smoke.yaml")
    (sandbox_project / "remote" / "examples").mkdir(parents=True)
    shutil.copyfile(repo / "remote" / "examples" / "train_tiny.py",
                    sandbox_project / "remote" / "examples" / "train_tiny.py")
    demo = outrig_cli(["demo", "--keep", "--delay", "20"], sandbox_project, timeout=300)
    assert demo.returncode == 0, demo.stderr
    assert "stop both: outrig sandbox-down" in demo.stderr

    status = outrig_cli(["status", "--host", "sandbox", "--json"], sandbox_project)
    assert status.returncode == 0, status.stderr  # through the kept proxy, from a new process
    runs = json.loads(status.stdout)["runs"]
    assert [r["playbook"] for r in runs] == ["smoke"]
    server = next(p for p in runs[0]["processes"] if p["name"] == "server")
    assert server["state"] == "running"  # kept, not cleaned up
    run_pids = marked(runs[0]["run_id"])
    assert run_pids

    state = json.loads((sandbox_root_state("sandbox")).read_text())
    down = outrig_cli(["sandbox-down"], sandbox_project)
    assert down.returncode == 0, down.stderr
    assert wait_gone([state["server"]["pid"], state["sshd"]["pid"], *run_pids]) == []
    assert not (sandbox_project / "hosts" / "sandbox.yaml").exists()


def sandbox_root_state(name: str) -> Path:
    from outrig.sandbox.service import STATE_FILE, sandbox_root

    return sandbox_root(name) / STATE_FILE


def test_demo_json_prints_only_json_lines(sandbox_project: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    demo = outrig_cli(["demo", "--json", "--project", str(repo)], sandbox_project, timeout=300)
    assert demo.returncode == 0, demo.stderr
    docs = [json.loads(line) for line in demo.stdout.splitlines()]  # every line is JSON
    events = [d.get("event") for d in docs]
    assert "deployed" in events and "stopped" in events  # deploy's and cleanup's events
    assert any("runs" in d for d in docs)  # the status document
    assert any({"process", "line"} <= set(d) for d in docs)  # log lines
    assert "smoke ready on sandbox" in demo.stderr  # notes for people stay on stderr
