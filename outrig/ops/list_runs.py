"""``outrig runs``: every run the journal knows, reconciled with the boxes that answer.

One ``status`` call per host, every host at once through the fan-out executor
(:func:`outrig.fanout.run_fanout`) with its short RTT-scaled deadline: the box's run index
(the ``runs`` event every status sends) reconciles the journal's records of that host
(:meth:`outrig.journal.Journal.reconcile`), and the answer's progress and checkpoints are
kept as the runs' ``last_seen`` (:func:`outrig.ops.status.remember_progress`). A host that
does not answer holds nothing up: its runs are shown as the journal last knew them, "not
seen since T". The document and the table are :mod:`outrig.run_history`.

Which hosts are asked: those of ``--host`` when given; else every host of a run the table
is to show (with ``--all``: every host the journal knows). A box whose runs are all old and
not shown is not asked: a returned rental would otherwise cost every ``outrig runs`` its
deadline.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from outrig.console import Reporter
from outrig.fanout import MAX_PARALLEL, HostOutcome, run_fanout
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.ops.status import PROGRESS_BYTES, PROGRESS_MARKERS, enrich_status, remember_progress
from outrig.providers.ledger import annotate_costs
from outrig.run_history import RECENT, HostView, chosen, history_document, history_lines
from outrig.session import HostSession, Project


def journal_runs(journal: Journal, hosts: Sequence[str] | None,
                 playbook: str | None) -> list[dict[str, Any]]:
    """The journal's runs (of ``hosts``, of ``playbook``), newest first."""
    wanted = None if hosts is None else set(hosts)
    return [r for r in journal.runs(playbook=playbook)
            if wanted is None or str(r.get("host")) in wanted]


def _ask(session: HostSession) -> dict[str, Any]:
    """One host's part: one status call (its run index reconciles the journal), the
    progress it shows kept in the journal."""
    result = session.call("status", stream=False, log_lines=0, progress_bytes=PROGRESS_BYTES,
                          markers=PROGRESS_MARKERS, gpu_holders=False)
    enrich_status(result)
    remember_progress(session.journal, result)
    return {"runs": [r.get("run_id") for r in result.get("runs") or []]}


def runs_history(project: Project, reporter: Reporter, *, hosts: Sequence[str] | None = None,
                 playbook: str | None = None, show_all: bool = False,
                 max_parallel: int = MAX_PARALLEL, deadline: float | None = None,
                 journal: Journal | None = None, recent: int = RECENT,
                 book: HostBook | None = None) -> dict[str, Any]:
    """``outrig runs``: shown as a table (or one JSON document) and returned. ``playbook`` is
    the name runs are filed under (the command resolved ``--playbook`` to it); ``book``: the
    command's hosts, resolved once."""
    journal = journal or Journal()
    book = book or HostBook(project.hosts_dir)
    keys = None if hosts is None else list(dict.fromkeys(book.filed_under(h) for h in hosts))
    before, _ = chosen(journal_runs(journal, keys, playbook), show_all=show_all, recent=recent)
    # the journal's hosts that still have a way in: a released box's host file is gone, and
    # its runs are shown as last seen
    specs = list(hosts) if hosts is not None else \
        [h for h in dict.fromkeys(str(r.get("host")) for r in before if r.get("host"))
         if book.knows(h)]
    outcomes: list[HostOutcome] = []
    if specs:
        outcomes = run_fanout(project, specs, _ask, max_parallel=max_parallel,
                              deadline=deadline, journal=journal, book=book)
    now = time.time()
    answered = {book.filed_under(o.host): o for o in outcomes}
    records = journal_runs(journal, keys, playbook)
    names = list(dict.fromkeys([*answered, *(str(r.get("host")) for r in records)]))
    views = []
    for name in names:
        seen_at, listed = journal.runs_seen(name)
        outcome = answered.get(name)
        views.append(HostView(name, answered=outcome is not None and outcome.ok,
                              error=None if outcome is None or outcome.ok else
                              (outcome.error or outcome.state).split(". ")[0],
                              seen_at=seen_at, listed=listed, contacted=outcome is not None))
    doc = history_document(records, views, now=now, show_all=show_all, recent=recent)
    annotate_costs(journal, doc["runs"], now)  # runs on rented boxes: their share of the bill
    if reporter.json_mode:
        reporter.emit_json(doc)
    else:
        reporter.lines(history_lines(doc, reporter.width))
    return doc
