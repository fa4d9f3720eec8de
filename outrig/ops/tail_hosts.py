"""``tail-logs`` on several hosts at once: every host's lines as they come, each line whole.

Each host is tailed by :func:`outrig.ops.logs.tail_on` on a session of its own, through the
fan-out executor (:func:`outrig.fanout.run_fanout`, no deadline: a follow runs until stopped),
so exactly-once holds per host (its own mirror and cursors). The hosts' threads write to one
stdout and one stderr through :class:`SharedOut`, a batch of whole lines at a time, and each
host reports through a :class:`LineReporter` that prefixes its notes with the host.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import IO, Any

from outrig.console import Reporter
from outrig.fanout import MAX_PARALLEL, FanOutFailed, HostOutcome, HostReporter, run_fanout
from outrig.ops.logs import tail_on
from outrig.session import HostSession, Project
from outrig.text.layout import fanout_failures, visible
from outrig.timing import fanout_deadline_for


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
        err.write("".join(f"{line}\n" for line in
                          fanout_failures(failures, len(outcomes), reporter.width)[1:]))
    if failures:
        raise FanOutFailed(
            f"tail-logs failed on {len(failures)} of {len(outcomes)} hosts: "
            f"{', '.join(h for h, _ in failures)} (the reasons are listed above); the other "
            "hosts' lines are shown")
    return outcomes
