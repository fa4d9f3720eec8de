"""The ``local`` connector: the agent runs as a child process of this machine.

``hostname: local`` in a host file (``--host local``), and the fast path in tests. There is no
link to lose: the RTT is zero, a reconnect has nothing to do, and a look from outside
(``probe``, ``confirm_alive``) finds this machine up by construction, so ``watch`` judges a
local run by its agent's answers alone.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import time
from collections.abc import Callable

from outrig.errors import OutrigError
from outrig.inventory import Host
from outrig.transport import AgentChannel, Transport
from outrig.watching.health import Observation


class _LocalChannel(AgentChannel):
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.sel = selectors.DefaultSelector()
        assert proc.stdout is not None and proc.stderr is not None
        self.sel.register(proc.stdout, selectors.EVENT_READ, "out")
        self.sel.register(proc.stderr, selectors.EVENT_READ, "err")
        self._err = bytearray()
        self._out_eof = False

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while not self._out_eof:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            for key, _ in self.sel.select(remaining):
                chunk = os.read(key.fd, 65536)
                if key.data == "err":
                    if chunk:
                        self._err.extend(chunk)
                    else:
                        self.sel.unregister(key.fileobj)
                    continue
                if not chunk:
                    self._out_eof = True
                    return b""
                return chunk
        return b""

    def close_input(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def stderr_text(self) -> str:
        assert self.proc.stderr is not None
        if self.proc.poll() is not None:
            try:
                rest = self.proc.stderr.read()
                if rest:
                    self._err.extend(rest)
            except (OSError, ValueError):
                pass
        return self._err.decode("utf-8", "replace")

    def exit_status(self, timeout: float = 5.0) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        if self.proc.poll() is None:
            # The agent itself (our child, recorded by Popen) — never its launched processes,
            # which live in their own sessions.
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.sel.close()


class LocalTransport(Transport):
    name = "local"

    """Runs the agent on this machine: ``--host local``, and the fast path in tests."""

    def __init__(self, host: Host, *, rtt_hint: float | None = None,
                 notify: Callable[[str], None] | None = None,
                 keep_seconds: float | None = None) -> None:
        """``rtt_hint``, ``notify`` and ``keep_seconds`` are every connector's arguments; a
        local child has no link to time, report on or keep warm."""
        self.host = host
        self.rtt = 0.0

    def start(self, argv: list[str], *, window_size: int | None = None) -> AgentChannel:
        env = dict(os.environ)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=env, cwd="/")
        except FileNotFoundError:
            raise OutrigError(
                f"cannot run {argv[0]!r} on this machine: not found. Install python3 (≥3.8) "
                "or point python: at an interpreter"
            ) from None
        return _LocalChannel(proc)

    def probe(self, timeout: float) -> list[Observation]:
        """This machine, seen from itself: no door that could be shut, so ``tcp`` and
        ``banner`` both answer."""
        now = time.monotonic()
        return [Observation(now, "tcp", True), Observation(now, "banner", True)]

    def confirm_alive(self, timeout: float) -> Observation:
        """This machine is up while this code runs."""
        return Observation(time.monotonic(), "confirm", True, "local")
