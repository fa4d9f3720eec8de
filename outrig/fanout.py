"""One command on several hosts at once: a thread per host, each with its own deadline.

A command given a ``--host`` selection of more than one host runs its op core
(``check_on``, ``status_on``, ``cleanup_on``, ``deploy_on``, ...) on every host of it at the
same time, each over its own :class:`~outrig.ops.base.HostSession` (so each host keeps its
own settings, transport, journal entries and link retries). Each host reports into a
:class:`HostReporter` of its own, which keeps its tables and notes quiet (interleaved
progress would garble the output) and collects its warnings. Each host's row (or JSON line)
is printed the moment that host finishes (:class:`Rows`), so the healthy hosts are shown
before the slowest deadline runs out; the failed hosts' reasons follow the table.

Why a deadline per host rather than one for the command: a dead, blackholed or stalled box
must not hold back the answers of the others. A host still busy past its deadline
(:func:`outrig.timing.fanout_deadline_for`, from its last RTT and the work the command
waits for on the box) is reported as ``no answer within N s``; its thread is a daemon left
to end on its own (its connection is closed), and the command goes on with the rest.
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
from outrig.errors import OutrigError
from outrig.inventory import resolve_host
from outrig.journal import Journal
from outrig.ops.base import HostSession, Project
from outrig.textlayout import visible
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
               on_interrupt: Callable[[], None] | None = None) -> list[HostOutcome]:
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
    or any Ctrl-C without it, is raised."""
    if max_parallel < 1:
        from outrig.errors import ConfigError

        raise ConfigError(f"--max-parallel must be at least 1, not {max_parallel}")
    done: queue.Queue[HostOutcome] = queue.Queue()
    pending = list(dict.fromkeys(specs))
    running: dict[str, _Running] = {}
    outcomes: dict[str, HostOutcome] = {}
    interrupted = False
    while pending or running:
        while pending and len(running) < max_parallel:
            spec = pending.pop(0)
            limit = deadline if deadline is not None else _deadline(project, spec, work,
                                                                    journal)
            running[spec] = _Running(time.monotonic(), limit, [], reporter_for(spec))
            threading.Thread(target=_work, name=f"outrig-fanout {spec}", daemon=True,
                             args=(project, spec, core, journal, running[spec], done)).start()
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


def _deadline(project: Project, spec: str, work: float, journal: Journal | None) -> float:
    host = resolve_host(spec, hosts_dir=project.hosts_dir)
    rtt = (journal or Journal()).host_facts(host.name).get("rtt")
    return fanout_deadline_for(host, rtt if isinstance(rtt, float) else None, work)[0]


def _work(project: Project, spec: str, core: Core, journal: Journal | None,
          slot: _Running, done: queue.Queue[HostOutcome]) -> None:
    """One host's thread: open its session, run the core, put the outcome (never raises:
    a failure on one host is that host's result, not the command's)."""
    reporter = slot.reporter
    try:
        session = HostSession(project, spec, reporter, journal)
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
    from outrig.textlayout import audit_gpus

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


def deploy_work(project: Project, job: Any, hosts: Sequence[str]) -> float:
    """Seconds a deploy waits on the box for its processes to be ready (the sum of their
    ready timeouts, as they start one after another), the largest over the hosts' plans;
    added to each host's deadline. A plan that cannot be made here (facts not known yet)
    counts the playbook's own processes."""
    from outrig.ops.deploy import plan_job

    journal = Journal()
    most = sum(p.ready.timeout for p in job.spec.processes.values() if p.ready is not None)
    for spec in hosts:
        try:
            plan = plan_job(job, resolve_host(spec, hosts_dir=project.hosts_dir), journal)
        except OutrigError:
            continue
        most = max(most, sum(p.ready.timeout for p in plan.processes.values()
                             if p.ready is not None))
    return float(most)


def deploy_summary(result: dict[str, Any]) -> str:
    """``run smoke-20260101-000000-ab12 running · server, trainer`` (one host's deploy)."""
    names = ", ".join(str(p.get("process") or p.get("name")) for p in
                      result.get("processes") or [])
    return f"run {result.get('run_id')} {result.get('status')}" + (f" · {names}" if names
                                                                    else "")


def provision_summary(result: dict[str, Any]) -> str:
    """What provision set up (or would, with ``--dry-run``) on one host."""
    envs = result.get("environments") or []
    by_status: dict[str, list[str]] = {}
    for env in envs:
        by_status.setdefault(str(env.get("status")), []).append(str(env.get("name")))
    if not envs:
        return "checks passed; no environments"
    return " · ".join(f"{status}: {', '.join(names)}" for status, names in by_status.items())


def stage_summary(result: dict[str, Any]) -> str:
    """``model present · data pushed 1.2 GB`` (one host's stage)."""
    from outrig.transfer import human_bytes

    parts = []
    for item in result.get("items") or []:
        route = str(item.get("route"))
        moved = int(item.get("bytes") or 0)
        parts.append(f"{item.get('name')} {route}" + (f" {human_bytes(moved)}" if moved else ""))
    checkpoint = result.get("checkpoint")
    if isinstance(checkpoint, dict):
        parts.append(f"checkpoint {checkpoint.get('route', 'placed')}")
    return " · ".join(parts) or "nothing to stage"


def sync_summary(result: dict[str, Any]) -> str:
    """``2 new checkpoint(s) · 1 not complete`` (one host's sync-checkpoints)."""
    text = f"{len(result.get('pulled') or [])} new checkpoint(s)"
    if result.get("not_complete"):
        text += f" · {len(result['not_complete'])} not complete"
    if result.get("refused"):
        text += f" · {len(result['refused'])} refused (moved run)"
    return text


# ------------------------------------------------------------------------------- output


class Rows:
    """The output of a fan-out, printed as it comes: the header first (the host column's
    width is known from the selection), then each host's row (with its warnings under it)
    or JSON line the moment that host finishes, then the failed hosts with their reasons."""

    def __init__(self, reporter: Reporter, hosts: Sequence[str],
                 summarize: Callable[[dict[str, Any]], str], *, what: str) -> None:
        from outrig.textlayout import fanout_header

        self.reporter = reporter
        self.hosts = list(dict.fromkeys(hosts))
        self.summarize = summarize
        self.what = what
        self.header, self.host_width = fanout_header(self.hosts)
        self.started = False

    def start(self) -> None:
        """The header (nothing in --json mode: each line is a whole object)."""
        if not self.started and not self.reporter.json_mode:
            self.reporter.lines([self.header])
        self.started = True

    def show(self, outcome: HostOutcome) -> None:
        """One host's row (or JSON line), now."""
        self.start()
        if self.reporter.json_mode:
            self.reporter.emit_json(outcome.to_json())
            return
        from outrig.textlayout import fanout_row

        summary = self.summarize(outcome.result) if outcome.result is not None else "-"
        self.reporter.lines(fanout_row(outcome.host, outcome.state, summary, outcome.warnings,
                                       self.host_width, self.reporter.width))

    def finish(self, outcomes: Sequence[HostOutcome]) -> None:
        """The failed hosts with their reasons, then :class:`FanOutFailed` naming them, so
        the exit status is 0 only when every host succeeded."""
        self.start()
        failures = [(o.host, o.error or o.state) for o in outcomes if not o.ok]
        if not self.reporter.json_mode:
            from outrig.textlayout import fanout_failures

            self.reporter.lines(fanout_failures(failures, len(outcomes), self.reporter.width))
        if failures:
            raise FanOutFailed(
                f"{self.what} failed on {len(failures)} of {len(outcomes)} hosts: "
                f"{', '.join(h for h, _ in failures)} (the reasons are listed above); the "
                "other hosts' results are shown")


def report(reporter: Reporter, outcomes: Sequence[HostOutcome],
           summarize: Callable[[dict[str, Any]], str], *, what: str) -> None:
    """Show every host's outcome at once (a table, or one JSON line per host) in the order
    given, then raise :class:`FanOutFailed` if any failed (see :class:`Rows`)."""
    rows = Rows(reporter, [o.host for o in outcomes], summarize, what=what)
    for outcome in outcomes:
        rows.show(outcome)
    rows.finish(outcomes)


# ----------------------------------------------------------------------------- tail-logs


class SharedOut:
    """One stream that several hosts' threads write to: each write (a batch of whole lines)
    goes out whole, never interleaved with another host's."""

    def __init__(self, stream: IO[str], lock: threading.Lock) -> None:
        self.stream = stream
        self.lock = lock

    def write(self, text: str) -> int:
        with self.lock:
            return self.stream.write(text)

    def flush(self) -> None:
        with self.lock:
            self.stream.flush()

    def isatty(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())


class LineReporter(HostReporter):
    """The reporter of one host of ``tail-logs`` on several hosts: its log lines go straight
    to the shared stdout (prefixed with the host by the tailer), its notes and warnings to
    stderr as ``HOST | ...`` the moment they happen; warnings are kept too."""

    def __init__(self, host: str, host_width: int, *, json_mode: bool, out: SharedOut,
                 err: SharedOut) -> None:
        super().__init__(host, json_mode=json_mode, quiet=False, out=out)  # type: ignore[arg-type]
        self.err = err
        self.prefix = f"{visible(host):<{host_width}} | "

    def info(self, message: str) -> None:
        self.err.write(f"{self.prefix}{visible(message)}\n")

    def warn(self, message: str) -> None:
        super().warn(message)
        self.err.write(f"{self.prefix}warning: {visible(message)}\n")

    def success(self, message: str) -> None:
        self.info(message)

    def live(self, text: str) -> None:
        """Nothing: a redrawn status line per host would garble the others' lines."""


def tail_summary(result: dict[str, Any]) -> str:
    """``run smoke-2026... · 120 lines · 1 reconnect`` (one host's tail-logs)."""
    reconnects = int(result.get("reconnects") or 0)
    return (f"run {result.get('run_id')} · {result.get('lines')} lines"
            + (f" · {reconnects} reconnect{'s' if reconnects != 1 else ''}" if reconnects
               else ""))


def tail_hosts(project: Project, hosts: Sequence[str], reporter: Reporter, *, follow: bool,
               max_parallel: int = MAX_PARALLEL, stop: threading.Event | None = None,
               **tail: Any) -> list[HostOutcome]:
    """``tail-logs`` on several hosts at once: every line as ``HOST | process | line`` (or
    a JSON object with a ``host`` key) the moment it arrives from any host, exactly once per
    host (each host has its own mirror and cursors). A host that fails (refused, or gone for
    longer than the tailer's reconnects last) ends alone, said at once on stderr as
    ``HOST | failed: reason``; the others go on. At the end the
    failed hosts are named with their reasons on stderr (``--json``: one object per host),
    and :class:`FanOutFailed` is raised if any failed.

    With ``follow`` every host is followed at once (``max_parallel`` is not a bound then:
    a follow never ends by itself) until ``stop`` is set or Ctrl-C. No deadline: a host
    that answers goes on streaming, and one that does not fails on its own connect and
    reconnect limits without holding the others' lines back: a host that has not answered
    once within its fan-out deadline (:func:`outrig.timing.fanout_deadline_for`) is given up,
    one that answered and then went away is retried as with one host."""
    from outrig.ops.logs import tail_on

    stop = stop or threading.Event()
    selection = list(dict.fromkeys(hosts))
    width = max(len(visible(h)) for h in selection)
    lock = threading.Lock()
    out, err = SharedOut(reporter.out, lock), SharedOut(reporter.console.file, lock)

    def ended(outcome: HostOutcome) -> None:
        """Say on stderr, the moment it happens, that a host's lines stopped and why."""
        if not outcome.ok:
            err.write(f"{visible(outcome.host):<{width}} | {outcome.state}: "
                      f"{outcome.error}\n")

    def core(session: HostSession) -> dict[str, Any]:
        first = fanout_deadline_for(session.host, session.transport.best_rtt)[0]
        result = tail_on(session, follow=follow, stop=stop, host_label=session.host_spec,
                         host_width=width, first_answer_within=first, **tail)
        return {"run_id": result.run_id, "lines": result.lines, "bytes": result.bytes,
                "reconnects": result.reconnects,
                "mirror_dir": None if result.mirror_dir is None else str(result.mirror_dir)}

    outcomes = run_fanout(
        project, selection, core, deadline=math.inf,
        max_parallel=len(selection) if follow else max_parallel,
        reporter_for=lambda host: LineReporter(host, width, json_mode=reporter.json_mode,
                                               out=out, err=err),
        on_interrupt=stop.set, on_outcome=ended)
    failures = [(o.host, o.error or o.state) for o in outcomes if not o.ok]
    if reporter.json_mode:
        for outcome in outcomes:
            reporter.emit_json(outcome.to_json())
    elif failures:
        from outrig.textlayout import fanout_failures

        err.write("".join(f"{line}\n" for line in
                          fanout_failures(failures, len(outcomes), reporter.width)[1:]))
    if failures:
        raise FanOutFailed(
            f"tail-logs failed on {len(failures)} of {len(outcomes)} hosts: "
            f"{', '.join(h for h, _ in failures)} (the reasons are listed above); the other "
            "hosts' lines are shown")
    return outcomes
