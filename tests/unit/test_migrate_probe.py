"""migrate's probe of OLD: ``attempts=0`` (the watch has just confirmed the death) tries
nothing, not even the connector's look from outside (for SSH a TCP connect)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.ops import migrate as migrate_module
from outrig.session import Project


def test_zero_attempts_probe_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    connects: list[object] = []

    def no_connect(*args: object, **kwargs: object) -> socket.socket:
        connects.append(args)
        raise AssertionError("no connection may be tried")

    monkeypatch.setattr(socket, "create_connection", no_connect)
    monkeypatch.setattr(migrate_module.HostSession, "call", no_connect)
    session, tried = migrate_module.probe(Project(tmp_path), "root@127.0.0.1:9",
                                          Reporter(quiet=True), Journal(tmp_path / "j"),
                                          attempts=0)
    assert session is None
    assert tried == ["not probed: the death was confirmed before the move"]
    assert connects == []
