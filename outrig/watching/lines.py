"""What ``watch`` says: its heartbeat line and the errors of a crashed run and of a dead box
that no spare took, each with what to do next.

Pure wording (no I/O), kept apart from :mod:`outrig.ops.watch` so the loop reads as the loop and
each line is tested on its own (tests/unit/test_watch_lines.py).
"""

from __future__ import annotations

from typing import Any


def heartbeat_line(host: Any, run_id: Any, latest: dict[str, Any], last_answer: float | None,
                   now: float) -> str:
    """``  HOST RUN: running, step 40, loss 0.52, ETA 3m · the box answered 2s ago``: what is
    known, nothing invented (a run without metrics shows its state alone)."""
    parts = [str(latest.get("state") or "waiting for the first answer")]
    for key in ("step", "epoch"):
        if latest.get(key) is not None:
            parts.append(f"{key} {latest[key]}")
    loss = latest.get("loss")
    if isinstance(loss, (int, float)):
        trend = f"{latest['loss_trend']} " if latest.get("loss_trend") else ""
        parts.append(f"loss {trend}{loss:.4g}")
    eta = latest.get("eta_s")
    if isinstance(eta, (int, float)):
        parts.append(f"ETA {_span(float(eta))}")
    answered = ("no answer from the box yet" if last_answer is None
                else f"the box answered {_span(max(0.0, now - last_answer))} ago")
    return f"  {host} {run_id}: {', '.join(parts)} · {answered}"


def _span(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def crash_hint(record: dict[str, Any], why: str, used: int, allowed: int,
               checkpointed: bool) -> str:
    """The error of a run that failed on a box that answers, with what to do next. A resume
    is promised only when a process of the playbook declares ``checkpoints:``."""
    host, run_id, playbook = record.get("host"), record.get("run_id"), record.get("playbook")
    again = (" (its processes with checkpoints: resume from the newest complete one)"
             if checkpointed else "")
    return (f"run {run_id} failed on {host}: {why}. The box answers, so it was not moved "
            f"(used {used} of {allowed} restart(s)). See `outrig tail-logs --host {host} "
            f"--run {run_id}`; to start it again yourself: `outrig deploy --host {host} "
            f"--playbook {playbook}`{again}, or let watch do it: --restarts N")


def death_hint(record: dict[str, Any], host: str, run_id: str, why: str, skipped: list[str],
               checkpointed: bool) -> str:
    """The error of a dead box that no spare took. ``migrate`` resumes from the mirrored
    checkpoint; a playbook without checkpoints is simply deployed on the new box."""
    playbook = record.get("playbook")
    text = (f"{host} is dead ({why}) and no spare took run {run_id}"
            + (f": {'; '.join(skipped)}" if skipped else ": no --spare left")
            + ". Rent a box and write its host file, then ")
    if checkpointed:
        return text + (f"run `outrig migrate --run {run_id} --to NEW` (the mirror holds the "
                       "newest complete checkpoint; the run's playbook, params and box "
                       "address are in the journal, so the old box's host file is not "
                       "needed)")
    return text + f"run `outrig deploy --host NEW --playbook {playbook}` (it starts afresh)"
