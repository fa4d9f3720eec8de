"""Locks: the workdir lock every changing op takes (flock with a note of the holder)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from typing import Optional

from .events import AgentError
from .layout import Layout
from .validation import _is_num


class FileLock:
    """An fcntl.flock on ``path``, polled until ``timeout``.

    The holder writes its pid and op into the file, so a waiting agent can name it. The fd is
    not inheritable, so launched processes never hold the lock.
    """

    def __init__(self, path: str, op: str, timeout: float, busy: str) -> None:
        self.path = path
        self.op = op
        self.timeout = timeout
        self.busy = busy  # what it means that someone else holds it, and what to do
        self.fd: Optional[int] = None
        self.unrecorded: Optional[str] = None  # what could not be written (full disk)

    def __enter__(self) -> FileLock:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    os.close(fd)
                    raise
            if time.monotonic() >= deadline:
                holder = self._holder(fd)
                os.close(fd)
                raise AgentError(
                    "lock", f"{self.path} is held by {holder}; waited {self.timeout:g} s"
                            f" ({self.busy})")
            time.sleep(0.1)
        info = {"pid": os.getpid(), "op": self.op, "since": round(time.time(), 3)}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        except OSError as exc:
            # A full disk must not stop a cleanup: the flock itself is held; only the note of
            # who holds it (for a waiting agent's message) is lost.
            self.unrecorded = f"the lock holder in {self.path} ({exc.strerror or exc})"
        self.fd = fd
        return self

    @staticmethod
    def _holder(fd: int) -> str:
        """Who holds the lock, from what it wrote into the file."""
        try:
            raw = os.pread(fd, 4096, 0).decode("utf-8", errors="replace").strip()
            info = json.loads(raw)
            if isinstance(info, dict):
                since = info.get("since")
                when = ""
                if _is_num(since):
                    when = f" since {time.strftime('%H:%M:%S', time.localtime(since))}"
                return f"pid {info.get('pid')} (op {info.get('op')}{when})"
        except (OSError, ValueError):
            pass
        return "an unknown process"

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)  # still holding the lock: nobody else's content
            os.close(self.fd)  # releases the flock
            self.fd = None


class WorkdirLock(FileLock):
    """``<workdir>/.outrig/lock``: one deploy/cleanup at a time per workdir."""

    def __init__(self, layout: Layout, op: str, timeout: float) -> None:
        super().__init__(layout.lock, op, timeout,
                         "another deploy or cleanup is running on this workdir")
