"""One op core on several hosts at once: a thread and a session per host, each with its own
deadline. The session layer's way to many boxes, as :mod:`outrig.session` is its way to one.

A command given a ``--host`` selection of more than one host runs its op core
(``check_on``, ``status_on``, ``cleanup_on``, ``deploy_on``, ...) on every host of it at the
same time, each over its own :class:`~outrig.session.HostSession` (so each host keeps its
own settings, transport, journal entries and link retries). Each host reports into a
:class:`HostReporter` of its own, which keeps its tables and notes quiet (interleaved
progress would garble the output) and collects its warnings. Each host's outcome is handed
to the caller the moment that host finishes (``on_outcome``), so the healthy hosts can be
shown before the slowest deadline runs out (the rows are :mod:`outrig.cli.rows`).

Why a deadline per host rather than one for the command: a dead, blackholed or stalled box
must not hold back the answers of the others. A host still busy past its deadline
(:func:`outrig.timing.fanout_deadline_for`, from its last RTT and the work the command
waits for on the box) is reported as ``no answer within N s``; its thread is a daemon left
to end on its own (its connection is closed), and the command goes on with the rest.

A module apart from :mod:`outrig.session` because it is a concept of its own: threads, a
queue of outcomes and per-host deadlines over many sessions, where a session is one box's
calls (as fabric keeps ``Group`` apart from ``Connection``).
"""

from __future__ import annotations

import io
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from outrig.console import Reporter
from outrig.errors import ConfigError, OutrigError
from outrig.inventory import Host, HostBook
from outrig.journal import Journal
from outrig.session import HostSession, Project
from outrig.text.layout import visible
from outrig.timing import fanout_deadline_for

MAX_PARALLEL = 32  # hosts in progress at once unless --max-parallel says otherwise

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
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "ok": self.ok, "state": self.state,
                "seconds": round(self.seconds, 3), "error": self.error, "result": self.result,
                "warnings": list(self.warnings)}


class HostReporter(Reporter):
    """The reporter of one host of a fan-out: its tables, notes and events go to memory
    (each host's row says what it did), and its warnings are kept, to be shown under its row
    or in its JSON object: a warning such as fencing's "moved run" must reach the user from
    every host, not only when one host is driven alone."""

    def __init__(self, host: str, *, json_mode: bool = False, quiet: bool = True,
                 out: IO[str] | None = None, err: IO[str] | None = None) -> None:
        super().__init__(quiet=quiet, json_mode=json_mode, out=out or io.StringIO(),
                         err=err or io.StringIO())
        self.host = host
        self.warnings: list[str] = []
        self._lock = threading.Lock()

    def warn(self, message: str) -> None:
        with self._lock:
            self.warnings.append(visible(message))

    def taken(self) -> list[str]:
        """The warnings so far (a copy: the host's thread may still add to them)."""
        with self._lock:
            return list(self.warnings)

    def emit_json(self, document: Any) -> None:
        """Nothing: a host's own JSON events would interleave with the others'; its
        result is its line of the fan-out's output."""


@dataclass
class _Running:
    start: float
    limit: float
    session: list[HostSession]  # filled by the worker once the session is open
    reporter: HostReporter


Shown = Callable[[HostOutcome], None]


def run_fanout(project: Project, specs: Sequence[str], core: Core, *,
               max_parallel: int = MAX_PARALLEL, work: float = 0.0,
               deadline: float | None = None, journal: Journal | None = None,
               on_outcome: Shown | None = None,
               reporter_for: Callable[[str], HostReporter] = HostReporter,
               on_interrupt: Callable[[], None] | None = None,
               book: Callable[[str], Host] | None = None) -> list[HostOutcome]:
    """Run ``core`` on every host of ``specs`` (at most ``max_parallel`` in progress at
    once); return one outcome per host, in the order given.

    ``deadline``: seconds each host may take (default: from its RTT, with ``work`` seconds
    of waiting on the box added; see :func:`outrig.timing.fanout_deadline_for`).
    ``on_outcome`` is called (on this thread) with each host's outcome the moment it is
    known, in the order the hosts finish: that is how rows are shown as they come.
    ``reporter_for`` makes each host's reporter (``tail-logs`` prints its lines through
    it). ``deadline`` may be ``math.inf`` (``tail-logs --follow`` runs until stopped).
    ``on_interrupt``: on a first Ctrl-C, call it (it asks the running hosts to stop), give
    the hosts not started yet up, and collect the running ones' outcomes; a second Ctrl-C,
    or any Ctrl-C without it, is raised. ``book``: the command's hosts, each resolved once
    (its target's :class:`~outrig.inventory.HostBook`; a book of its own without one)."""
    if max_parallel < 1:
        raise ConfigError(f"--max-parallel must be at least 1, not {max_parallel}")
    resolve = book or HostBook(project.hosts_dir)
    done: queue.Queue[HostOutcome] = queue.Queue()
    pending = list(dict.fromkeys(specs))
    running: dict[str, _Running] = {}
    outcomes: dict[str, HostOutcome] = {}
    interrupted = False
    while pending or running:
        while pending and len(running) < max_parallel:
            spec = pending.pop(0)
            limit = deadline if deadline is not None else _deadline(resolve(spec), work,
                                                                    journal)
            running[spec] = _Running(time.monotonic(), limit, [], reporter_for(spec))
            threading.Thread(target=_work, name=f"outrig-fanout {spec}", daemon=True,
                             args=(project, spec, resolve, core, journal, running[spec],
                                   done)).start()
        soonest = min(r.start + r.limit for r in running.values())
        try:
            outcome = done.get(timeout=None if soonest == math.inf else
                               max(0.0, soonest - time.monotonic()))
        except KeyboardInterrupt:
            if on_interrupt is None or interrupted:
                raise
            interrupted = True
            on_interrupt()
            for spec in pending:
                outcomes[spec] = HostOutcome(spec, "failed", 0.0,
                                             error="interrupted before it was started")
                if on_outcome is not None:
                    on_outcome(outcomes[spec])
            pending.clear()
            continue
        except queue.Empty:
            for expired in _expire(running):
                outcomes[expired.host] = expired
                if on_outcome is not None:
                    on_outcome(expired)
            continue
        if outcome.host in running:  # a late answer of a host already given up is dropped
            del running[outcome.host]
            outcomes[outcome.host] = outcome
            if on_outcome is not None:
                on_outcome(outcome)
    return [outcomes[spec] for spec in dict.fromkeys(specs)]


def _deadline(host: Host, work: float, journal: Journal | None) -> float:
    rtt = (journal or Journal()).host_facts(host.name).get("rtt")
    return fanout_deadline_for(host, rtt if isinstance(rtt, float) else None, work)[0]


def _work(project: Project, spec: str, resolve: Callable[[str], Host], core: Core,
          journal: Journal | None,
          slot: _Running, done: queue.Queue[HostOutcome]) -> None:
    """One host's thread: open its session, run the core, put the outcome (never raises:
    a failure on one host is that host's result, not the command's)."""
    reporter = slot.reporter
    try:
        session = HostSession(project, spec, reporter, journal, host=resolve(spec))
        slot.session.append(session)
        try:
            result = core(session)
        finally:
            session.close()
        done.put(HostOutcome(spec, "ok", time.monotonic() - slot.start, result=result,
                             warnings=reporter.taken()))
    except OutrigError as exc:
        done.put(HostOutcome(spec, "failed", time.monotonic() - slot.start,
                             error=visible(str(exc)), warnings=reporter.taken()))
    except Exception as exc:  # a bug on one host must not lose the others' results
        done.put(HostOutcome(spec, "failed", time.monotonic() - slot.start,
                             error=f"unexpected {type(exc).__name__}: {visible(str(exc))}; "
                                   "this is a bug in outrig, please report it",
                             warnings=reporter.taken()))


def _expire(running: dict[str, _Running]) -> list[HostOutcome]:
    """Give up on every host past its deadline: its outcome says so, and its connection is
    closed (its thread then ends on its own; nothing waits for it)."""
    now = time.monotonic()
    expired = []
    for spec, slot in list(running.items()):
        if now < slot.start + slot.limit:
            continue
        del running[spec]
        expired.append(HostOutcome(
            spec, "no answer", now - slot.start, warnings=slot.reporter.taken(),
            error=f"no answer within {slot.limit:.0f} s (the box may be down, unreachable or "
                  f"stalled); try `outrig check --host {spec}` on its own"))
        for session in slot.session:
            threading.Thread(target=session.transport.close, daemon=True).start()
    return expired
