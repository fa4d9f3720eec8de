"""Fencing without a box: the journal's ``moved_to``/``fenced`` marks survive the box's run
index, the ordering of checkpoints, the rule that keeps a moved run out of the mirror, the
"moved" warning a session gives once, and how status shows a moved run."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from outrig.checkpoints import checkpoint_order, state_order
from outrig.console import Reporter
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.moves import mark_moved, moved_runs
from outrig.ops.cleanup import fence_stopped
from outrig.ops.stage import moved_refusal
from outrig.session import HostSession, Project
from outrig.text.layout import status_lines


def journal_with_run(tmp_path: Path, status: str = "running") -> Journal:
    journal = Journal(tmp_path / "state")
    journal.record_run("old-1", {"run_id": "old-1", "host": "a", "playbook": "job",
                                 "status": status, "ran": True, "created": 1.0})
    return journal


def test_moved_mark_survives_the_box_reporting_the_run_running(tmp_path: Path) -> None:
    journal = journal_with_run(tmp_path, status="unknown")
    mark_moved(journal, "a", "old-1", "b", "new-1")
    # the old box answers again and its run index says the run is running
    changed = journal.reconcile("a", [{"run_id": "old-1", "status": "running", "ran": True}])
    record = journal.run("old-1")
    assert record is not None and changed == ["old-1"]
    assert record["status"] == "running", "status follows the box"
    assert record["moved_to"]["host"] == "b" and record["moved_to"]["run_id"] == "new-1"
    assert [r["run_id"] for r in moved_runs(journal, "a")] == ["old-1"]
    assert moved_runs(journal, "b") == []


def test_fenced_runs_are_no_longer_pending_and_reconcile_keeps_the_mark(
        tmp_path: Path) -> None:
    journal = journal_with_run(tmp_path)
    mark_moved(journal, "a", "old-1", "b", "new-1")
    journal.mark_fenced("old-1", stopped=[{"process": "trainer", "pid": 7, "how": "term"}])
    journal.reconcile("a", [{"run_id": "old-1", "status": "stopped", "ran": True}])
    assert moved_runs(journal, "a") == []
    kept = moved_runs(journal, "a", fenced=True)
    assert [r["run_id"] for r in kept] == ["old-1"]
    assert kept[0]["fenced"]["stopped"][0]["process"] == "trainer"


def test_a_run_migrate_stopped_itself_is_fenced_at_once(tmp_path: Path) -> None:
    journal = journal_with_run(tmp_path)
    stopped = {"runs": [{"run_id": "old-1", "processes": [
        {"process": "server", "pid": 5, "how": "term"},
        {"process": "trainer", "pid": 6, "how": "kill"}]}]}
    mark_moved(journal, "a", "old-1", "b", "new-1", stopped=stopped)
    record = journal.run("old-1")
    assert record is not None and record["moved_to"]["run_id"] == "new-1"
    assert [p["how"] for p in record["fenced"]["stopped"]] == ["term", "kill"]
    assert moved_runs(journal, "a") == []


def test_a_cleanup_of_other_runs_does_not_fence_the_moved_one(tmp_path: Path) -> None:
    journal = journal_with_run(tmp_path)
    mark_moved(journal, "a", "old-1", "b", "new-1",
               stopped={"runs": [{"run_id": "another", "processes": []}]})
    assert [r["run_id"] for r in moved_runs(journal, "a")] == ["old-1"]


def test_any_cleanup_that_stopped_a_moved_run_fences_it(tmp_path: Path) -> None:
    journal = journal_with_run(tmp_path)
    journal.record_run("other-1", {"run_id": "other-1", "host": "a", "playbook": "job",
                                   "status": "running", "created": 2.0})
    mark_moved(journal, "a", "old-1", "b", "new-1")
    fence_stopped(journal, {"runs": [
        {"run_id": "old-1", "processes": [{"process": "trainer", "pid": 6, "how": "term"}]},
        {"run_id": "other-1", "processes": []}]})
    record, other = journal.run("old-1"), journal.run("other-1")
    assert record is not None and record["fenced"]["stopped"][0]["how"] == "term"
    assert other is not None and "fenced" not in other, "only moved runs are fenced"


def test_no_old_run_marks_nothing_and_an_unknown_one_is_filed_under_its_host(
        tmp_path: Path) -> None:
    journal = Journal(tmp_path / "state")
    mark_moved(journal, "a", None, "b", "new-1")
    assert journal.runs() == []
    mark_moved(journal, "a", "lost-1", "b", "new-1")
    assert [r["run_id"] for r in moved_runs(journal, "a")] == ["lost-1"]


def test_checkpoint_order_puts_a_whole_epoch_after_its_mid_epoch_saves() -> None:
    assert checkpoint_order(3, 10) < checkpoint_order(3, 40) < checkpoint_order(3, 0)
    assert checkpoint_order(3, 0) < checkpoint_order(4, 1)
    assert state_order(3, {"epoch": 3, "local_step": 40}) == checkpoint_order(3, 40)
    # no usable step: counted as the end of the epoch, the newest the folder can be
    assert state_order(3, {"epoch": 3}) == checkpoint_order(3, 0)
    assert state_order(3, None) == checkpoint_order(3, 0)


END_2, END_3, END_5 = checkpoint_order(2, 0), checkpoint_order(3, 0), checkpoint_order(5, 0)
MID_3 = checkpoint_order(3, 20)


@pytest.mark.parametrize(("order", "resumed", "held", "newest", "refused"), [
    (END_5, 3, None, END_5, "past checkpoint 3"),      # the old trainer's work after the move
    (checkpoint_order(4, 0), 3, None, None, "past checkpoint 3"),
    (END_3, None, None, None, "started afresh"),
    (END_3, 3, MID_3, END_5, "would replace"),         # newer state of the resumed epoch
    (END_3, 3, END_3, END_5, None),                    # already there: nothing to take
    (MID_3, 3, END_3, END_5, None),                    # older: the usual rule skips it
    (END_2, 3, None, END_5, "not newer than"),         # a hole below the newest
    (END_2, 3, None, None, None),                      # an empty mirror may take it
])
def test_a_moved_run_never_moves_the_mirror_backwards(
        order: tuple[int, int, int], resumed: int | None, held: tuple[int, int, int] | None,
        newest: tuple[int, int, int] | None, refused: str | None) -> None:
    why = moved_refusal(order, resumed, held, newest)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why


class NoLink:
    """A transport that must never be used: the warning is given before any agent call."""

    rtt = None
    best_rtt = None

    def close(self) -> None:
        pass


def session_for(tmp_path: Path, journal: Journal, err: io.StringIO) -> HostSession:
    hosts = tmp_path / "proj" / "hosts"
    hosts.mkdir(parents=True, exist_ok=True)
    (hosts / "a.yaml").write_text("hostname: 127.0.0.1\nport: 2222\nuser: root\n"
                                  "workdir: /workspace/a\n")
    project = Project(tmp_path / "proj")
    return HostSession(project, "a", Reporter(err=err), journal,
                       host=HostBook(project.hosts_dir)("a"),
                       transport=NoLink())  # type: ignore[arg-type]


def test_a_session_to_the_old_box_warns_once_until_the_run_is_fenced(tmp_path: Path) -> None:
    journal = journal_with_run(tmp_path)
    mark_moved(journal, "a", "old-1", "b", "new-1")
    err = io.StringIO()
    session = session_for(tmp_path, journal, err)
    session.warn_moved()
    session.warn_moved()
    text = err.getvalue()
    assert text.count("was moved to b") == 1
    assert "run old-1 of job on a was moved to b at " in text
    assert "`outrig cleanup --host a` stops it" in text
    journal.mark_fenced("old-1", stopped=[])
    quiet = io.StringIO()
    session_for(tmp_path, journal, quiet).warn_moved()
    assert "moved" not in quiet.getvalue()


def moved_status(fenced: dict[str, Any] | None) -> dict[str, Any]:
    return {"runs": [{"run_id": "old-1", "playbook": "job", "status": "fenced" if fenced
                      else "moved", "box_status": "running",
                      "moved_to": {"host": "b", "run_id": "new-1", "at": 0.0},
                      "fenced": fenced, "processes": []}]}


def test_status_shows_a_moved_run_as_moved_then_fenced() -> None:
    header = status_lines(moved_status(None), 120)[0]
    assert header.startswith("run old-1 (job): moved to b at 1970-01-01 00:00:00 UTC")
    assert "running here, not fenced yet" in header
    header = status_lines(moved_status({"at": 60.0, "stopped": []}), 120)[0]
    assert "fenced at 1970-01-01 00:01:00 UTC" in header
