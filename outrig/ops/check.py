"""``inv check``: the preflight of a box (reach, python, GPUs and their health, workdir,
disk), one agent call. GPU health is judged here from the facts the box sent
(:mod:`outrig.hosts.gpu_health`): a ``bad`` GPU is shown with its field and fix, not raised: the
box's other GPUs may still serve, and deploy refuses the bad one itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from outrig.console import Reporter
from outrig.errors import RemoteError
from outrig.hosts import gpu_health
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.session import HostSession, Project, host_session


def check(project: Project, host_spec: str, reporter: Reporter,
          journal: Journal | None = None, *, book: HostBook | None = None) -> dict[str, Any]:
    """Preflight: reach, python, GPUs, workdir, disk. Raises when the box is not usable.
    ``book``: the command's hosts, resolved once."""
    with host_session(project, host_spec, reporter, journal, book=book) as session:
        return check_on(session)


def check_on(session: HostSession) -> dict[str, Any]:
    """The preflight on the session's box, reported in one line (or JSON) and returned."""
    reporter = session.reporter
    if reporter.json_mode:  # one document, as status prints: the facts are in it already
        result = session.call("check", handler=_warnings_only(reporter))
    else:
        result = session.call("check")
    rtt = session.transport.rtt
    verdicts, _ = gpu_health.look(session.journal, session.host.name,
                                  result.get("facts") or {})
    result["gpu_health"] = verdicts
    unreadable = unreadable_gpus(session, result.get("facts") or {})
    if reporter.json_mode:
        reporter.emit_json({**result, "rtt": rtt})
    else:
        free = result.get("disk_free_bytes")
        line = (f"{session.host.label()} reachable (RTT {rtt * 1000:.0f} ms), python "
                f"{result.get('python')}, workdir {session.host.workdir} "
                f"{'writable' if result.get('workdir_writable') else 'NOT writable'}"
                + (f", {int(free) / 1e9:.1f} GB free" if isinstance(free, int) else "")
                if rtt is not None else f"{session.host.label()} reachable")
        if unreadable is None:
            reporter.success(line)
        else:  # not a ✓: the box is reachable, but no GPU work can be placed there
            reporter.info(f"• {line}")
        show_health(reporter, verdicts)
    if unreadable is not None:
        raise unreadable
    return result


def unreadable_gpus(session: HostSession, facts: dict[str, Any]) -> RemoteError | None:
    """The error of a box whose nvidia-smi is there but failed (``could not communicate
    with the NVIDIA driver``, exit 9) or hung: its GPUs cannot be read, so a check of it is
    no success (deploy refuses GPU work there too); None for any other box."""
    if not facts.get("gpu_unreadable"):
        return None
    return RemoteError(
        f"{session.host.label()}: the box's GPUs cannot be read ({facts.get('gpu_error')}). "
        "Look at the driver (nvidia-smi on the box; a reboot often brings it back; on a "
        "rented box: ask the provider for another box). Deploy refuses processes with GPUs "
        "there unless given --allow-unhealthy-gpu.", kind="gpu_unhealthy")


def show_health(reporter: Reporter, verdicts: list[dict[str, Any]]) -> None:
    """``• GPU health: 0-6 ok, 7 bad``, then each GPU that is not ok with its fields and
    fix (a bad one as a warning)."""
    head = gpu_health.health_head(verdicts)
    if head is None:
        return
    reporter.info(f"• {head}")
    for verdict in verdicts:
        if verdict["verdict"] == gpu_health.BAD:
            reporter.warn(gpu_health.summary(verdict))
        elif verdict["verdict"] != gpu_health.OK:
            reporter.info(f"  {gpu_health.summary(verdict)}")


def _warnings_only(reporter: Reporter) -> Callable[[dict[str, Any]], None]:
    """With --json: the agent's warnings go to stderr as notes; its ``facts`` event is not
    printed as a document of its own (the result carries the same facts)."""
    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == "warning":
            reporter.warn(str(event.get("msg", "")))
    return on_event
