"""Serve mode: the resident agent of one kept connection (docs/agent-protocol.md, "Live agent").

Why: on the exec path every call pays a channel open, an exec, a new sshd session with the
account's shell start-up, a Python start and the agent's imports on the box. The workstation's
keeper starts this once per connection on a channel of its own; a request is then one frame in
and its events out, and costs the link one round trip.

- **One request, one child.** Each request runs in a child forked from this process (which has
  the agent's modules imported already), in a session of its own, with its own stdin, stdout
  and stderr pipes, running exactly what the exec path runs (``__main__.run``): the request's
  env is applied in the child only, a crash is that request's alone, and two requests never
  share state. Requests run side by side, multiplexed by id.
- **This process only relays bytes** (single-threaded, ``select``): it never blocks on a child,
  so one slow request cannot hold up another's frames.
- **It lives exactly as long as its stdin** (the channel). At EOF it closes every child's
  pipes, which is what sshd does when a channel closes under the exec path: the child sees EOF
  on stdin (a deploy carries on to a consistent end, a follow stops) and EPIPE on its next
  write. Nothing of it outlives the connection by more than a child's last step.
- **Heartbeats.** When it has sent nothing for ``heartbeat`` seconds it sends an ``h`` frame, so
  the keeper hears the box often enough never to need a keepalive probe before lending the
  link, and learns of a dead link within a few RTTs even while no request runs.

- **A request never runs late.** ``Q`` carries a deadline on this process's own clock (the
  keeper learns the clock from ``R`` and each ``h``): a request read after it is refused, never
  started, because by then the keeper has given up on it (this process was stopped or starved)
  and served it elsewhere. A request that is started is acknowledged at once (``a``), so the
  keeper knows which requests it may still hand to the exec path.

Frames, both ways: one kind byte, the request id and the payload's length (``>cII``), then the
payload. Keeper to agent: ``Q`` (a request: its deadline, ``>d``, then its JSON line), ``q`` (a
request without a deadline), ``i`` (stdin bytes), ``e`` (stdin's end), ``c`` (the client is
gone: close the child's pipes). Agent to keeper: ``R`` (ready, id 0: digest, pid, Python
version, clock), ``a`` (the request was started), ``o`` (stdout bytes), ``r`` (stderr bytes),
``x`` (the exit status, JSON), ``h`` (heartbeat, id 0: the clock, ``>d``). Stdlib only,
Python 3.8.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import struct
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

FRAME = struct.Struct(">cII")  # kind, request id, payload length
MAX_PAYLOAD = 1 << 20  # one frame's payload at most (the keeper splits longer writes)
DEFAULT_HEARTBEAT_S = 0.5
STDIN_LIMIT = 64 << 20  # a child that leaves this much of its stdin unread is cut off
READ_CHUNK = 65536
FORK_FAILED = 75  # the exit status of a request that could not be started (EX_TEMPFAIL)
EXPIRED = 76  # the exit status of a request read after its deadline (never started)
CLOCK = struct.Struct(">d")  # a ``Q`` frame's deadline and an ``h`` frame's clock


def frame(kind: bytes, rid: int, payload: bytes = b"") -> bytes:
    """One frame (both sides use it: the keeper imports it through ``outrig.agent_code``)."""
    return FRAME.pack(kind, rid, len(payload)) + payload


class FrameBuffer:
    """Frames out of a byte stream that arrives in pieces."""

    def __init__(self) -> None:
        self.data = bytearray()

    def feed(self, chunk: bytes) -> List[Tuple[bytes, int, bytes]]:
        """Add ``chunk``; every frame now whole, as ``(kind, id, payload)``. A length over
        :data:`MAX_PAYLOAD` is a broken stream: ``ValueError``."""
        self.data.extend(chunk)
        out = []
        while len(self.data) >= FRAME.size:
            kind, rid, size = FRAME.unpack_from(self.data)
            if size > MAX_PAYLOAD:
                raise ValueError(f"frame of {size} bytes")
            end = FRAME.size + size
            if len(self.data) < end:
                break
            out.append((kind, rid, bytes(self.data[FRAME.size:end])))
            del self.data[:end]
        return out


class Child:
    """One request's process and this side's ends of its pipes."""

    def __init__(self, rid: int, pid: int, stdin: int, stdout: int, stderr: int) -> None:
        self.rid = rid
        self.pid = pid
        self.stdin: Optional[int] = stdin
        self.stdout: Optional[int] = stdout
        self.stderr: Optional[int] = stderr
        self.pending = bytearray()  # stdin bytes the child has not taken yet
        self.stdin_ends = False  # the client closed stdin: close it once pending is written
        self.status: Optional[int] = None  # set once reaped
        self.gone = False  # the client went away: nothing more is sent for it


def _close(fd: Optional[int]) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def _child_fds_closed() -> None:
    """In a new child: close every inherited descriptor above stderr (other requests' pipes,
    the channel itself), so a request holds only its own."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        names = [str(n) for n in range(3, 1024)]
    for name in names:
        fd = int(name)
        if fd > 2:
            _close(fd)


class Server:
    """The relay between the channel (``fd_in``/``fd_out``) and the requests' children."""

    def __init__(self, run: Callable[[bytes], None], *, heartbeat: float,
                 preload: Callable[[], None], fd_in: int = 0, fd_out: int = 1) -> None:
        self.run = run  # runs one request line in a child (``__main__.run``)
        self.heartbeat = heartbeat
        self.preload = preload
        self.preloaded = False
        self.fd_in, self.fd_out = fd_in, fd_out
        self.frames = FrameBuffer()
        self.children: Dict[int, Child] = {}
        self.by_fd: Dict[int, Child] = {}
        self.last_sent = 0.0
        self.wake_r = -1  # the read end of the SIGCHLD wake-up pipe (set by :meth:`serve`)

    # ---------------------------------------------------------------- the channel

    def send(self, kind: bytes, rid: int, payload: bytes = b"") -> None:
        data = memoryview(frame(kind, rid, payload))
        while data:
            try:
                data = data[os.write(self.fd_out, data):]
            except InterruptedError:
                continue
        self.last_sent = time.monotonic()

    def serve(self, info: Dict[str, object]) -> int:
        """Say ready, then relay until stdin's end. A child's exit wakes the loop (SIGCHLD
        through a wake-up pipe), so its exit status follows its last output at once."""
        self.wake_r, wake_w = os.pipe()
        for fd in (self.wake_r, wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.send(b"R", 0, json.dumps({**info, "clock": time.monotonic()}).encode())
        while True:
            if not self.step():
                break
        for child in list(self.children.values()):
            self.drop(child)
        return 0

    def step(self) -> bool:
        """One round of the loop; ``False`` once the channel's stdin has ended."""
        readers = [self.fd_in, self.wake_r, *self.by_fd]
        writers = [c.stdin for c in self.children.values() if c.pending and c.stdin is not None]
        wait = max(0.0, self.heartbeat - (time.monotonic() - self.last_sent))
        if not self.preloaded and not self.children:
            wait = 0.0  # nothing to do yet: import what requests need, then wait
        try:
            readable, writable, _ = select.select(readers, writers, [], wait)
        except InterruptedError:
            return True
        if not readable and not writable and not self.preloaded:
            self.preloaded = True
            self.preload()
        for fd in writable:
            child = self.by_stdin(fd)
            if child is not None:
                self.feed_stdin(child)
        for fd in readable:
            if fd == self.wake_r:
                with contextlib.suppress(OSError):
                    os.read(fd, 4096)
            elif fd == self.fd_in:
                if not self.take_input():
                    return False
            else:
                self.relay_output(fd)
        self.reap()
        if time.monotonic() - self.last_sent >= self.heartbeat:
            self.send(b"h", 0, CLOCK.pack(time.monotonic()))
        return True

    def take_input(self) -> bool:
        """Read the channel and act on every whole frame; ``False`` at its end."""
        try:
            chunk = os.read(self.fd_in, READ_CHUNK)
        except InterruptedError:
            return True
        except OSError:
            return False
        if not chunk:
            return False
        try:
            frames = self.frames.feed(chunk)
        except ValueError:
            return False  # a broken stream: nothing after it can be trusted
        for kind, rid, payload in frames:
            self.on_frame(kind, rid, payload)
        return True

    def on_frame(self, kind: bytes, rid: int, payload: bytes) -> None:
        if kind == b"Q" and len(payload) >= CLOCK.size:
            late = time.monotonic() - CLOCK.unpack_from(payload)[0]
            if late > 0:  # the keeper has given this request up: it must never run now
                self.send(b"r", rid, f"outrig agent: refused a request read {late:.1f} s "
                          "after its deadline (this agent was stopped or starved)\n".encode())
                self.send(b"x", rid, json.dumps(EXPIRED).encode())
            elif rid not in self.children:
                self.spawn(rid, payload[CLOCK.size:])
            return
        if kind == b"q":
            if rid not in self.children:
                self.spawn(rid, payload)
            return
        child = self.children.get(rid)
        if child is None:
            return
        if kind == b"i" and child.stdin is not None and not child.stdin_ends:
            child.pending.extend(payload)
            if len(child.pending) > STDIN_LIMIT:
                self.drop(child)  # never let one child's unread stdin fill this process
            else:
                self.feed_stdin(child)
        elif kind == b"e":
            child.stdin_ends = True
            self.feed_stdin(child)
        elif kind == b"c":
            self.drop(child)

    # ---------------------------------------------------------------- children

    def spawn(self, rid: int, line: bytes) -> None:
        """Fork the child that runs ``line``; its stdin, stdout and stderr are new pipes."""
        fds: List[int] = []
        try:
            for _ in range(3):
                fds.extend(os.pipe())
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
        except OSError as exc:  # no process or descriptor left: this request fails, alone
            for fd in fds:
                _close(fd)
            self.send(b"r", rid, f"outrig agent: cannot start the request on the box: "
                      f"{exc.strerror or exc}\n".encode())
            self.send(b"x", rid, json.dumps(FORK_FAILED).encode())
            return
        in_r, in_w, out_r, out_w, err_r, err_w = fds
        if pid == 0:  # the child: never returns
            code = 0
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.setsid()  # a session of its own, as sshd gives the exec path's agent
                os.dup2(in_r, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                _child_fds_closed()
                self.run(line)
            except BaseException:  # the run reports its own errors; this is a last resort
                code = 70
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        for fd in (in_w, out_r, err_r):
            os.set_blocking(fd, False)
        child = Child(rid, pid, in_w, out_r, err_r)
        self.children[rid] = child
        self.by_fd[out_r] = child
        self.by_fd[err_r] = child
        self.send(b"a", rid)

    def by_stdin(self, fd: int) -> Optional[Child]:
        for child in self.children.values():
            if child.stdin == fd:
                return child
        return None

    def feed_stdin(self, child: Child) -> None:
        """Write what the child's stdin pipe takes now; close it after its end was sent."""
        while child.pending and child.stdin is not None:
            try:
                written = os.write(child.stdin, child.pending[:READ_CHUNK])
            except BlockingIOError:
                return
            except OSError as exc:  # the child closed its stdin: nothing more can go there
                if exc.errno not in (errno.EPIPE, errno.EBADF):
                    raise
                child.pending.clear()
                break
            del child.pending[:written]
        if child.stdin_ends and not child.pending and child.stdin is not None:
            _close(child.stdin)
            child.stdin = None

    def relay_output(self, fd: int) -> None:
        child = self.by_fd.get(fd)
        if child is not None:
            self.relay_chunk(child, fd)

    def relay_chunk(self, child: Child, fd: int) -> bool:
        """Relay one read of a child's ``fd``; ``False`` when nothing more comes now (it would
        block) or ever (its end: then it is closed)."""
        try:
            chunk = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self.forget_fd(child, fd)
            return False
        if not child.gone:
            self.send(b"o" if fd == child.stdout else b"r", child.rid, chunk)
        return True

    def forget_fd(self, child: Child, fd: int) -> None:
        self.by_fd.pop(fd, None)
        _close(fd)
        if fd == child.stdout:
            child.stdout = None
        elif fd == child.stderr:
            child.stderr = None

    def drain(self, child: Child) -> None:
        """After the child exited: relay what its pipes still hold, then close them (a
        process it left behind may hold their other ends open forever)."""
        for fd in (child.stdout, child.stderr):
            while fd is not None and fd in self.by_fd and self.relay_chunk(child, fd):
                pass
            if fd is not None and fd in self.by_fd:
                self.forget_fd(child, fd)

    def reap(self) -> None:
        """Collect exited children; send each one's exit status after its last output."""
        for child in list(self.children.values()):
            if child.status is None:
                try:
                    pid, status = os.waitpid(child.pid, os.WNOHANG)
                except ChildProcessError:
                    pid, status = child.pid, 0
                if pid == 0:
                    continue
                child.status = os.waitstatus_to_exitcode(status) if hasattr(
                    os, "waitstatus_to_exitcode") else (status >> 8 if status & 0x7F == 0
                                                        else -(status & 0x7F))
            self.drain(child)
            if not child.gone:
                self.send(b"x", child.rid, json.dumps(child.status).encode())
            self.finish(child)

    def drop(self, child: Child) -> None:
        """The client is gone (or the channel ended): close the child's pipes, as sshd closes
        a channel's; it is still reaped when it exits."""
        child.gone = True
        child.pending.clear()
        _close(child.stdin)
        child.stdin = None
        for fd in (child.stdout, child.stderr):
            if fd is not None:
                self.forget_fd(child, fd)

    def finish(self, child: Child) -> None:
        _close(child.stdin)
        child.stdin = None
        for fd in (child.stdout, child.stderr):
            if fd is not None:
                self.forget_fd(child, fd)
        self.children.pop(child.rid, None)


def serve(options: Dict[str, object], run: Callable[[bytes], None],
          preload: Callable[[], None], digest: str) -> None:
    """Run serve mode on this process's stdin and stdout until stdin ends."""
    try:
        heartbeat = float(options.get("heartbeat") or DEFAULT_HEARTBEAT_S)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        heartbeat = DEFAULT_HEARTBEAT_S
    server = Server(run, heartbeat=max(0.05, heartbeat), preload=preload)
    info = {"digest": digest, "pid": os.getpid(), "python": sys.version.split()[0]}
    sys.exit(server.serve(info))
