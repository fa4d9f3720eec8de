"""``inv check``: the preflight of a box (reach, python, GPUs, workdir, disk), one agent call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.session import HostSession, Project, host_session


def check(project: Project, host_spec: str, reporter: Reporter,
          journal: Journal | None = None) -> dict[str, Any]:
    """Preflight: reach, python, GPUs, workdir, disk. Raises when the box is not usable."""
    with host_session(project, host_spec, reporter, journal) as session:
        return check_on(session)


def check_on(session: HostSession) -> dict[str, Any]:
    """The preflight on the session's box, reported in one line (or JSON) and returned."""
    reporter = session.reporter
    if reporter.json_mode:  # one document, as status prints: the facts are in it already
        result = session.call("check", handler=_warnings_only(reporter))
    else:
        result = session.call("check")
    rtt = session.transport.rtt
    if reporter.json_mode:
        reporter.emit_json({**result, "rtt": rtt})
    else:
        free = result.get("disk_free_bytes")
        reporter.success(
            f"{session.host.label()} reachable (RTT {rtt * 1000:.0f} ms), python "
            f"{result.get('python')}, workdir {session.host.workdir} "
            f"{'writable' if result.get('workdir_writable') else 'NOT writable'}"
            + (f", {int(free) / 1e9:.1f} GB free" if isinstance(free, int) else "")
            if rtt is not None else f"{session.host.label()} reachable")
    return result


def _warnings_only(reporter: Reporter) -> Callable[[dict[str, Any]], None]:
    """With --json: the agent's warnings go to stderr as notes; its ``facts`` event is not
    printed as a document of its own (the result carries the same facts)."""
    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == "warning":
            reporter.warn(str(event.get("msg", "")))
    return on_event
