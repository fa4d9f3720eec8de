"""The warm connection: a keeper process per host holds the SSH link, later commands open
their channels through it (connectors/keeper/client.py, connectors/keeper/daemon.py). Keeping is
off in the suite by default (conftest); every test here turns it on."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.connectors.keeper import client as kept
from outrig.connectors.keeper.client import KeptTransport, close_keepers, keepers, wait_gone
from outrig.connectors.keeper.wire import recv_frame, runtime_dir, send_json
from outrig.console import Reporter
from outrig.errors import AuthenticationError
from outrig.fanout import run_fanout
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.sandbox.proxy import Fault, LatencyProxy
from outrig.session import HostSession, Project

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)
OUTRIG = [sys.executable, "-c",
          "import sys; from outrig.cli import program; program.run(['outrig', *sys.argv[1:]])"]


def proxied(box_host: Path, make_proxy: Any, **changes: Any) -> tuple[Path, LatencyProxy]:
    """The sandbox's host file through a fresh proxy (which counts TCP connections)."""
    config = yaml.safe_load(box_host.read_text())
    proxy: LatencyProxy = make_proxy(config["port"], one_way_delay=0.005)
    config["port"] = proxy.port
    config.update(changes)
    path = box_host.with_name("proxied.yaml")
    path.write_text(yaml.safe_dump(config))
    return path, proxy


def status_once(host: Path, journal: Journal,
                notices: list[str] | None = None) -> tuple[dict[str, Any], HostSession]:
    """One command's worth: a session, one status call, closed (as the CLI does)."""
    reporter = Reporter(quiet=True)
    if notices is not None:
        reporter.info = notices.append  # type: ignore[method-assign]
    session = HostSession(PROJECT, str(host), reporter, journal,
                          host=HostBook(PROJECT.hosts_dir)(str(host)))
    try:
        result = session.call("status", stream=False)
    finally:
        session.transport.close()
    return result, session


def test_second_status_goes_through_the_keeper(box_host: Path, make_proxy: Any,
                                               tmp_path: Path, keeping: None) -> None:
    host, proxy = proxied(box_host, make_proxy)
    journal = Journal(tmp_path / "state")
    first, one = status_once(host, journal)
    second, two = status_once(host, journal)
    assert isinstance(one.transport, KeptTransport) and one.transport.keepers_started == 1
    assert isinstance(two.transport, KeptTransport) and two.transport.keepers_started == 0
    assert two.transport.kept_channels == 1 and two.transport.connection is None
    assert proxy.accepted == 1, "two commands, one TCP connection (the keeper's)"
    assert first["ok"] and second["ok"]
    listed = keepers()
    assert [e["name"] for e in listed] == ["proxied"]
    assert listed[0]["idle_left"] > 0 and listed[0]["pid"] != os.getpid()


def test_the_keepers_connect_sends_the_channel_open_behind_its_login(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None) -> None:
    """The keeper's login carries a session-channel open (its first spare channel): the
    first command's exec leaves in the flight after the login, as a direct command's does,
    and the kept connection has the same layout on the wire."""
    host, proxy = proxied(box_host, make_proxy)
    proxy.early_channel = True
    result, session = status_once(host, Journal(tmp_path / "state"))
    assert result["ok"] and isinstance(session.transport, KeptTransport)
    assert session.transport.keepers_started == 1 and proxy.accepted == 1
    tracker = proxy.tracker(1)
    assert tracker.pipelined_login is True
    assert "channel" not in tracker.turn_of
    assert tracker.flight_turns[1] == tracker.flight_turns[0] + 1  # exec: the next turn
    assert tracker.turn_of["exec"] == tracker.turn_of["auth"] + 1


def test_the_first_contact_starts_a_keeper_without_calling_anything_stale(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None) -> None:
    """No socket at all is no keeper yet, not a stale one: the first command to a host said
    `stale warm connection (no keeper at ...sock); starting a fresh one` every time."""
    host, proxy = proxied(box_host, make_proxy)
    notices: list[str] = []
    result, session = status_once(host, Journal(tmp_path / "state"), notices)
    assert result["ok"]
    assert isinstance(session.transport, KeptTransport)
    assert session.transport.keepers_started == 1 and session.transport.kept_channels == 1
    assert not any("stale" in n or "no keeper" in n for n in notices), notices
    assert proxy.accepted == 1


def only_keeper() -> dict[str, Any]:
    """The one live keeper (its record and what it says about itself)."""
    listed = keepers()
    assert len(listed) == 1, listed
    return listed[0]


def test_killed_keeper_is_detected_and_the_command_starts_a_fresh_one(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None) -> None:
    host, proxy = proxied(box_host, make_proxy)
    journal = Journal(tmp_path / "state")
    status_once(host, journal)
    old = only_keeper()
    os.kill(int(old["pid"]), signal.SIGKILL)
    assert wait_gone(int(old["pid"]), 10.0)
    assert Path(old["socket"]).exists(), "a killed keeper leaves its socket behind"
    notices: list[str] = []
    result, session = status_once(host, journal, notices)
    assert result["ok"]
    assert isinstance(session.transport, KeptTransport)
    assert session.transport.keepers_started == 1 and session.transport.kept_channels == 1
    assert any("stale" in n for n in notices), notices
    assert only_keeper()["pid"] != old["pid"]
    assert proxy.accepted == 2


def test_link_dropped_under_the_keeper_next_command_works(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None) -> None:
    host, proxy = proxied(box_host, make_proxy)
    journal = Journal(tmp_path / "state")
    status_once(host, journal)
    old = only_keeper()
    assert proxy.cut_all() == 1
    result, session = status_once(host, journal)
    assert result["ok"]
    assert isinstance(session.transport, KeptTransport)
    assert session.transport.kept_channels == 1
    assert kept.wait_closed(old, 10.0), "a keeper whose link died exits"
    assert proxy.accepted == 2


def test_two_commands_at_the_same_time_share_the_keeper(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None) -> None:
    host, proxy = proxied(box_host, make_proxy)
    journal = Journal(tmp_path / "state")
    status_once(host, journal)
    results: list[tuple[dict[str, Any], HostSession]] = []
    errors: list[BaseException] = []
    both_in = threading.Barrier(2)

    def one() -> None:
        try:
            both_in.wait(30)
            results.append(status_once(host, journal))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert [r["ok"] for r, _ in results] == [True, True]
    assert all(isinstance(s.transport, KeptTransport) and s.transport.kept_channels == 1
               and s.transport.keepers_started == 0 for _, s in results)
    assert proxy.accepted == 1


def test_keeper_exits_after_its_idle_time(box_host: Path, make_proxy: Any, tmp_path: Path,
                                          keeping: None,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTRIG_KEEP_SECONDS", "1")
    host, _proxy = proxied(box_host, make_proxy)
    status_once(host, Journal(tmp_path / "state"))
    entry = only_keeper()
    assert entry["keep_seconds"] == 1
    assert wait_gone(int(entry["pid"]), 60.0)
    assert not Path(entry["socket"]).exists()
    assert keepers() == []


def test_host_file_keep_seconds_zero_connects_directly(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUTRIG_KEEP_SECONDS")
    host, proxy = proxied(box_host, make_proxy, keep_seconds=0)
    journal = Journal(tmp_path / "state")
    _, one = status_once(host, journal)
    _, two = status_once(host, journal)
    assert not isinstance(one.transport, KeptTransport)
    assert not isinstance(two.transport, KeptTransport)
    assert proxy.accepted == 2 and keepers() == []


def test_cli_commands_share_a_forked_keeper_and_connections_close_stops_it(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None) -> None:
    """The CLI (one thread) forks its keeper; the next CLI command goes through it."""
    host, proxy = proxied(box_host, make_proxy)

    def outrig(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*OUTRIG, *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)

    for _ in range(2):
        done = outrig("status", "--host", str(host), "--json")
        assert done.returncode == 0, done.stderr
    assert proxy.accepted == 1, "two CLI commands, one TCP connection"
    entry = only_keeper()

    listed = outrig("connections", "--json")
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert [(c["name"], c["pid"]) for c in doc["connections"]] == [("proxied",
                                                                     entry["pid"])]
    other = outrig("connections", "--close", "--host", "elsewhere")
    assert other.returncode == 0 and "no warm connection" in other.stdout
    assert keepers() != []
    closed = outrig("connections", "--close", "--host", "proxied")
    assert closed.returncode == 0, closed.stderr
    assert f"pid {entry['pid']}" in closed.stdout
    assert wait_gone(int(entry["pid"]), 10.0)
    assert keepers() == [] and not Path(entry["socket"]).exists()


def test_no_keep_flag_neither_uses_nor_leaves_a_keeper(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None) -> None:
    host, proxy = proxied(box_host, make_proxy)
    done = subprocess.run([*OUTRIG, "status", "--host", str(host),
                           "--no-keep", "--json"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert keepers() == [] and proxy.accepted == 1


@pytest.mark.parametrize("keep", [0, 30])
def test_keep_seconds_in_outrig_yaml_reaches_the_cli_commands_connector(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None,
        monkeypatch: pytest.MonkeyPatch, keep: int) -> None:
    """The project's ``keep_seconds:`` travels with the command to its connector: 0 connects
    directly and leaves no keeper; 30 leaves a keeper with that idle time."""
    monkeypatch.delenv("OUTRIG_KEEP_SECONDS")
    host, proxy = proxied(box_host, make_proxy)
    project = tmp_path / "project"
    (project / "hosts").mkdir(parents=True)
    (project / "outrig.yaml").write_text(yaml.safe_dump({"keep_seconds": keep}))
    done = subprocess.run([*OUTRIG, "status", "--host", str(host), "--project", str(project),
                           "--json"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert proxy.accepted == 1
    if keep == 0:
        assert keepers() == []
    else:
        assert only_keeper()["keep_seconds"] == keep


def test_socket_open_to_others_is_refused(box_host: Path, make_proxy: Any, tmp_path: Path,
                                          keeping: None) -> None:
    host, proxy = proxied(box_host, make_proxy)
    journal = Journal(tmp_path / "state")
    status_once(host, journal)
    entry = only_keeper()
    os.chmod(entry["socket"], 0o666)
    notices: list[str] = []
    result, session = status_once(host, journal, notices)
    assert result["ok"]
    assert isinstance(session.transport, KeptTransport)
    assert session.transport.kept_channels == 0 and session.transport.direct
    assert any("refused" in n for n in notices), notices
    assert proxy.accepted == 2


def test_runtime_folder_open_to_others_is_refused(box_host: Path, make_proxy: Any,
                                                  tmp_path: Path, keeping: None) -> None:
    host, proxy = proxied(box_host, make_proxy)
    folder = runtime_dir()
    folder.mkdir(parents=True)
    os.chmod(folder, 0o755)
    notices: list[str] = []
    try:
        result, session = status_once(host, Journal(tmp_path / "state"), notices)
        assert list(folder.iterdir()) == []
    finally:
        os.chmod(folder, 0o700)
    assert result["ok"]
    assert isinstance(session.transport, KeptTransport) and session.transport.direct
    assert any("not a private folder" in n for n in notices), notices
    assert proxy.accepted == 1


OTHER_PYTHON = "/usr/bin/python3"  # an interpreter another user can run


@pytest.mark.skipif(os.getuid() != 0 or not os.access(OTHER_PYTHON, os.X_OK),
                    reason="needs root (to act as another user) and /usr/bin/python3")
def test_keeper_answers_no_other_user(box_host: Path, make_proxy: Any, tmp_path: Path,
                                      keeping: None) -> None:
    host, _proxy = proxied(box_host, make_proxy)
    status_once(host, Journal(tmp_path / "state"))
    entry = only_keeper()
    # Open the way to the socket for the test only, so that the keeper's own uid check is
    # what refuses: another user gets no answer at all.
    folder = Path(entry["socket"]).parent
    opened = [folder, folder.parent]
    for path in opened:
        os.chmod(path, 0o711)
    os.chmod(entry["socket"], 0o666)
    # The keeper may close before the request is even sent (a broken pipe) or after (EOF,
    # or a reset): either way the other user gets no byte back.
    probe = ("import json,socket,struct,sys\n"
             "s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(30)\n"
             "body=json.dumps({'op':'info'}).encode()\n"
             "try:\n"
             "    s.sendall(struct.pack('>cI',b'h',len(body))+body)\n"
             "    print(repr(s.recv(100)))\n"
             "except (ConnectionResetError, BrokenPipeError):\n    print(repr(b''))\n")
    try:
        done = subprocess.run([OTHER_PYTHON, "-c", probe, entry["socket"]], user=65534,
                              capture_output=True, text=True, timeout=60, cwd="/")
    finally:
        for path in opened:
            os.chmod(path, 0o700)
        os.chmod(entry["socket"], 0o600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "b''", "the keeper must close on another user unanswered"


def test_keeper_refuses_a_request_for_another_identity(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None) -> None:
    host, _proxy = proxied(box_host, make_proxy)
    status_once(host, Journal(tmp_path / "state"))
    entry = only_keeper()
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(entry["socket"])
    sock.settimeout(30)
    send_json(sock, b"h", {"op": "exec", "argv": ["true"],
                           "identity": {"hostname": "elsewhere"}})
    frame = recv_frame(sock)
    sock.close()
    assert frame is not None and frame[0] == b"f"
    assert json.loads(frame[1])["kind"] == "stale"


def test_changed_host_key_in_known_hosts_gets_a_fresh_connection(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None) -> None:
    host, proxy = proxied(box_host, make_proxy)
    journal = Journal(tmp_path / "state")
    status_once(host, journal)
    old = only_keeper()
    (tmp_path / "known_hosts").write_text("")  # as after `ssh-keygen -R` for a rebuilt box
    notices: list[str] = []
    result, session = status_once(host, journal, notices)
    assert result["ok"]
    assert isinstance(session.transport, KeptTransport)
    assert session.transport.keepers_started == 1
    assert any("host key" in n for n in notices), notices
    assert kept.wait_closed(old, 10.0)
    assert proxy.accepted == 2


def test_first_command_with_keeping_fails_as_a_direct_one_refused_key(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None) -> None:
    """The keeper's connect failure is the command's: same type and message, never a second
    try by a direct connection."""
    wrong_key = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)],
                   check=True)
    host, proxy = proxied(box_host, make_proxy, identity_file=str(wrong_key))
    with pytest.raises(AuthenticationError, match="authentication failed .* tried .*wrong_key"):
        status_once(host, Journal(tmp_path / "state"))
    assert proxy.accepted == 1
    assert keepers() == []


def test_first_command_with_keeping_retries_cuts_and_tells_as_it_goes(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None) -> None:
    host, proxy = proxied(box_host, make_proxy)
    proxy.inject(Fault(phase="auth"), Fault(phase="auth"))
    notices: list[str] = []
    result, session = status_once(host, Journal(tmp_path / "state"), notices)
    assert result["ok"]
    assert isinstance(session.transport, KeptTransport)
    assert session.transport.keepers_started == 1
    assert proxy.fired == [(1, "auth", "cut"), (2, "auth", "cut")]
    assert proxy.accepted == 3
    assert sum("retrying" in n for n in notices) == 2, notices


def test_connections_forgets_a_dead_keeper_and_signals_no_other_pid(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None) -> None:
    host, _proxy = proxied(box_host, make_proxy)
    status_once(host, Journal(tmp_path / "state"))
    entry = only_keeper()
    record = Path(entry["socket"]).with_suffix(".json")
    doc = json.loads(record.read_text())
    record.write_text(json.dumps({**doc, "pid": os.getpid()}))  # a record naming us
    assert keepers() == [] and close_keepers() == [], "never signal a pid the socket denies"
    record.write_text(json.dumps(doc))
    os.kill(int(entry["pid"]), signal.SIGKILL)
    assert wait_gone(int(entry["pid"]), 10.0)
    assert keepers() == []
    assert not record.exists() and not Path(entry["socket"]).exists()


def counting_keeper_processes(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Record every keeper process the connector starts (argv), and give this test a
    launcher of its own (one left by an earlier test would hide a start)."""
    started: list[list[str]] = []
    real_popen = kept.subprocess.Popen

    def popen(argv: list[str], *args: Any, **kwargs: Any) -> Any:
        if {"outrig.connectors.keeper.daemon", "outrig.connectors.keeper.launch"} & set(argv):
            started.append(list(argv))
        return real_popen(argv, *args, **kwargs)

    monkeypatch.setattr(kept.subprocess, "Popen", popen)
    monkeypatch.setattr(kept, "LAUNCHER", kept.KeeperLauncher())
    return started


def fanout_hosts(box_host: Path, make_proxy: Any, tmp_path: Path, count: int) -> tuple[
        Project, list[str], list[LatencyProxy]]:
    """``count`` hosts in a project of their own: the sandbox, each through its own proxy
    (so each is its own identity, with a keeper of its own)."""
    config = yaml.safe_load(box_host.read_text())
    proxies = []
    for i in range(count):
        proxy: LatencyProxy = make_proxy(config["port"], one_way_delay=0.005)
        proxies.append(proxy)
        hosts = tmp_path / "fan" / "hosts"
        hosts.mkdir(parents=True, exist_ok=True)
        (hosts / f"h{i}.yaml").write_text(yaml.safe_dump({**config, "port": proxy.port}))
    return Project(tmp_path / "fan"), [f"h{i}" for i in range(count)], proxies


def test_fanout_starts_every_keeper_from_one_launcher(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A command with threads cannot fork its keepers: one launcher process forks them all
    (one interpreter start for the command, not one per host), and each is a working
    keeper that the next command uses."""
    started = counting_keeper_processes(monkeypatch)
    project, names, proxies = fanout_hosts(box_host, make_proxy, tmp_path, 3)
    journal = Journal(tmp_path / "state")
    outcomes = run_fanout(project, names, lambda s: s.call("status", stream=False),
                          journal=journal)
    assert [(o.host, o.state) for o in outcomes] == [(n, "ok") for n in names], outcomes
    assert len(started) == 1 and "outrig.connectors.keeper.launch" in started[0], started
    assert kept.LAUNCHER.started == 1
    listed = keepers()
    assert sorted(e["name"] for e in listed) == names
    assert len({e["pid"] for e in listed}) == 1, "one process holds the three hosts' links"
    assert listed[0]["pid"] != os.getpid()
    again = run_fanout(project, names, lambda s: s.call("status", stream=False),
                       journal=journal)
    assert all(o.ok for o in again), again
    assert [p.accepted for p in proxies] == [1, 1, 1], "the second round used the keepers"
    assert len(started) == 1
    launcher = kept.LAUNCHER._proc
    assert launcher is not None
    kept.LAUNCHER.close()
    assert launcher.returncode == 0, "the launcher leaves at the end of its socket"
    assert sorted(e["name"] for e in keepers()) == names, "its keepers stay"


def test_launcher_gone_idle_is_replaced_by_a_fresh_one(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    started = counting_keeper_processes(monkeypatch)
    monkeypatch.setattr(kept.LAUNCHER, "IDLE_S", 0.5)
    project, names, _ = fanout_hosts(box_host, make_proxy, tmp_path, 2)
    journal = Journal(tmp_path / "state")
    first = run_fanout(project, names[:1], lambda s: s.call("status", stream=False),
                       journal=journal)
    assert first[0].ok, first
    launcher = kept.LAUNCHER._proc
    assert launcher is not None
    assert launcher.wait(30) == 0  # left on its own after its idle time
    second = run_fanout(project, names[1:], lambda s: s.call("status", stream=False),
                        journal=journal)
    assert second[0].ok, second
    assert kept.LAUNCHER.started == 2 and len(started) == 2
    assert sorted(e["name"] for e in keepers()) == names
    kept.LAUNCHER.close()


def test_one_host_of_a_shared_keeper_process_closes_alone_and_a_dead_link_ends_only_its_own(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fan-out's keepers share one hosting process: closing one host's (``connections
    --close --host``) or losing one host's link ends that keeper only; the others keep their
    links and serve the next command. Closing the rest ends the process."""
    counting_keeper_processes(monkeypatch)
    project, names, proxies = fanout_hosts(box_host, make_proxy, tmp_path, 3)
    journal = Journal(tmp_path / "state")
    first = run_fanout(project, names, lambda s: s.call("status", stream=False),
                       journal=journal)
    assert all(o.ok for o in first), first
    kept.LAUNCHER.close()
    listed = {e["name"]: e for e in keepers()}
    assert len({e["pid"] for e in listed.values()}) == 1
    pid = int(listed["h0"]["pid"])
    closed = close_keepers("h0")
    assert [e["name"] for e in closed] == ["h0"]
    assert kept.wait_closed(closed[0], 30.0)
    assert proxies[1].cut_all() == 1  # h1's link dies under its keeper
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "h1" in {e["name"] for e in keepers()}:
        time.sleep(0.05)
    assert sorted(e["name"] for e in keepers()) == ["h2"]
    assert int(keepers()[0]["pid"]) == pid, "the process lives on for h2"
    again = run_fanout(project, ["h2"], lambda s: s.call("status", stream=False),
                       journal=journal)
    assert again[0].ok and proxies[2].accepted == 1, "h2's keeper still served it"
    assert [e["name"] for e in close_keepers()] == ["h2"]
    assert wait_gone(pid, 30.0), "the hosting process outlived its last keeper"
