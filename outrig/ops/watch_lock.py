"""One ``watch`` per run: a lock file per run (and per saved watch) under the journal.

Why: two watches of one run both acted on it: each restarted a crashed run (the second's
redeploy replaced the first's) and each would migrate a dead one. The second ``watch`` is
refused before it writes anything, naming the first's pid.

How: ``<journal>/watches/<name>.lock``, held with ``flock`` for as long as the watch runs, so
the kernel lets it go when the process ends however it ends (no stale lock to clear after a
``kill -9`` or a reboot); the holder writes its pid into it for the refusal to name.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from outrig.errors import ConfigError
from outrig.journal import Journal, safe_name

LOCK_DIR = "watches"


class WatchLock:
    """The locks one watch holds (released by :meth:`release`, or by the process's end)."""

    def __init__(self, journal: Journal) -> None:
        self.folder = journal.root / LOCK_DIR
        self._held: dict[str, int] = {}

    def claim(self, run_id: str, *records: Path) -> None:
        """Hold the run's lock (and each saved watch's, which follows the run across moves);
        a :class:`ConfigError` naming the holder's pid when another watch has one."""
        keys = [f"run-{safe_name(run_id)}", *(f"watch-{record.stem}" for record in records)]
        for key in keys:
            if key in self._held:
                continue
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = self.folder / f"{key}.lock"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                self.release()
                raise ConfigError(
                    f"run {run_id} is already watched by another `outrig watch` (pid "
                    f"{holder}); one watch per run, or their restarts and moves would race. "
                    f"Stop that one first (kill {holder}) or leave it watching. Nothing was "
                    "changed.") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            self._held[key] = fd

    def release(self) -> None:
        """Let every lock go (the files stay: removing one could split a waiting claim)."""
        for fd in self._held.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._held.clear()
