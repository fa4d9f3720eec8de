"""The warm connection: a keeper process per host holds the SSH link, later commands open
their channels through it (connectors/kept.py, connectors/keeper.py). Keeping is off in the
suite by default (conftest); every test here turns it on."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.connectors import kept
from outrig.connectors.kept import KeptTransport, close_keepers, keepers, wait_gone
from outrig.console import Reporter
from outrig.journal import Journal
from outrig.ops.base import HostSession, Project
from outrig.sandbox.proxy import LatencyProxy

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)


@pytest.fixture
def keeping(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keeping on for this test; every keeper it started is closed at teardown."""
    monkeypatch.setenv("OUTRIG_KEEP_SECONDS", "600")
    yield
    for entry in close_keepers():
        wait_gone(int(entry["pid"]), 10.0)


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
    session = HostSession(PROJECT, str(host), reporter, journal)
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
