"""A box's liveness is the connector's to tell (``Transport.probe``, ``Transport.confirm_alive``):
``watch`` and ``migrate`` ask it and never look at the kind of host, so a new connector gets
them by answering the two, and one that cannot answer is refused rather than guessed at."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from outrig import transport as transport_module
from outrig.connectors.local import LocalTransport
from outrig.connectors.ssh.transport import SSHTransport
from outrig.console import Reporter
from outrig.errors import ConfigError, ConnectRefused
from outrig.inventory import Host
from outrig.journal import Journal
from outrig.ops import migrate as migrate_module
from outrig.ops.watch import Watcher
from outrig.ops.watch_record import WatchOptions, WatchRecord
from outrig.session import Project
from outrig.transport import AgentChannel, Registration, Transport
from outrig.watching.health import Limits, Observation
from outrig.watching.notify import Notifier
from tests.support.replay import ReplayConnector


class DoorConnector(Transport):
    """A connector whose box never lets anyone in, but whose door says something: the
    observations and the confirmation it was asked for are recorded."""

    name = "door"

    def __init__(self, host: Host, **_: Any) -> None:
        self.host = host
        self.asked: list[tuple[str, float]] = []

    def start(self, argv: list[str], *, window_size: int | None = None) -> AgentChannel:
        raise ConnectRefused(f"{self.host.name}: nobody home")

    def probe(self, timeout: float) -> list[Observation]:
        self.asked.append(("probe", timeout))
        return [Observation(1.0, "tcp", False, "the door's own words"),
                Observation(1.0, "banner", False, "no banner")]

    def confirm_alive(self, timeout: float) -> Observation:
        self.asked.append(("confirm", timeout))
        return Observation(2.0, "confirm", False, "still nobody")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_connector_that_cannot_look_from_outside_is_refused_not_guessed() -> None:
    replay = ReplayConnector(Host(name="rec", hostname="replay:none", workdir="/w"), calls=[])
    with pytest.raises(ConfigError, match="replay connector cannot look at a box"):
        replay.probe(1.0)
    with pytest.raises(ConfigError, match="replay connector cannot confirm"):
        replay.confirm_alive(1.0)


def test_the_local_connector_is_up_by_construction() -> None:
    local = LocalTransport(Host(name="local", hostname="localhost", workdir="/w",
                                is_local=True))
    seen = local.probe(1.0)
    assert [(o.signal, o.ok) for o in seen] == [("tcp", True), ("banner", True)]
    confirm = local.confirm_alive(1.0)
    assert (confirm.signal, confirm.ok) == ("confirm", True)


def test_ssh_looks_at_the_port_and_confirms_without_a_login_when_it_is_shut(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_login(self: SSHTransport) -> None:
        raise AssertionError("a shut port needs no login to be called shut")

    monkeypatch.setattr(SSHTransport, "connect", no_login)
    ssh = SSHTransport(Host(name="shut", hostname="127.0.0.1", port=closed_port(),
                            workdir="/w"))
    assert [(o.signal, o.ok) for o in ssh.probe(1.0)] == [("tcp", False), ("banner", False)]
    confirm = ssh.confirm_alive(1.0)
    assert (confirm.signal, confirm.ok) == ("confirm", False)
    assert confirm.detail.startswith("TCP: ")


def test_watch_takes_its_look_from_the_sessions_connector(tmp_path: Path) -> None:
    host = Host(name="door", hostname="door:box", workdir="/w")
    door = DoorConnector(host)
    watcher = Watcher(Project(tmp_path), Reporter(quiet=True), Journal(tmp_path / "j"),
                      Notifier(), WatchRecord(tmp_path / "w.json", {}), WatchOptions())
    session: Any = SimpleNamespace(host=host, transport=door)
    seen = watcher.probe(session, Limits(threshold=60.0, suspect_after=15.0, period=3.0))
    assert [o.detail for o in seen] == ["the door's own words", "no banner"]
    assert door.asked == [("probe", 3.0)]


def test_migrates_last_probe_reports_what_the_connector_saw(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hosts").mkdir()
    (tmp_path / "hosts" / "old.yaml").write_text("hostname: door:old\nworkdir: /w\n")
    made: list[DoorConnector] = []

    def door_factory(host: Host, **kwargs: Any) -> DoorConnector:
        made.append(DoorConnector(host))
        return made[-1]

    monkeypatch.setattr(transport_module, "CONNECTORS", [
        Registration("door", "unused:Door", lambda h: h.hostname.startswith("door:"))])
    monkeypatch.setattr(Registration, "load", lambda self: door_factory)
    session, tried = migrate_module.probe(Project(tmp_path), "old", Reporter(quiet=True),
                                          Journal(tmp_path / "j"), attempts=1, pause=0.0)
    assert session is None
    assert len(tried) == 2 and tried[0].startswith("ssh attempt 1: ")
    assert tried[-1] == "tcp door:old:22: the door's own words"
    assert [what for what, _ in made[-1].asked] == ["probe"]


def test_a_failed_mirror_is_said_once_per_checkpoint_and_tried_at_each_heartbeat(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found on a dry run of the real-GPU watch bench: a playbook whose trainer declares
    ``checkpoints:`` but has no stage item to mirror them said "mirroring the newest
    checkpoint failed ...; trying again after the next one" at every heartbeat (once a
    second). The mirror is still tried at each heartbeat (a blip must not cost a checkpoint),
    and the failure is said once per checkpoint."""
    from outrig.ops import stage as stage_module

    tries: list[str] = []

    def failing(session: Any, **kw: Any) -> dict[str, Any]:
        tries.append(str(kw.get("run_id")))
        raise ConfigError("playbook p has no checkpoints item (stage: ...). Fix it")

    monkeypatch.setattr(stage_module, "sync_checkpoints_on", failing)
    record = WatchRecord(tmp_path / "w.json", {"run_id": "r1", "playbook": "p", "host": "h",
                                               "mirror_tried": None, "mirrored": None})
    warned: list[str] = []
    reporter = Reporter(quiet=True)
    reporter.warn = warned.append  # type: ignore[method-assign]
    watcher = Watcher(Project(tmp_path), reporter, Journal(tmp_path / "j"), Notifier(),
                      record, WatchOptions())
    watcher.hangs = SimpleNamespace(request=None)  # type: ignore[assignment]
    watcher.on_status = lambda at, result: []  # type: ignore[method-assign]

    def answer(newest: str) -> dict[str, Any]:
        return {"runs": [{"run_id": "r1", "processes": [
            {"name": "trainer", "state": "running", "checkpoint": {"name": newest}}]}]}

    for newest in ("0", "0", "0", "1", "1"):
        session: Any = SimpleNamespace(call=lambda *a, n=newest, **k: answer(n))
        watcher.heartbeat(session, watcher.results)
        watcher.drain(session)
    assert tries == ["r1"] * 5, "tried at each heartbeat until it works"
    assert [w.split(" failed")[0] for w in warned] == ["mirroring checkpoint 0",
                                                      "mirroring checkpoint 1"]
    assert record["mirror_tried"] is None
