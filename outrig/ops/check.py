"""``inv check``: the preflight of a box (reach, python, GPUs, workdir, disk), one agent call."""

from __future__ import annotations

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
    result = session.call("check")
    rtt = session.transport.rtt
    if reporter.json_mode:
        reporter.emit_json({**result, "rtt": rtt})
    else:
        free = result.get("disk_free_bytes")
        reporter.success(
            f"{session.host.describe()} reachable (RTT {rtt * 1000:.0f} ms), python "
            f"{result.get('python')}, workdir {session.host.workdir} "
            f"{'writable' if result.get('workdir_writable') else 'NOT writable'}"
            + (f", {int(free) / 1e9:.1f} GB free" if isinstance(free, int) else "")
            if rtt is not None else f"{session.host.describe()} reachable")
    return result
