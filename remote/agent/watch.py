"""Deploy's watchers: readiness and fatal-log watching per process, and the cancel line on
stdin."""

from __future__ import annotations

import os
import subprocess
import time
from typing import List, Optional, Set, Tuple

from .constants import DEFAULT_SETTLE_S, JSONDict
from .logs import LogFollower
from .probes import read_exit_file
from .validation import ProcSpec


class Watch:
    """A process launched in this call, and what we know about its readiness.

    ``kinds`` are the conditions that make it ready; a process without ``ready:`` gets the
    single condition ``alive``: still running after the settle window. ``finished`` is set
    when it exited with code 0 before it was ready and nothing waits for it (a resumed
    trainer with nothing left to do): done, not failed."""

    def __init__(
        self, spec: ProcSpec, popen: subprocess.Popen[bytes], record: JSONDict, log_offset: int,
        settle: float = DEFAULT_SETTLE_S, secrets: Optional[List[str]] = None,
    ) -> None:
        self.spec = spec
        self.popen = popen
        self.record = record
        self.follower = LogFollower(record["log"], log_offset, secrets)
        self.t0 = time.monotonic()
        kinds = spec.ready.kinds() if spec.ready is not None else []
        self.kinds = kinds or ["alive"]
        self.settle = settle
        self.met: Set[str] = set()
        self.ready = False
        self.finished = False
        self.ended = False
        self.next_probe = 0.0
        self.probes = 0

    @property
    def done(self) -> bool:
        """Nothing more to wait for: ready, or finished (exited 0 before it was ready)."""
        return self.ready or self.finished

    @property
    def limit(self) -> float:
        """Seconds this process may take to be done: its ready timeout, or the settle window."""
        if self.spec.ready is not None and self.spec.ready.kinds():
            return self.spec.ready.timeout
        return self.settle

    def elapsed(self) -> float:
        """Seconds since launch."""
        return round(time.monotonic() - self.t0, 2)

    def exit_status(self) -> Tuple[Optional[int], Optional[int]]:
        """(code, signal) of the ended process: the exit file, else the wrapper's own status."""
        status = read_exit_file(self.record["exit_file"])
        if status is not None:
            return status
        rc = self.popen.returncode
        if rc is None:
            return None, None
        return (rc, None) if rc >= 0 else (None, -rc)


class CancelWatch:
    """The workstation's Ctrl-C during a deploy: a ``cancel`` line on the agent's stdin.

    Only that line cancels. EOF (the link dropped, the workstation went away) does not: a
    deploy whose workstation vanished still completes, as before. Read without blocking, once
    a tick, from fd 0 (the request, if it came on stdin, was read whole before)."""

    def __init__(self) -> None:
        self.open = True
        self.seen = b""

    def requested(self) -> bool:
        if not self.open:
            return False
        try:
            import select

            ready, _, _ = select.select([0], [], [], 0)
            if not ready:
                return False
            data = os.read(0, 4096)
        except (OSError, ValueError):
            self.open = False
            return False
        if not data:
            self.open = False
            return False
        self.seen = (self.seen + data)[-64:]
        return b"cancel\n" in self.seen


CANCEL_MESSAGE = "deploy cancelled from the workstation (Ctrl-C)"
