"""One command on several hosts at once: a thread per host, each with its own deadline.

``check``, ``status`` and ``cleanup`` with a ``--host`` selection of more than one host run
their op core (``check_on``, ``status_on``, ``cleanup_on``) on every host of it at the same
time, each over its own :class:`~outrig.ops.base.HostSession` (so each host keeps its own
settings, transport, journal entries and link retries). Each host reports into a quiet
reporter of its own, so interleaved progress cannot garble the output; the results are
collected and rendered once, as one table (:func:`outrig.layout.fanout_lines`) or one JSON
line per host.

Why a deadline per host rather than one for the command: a dead, blackholed or stalled box
must not hold back the answers of the others. A host still busy past its deadline
(:func:`outrig.timing.fanout_deadline_for`, from its last RTT) is reported as ``no answer
within N s``; its thread is a daemon left to end on its own (its connection is closed), and
the command goes on with the rest.
"""

from __future__ import annotations

import io
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from outrig.console import Reporter, visible
from outrig.errors import OutrigError
from outrig.inventory import resolve_host
from outrig.journal import Journal
from outrig.ops.base import HostSession, Project
from outrig.timing import fanout_deadline_for

MAX_PARALLEL = 16  # hosts in progress at once unless --max-parallel says otherwise

Core = Callable[[HostSession], dict[str, Any]]


class FanOutFailed(OutrigError):
    """Some hosts of a selection failed or gave no answer; the others' results were shown."""


@dataclass
class HostOutcome:
    """What one host of the selection gave: its result, or why it failed."""

    host: str
    state: str  # "ok", "failed" or "no answer"
    seconds: float
    result: dict[str, Any] | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "ok": self.ok, "state": self.state,
                "seconds": round(self.seconds, 3), "error": self.error, "result": self.result}


def quiet_reporter() -> Reporter:
    """A reporter per host that shows nothing (its tables and notes go to memory): the
    results are rendered together once every host has answered or run out of time."""
    return Reporter(quiet=True, out=io.StringIO(), err=io.StringIO())


@dataclass
class _Running:
    start: float
    limit: float
    session: list[HostSession]  # filled by the worker once the session is open


def run_fanout(project: Project, specs: Sequence[str], core: Core, *,
               max_parallel: int = MAX_PARALLEL, work: float = 0.0,
               deadline: float | None = None,
               journal: Journal | None = None) -> list[HostOutcome]:
    """Run ``core`` on every host of ``specs`` (at most ``max_parallel`` in progress at
    once); return one outcome per host, in the order given.

    ``deadline``: seconds each host may take (default: from its RTT, with ``work`` seconds
    of waiting on the box added; see :func:`outrig.timing.fanout_deadline_for`)."""
    if max_parallel < 1:
        from outrig.errors import ConfigError

        raise ConfigError(f"--max-parallel must be at least 1, not {max_parallel}")
    done: queue.Queue[HostOutcome] = queue.Queue()
    pending = list(dict.fromkeys(specs))
    running: dict[str, _Running] = {}
    outcomes: dict[str, HostOutcome] = {}
    while pending or running:
        while pending and len(running) < max_parallel:
            spec = pending.pop(0)
            limit = deadline if deadline is not None else _deadline(project, spec, work,
                                                                    journal)
            running[spec] = _Running(time.monotonic(), limit, [])
            threading.Thread(target=_work, name=f"outrig-fanout {spec}", daemon=True,
                             args=(project, spec, core, journal, running[spec], done)).start()
        soonest = min(r.start + r.limit for r in running.values())
        try:
            outcome = done.get(timeout=max(0.0, soonest - time.monotonic()))
        except queue.Empty:
            _expire(running, outcomes)
            continue
        if outcome.host in running:  # a late answer of a host already given up is dropped
            del running[outcome.host]
            outcomes[outcome.host] = outcome
    return [outcomes[spec] for spec in dict.fromkeys(specs)]


def _deadline(project: Project, spec: str, work: float, journal: Journal | None) -> float:
    host = resolve_host(spec, hosts_dir=project.hosts_dir)
    rtt = (journal or Journal()).host_facts(host.name).get("rtt")
    return fanout_deadline_for(host, rtt if isinstance(rtt, float) else None, work)[0]


def _work(project: Project, spec: str, core: Core, journal: Journal | None,
          slot: _Running, done: queue.Queue[HostOutcome]) -> None:
    """One host's thread: open its session, run the core, put the outcome (never raises:
    a failure on one host is that host's result, not the command's)."""
    try:
        session = HostSession(project, spec, quiet_reporter(), journal)
        slot.session.append(session)
        try:
            result = core(session)
        finally:
            session.close()
        done.put(HostOutcome(spec, "ok", time.monotonic() - slot.start, result=result))
    except OutrigError as exc:
        done.put(HostOutcome(spec, "failed", time.monotonic() - slot.start,
                             error=visible(str(exc))))
    except Exception as exc:  # a bug on one host must not lose the others' results
        done.put(HostOutcome(spec, "failed", time.monotonic() - slot.start,
                             error=f"unexpected {type(exc).__name__}: {visible(str(exc))}; "
                                   "this is a bug in outrig, please report it"))


def _expire(running: dict[str, _Running], outcomes: dict[str, HostOutcome]) -> None:
    """Give up on every host past its deadline: report it and close its connection (its
    thread then ends on its own; nothing waits for it)."""
    now = time.monotonic()
    for spec, slot in list(running.items()):
        if now < slot.start + slot.limit:
            continue
        del running[spec]
        outcomes[spec] = HostOutcome(
            spec, "no answer", now - slot.start,
            error=f"no answer within {slot.limit:.0f} s (the box may be down, unreachable or "
                  f"stalled); try `outrig check --host {spec}` on its own")
        for session in slot.session:
            threading.Thread(target=session.transport.close, daemon=True).start()


# ----------------------------------------------------------------------------- summaries


def status_summary(result: dict[str, Any]) -> str:
    """``2 runs: smoke running, job failed · GPUs 6/8 free`` (one host's status)."""
    runs = result.get("runs") or []
    if runs:
        states = ", ".join(f"{r.get('playbook')} {r.get('status')}" for r in runs)
        text = f"{len(runs)} run{'s' if len(runs) != 1 else ''}: {states}"
    else:
        text = "no runs"
    return f"{text} · {gpus_free(result.get('gpus') or [], result.get('gpu_error'))}"


def gpus_free(gpus: Sequence[dict[str, Any]], error: Any = None) -> str:
    """``GPUs 6/8 free`` (a GPU is free when nothing holds it)."""
    if not gpus:
        return f"GPUs: none ({error})" if error else "GPUs: none"
    free = sum(1 for g in gpus if not g.get("holders"))
    return f"GPUs {free}/{len(gpus)} free"


def cleanup_summary(result: dict[str, Any]) -> str:
    """What cleanup stopped (or would stop, with ``--dry-run``) on one host."""
    runs = result.get("runs") or []
    procs = sum(len(r.get("processes") or []) for r in runs)
    if result.get("dry_run"):
        text = f"would stop {len(runs)} run(s), {procs} process(es)"
    elif runs:
        text = f"stopped {', '.join(str(r.get('run_id')) for r in runs)} ({procs} process(es))"
    else:
        text = "nothing of ours was running"
    from outrig.layout import audit_gpus

    audit = result.get("gpus_after") or result.get("gpus_before") or {}
    foreign = [h for h in audit.get("holders") or [] if not h.get("owner")]
    if foreign:
        text += f" · {len(foreign)} foreign GPU holder(s) left alone"
    if audit.get("gpus"):
        text += f" · {gpus_free(audit_gpus(audit))}"
    return text


def check_summary(result: dict[str, Any]) -> str:
    """``python 3.12.3 · 8 GPUs · RTT 240 ms · 12.3 GB free`` (one host's check)."""
    facts = result.get("facts") or {}
    gpus = facts.get("gpus")
    parts = [f"python {result.get('python')}",
             f"{len(gpus)} GPUs" if isinstance(gpus, list) else "GPUs unknown"]
    rtt = result.get("rtt")
    if isinstance(rtt, float):
        parts.append(f"RTT {rtt * 1000:.0f} ms")
    free = result.get("disk_free_bytes")
    if isinstance(free, int):
        parts.append(f"{free / 1e9:.1f} GB free")
    if not result.get("workdir_writable", True):
        parts.append("workdir NOT writable")
    return " · ".join(parts)


# ------------------------------------------------------------------------------- output


def report(reporter: Reporter, outcomes: Sequence[HostOutcome],
           summarize: Callable[[dict[str, Any]], str], *, what: str) -> None:
    """Show every host's outcome (a table, or one JSON line per host), then raise
    :class:`FanOutFailed` naming the hosts that failed, so the exit status is 0 only when
    every host succeeded."""
    if reporter.json_mode:
        for outcome in outcomes:
            reporter.emit_json(outcome.to_json())
    else:
        from outrig.layout import fanout_lines

        rows = [(o.host, o.state, summarize(o.result) if o.result is not None else "-")
                for o in outcomes]
        failures = [(o.host, o.error or o.state) for o in outcomes if not o.ok]
        reporter.lines(fanout_lines(rows, failures, reporter.width))
    failed = [o.host for o in outcomes if not o.ok]
    if failed:
        raise FanOutFailed(f"{what} failed on {len(failed)} of {len(outcomes)} hosts: "
                           f"{', '.join(failed)} (the reasons are listed above); the other "
                           "hosts' results are shown")
