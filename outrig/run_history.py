"""The history of runs (``outrig runs``) and a run's last known state: pure, no I/O.

The journal holds every run outrig deployed or a box reported (:mod:`outrig.journal`), each
with the state the box last gave it (the box's run index reconciles the journal on every
contact) and, since ``status`` and ``watch`` record it, the progress last seen
(``last_seen``: step, epoch, loss, newest complete checkpoint). Here those records, and what
the command learnt of each host (it answered now, or since when it has not), become one
document (``--json``) and the lines of a table that fits 80 columns; the same record is what
``status --run R`` shows, marked as the journal's, when the box does not answer.

Which runs are shown without ``--all`` (:func:`chosen`): the newest :data:`RECENT` runs, and
every older run that may still hold a box (running as last seen, or moved away and not
fenced yet), because those are the ones a person must act on; ``--all`` shows every run. A
journal grows with every deploy, and a table of hundreds of finished runs would hide the
few that matter.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from outrig.journal import utc_text
from outrig.progress import format_duration
from outrig.providers.ledger import money
from outrig.text.layout import INDENT, columns, labelled, visible, wrapped

RECENT = 20  # runs shown without --all (and every older run that may still hold a box)
HOLDING = ("running", "deploying", "launching", "unknown")  # states that may still hold GPUs


@dataclass
class HostView:
    """What ``outrig runs`` learnt of one host: whether its box answered now, why not, and
    (from the journal) when its run index last arrived and the runs it listed."""

    host: str
    answered: bool
    error: str | None = None
    seen_at: float | None = None
    listed: set[str] = field(default_factory=set)
    contacted: bool = True  # False: not asked this time (no run of it was to be shown)


def seen_from_status(run: dict[str, Any], at: float) -> dict[str, Any]:
    """What to keep of one run of an enriched ``status`` answer
    (:func:`outrig.ops.status.enrich_status`): the trainer's (or the first process with
    progress's) step, epoch and loss, and the newest complete checkpoint of any process."""
    procs = [p for p in run.get("processes") or [] if isinstance(p, dict)]
    with_progress = [p for p in procs if isinstance(p.get("progress"), dict)]
    trainer = next((p for p in with_progress if p.get("name") == "trainer"),
                   with_progress[0] if with_progress else None)
    seen: dict[str, Any] = {"at": at}
    if trainer is not None:
        progress = trainer["progress"]
        seen.update(process=trainer.get("name"), step=progress.get("step"),
                    epoch=progress.get("epoch"), loss=progress.get("loss"),
                    epochs_total=progress.get("epochs_total"))
    for proc in procs:
        checkpoint = proc.get("checkpoint")
        if isinstance(checkpoint, dict) and checkpoint.get("path"):
            seen["checkpoint"] = {"name": checkpoint.get("name"), "path": checkpoint["path"],
                                  "count": checkpoint.get("count"), "at": at}
            break
    return seen


def may_hold_a_box(record: dict[str, Any]) -> bool:
    """Running (or not known to have ended) as last seen, or moved and not fenced yet."""
    if isinstance(record.get("moved_to"), dict):
        return not isinstance(record.get("fenced"), dict)
    return str(record.get("status")) in HOLDING


def chosen(records: Sequence[dict[str, Any]], *, show_all: bool,
           recent: int = RECENT) -> tuple[list[dict[str, Any]], int]:
    """The records to show (newest first, as given) and how many were left out."""
    if show_all:
        return list(records), 0
    shown = [r for i, r in enumerate(records) if i < recent or may_hold_a_box(r)]
    return shown, len(records) - len(shown)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def run_row(record: dict[str, Any], view: HostView | None, now: float) -> dict[str, Any]:
    """One run of the history document: the journal's record with what the host said now."""
    run_id = str(record.get("run_id"))
    box_state = record.get("status")
    moved = record.get("moved_to") if isinstance(record.get("moved_to"), dict) else None
    fenced = record.get("fenced") if isinstance(record.get("fenced"), dict) else None
    state = "fenced" if fenced and moved else "moved" if moved else box_state
    listed = view is not None and run_id in view.listed
    seen_at = view.seen_at if listed and view is not None and view.seen_at else \
        _number(record.get("box_seen"))
    seen_now = bool(view is not None and view.answered and listed)
    created = _number(record.get("created"))
    end = _number(record.get("stopped_at")) or _number(record.get("ended_at"))
    if end is None and box_state == "running":
        end = now if seen_now else seen_at
    raw = record.get("last_seen")
    last: dict[str, Any] = raw if isinstance(raw, dict) else {}
    checkpoint = last.get("checkpoint") if isinstance(last.get("checkpoint"), dict) else None
    return {
        "run_id": run_id, "host": record.get("host"), "playbook": record.get("playbook"),
        "state": state, "box_state": box_state, "seen_now": seen_now, "seen_at": seen_at,
        "created": created, "ready_at": _number(record.get("ready_at")),
        "stopped_at": _number(record.get("stopped_at")),
        "ended_at": _number(record.get("ended_at")),
        "duration_s": None if created is None or end is None else round(max(0.0, end - created),
                                                                         3),
        "progress": None if not last.get("step") and last.get("loss") is None else {
            "step": last.get("step"), "epoch": last.get("epoch"), "loss": last.get("loss"),
            "process": last.get("process"), "at": last.get("at")},
        "checkpoint": checkpoint, "moved_to": moved, "fenced": fenced,
        "job_id": record.get("job_id"), "source": record.get("source") or "deploy",
    }


def history_document(records: Sequence[dict[str, Any]], views: Iterable[HostView], *,
                     now: float, show_all: bool, recent: int = RECENT) -> dict[str, Any]:
    """``outrig runs --json``: the runs shown (newest first), each host as the command found
    it, and how many older runs ``--all`` would add."""
    by_host = {v.host: v for v in views}
    shown, hidden = chosen(records, show_all=show_all, recent=recent)
    return {"runs": [run_row(r, by_host.get(str(r.get("host"))), now) for r in shown],
            "hosts": [{"host": v.host, "contacted": v.contacted, "answered": v.answered,
                       "error": v.error, "runs_seen_at": v.seen_at}
                      for v in by_host.values()],
            "hidden": hidden, "all": show_all, "at": now}


def _when(stamp: float | None) -> str:
    """``01-02 13:04`` (UTC): short enough for a table cell."""
    if stamp is None:
        return "-"
    return utc_text(stamp)[5:16]


def _progress_text(row: dict[str, Any]) -> str:
    """``step 40, epoch 1, loss 0.412`` (what is known of them)."""
    parts = []
    progress = row.get("progress") or {}
    if progress.get("step") is not None:
        parts.append(f"step {progress['step']}")
    if progress.get("epoch") is not None:
        parts.append(f"epoch {progress['epoch']}")
    if isinstance(progress.get("loss"), (int, float)):
        parts.append(f"loss {progress['loss']:.3f}")
    return ", ".join(parts)


def _checkpoint_lines(row: dict[str, Any], width: int) -> list[str]:
    """``checkpoint 4: PATH`` under a row, the path on a line of its own when it is long."""
    checkpoint = row.get("checkpoint")
    if not checkpoint:
        return []
    return labelled(f"newest complete checkpoint {checkpoint.get('name')}",
                    visible(str(checkpoint.get("path"))), width)


def _seen_text(row: dict[str, Any]) -> str:
    if row["seen_now"]:
        return ""
    if row["seen_at"] is None:
        return "never seen on its box"
    return f"not seen since {utc_text(row['seen_at'])}"


def _moved_text(row: dict[str, Any]) -> str:
    moved = row.get("moved_to")
    if not moved:
        return ""
    text = f"moved to {moved.get('host')} as {moved.get('run_id')} at {utc_text(moved.get('at'))}"
    if row.get("fenced"):
        return text + f"; fenced at {utc_text(row['fenced'].get('at'))}"
    return text + f"; {row.get('box_state')} on its box, not fenced yet (outrig cleanup " \
                  f"--host {row.get('host')})"


def cost_text(row: dict[str, Any]) -> str:
    """``cost $1.24 (rented at $2.49/h)`` for a run on a box rented through outrig."""
    cost = row.get("cost")
    if not isinstance(cost, dict):
        return ""
    return f"cost {money(float(cost.get('usd') or 0))} (rented at " \
           f"${float(cost.get('price_per_hour') or 0):.2f}/h)"


def _pieces(pieces: Sequence[str], width: int, indent: str = INDENT) -> list[str]:
    """Short facts under a row, ``; ``-joined on as few lines as fit, each fact whole on a
    line when it fits (a date is not split from its time)."""
    out: list[str] = []
    line = ""
    for piece in (visible(p) for p in pieces):
        joined = f"{line}; {piece}" if line else piece
        first = indent if not out else indent + "  "
        if not line or len(first) + len(joined) <= width:
            line = joined
            continue
        out += wrapped(line + ";", width, first, indent + "  ")
        line = piece
    if line:
        out += wrapped(line, width, indent if not out else indent + "  ", indent + "  ")
    return out


def row_cells(row: dict[str, Any], *, with_host: bool) -> list[str]:
    duration = row.get("duration_s")
    cells = [visible(str(row["run_id"]))]
    if with_host:
        cells.append(visible(str(row.get("host"))))
    cells += [str(row.get("state")), _when(row.get("created")),
              "-" if duration is None else format_duration(float(duration))]
    return cells


def history_lines(doc: dict[str, Any], width: int) -> list[str]:
    """``outrig runs`` for people: a row of short fields per run (the host in the row when
    the table still fits ``width``, else under it), then under the row what is long: the
    host and playbook, the last progress and checkpoint, a move, and "not seen since T"
    when the box did not answer. Then the hosts that did not answer, with the reason."""
    rows = doc.get("runs") or []
    if not rows:
        out = ["no runs in the journal" + (" (older runs: --all)" if doc.get("hidden") else "")]
        return out
    headers = ["run", "host", "state", "started", "took"]
    header, lines = columns(headers, [row_cells(r, with_host=True) for r in rows])
    with_host = max(len(line) for line in [header, *lines]) <= width
    if not with_host:
        header, lines = columns([h for h in headers if h != "host"],
                                [row_cells(r, with_host=False) for r in rows])
    out = [header]
    for row, line in zip(rows, lines, strict=False):
        out.append(line)
        about = [] if with_host else [f"on {row.get('host')}"]
        if row.get("playbook") and not str(row["run_id"]).startswith(f"{row['playbook']}-"):
            about.append(f"playbook {row['playbook']}")
        for text in (_progress_text(row), _moved_text(row), _seen_text(row), cost_text(row)):
            if text:
                about.append(text)
        out += _pieces(about, width)
        out += _checkpoint_lines(row, width)
    hosts = [h for h in doc.get("hosts") or [] if h.get("contacted") and not h.get("answered")]
    if hosts:
        out.append("")
        for host in hosts:
            since = host.get("runs_seen_at")
            out += _pieces([f"{host['host']} did not answer: {host.get('error')}",
                            "its runs are shown as last seen"
                            + (f" at {utc_text(since)}" if since else "")], width, "  ")
    if doc.get("hidden"):
        out.append(f"  {doc['hidden']} older run(s) not shown (finished, stopped or fenced); "
                   "outrig runs --all shows them")
    return out


def last_known_document(record: dict[str, Any], error: str) -> dict[str, Any]:
    """``status --run R --json`` when the box does not answer: the journal's record of the
    run (as :func:`run_row` shapes it), marked as such."""
    row = run_row(record, None, 0.0)
    return {"source": "journal", "reachable": False, "error": error, "run": row}


def last_known_lines(record: dict[str, Any], error: str, width: int) -> list[str]:
    """``status --run R`` when the box does not answer: what the journal last knew, clearly
    said to be that, never the box's own answer."""
    row = run_row(record, None, 0.0)
    seen = row["seen_at"]
    head = visible(f"run {row['run_id']} ({row.get('playbook')}) on {row.get('host')}:")
    state = f"{row.get('state')} as last seen " + (
        f"at {utc_text(seen)}" if seen else "(never seen on its box)")
    out = [f"{head} {state}"] if len(head) + 1 + len(state) <= width else [head, INDENT + state]
    out += wrapped(visible(f"the box did not answer ({error}); this is the journal's last "
                           "known state, not the box's answer now"), width, INDENT)
    details = [("started", utc_text(row["created"]) if row.get("created") else None),
               ("progress", _progress_text(row) or None),
               ("checkpoint", None if not row.get("checkpoint") else
                f"{row['checkpoint'].get('name')} ({row['checkpoint'].get('path')}), seen "
                f"{utc_text(row['checkpoint'].get('at'))}"),
               ("moved", _moved_text(row) or None)]
    for label, value in details:
        if value:
            out += wrapped(visible(f"{label}: {value}"), width, INDENT, INDENT + "  ")
    progress_at = (row.get("progress") or {}).get("at")
    if progress_at:
        out += wrapped(f"progress as of {utc_text(progress_at)}", width, INDENT)
    return out
