"""A command run on a pseudo-terminal (its stdin, stdout and stderr), as a person's shell
runs it: what outrig draws only for a terminal (spinners, colour, cursor moves, the width
it wraps at) is what these tests read."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path


def on_a_terminal(argv: list[str], *, cwd: Path | None = None,
                  env: dict[str, str] | None = None, timeout: float = 60,
                  react: Callable[[int, bytes], None] | None = None) -> tuple[int, bytes]:
    """Run ``argv`` (``argv[0]`` a path) on a pseudo-terminal: its exit status and
    everything it wrote. ``react(pid, output so far)`` is called as output comes (a test
    sends Ctrl-C's SIGINT once it sees what it waits for). A child still running at
    ``timeout`` is killed (its status then says so)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: never returns into the test
        try:
            if cwd is not None:
                os.chdir(cwd)
            os.environ.update(env or {})
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    output = b""
    status: int | None = None
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if react is not None:
                react(pid, output)
            ready, _, _ = select.select([fd], [], [], 0.5)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not chunk:
                break
            output += chunk
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    finally:
        if status is None:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), output
