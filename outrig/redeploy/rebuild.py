"""The inputs of a redeploy (a move or a restart) rebuilt from a run's journal record.

The job is the playbook *as it was deployed* (its text from the move record), with the
run's ``--param`` overrides and ``--test``; a ``--param`` given again on this command line
wins. What differs from a fresh deploy of today's file is said, one note each, so the
success line and ``status`` can name it: the playbook file changed (or is gone) since the
run was deployed, a param given again. A run deployed by an older outrig has no move record:
today's file is used with the params and test mode its record kept, and a note says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outrig.errors import ConfigError
from outrig.journal import Journal
from outrig.playbook import Job, find_playbook, load_job
from outrig.redeploy.record import RECORD_KEY, text_digest


@dataclass
class Redeploy:
    """What a redeploy of one run deploys: ``job`` (loaded with ``params`` and ``test``),
    and ``notes``, each a difference from the run as it was deployed or from today's file."""

    run_id: str
    job: Job
    params: dict[str, Any]
    test: bool
    notes: list[str] = field(default_factory=list)

    def member(self, ref: str, playbooks_dir: Path) -> tuple[Job, dict[str, Any]]:
        """The job for family member ``ref`` (a name or path, see
        :func:`~outrig.playbook.find_playbook`) and the params it is deployed with: the
        recorded job when it is the run's own playbook, else today's file of that member with
        its test mode and those of the run's params it declares."""
        if ref == self.job.name:
            return self.job, dict(self.params)
        path = find_playbook(ref, playbooks_dir)
        if path.expanduser().absolute() == self.job.doc.source:
            return self.job, dict(self.params)
        probe = load_job(path, test=self.test)
        declared = probe.doc.data.get("params")
        keep = {k: v for k, v in self.params.items()
                if isinstance(declared, dict) and k in declared}
        return (load_job(path, test=self.test, params=keep) if keep else probe), keep


def rebuild(project_playbooks: Path, record: dict[str, Any], *,
            params: dict[str, Any] | None = None, named: str | None = None) -> Redeploy:
    """The redeploy of the run ``record`` (a journal run record); ``params``: ``--param``
    values given on this command line, which win over the recorded ones. ``named``: a
    playbook named on the command line (``migrate --playbook``): its file as it is now is
    deployed, with the run's params (those it declares) and test mode, and a note says when
    it differs from the run's playbook as deployed."""
    run_id = str(record.get("run_id"))
    given = dict(params or {})
    deployed = record.get(RECORD_KEY)
    book = deployed.get("playbook") if isinstance(deployed, dict) else None
    if not isinstance(book, dict) or not isinstance(book.get("text"), str) \
            or not book["text"]:
        return _from_today(project_playbooks, record, given, named)
    if named is not None:
        return _named(project_playbooks, record, given, named)
    assert isinstance(deployed, dict)
    kept = deployed.get("params")
    recorded: dict[str, Any] = dict(kept) if isinstance(kept, dict) else {}
    test = bool(deployed.get("test"))
    path = Path(str(book.get("file")))
    text = str(book["text"])
    notes = []
    try:
        now = path.read_text(encoding="utf-8")
    except OSError:
        now = None
    if now is None:
        notes.append(f"the playbook file {path} is gone; run {run_id}'s playbook is deployed "
                     "as it was")
    elif text_digest(now) != book.get("sha256"):
        notes.append(f"{path} changed since run {run_id} was deployed; it is deployed as it "
                     "was then (deploy afresh to use the file as it is now)")
    notes += _param_notes(recorded, given)
    merged = {**recorded, **given}
    base = book.get("base_dir")
    job = load_job(path, test=test, params=merged or None, text=text,
                   base_dir=Path(base) if isinstance(base, str) else None)
    return Redeploy(run_id, job, merged, test, notes)


def _named(playbooks_dir: Path, record: dict[str, Any], given: dict[str, Any],
           named: str) -> Redeploy:
    """``--playbook`` named on the command line: that file as it is now, with the run's
    params it declares and its test mode (see :func:`rebuild`)."""
    deployed = record[RECORD_KEY]
    kept = deployed.get("params")
    recorded: dict[str, Any] = dict(kept) if isinstance(kept, dict) else {}
    test = bool(deployed.get("test"))
    path = find_playbook(named, playbooks_dir)
    declared = load_job(path, test=test).doc.data.get("params")
    merged = {k: v for k, v in {**recorded, **given}.items()
              if isinstance(declared, dict) and k in declared}
    job = load_job(path, test=test, params=merged or None)
    notes = []
    if job.doc.text != deployed["playbook"].get("text"):
        notes.append(f"--playbook {named}: {path} as it is now, which is not run "
                     f"{record.get('run_id')}'s playbook as deployed")
    dropped = sorted(set(recorded) - set(merged))
    if dropped:
        notes.append(f"{path} has no param {', '.join(dropped)}: the run's value is not used")
    return Redeploy(str(record.get("run_id")), job, merged, test,
                    notes + _param_notes(recorded, given))


def _from_today(playbooks_dir: Path, record: dict[str, Any],
                given: dict[str, Any], named: str | None = None) -> Redeploy:
    """A run without a move record: today's file (``named``, else the run's), with the
    params and test mode the record kept."""
    run_id = str(record.get("run_id"))
    name = named or record.get("playbook")
    if not isinstance(name, str):
        raise ConfigError(f"the journal's record of run {run_id} names no playbook; pass "
                          "--playbook NAME")
    kept = record.get("param_overrides")
    recorded = dict(kept) if isinstance(kept, dict) else {}
    test = bool(record.get("test_mode"))
    path = find_playbook(name, playbooks_dir)
    merged = {**recorded, **given}
    job = load_job(path, test=test, params=merged or None)
    notes = [f"run {run_id} has no record of its playbook as deployed (an older outrig "
             f"deployed it): {path} as it is now is used, with the run's params"
             + (" and --test" if test else "")]
    return Redeploy(run_id, job, merged, test, notes + _param_notes(recorded, given))


def _param_notes(recorded: dict[str, Any], given: dict[str, Any]) -> list[str]:
    return [f"--param {key}={value} given on the command line wins over the run's "
            f"{key}={recorded[key]}" if key in recorded else
            f"--param {key}={value} given on the command line (the run had the playbook's value)"
            for key, value in given.items() if recorded.get(key) != value]


def redeploy_of(playbooks_dir: Path, journal: Journal, run_id: str, playbook: str,
                params: dict[str, Any] | None = None) -> Redeploy:
    """:func:`rebuild` of the journal's record of ``run_id`` (a run the journal lacks, one
    the box reported but this workstation did not deploy, is ``playbook``'s file as it is
    now, without params)."""
    record = journal.run(run_id) or {"run_id": run_id, "playbook": playbook}
    record.setdefault("playbook", playbook)
    return rebuild(playbooks_dir, record, params=params)
