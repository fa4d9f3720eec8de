"""Op cores on a session whose connector replays what a real agent printed.

Each test first records a real agent call (the local agent, on this machine) through
:class:`~tests.support.replay.RecordingConnector`, then runs the op again through its
host-string entry point on a host file with ``hostname: replay:FILE``: the registry picks the
replay connector (tests/support/replay.py, registered by one line in conftest.py), and the
op must show and return exactly what it did live, with no box and no link."""

from __future__ import annotations

import io
import os
import socket
import sys
from pathlib import Path

import pytest
import yaml

from outrig.console import Reporter
from outrig.errors import RemoteError
from outrig.inventory import HostBook, resolve_host
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup, cleanup_on
from outrig.ops.deploy import deploy, deploy_on
from outrig.ops.status import status, status_on
from outrig.playbook import find_playbook, load_job
from outrig.session import HostSession, Project
from outrig.transport import connector_for, transport_for
from tests.support.replay import Recording, RecordingConnector, save
from tests.support.replay_cases import host_file

SLEEPER = "import time; print('up', flush=True); time.sleep(600)"


def playbook(tmp_path: Path, ready: dict[str, object]) -> Path:
    path = tmp_path / "playbooks" / "cores.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"name": "cores", "processes": {"a": {
        "command": [sys.executable, "-c", SLEEPER], "ready": ready, "stop": {"grace": 2}}}}))
    return path


def recording(project: Project, host: Path, reporter: Reporter,
              journal: Journal) -> tuple[HostSession, RecordingConnector]:
    """A session on the local agent whose every call is recorded."""
    box = resolve_host(str(host), hosts_dir=project.hosts_dir)
    recorder = RecordingConnector(transport_for(box))
    return HostSession(project, str(host), reporter, journal, transport=recorder,
                       host=HostBook(project.hosts_dir)(str(host))), recorder


def replay_host(tmp_path: Path, calls: list[Recording]) -> Path:
    saved = save(tmp_path / "recording.json", calls)
    host = host_file(tmp_path, "replayed", f"replay:{saved}")
    assert connector_for(resolve_host(str(host), hosts_dir=tmp_path)).name == "replay"
    return host


def test_status_shows_a_recorded_status_result_as_it_did_live(tmp_path: Path) -> None:
    project, journal = Project(tmp_path), Journal(tmp_path / "state")
    local = host_file(tmp_path, "here", "local")
    book = playbook(tmp_path, {"log": "^up$", "timeout": 20})
    run = deploy(project, str(local), str(book), Reporter(quiet=True), journal=journal)
    live_out = io.StringIO()
    session, recorder = recording(project, local, Reporter(out=live_out), journal)
    try:
        live = status_on(session, playbook="cores")
    finally:
        session.close()
        cleanup(project, str(local), Reporter(quiet=True), playbook="cores", journal=journal)
    assert [r["run_id"] for r in live["runs"]] == [run.plan.run_id]
    assert len(recorder.calls) == 1

    replay_out = io.StringIO()
    replayed = status(project, str(replay_host(tmp_path, recorder.calls)),
                      Reporter(out=replay_out), playbook="cores",
                      journal=Journal(tmp_path / "other-state"))
    assert replayed == live
    assert replay_out.getvalue() == live_out.getvalue()
    assert run.plan.run_id in replay_out.getvalue()
    assert live["runs"][0]["processes"][0]["state"] == "running"


def test_cleanup_reports_a_refused_kill_from_a_recording(tmp_path: Path) -> None:
    """--force-foreign naming the agent's own parent (this test process) is refused by the
    box; the recorded refusal is reported the same way when replayed."""
    project, journal = Project(tmp_path), Journal(tmp_path / "state")
    local = host_file(tmp_path, "here", "local")
    session, recorder = recording(project, local, Reporter(quiet=True), journal)
    try:
        live = cleanup_on(session, force_foreign=[os.getpid()])
    finally:
        session.close()
    assert [f["how"] for f in live["forced"]] == ["refused"]

    out = io.StringIO()
    replayed = cleanup(project, str(replay_host(tmp_path, recorder.calls)), Reporter(out=out),
                       force_foreign=[os.getpid()], journal=Journal(tmp_path / "other"))
    assert replayed["forced"] == live["forced"]
    shown = out.getvalue()
    assert f"force-foreign pid {os.getpid()}" in shown and "refused" in shown


def test_deploy_records_a_recorded_placement_refusal_as_failed(tmp_path: Path) -> None:
    """A port the process is to serve on is taken: the box refuses the placement
    (``port_busy``) before starting anything; replayed, deploy raises the same error and the
    journal records the run as failed."""
    project, journal = Project(tmp_path), Journal(tmp_path / "state")
    local = host_file(tmp_path, "here", "local")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        book = playbook(tmp_path, {"port": port, "timeout": 20})
        job = load_job(find_playbook(str(book), project.playbooks_dir))
        session, recorder = recording(project, local, Reporter(quiet=True), journal)
        try:
            with pytest.raises(RemoteError) as live:
                deploy_on(session, job)
        finally:
            session.close()
    assert live.value.kind == "port_busy"
    assert live.value.exit_code == 2  # refused before anything started: bad input
    assert [e.get("event") for e in recorder.calls[0].events()][-1] == "result"

    other = Journal(tmp_path / "other")
    with pytest.raises(RemoteError) as replayed:
        deploy(project, str(replay_host(tmp_path, recorder.calls)), str(book),
               Reporter(quiet=True), journal=other)
    assert replayed.value.kind == "port_busy"
    assert str(replayed.value).split(": ", 1)[1] == str(live.value).split(": ", 1)[1]
    assert [r["status"] for r in other.runs()] == ["failed"]
