"""Fencing on two sandbox boxes: A (its own sshd) runs the job, loses its sshd while its
processes keep training, and is migrated to B from the workstation's mirror. Then A comes
back: the first command to it warns, ``status`` shows the run as moved, ``sync-checkpoints``
from A keeps the mirror on B's line, and ``fence_on`` / ``cleanup --host A`` stop exactly the
old run (a foreign process on A and B's run live on) and send the ``fenced`` event.

Also the mirror's own ordering on one box: a whole epoch replaces the mirror's mid-epoch save
of the same epoch, and an older save never replaces a newer one."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig._box.agent.transfer import staged_record
from outrig.console import Reporter
from outrig.errors import ConfigError
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.moves import moved_runs
from outrig.ops.cleanup import cleanup, fence_on
from outrig.ops.deploy import deploy
from outrig.ops.migrate import migrate
from outrig.ops.stage import mirror_root, sync_checkpoints
from outrig.ops.status import status
from outrig.sandbox.box import SandboxBox
from outrig.session import HostSession, Project
from outrig.watching.notify import Notifier
from tests.support.network import free_port
from tests.support.processes import ProcessTracker, alive, marked
from tests.support.runs import kill_run, wait_checkpoints, write_playbooks

pytestmark = pytest.mark.integration


@dataclass
class Moved:
    """A job moved from A (still training, sshd back) to B, and a foreign process on A."""

    project: Project
    journal: Journal
    a: Path
    b: Path
    old_run: str
    new_run: str
    resumed: int
    foreign: int


def mirror_state(family: str) -> dict[str, Any]:
    """Every mirror folder with its stage mark's source and its training state."""
    mirror = mirror_root(family)
    return {p.name: ((staged_record(str(p)) or {}).get("source"),
                     (p / "training_state.json").read_text())
            for p in sorted(mirror.glob("*")) if p.name.isdigit()}


def wait_epoch_past(save: Path, epoch: int, timeout: float = 60) -> None:
    """Until the trainer writing ``save`` has a complete checkpoint past ``epoch``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.name.isdigit() and int(p.name) > epoch and (p / "training_state.json").is_file()
               for p in save.glob("*")):
            return
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint past {epoch} in {save}")


def start_on_a(box_a: SandboxBox, tmp_path: Path,
               monkeypatch: pytest.MonkeyPatch) -> tuple[Project, Journal, Path, str]:
    """The job (family "mig") running on A until its trainer wrote two checkpoints. B's
    member serves on another port than A's, so both boxes' runs can live at once."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    project = write_playbooks(tmp_path / "proj", free_port())
    member = project.playbooks_dir / "mig-8gpu.yaml"
    book = yaml.safe_load(member.read_text())
    book["params"]["port"] = free_port()
    member.write_text(yaml.safe_dump(book, sort_keys=False))
    journal = Journal()
    a = box_a.write_host_file(tmp_path / "hosts" / "a.yaml", workdir=box_a.workdir)
    first = deploy(project, str(a), "mig-4gpu", Reporter(quiet=True), journal=journal)
    wait_checkpoints(box_a.workdir / "ckpt", 2)
    return project, journal, a, first.plan.run_id


@pytest.fixture
def moved(box_a: SandboxBox, host_b: Path, tmp_path: Path, procs: ProcessTracker,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Moved]:
    """The job ran on A and was mirrored; A's sshd stopped (its processes keep training) and
    migrate moved the job to B from the mirror; then A's sshd came back."""
    quiet = Reporter(quiet=True)
    project, journal, a, old_run = start_on_a(box_a, tmp_path, monkeypatch)
    new_run = None
    try:
        assert sync_checkpoints(project, str(a), quiet, journal=journal)["pulled"]
        foreign = procs.spawn([sys.executable, "-c", "import time; time.sleep(600)"]).pid
        box_a.stop()  # A's link is gone; its trainer is not
        assert marked(old_run), "A's run keeps running without its sshd"
        report = migrate(project, str(a), str(host_b), quiet, journal=journal,
                         probe_attempts=1, probe_pause=0.0)
        assert report["old_alive"] is False and report["checkpoint"]["route"] == "mirror"
        new_run = str(report["run_id"])
        box_a.start()
        yield Moved(project, journal, a, host_b, old_run, new_run,
                    int(report["checkpoint"]["epoch"]), foreign)
    finally:
        if new_run is not None:
            cleanup(project, str(host_b), quiet, all_runs=True, journal=journal)
        kill_run(box_a.workdir, old_run)


def b_name(m: Moved) -> str:
    return m.b.stem


def test_the_old_box_coming_back_is_warned_shown_moved_kept_out_of_the_mirror_and_fenced(
        moved: Moved, box_a: SandboxBox, tmp_path: Path) -> None:
    m = moved
    record = m.journal.run(m.old_run)
    assert record is not None and record["moved_to"]["run_id"] == m.new_run
    assert not record.get("fenced")

    # the first command to A says so first
    said = io.StringIO()
    shown = status(m.project, str(m.a), Reporter(err=said, json_mode=True), journal=m.journal)
    warning = (f"run {m.old_run} of mig-4gpu on {m.a} was moved to {b_name(m)} at ")
    assert said.getvalue().count(warning) == 1
    assert f"`outrig cleanup --host {m.a}` stops it" in said.getvalue()
    run = next(r for r in shown["runs"] if r["run_id"] == m.old_run)
    assert run["status"] == "moved" and run["box_status"] == "running"
    assert run["moved_to"]["host"] == b_name(m) and run["fenced"] is None
    record = m.journal.run(m.old_run)
    assert record is not None and record["status"] == "running", "status follows the box"
    assert record["moved_to"]["run_id"] == m.new_run, "and the move is still known"

    # the mirror follows B: B's checkpoints go in, A's later ones (a second trainer) do not
    b_workdir = Path(yaml.safe_load(m.b.read_text())["workdir"])
    wait_epoch_past(b_workdir / "ckpt", m.resumed)
    quiet = Reporter(quiet=True)
    from_b = sync_checkpoints(m.project, str(m.b), quiet, journal=m.journal)
    assert from_b["pulled"] and min(p["epoch"] for p in from_b["pulled"]) > m.resumed
    wait_epoch_past(box_a.workdir / "ckpt", max(p["epoch"] for p in from_b["pulled"]))
    before = mirror_state("mig")
    said = io.StringIO()
    from_a = sync_checkpoints(m.project, str(m.a), Reporter(err=said), journal=m.journal)
    assert from_a["pulled"] == [] and mirror_state("mig") == before
    refused = {r["epoch"] for r in from_a["refused"]}
    held_from_b = {p["epoch"] for p in from_b["pulled"]}
    assert held_from_b & refused, "A's saves of the epochs the mirror holds from B"
    assert all(e > m.resumed for e in refused)
    text = said.getvalue()
    assert text.count(warning) == 1, "one warning per command, however many calls it makes"
    assert f"checkpoint(s) of run {m.old_run} not mirrored" in text
    assert "a second trainer's work" in text and f"outrig cleanup --host {m.a}" in text

    # fenced: exactly the old run stops; the foreign process and B's run live on
    events = tmp_path / "events.jsonl"
    code = f"import sys; open({str(events)!r}, 'a').write(sys.stdin.read())"
    notifier = Notifier([sys.executable, "-c", code])
    session = HostSession(m.project, str(m.a), Reporter(quiet=True), m.journal,
                          host=HostBook(m.project.hosts_dir)(str(m.a)))
    try:
        assert fence_on(session, notifier) == [m.old_run]
    finally:
        session.close()
        notifier.close(timeout=60)
    assert marked(m.old_run) == []
    assert alive(m.foreign), "a process outrig did not start is never touched"
    assert marked(m.new_run), "B's run is untouched"
    record = m.journal.run(m.old_run)
    assert record is not None and record["fenced"]["stopped"]
    assert {p["process"] for p in record["fenced"]["stopped"]} == {"server", "trainer"}
    sent = [json.loads(line) for line in events.read_text().splitlines()]
    assert [(e["event"], e["run_id"], e["moved_to"]["host"]) for e in sent] == \
        [("fenced", m.old_run, b_name(m))]
    assert notifier.failures == []

    # afterwards: no warning, status (of the stopped run, named) says fenced, and fencing
    # again has nothing to do
    said = io.StringIO()
    shown = status(m.project, str(m.a), Reporter(err=said, json_mode=True), run_id=m.old_run,
                   journal=m.journal)
    assert "was moved" not in said.getvalue()
    run = next(r for r in shown["runs"] if r["run_id"] == m.old_run)
    assert run["status"] == "fenced" and run["box_status"] == "stopped"
    session = HostSession(m.project, str(m.a), Reporter(quiet=True), m.journal,
                          host=HostBook(m.project.hosts_dir)(str(m.a)))
    try:
        assert fence_on(session) == []
    finally:
        session.close()


def test_cleanup_of_the_old_box_without_a_selection_stops_the_moved_run(
        moved: Moved) -> None:
    m = moved
    said = io.StringIO()
    result = cleanup(m.project, str(m.a), Reporter(err=said), journal=m.journal)
    assert result["fenced"] == [m.old_run]
    assert "stopping the run(s) moved away from" in said.getvalue()
    assert marked(m.old_run) == []
    assert alive(m.foreign) and marked(m.new_run)
    assert moved_runs(m.journal, m.a.stem) == []
    # nothing left to fence: a bare cleanup is the usual error again, and sends nothing
    with pytest.raises(ConfigError, match="say what to clean up"):
        cleanup(m.project, str(m.a), Reporter(quiet=True), journal=m.journal)


def test_a_run_migrate_stopped_on_a_live_box_is_fenced_at_once(
        box_a: SandboxBox, host_b: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    project, journal, a, old_run = start_on_a(box_a, tmp_path, monkeypatch)
    quiet = Reporter(quiet=True)
    try:
        report = migrate(project, str(a), str(host_b), quiet, journal=journal,
                         playbook="mig-8gpu")
        assert report["old_alive"] is True and marked(old_run) == []
        record = journal.run(old_run)
        assert record is not None and record["moved_to"]["run_id"] == report["run_id"]
        assert {p["process"] for p in record["fenced"]["stopped"]} == {"server", "trainer"}
        assert moved_runs(journal, a.stem) == []
        said = io.StringIO()
        status(project, str(a), Reporter(err=said), journal=journal)
        assert "was moved" not in said.getvalue(), "nothing to warn about: it is stopped"
    finally:
        cleanup(project, str(host_b), quiet, all_runs=True, journal=journal)
        kill_run(box_a.workdir, old_run)


def write_state(folder: Path, epoch: int, step: int, size: int = 20_000) -> None:
    """One checkpoint folder as speculators leaves it, the training state written last, a
    while ago (so the trainer is done with it)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = ["config.json", "model.safetensors", "optimizer_state_dict.pt",
             "scheduler_state_dict.pt"]
    for name in names:
        (folder / name).write_bytes(os.urandom(size))
    (folder / "training_state.json").write_text(json.dumps(
        {"epoch": epoch, "local_step": step, "global_step": epoch * 100 + step}))
    old = time.time() - 600
    for index, name in enumerate([*names, "training_state.json"]):
        os.utime(folder / name, (old + index, old + index))


def test_the_mirror_takes_a_whole_epoch_over_its_mid_epoch_save_and_never_goes_back(
        box_host: Path, tmp_path: Path) -> None:
    save = tmp_path / "ckpt"
    book = tmp_path / "ckptjob.yaml"
    book.write_text(yaml.safe_dump({"name": "ckptjob", "stage": {"ckpt": {
        "path": str(save), "kind": "checkpoints"}}, "processes": {"a": {"command": "true"}}}))
    project = Project(tmp_path)
    journal = Journal(tmp_path / "state")
    quiet = Reporter(quiet=True)
    mirror = mirror_root("ckptjob") / "3"

    write_state(save / "3", 3, 40)  # a mid-epoch save of epoch 3
    first = sync_checkpoints(project, str(box_host), quiet, playbook=str(book), journal=journal)
    assert [(p["epoch"], p["step"]) for p in first["pulled"]] == [(3, 40)]
    write_state(save / "3", 3, 0)  # the trainer finished epoch 3 in the same folder
    whole = sync_checkpoints(project, str(box_host), quiet, playbook=str(book), journal=journal)
    assert [(p["epoch"], p["step"], p["replaced"]) for p in whole["pulled"]] == [(3, 0, True)]
    assert json.loads((mirror / "training_state.json").read_text())["local_step"] == 0
    assert (mirror / "model.safetensors").read_bytes() == \
        (save / "3" / "model.safetensors").read_bytes()
    assert not [p for p in mirror.parent.iterdir() if p.name.startswith(".3.")], \
        "the swap leaves no incoming or retired folder behind"

    write_state(save / "3", 3, 10)  # an older state of epoch 3 (another box's, say)
    kept = (mirror / "model.safetensors").read_bytes()
    older = sync_checkpoints(project, str(box_host), quiet, playbook=str(book), journal=journal)
    assert older["pulled"] == []
    assert json.loads((mirror / "training_state.json").read_text())["local_step"] == 0
    assert (mirror / "model.safetensors").read_bytes() == kept
