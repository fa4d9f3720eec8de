"""The live agent behind a kept connection (connectors/keeper/live.py, remote/agent/serve.py).

Each test has a sandbox box of its own whose sshd logs at DEBUG1, which writes one line per
session-channel open and one per exec: the tests count those lines, on the box's side, to
prove that a call served by the live agent opened no channel and exec'd nothing. Never a
clock: a wait is for a state the keeper reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.agent import client as agent_client
from outrig.agent_code import bundle as agent_bundle
from outrig.connectors.keeper.client import KeptTransport, close_keepers, keepers, wait_gone
from outrig.console import Reporter
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.ops.deploy import deploy
from outrig.ops.logs import LOG_WINDOW
from outrig.sandbox.box import SandboxBox, start_sandbox
from outrig.sandbox.proxy import LatencyProxy
from outrig.session import HostSession, Project
from tests.support.processes import alive

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)
OUTRIG = [sys.executable, "-c",
          "import sys; from outrig.cli import program; program.run(['outrig', *sys.argv[1:]])"]
WAIT_S = 120.0  # the most a state the keeper reports may take to come (a loaded machine)


def counted_box(tmp_path: Path, **options: Any) -> Iterator[SandboxBox]:
    box = start_sandbox(tmp_path / "box", log_level="DEBUG1", **options)
    try:
        yield box
    finally:
        box.stop()


@pytest.fixture
def box(tmp_path: Path) -> Iterator[SandboxBox]:
    yield from counted_box(tmp_path)


def host_file(box: SandboxBox, proxy: LatencyProxy, tmp_path: Path) -> Path:
    path = box.write_host_file(tmp_path / "hosts" / "live.yaml", port=proxy.port)
    config = yaml.safe_load(path.read_text())
    box_python = os.environ.get("OUTRIG_TEST_BOX_PYTHON")
    if box_python:
        config["python"] = box_python
        path.write_text(yaml.safe_dump(config))
    return path


def sshd_counts(box: SandboxBox) -> tuple[int, int]:
    """(session channels opened, execs) on the box so far, as its sshd logged them."""
    text = box.log_file.read_text(errors="replace")
    return (text.count("server_input_channel_open: ctype session"),
            sum("session_input_channel_req" in line and "req exec" in line
                for line in text.splitlines()))


def status_once(host: Path, journal: Journal) -> tuple[dict[str, Any], KeptTransport]:
    session = HostSession(PROJECT, str(host), Reporter(quiet=True), journal,
                          host=HostBook(PROJECT.hosts_dir)(str(host)))
    try:
        result = session.call("status", stream=False)
    finally:
        session.transport.close()
    assert isinstance(session.transport, KeptTransport)
    return result, session.transport


def live_of_keeper() -> dict[str, Any]:
    listed = keepers()
    assert len(listed) == 1, listed
    live = listed[0].get("live")
    return live if isinstance(live, dict) else {}


def wait_live(state: str, *, other_than: dict[str, Any] | None = None) -> dict[str, Any]:
    """The keeper's live agent once it is in ``state`` (and, with ``other_than``, is not
    that one: another pid or digest)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        live = live_of_keeper()
        fresh = other_than is None or (live.get("pid"), live.get("digest")) != (
            other_than.get("pid"), other_than.get("digest"))
        if live.get("state") == state and fresh:
            return live
        time.sleep(0.05)
    raise AssertionError(f"the live agent never became {state}: {live_of_keeper()}")


@pytest.fixture
def warm(box: SandboxBox, make_proxy: Any, tmp_path: Path,
         keeping: None) -> tuple[Path, Journal, LatencyProxy]:
    """A host whose keeper has a ready live agent (after one call on the exec path)."""
    proxy: LatencyProxy = make_proxy(box.port, one_way_delay=0.005)
    host, journal = host_file(box, proxy, tmp_path), Journal(tmp_path / "state")
    first, transport = status_once(host, journal)
    assert first["ok"] and transport.live_calls == 0, "the first call takes the exec path"
    wait_live("ready")
    return host, journal, proxy


def test_calls_run_on_the_live_agent_without_a_channel_open_or_exec(
        box: SandboxBox, warm: tuple[Path, Journal, LatencyProxy]) -> None:
    host, journal, proxy = warm
    opens, execs = sshd_counts(box)
    for _ in range(3):
        result, transport = status_once(host, journal)
        assert result["ok"] and transport.live_calls == 1 and transport.kept_channels == 1
    assert sshd_counts(box) == (opens, execs), "no channel opened, nothing exec'd on the box"
    assert proxy.accepted == 1
    assert live_of_keeper()["served"] == 3


def test_calls_at_the_same_time_are_multiplexed_on_one_live_agent(
        box: SandboxBox, warm: tuple[Path, Journal, LatencyProxy]) -> None:
    import threading

    host, journal, _proxy = warm
    opens, execs = sshd_counts(box)
    results: list[tuple[dict[str, Any], KeptTransport]] = []
    barrier = threading.Barrier(4)

    def one() -> None:
        barrier.wait(30)
        results.append(status_once(host, journal))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert [r["ok"] for r, _ in results] == [True] * 4
    assert sum(t.live_calls for _, t in results) == 4
    assert sshd_counts(box) == (opens, execs)


def changed_bundle(monkeypatch: pytest.MonkeyPatch) -> str:
    """The agent as a newer install would send it: one more module, so another digest."""
    sources = agent_bundle.package_sources()
    monkeypatch.setattr(agent_bundle, "package_sources",
                        lambda: {**sources, "zz_newer.py": b"NEWER = 1\n"})
    for cached in (agent_client.agent_bundle_bytes, agent_client.agent_payload,
                   agent_client.agent_b64, agent_client.agent_digest):
        cached.cache_clear()
    monkeypatch.setattr(agent_client, "_cached_bundle", lambda key: None)
    monkeypatch.setattr(agent_client, "_keep_bundle", lambda path, bundle: None)
    return agent_client.agent_digest()


def test_a_changed_bundle_is_never_served_by_the_old_live_agent(
        warm: tuple[Path, Journal, LatencyProxy], monkeypatch: pytest.MonkeyPatch) -> None:
    host, journal, _proxy = warm
    old = live_of_keeper()
    try:
        digest = changed_bundle(monkeypatch)
        assert digest != old["digest"]
        result, transport = status_once(host, journal)
        assert result["ok"] and transport.live_calls == 0, "the old live agent served it"
        new = wait_live("ready", other_than=old)
        assert new["digest"] == digest
        result, transport = status_once(host, journal)
        assert result["ok"] and transport.live_calls == 1
    finally:
        monkeypatch.undo()
        for cached in (agent_client.agent_bundle_bytes, agent_client.agent_payload,
                       agent_client.agent_b64, agent_client.agent_digest):
            cached.cache_clear()


def test_a_live_agent_that_dies_is_replaced_and_no_call_fails(
        warm: tuple[Path, Journal, LatencyProxy]) -> None:
    host, journal, proxy = warm
    old = live_of_keeper()
    os.kill(int(old["pid"]), signal.SIGKILL)  # the box's live agent: a process this test's
    wait_live("ended")                         # own sshd started
    result, transport = status_once(host, journal)
    assert result["ok"] and transport.live_calls == 0  # the exec path, while a fresh one starts
    new = wait_live("ready", other_than=old)
    assert new["pid"] != old["pid"]
    result, transport = status_once(host, journal)
    assert result["ok"] and transport.live_calls == 1
    assert proxy.accepted == 1, "the same kept connection all along"


def test_the_live_agent_ends_with_its_connection(
        warm: tuple[Path, Journal, LatencyProxy]) -> None:
    live = live_of_keeper()
    pid = int(live["pid"])
    for entry in close_keepers():
        assert wait_gone(int(entry["pid"]), 30.0)
    assert wait_gone(pid, WAIT_S), "the live agent outlived its connection"


def test_a_follow_stream_runs_on_the_live_agent_and_its_child_ends_when_the_client_leaves(
        box: SandboxBox, warm: tuple[Path, Journal, LatencyProxy]) -> None:
    """tail-logs' stream is a long call with output over time; the client closing it ends
    the request's child on the box, as closing an exec channel ends the agent."""
    host, journal, _proxy = warm
    session = HostSession(PROJECT, str(host), Reporter(quiet=True), journal,
                          host=HostBook(PROJECT.hosts_dir)(str(host)))
    call = agent_client.AgentCall(session.transport)
    request = session.request("follow", follow=True, heartbeat=0.2, lines=0)
    opens, execs = sshd_counts(box)
    channel = call.start(request, window_size=LOG_WINDOW)
    try:
        assert channel.live
        first = next(iter(call.reader(channel).events()))
        assert first.get("event"), first
    finally:
        channel.close()
        session.transport.close()
    assert sshd_counts(box) == (opens, execs)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and live_of_keeper().get("requests_open"):
        time.sleep(0.05)
    assert live_of_keeper()["requests_open"] == 0


def test_secrets_of_a_deploy_on_the_live_agent_reach_the_process_and_no_argv(
        box: SandboxBox, warm: tuple[Path, Journal, LatencyProxy], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    host, journal, _proxy = warm
    secret = "hf_LIVESECRET0042"
    monkeypatch.setenv("HF_TOKEN", secret)
    out, cmdlines = tmp_path / "seen", tmp_path / "cmdlines"
    probe = tmp_path / "probe.py"
    probe.write_text(f"""import os
open({str(out)!r}, "w").write(os.environ["HF_TOKEN"])
seen = []
for pid in os.listdir("/proc"):
    try:
        seen.append(open(f"/proc/{{pid}}/cmdline", "rb").read().decode("utf-8", "replace"))
    except OSError:
        pass
open({str(cmdlines)!r}, "w").write("\\n".join(seen))
""")
    book = tmp_path / "secret.yaml"
    book.write_text(yaml.safe_dump({"name": "secret", "secrets": ["HF_TOKEN"], "processes": {
        "a": {"command": [sys.executable, str(probe)], "ready": {"exit": True,
                                                                  "timeout": 60}}}}))
    opens, execs = sshd_counts(box)
    deploy(PROJECT, str(host), str(book), Reporter(quiet=True), journal=journal)
    assert sshd_counts(box) == (opens, execs), "the deploy was served by the live agent"
    assert out.read_text() == secret
    assert secret not in cmdlines.read_text(), "a secret in some process's argv on the box"
    for path in journal.root.rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path


@pytest.fixture
def one_session_box(tmp_path: Path) -> Iterator[SandboxBox]:
    yield from counted_box(tmp_path, max_sessions=1)


def test_a_box_that_refuses_the_live_channel_keeps_the_exec_path_and_connections_says_why(
        one_session_box: SandboxBox, make_proxy: Any, tmp_path: Path, keeping: None) -> None:
    box = one_session_box
    proxy: LatencyProxy = make_proxy(box.port, one_way_delay=0.005)
    host, journal = host_file(box, proxy, tmp_path), Journal(tmp_path / "state")
    first, _ = status_once(host, journal)
    assert first["ok"]
    live = wait_live("failed")
    assert "channel" in live["why"]
    for _ in range(2):
        result, transport = status_once(host, journal)
        assert result["ok"] and transport.live_calls == 0 and transport.kept_channels == 1
    listed = subprocess.run([*OUTRIG, "connections"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    said = " ".join(listed.stdout.split())  # the state line wraps at 80 columns
    assert "off: the box refused it a session channel" in said
    assert "calls take the exec path" in said
    assert json.loads(subprocess.run([*OUTRIG, "connections", "--json"], cwd=tmp_path,
                                     capture_output=True, text=True, timeout=120).stdout)[
        "connections"][0]["live"]["state"] == "failed"


SLOW = """\
name: slow
processes:
  first:
    command: python3 -c "import time; print('up', flush=True); time.sleep(600)"
    gpus: []
    ready: {log: "never printed", timeout: 600}
    stop: {grace: 5}
"""


def test_ctrl_c_cancels_a_deploy_served_by_the_live_agent(
        box: SandboxBox, warm: tuple[Path, Journal, LatencyProxy], tmp_path: Path,
        procs: Any) -> None:
    """The CLI's first Ctrl-C writes ``cancel`` to the agent's stdin: through the live agent
    that is an ``i`` frame to the request's child, which stops what it launched and answers."""
    host, _journal, _proxy = warm
    project = tmp_path / "project"
    (project / "playbooks").mkdir(parents=True)
    (project / "hosts").mkdir()
    (project / "hosts" / "live.yaml").write_text(host.read_text())
    (project / "playbooks" / "slow.yaml").write_text(SLOW)
    served = live_of_keeper()["served"]
    opens, execs = sshd_counts(box)
    deploying = procs.spawn([*OUTRIG, "deploy", "--host", "live", "--playbook", "slow",
                             "--json"], cwd=project, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    assert deploying.stdout is not None
    pid = None
    for line in deploying.stdout:
        event = json.loads(line)
        if event.get("event") == "launched":
            pid = int(event["pid"])
            break
    assert pid is not None, deploying.communicate()
    assert live_of_keeper()["served"] > served, "the deploy was not on the live agent"
    deploying.send_signal(signal.SIGINT)
    _out, err = deploying.communicate(timeout=WAIT_S)
    assert deploying.returncode == 130, err
    assert f"had launched (first (pid {pid}))" in err and "workdir is unlocked" in err
    assert wait_gone(pid, WAIT_S), "the launched process outlived the cancel"
    assert sshd_counts(box) == (opens, execs)


# ------------------------------------------------------------------ its faults (issue: a
# stopped agent, a stopped client, a killed agent): each found by a state the keeper reports


def marked_book(tmp_path: Path, marker: Path) -> Path:
    """A playbook whose one process appends a line to ``marker`` each time it starts."""
    book = tmp_path / "marked.yaml"
    book.write_text(yaml.safe_dump({"name": "marked", "processes": {"svc": {
        "command": [sys.executable, "-u", "-c",
                    f"import time\nopen({str(marker)!r}, 'a').write('run\\n')\n"
                    "print('up', flush=True)\ntime.sleep(600)"],
        "ready": {"log": "up", "timeout": 60}, "stop": {"grace": 2}}}}))
    return book


def test_a_stopped_live_agent_is_dropped_and_a_deploy_sent_to_it_runs_once_on_the_exec_path(
        box: SandboxBox, warm: tuple[Path, Journal, LatencyProxy], tmp_path: Path) -> None:
    """The box's live agent stopped (SIGSTOP) while the link is fine: the deploy sent to it
    is not started within its deadline, so the keeper drops the agent and serves the deploy
    on the exec path; the stopped agent, resumed, refuses the request it then reads (too
    late) and leaves. The deploy ran exactly once; the next call is served as usual."""
    host, journal, proxy = warm
    old = live_of_keeper()
    pid = int(old["pid"])
    marker = tmp_path / "starts"
    book = marked_book(tmp_path, marker)
    os.kill(pid, signal.SIGSTOP)  # the box's live agent: a process this test's own sshd started
    try:
        deploy(PROJECT, str(host), str(book), Reporter(quiet=True), journal=journal)
        now = live_of_keeper()
        assert (now["pid"], now["state"]) != (pid, "ready"), "the stopped agent still counts"
        result, transport = status_once(host, journal)
        assert result["ok"] and transport.kept_channels == 1
    finally:
        os.kill(pid, signal.SIGCONT)
    assert wait_gone(pid, WAIT_S), "the resumed agent did not leave with its closed channel"
    assert marker.read_text() == "run\n", "the deploy ran again once the agent resumed"
    wait_live("ready", other_than=old)
    result, transport = status_once(host, journal)
    assert result["ok"] and transport.live_calls == 1
    assert proxy.accepted == 1, "the same kept connection all along"
    from outrig.ops.cleanup import cleanup
    cleanup(PROJECT, str(host), Reporter(quiet=True), playbook="marked", journal=journal)


def test_a_status_through_the_keeper_of_a_stopped_agent_takes_the_exec_path(
        warm: tuple[Path, Journal, LatencyProxy]) -> None:
    host, journal, _proxy = warm
    old = live_of_keeper()
    pid = int(old["pid"])
    os.kill(pid, signal.SIGSTOP)
    try:
        result, transport = status_once(host, journal)
        assert result["ok"] and transport.live_calls == 0 and transport.kept_channels == 1
        listed = json.loads(subprocess.run([*OUTRIG, "connections", "--json"],
                                           capture_output=True, text=True,
                                           timeout=120).stdout)["connections"][0]["live"]
        assert (listed["pid"], listed["state"]) != (pid, "ready"), listed
    finally:
        os.kill(pid, signal.SIGCONT)
    assert wait_gone(pid, WAIT_S)


def test_a_stopped_client_holds_up_no_other_request_on_the_live_agent(
        box: SandboxBox, warm: tuple[Path, Journal, LatencyProxy], tmp_path: Path,
        procs: Any) -> None:
    """A tail-logs suspended (SIGSTOP, as Ctrl-Z does) takes none of its stream: what the
    box sends for it queues for it alone, and a status served by the same live agent
    meanwhile gets its answer while the stopped client's request is still open (it was not
    dropped to free the others)."""
    from tests.support.logs import make_run

    host, journal, _proxy = warm
    logs = make_run(host, ["trainer"])
    (logs / "trainer.log").write_text("first\n")
    project = tmp_path / "project"
    (project / "hosts").mkdir(parents=True)
    (project / "hosts" / "live.yaml").write_text(host.read_text())
    tail = procs.spawn([*OUTRIG, "tail-logs", "--host", "live", "--playbook", "job",
                        "--json"], cwd=project, stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True, env=dict(os.environ))
    assert tail.stdout is not None
    assert "first" in tail.stdout.readline()
    tail.send_signal(signal.SIGSTOP)
    try:
        with open(logs / "trainer.log", "a") as log:  # random lines: no compression helps
            for _ in range(4):
                log.write("".join(f"{os.urandom(48).hex()}\n" for _ in range(20000)))
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and live_of_keeper().get("backlog", 0) < 1 << 20:
            time.sleep(0.05)
        assert live_of_keeper().get("backlog", 0) >= 1 << 20, live_of_keeper()
        result, transport = status_once(host, journal)
        assert result["ok"] and transport.live_calls == 1
        assert live_of_keeper()["requests_open"] >= 1, "the stopped client was dropped"
    finally:
        tail.send_signal(signal.SIGCONT)
        tail.send_signal(signal.SIGINT)
    tail.communicate(timeout=WAIT_S)


def test_a_killed_live_agent_does_not_end_a_follow_which_goes_on_through_a_new_one(
        warm: tuple[Path, Journal, LatencyProxy]) -> None:
    from tests.support.logs import Follow, make_run, wait_for

    host, journal, _proxy = warm
    logs = make_run(host, ["trainer"])
    (logs / "trainer.log").write_text("before\n")
    follow = Follow(host, journal, heartbeat=0.2, backoff=0.05)
    wait_for(lambda: "before" in follow.lines(), WAIT_S, "the first line")
    old = live_of_keeper()
    assert old["requests_open"] == 1, "the follow is not on the live agent"
    os.kill(int(old["pid"]), signal.SIGKILL)
    wait_live("ended")
    with open(logs / "trainer.log", "a") as log:
        log.write("after\n")
    wait_for(lambda: "after" in follow.lines() or follow.error is not None, WAIT_S,
             "the line written after the kill")
    result = follow.finish()
    assert follow.lines() == ["before", "after"], "lines lost or repeated"
    assert result.reconnects >= 1


def test_a_deploy_whose_live_agent_is_killed_says_what_keeps_running(
        warm: tuple[Path, Journal, LatencyProxy], tmp_path: Path, procs: Any) -> None:
    host, _journal, _proxy = warm
    project = tmp_path / "project"
    (project / "playbooks").mkdir(parents=True)
    (project / "hosts").mkdir()
    (project / "hosts" / "live.yaml").write_text(host.read_text())
    (project / "playbooks" / "slow.yaml").write_text(SLOW)
    deploying = procs.spawn([*OUTRIG, "deploy", "--host", "live", "--playbook", "slow",
                             "--json"], cwd=project, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    assert deploying.stdout is not None
    pid = None
    for line in deploying.stdout:
        event = json.loads(line)
        if event.get("event") == "launched":
            pid = int(event["pid"])
            break
    assert pid is not None, deploying.communicate()
    live = live_of_keeper()
    assert live["requests_open"] == 1, "the deploy is not on the live agent"
    os.kill(int(live["pid"]), signal.SIGKILL)
    _out, err = deploying.communicate(timeout=WAIT_S)
    assert deploying.returncode != 0
    assert "live agent ended" in err and "keeps running" in err, err
    assert "This is a bug" not in err, err
    try:
        assert alive(pid), "the launched process did not keep running"
    finally:
        subprocess.run([*OUTRIG, "cleanup", "--host", "live", "--playbook", "slow"],
                       cwd=project, capture_output=True, timeout=WAIT_S)
