"""Small process and port helpers shared by the integration tests (test code only).

Everything here looks, it never kills: tests end only what they recorded themselves.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup
from outrig.sandbox.box import children_of
from outrig.session import Project


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def alive(pid: int) -> bool:
    """Running and not a zombie (this machine's PID 1 may never reap orphans)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """Wait until none of ``pids`` is alive; return those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def marked(run_id: str) -> list[int]:
    """Live pids carrying the run's marker: what must be gone after a cleanup."""
    needle = f"OUTRIG_RUN={run_id}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if needle in environ and alive(int(entry)):
                out.append(int(entry))
    return out


def group_members(pgid: int) -> list[int]:
    """Live pids of one process group (renamed vLLM children keep the group, not the marker:
    setproctitle clears what /proc/PID/environ shows, docs/cleanup.md)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                rest = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(rest[2]) == pgid and rest[0] not in (b"Z", b"X"):
            found.append(int(entry))
    return sorted(found)


def children(pid: int) -> list[int]:
    """Direct children of ``pid``."""
    return children_of(pid)


def stop_every_run(project: Project, host: str, state: Path) -> None:
    """Teardown: outrig's own cleanup of every run on ``host`` (by its records, journal in
    ``state``). A failure is printed, not raised: the test's own failure matters more."""
    try:
        cleanup(project, host, Reporter(quiet=True), all_runs=True, journal=Journal(state))
    except Exception as exc:
        print(f"teardown cleanup failed: {exc}", file=sys.stderr)
