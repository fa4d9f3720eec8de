"""Processes a test started or looks at: liveness, waiting for them to go, the run marker,
and :class:`ProcessTracker`, which ends exactly what a test started.

Everything but the tracker looks, it never kills: tests end only what they recorded themselves.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from outrig.sandbox.box import children_of
from outrig.sandbox.service import start_ticks


def alive(pid: int) -> bool:
    """Running and neither a zombie nor dead (this machine's PID 1 may never reap orphans)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
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


MARK_ENV = "OUTRIG_TEST_MARK"


class ProcessTracker:
    """Starts processes in their own group and kills exactly what a test started, at teardown.

    What is killed: every recorded process group (``killpg``), every recorded pid, and every
    process whose environment carries this test's marker (``OUTRIG_TEST_MARK=<uuid>``), which
    catches children that called setsid and left the group. Nothing is matched by name.

    Each pid and group is recorded with its start ticks, and signalled only while it is
    still that process (a group: while no other process holds its leader's pid; Linux
    does not hand out a number that is still some living process's group id). This machine's
    pid_max may be 32768, which a long suite goes through more than once: a pid recorded
    minutes ago can be another test's process by now (a vLLM worker, say).
    """

    def __init__(self) -> None:
        self.mark = uuid.uuid4().hex
        self.groups: list[tuple[int, int | None]] = []
        self.pids: list[tuple[int, int | None]] = []
        self.popens: list[subprocess.Popen[Any]] = []

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """os.environ + ``extra`` + this tracker's marker."""
        env = dict(os.environ)
        env.update(extra or {})
        env[MARK_ENV] = self.mark
        return env

    def spawn(self, argv: list[str], *, env: dict[str, str] | None = None,
              **kw: Any) -> subprocess.Popen[Any]:
        """Popen in a new session (pid = pgid = sid), marked and recorded."""
        kw.setdefault("stdin", subprocess.DEVNULL)
        proc: subprocess.Popen[Any] = subprocess.Popen(
            argv, env=self.env(env), start_new_session=True, **kw)
        self.popens.append(proc)
        self.track_group(proc.pid)  # not reaped before wait(): its stat is there
        return proc

    def track_group(self, pgid: int) -> None:
        self.groups.append((pgid, start_ticks(pgid)))

    def track_pid(self, pid: int) -> None:
        self.pids.append((pid, start_ticks(pid)))

    def marked_pids(self) -> list[int]:
        """Live pids whose environment holds this tracker's marker."""
        needle = f"{MARK_ENV}={self.mark}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if needle in environ.split(b"\0"):
                found.append(int(entry))
        return found

    def cleanup(self) -> list[int]:
        """SIGKILL everything tracked; return the pids that were still running (for reports)."""
        leftovers = self.marked_pids()
        for pgid, ticks in self.groups:
            now = start_ticks(pgid)
            if now is not None and now != ticks:
                continue  # the leader's pid is another process's now: so is the group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        targets = [*self.pids, *((pid, start_ticks(pid)) for pid in leftovers)]
        for pid, ticks in targets:
            if ticks is None or start_ticks(pid) != ticks:
                continue  # gone, or its pid is another process's now
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and self.marked_pids():
            time.sleep(0.05)
        return leftovers
