"""Moved runs: after a migrate, the old box's run is a second trainer until it is stopped.

A box judged dead may only have lost its link; when it answers again its run is still
training, paid for, and writing checkpoints of its own. So every migrate marks the old run
``moved_to`` in the journal (apart from the box-reconciled ``status``, which the box's run
index would set back to ``running``), and the run stays "moved, not fenced" until its
processes are confirmed stopped. Then it is marked ``fenced`` with when and what was stopped.

This module is the journal's side of it, pure (only the journal is read and written): which
runs were moved (:func:`moved_runs`), the mark (:func:`mark_moved`), what a cleanup stopped
(:func:`stopped_processes`) and the warning (:func:`moved_line`).

Who acts on the mark: fencing is a cleanup selection (:func:`outrig.ops.cleanup.fence_on`),
which ``watch`` runs when the old box answers again and ``cleanup --host OLD`` runs without a
run selection; every other command that reaches the old box warns first
(:class:`outrig.session.HostSession`), ``status`` shows the run as moved, and
``sync-checkpoints`` keeps its checkpoints out of the mirror
(:func:`outrig.ops.stage.sync_checkpoints_on`). The stop is exact: the agent's ``cleanup`` op
with the recorded run id (recorded processes, their groups and the run's marker), the same
selection as ``cleanup --run``; nothing else on the box is touched.
"""

from __future__ import annotations

from typing import Any

from outrig.journal import RUN_ENDED, Journal
from outrig.journal import utc_text as when


def moved_runs(journal: Journal, host_name: str, *, fenced: bool = False) -> list[dict[str, Any]]:
    """The runs on ``host_name`` that a migrate moved elsewhere and that are not fenced yet
    (with ``fenced=True``: fenced ones too), newest first. Only the journal is read."""
    return [r for r in journal.moved_runs(host_name) if fenced or not r.get("fenced")]


def mark_moved(journal: Journal, old_host: str, old_run_id: str | None, new_host: str,
               new_run_id: str, *, stopped: dict[str, Any] | None = None) -> None:
    """After a migrate: mark the old run moved to ``new_run_id`` on ``new_host``.

    ``stopped`` is migrate's own cleanup of the old box (its result) when the old box was
    alive: a run that cleanup stopped is fenced at once. Without an old run (the journal had
    none) there is nothing to mark."""
    if not old_run_id:
        return
    journal.mark_moved(old_run_id, host=old_host, to_host=new_host, to_run_id=new_run_id)
    for run in (stopped or {}).get("runs") or []:
        if run.get("run_id") == old_run_id:
            journal.mark_fenced(old_run_id, stopped=stopped_processes(run))
            return
    if ended((journal.run(old_run_id) or {}).get("status")):
        journal.mark_fenced(old_run_id, stopped=[])  # stopped before the move: nothing runs


def ended(status: object) -> bool:
    """Whether a run's status (the box's, as the journal follows it, or a cleanup's) says
    none of its processes runs any more: a moved run in that state needs no fencing, and
    no warning that it "may still be running"."""
    return status in RUN_ENDED


def stopped_processes(run: dict[str, Any]) -> list[dict[str, Any]]:
    """What the agent's cleanup says it stopped for one run: process, pid and how it ended."""
    return [{"process": p.get("process"), "pid": p.get("pid"), "how": p.get("how")}
            for p in run.get("processes") or [] if isinstance(p, dict)]


def moved_line(record: dict[str, Any], host_label: str) -> str:
    """The warning for one moved, unfenced run, naming the command that stops it."""
    moved = record.get("moved_to") or {}
    return (f"run {record.get('run_id')} of {record.get('playbook')} on {host_label} was moved "
            f"to {moved.get('host')} at {when(moved.get('at'))}; it may still be running "
            f"here — `outrig cleanup --host {host_label}` stops it")
