"""The live agent: the box's resident agent on one channel of a kept connection.

The keeper (:mod:`outrig.connectors.keeper.daemon`) starts it on the first agent call it relays on
the exec path, with that call's own bundle, off the clock of any command; from the moment it
says it is ready, each agent call through the keeper is one request frame on its channel and
its output back (``remote/agent/serve.py`` is the box's side; docs/agent-protocol.md, "Live
agent"). No channel open, no exec, no sshd session, shell or Python start on the box: a warm
call costs the link one round trip plus the work itself.

What keeps it honest:

- **Same code.** It answers ready with the digest of the bundle it runs, and a request is
  served only when its own bundle's digest (and Python) is that one; any other request goes the
  exec path and starts a live agent of its own bundle in place of the old one, which leaves
  once its last request is over.
- **Same life.** It lives exactly as long as its channel: the keeper closing or the link dying
  ends it on the box (its stdin ends). A live agent that dies while the link is up ends the
  requests it had started as lost contact, saying why (``L``: a follow resumes, a deploy
  says that what it launched keeps running), and the next call starts a fresh one (and goes
  the exec path meanwhile).
- **Never stuck behind it.** A request must be started within a few heartbeats; the box's
  agent refuses it after its deadline (on its own clock), so one it did not start in time is
  served on the exec path and never runs later. A silent agent on a link that answers is
  dropped (:meth:`LiveAgent.drop_silent`); each client has its own writer, so one that takes
  nothing holds up no other.
- **Never a new failure mode.** Until it is ready, and for good once it failed to start (no
  Python able to stay resident, a box that refuses a second channel), every call takes the
  exec path; the reason is kept and shown by ``outrig connections``.
- **The link is heard.** The box sends a heartbeat whenever it has been quiet for a fraction of
  the probe time (:func:`heartbeat_for`), so a live link is never probed before it is lent, and
  a link that died shows as silence within a few RTTs.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import shlex
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from outrig.agent_code import bundle as agent_bundle
from outrig.agent_code import encode_request, serve
from outrig.connectors.keeper.wire import encode
from outrig.connectors.ssh.transport import exec_pipelined
from outrig.timing import live_silence_limit, probe_idle_after
from outrig.transport import LIVE_WINDOW

START_LIMIT = 60.0  # seconds for the box to start it and say ready
SEND_LIMIT = 30.0  # a client that takes none of its output for this long is dropped
ROUTE_BUFFER = 16 << 20  # bytes queued for one client at most; beyond, it is dropped
TICK = 1.0
HEARTBEAT_MIN = 0.2
STDERR_KEPT = 4000  # bytes of the live agent's own stderr kept for its failure reason


def heartbeat_for(rtt: float | None) -> float:
    """How quiet the box may be before it sends a heartbeat: a third of the time after which
    the keeper probes a quiet link (never below :data:`HEARTBEAT_MIN`)."""
    return max(HEARTBEAT_MIN, probe_idle_after(rtt) / 3)


def serve_argv(python: str, digest: str, workdir: str, bundle_b64: str,
               heartbeat: float) -> list[str]:
    """The exec that starts serve mode: the bootstrap with the bundle in argv and the serve
    request as its request (no secret is ever in it)."""
    line = json.dumps({"serve": {"heartbeat": heartbeat}}).encode()
    return agent_bundle.bootstrap_argv(python, digest, workdir, bundle_b64,
                                       encode_request(line))


class Route:
    """One request's client: its socket connection, fed by a writer thread of its own.

    Why a thread per route: the live agent's one pump sorts every request's frames; a send
    that blocked on one client (a ``tail-logs`` suspended with Ctrl-Z takes nothing) would
    stop every other request on the keeper. The pump only queues; a client that leaves more
    than :data:`ROUTE_BUFFER` bytes queued, or takes nothing for :data:`SEND_LIMIT` seconds,
    is dropped alone (its request closed on the box)."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        conn.settimeout(None)  # the client's stdin frames may take any time to come...
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,  # ...its output may not wait
                        struct.pack("ll", int(SEND_LIMIT), 0))
        self.done = False  # the exit status (or the end) was queued
        self.accepted = False  # the box started the request (``a``, or its own answer)
        self.settled = threading.Event()  # the box took or refused it, or the agent ended
        self.failed = False  # the client is gone, or took too little: nothing more goes
        self.on_gone: Callable[[], None] = lambda: None  # the live agent's: close it on the box
        self._frames: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._cond = threading.Condition()

    def send(self, kind: bytes, payload: bytes = b"") -> bool:
        """Queue one frame for the client; ``False`` when the client is gone or has left
        :data:`ROUTE_BUFFER` bytes untaken (then it is dropped)."""
        data = encode(kind, payload)
        with self._cond:
            if self.failed:
                return False
            if self._queued + len(data) > ROUTE_BUFFER:
                self.failed = True
                self._cond.notify_all()
                return False
            self._frames.append(data)
            self._queued += len(data)
            self._cond.notify_all()
        return True

    def backlog(self) -> int:
        """Bytes queued for the client, not yet taken."""
        return self._queued

    def discard(self) -> None:
        """Forget what was queued (a request refused by the box: the exec path serves it)."""
        with self._cond:
            self._frames.clear()
            self._queued = 0

    def start(self) -> None:
        """Start passing the queued frames on (after the keeper's answer went out)."""
        threading.Thread(target=self._write, daemon=True, name="outrig-live-route").start()

    def _write(self) -> None:
        while True:
            with self._cond:
                while not self._frames and not self.failed:
                    self._cond.wait()
                if self.failed:
                    break
                data = self._frames.popleft()
                self._queued -= len(data)
            try:
                self.conn.sendall(data)
            except OSError:
                with self._cond:
                    self.failed = True
                break
            if data[:1] in (b"x", b"L"):
                return  # the request's last frame
        self.on_gone()
        with contextlib.suppress(OSError):  # the client's stdin relay ends with it
            self.conn.shutdown(socket.SHUT_RDWR)


class LiveAgent:
    """The live agent of one keeper's link: its channel, its requests, its state."""

    def __init__(self, link: Any, *, python: str, digest: str, workdir: str, heartbeat: float,
                 heard: Callable[[], None], link_up: Callable[[], bool],
                 lost: Callable[[], bytes], rtt: Callable[[], float | None]) -> None:
        self.link = link
        self.python, self.digest, self.workdir = python, digest, workdir
        self.heartbeat = heartbeat
        self.heard = heard  # the keeper's: the box just showed it is there
        self.link_up = link_up
        self.lost = lost  # the keeper's: the ``L`` payload when the link is gone (and why)
        self.rtt = rtt  # the keeper's link's best RTT
        self.last_frame = time.monotonic()  # when it last sent anything (a heartbeat at least)
        # its clock minus ours, as its last frame with a clock showed it (never more than
        # the truth: the frame's time on the way only makes it smaller, deadlines earlier)
        self.clock_offset: float | None = None
        self.state = "starting"  # → ready → ended | failed
        self.why = ""  # why it failed or ended (``outrig connections`` shows it)
        self.pid: int | None = None  # the box's pid of the live agent
        self.served = 0  # requests it took
        self.retiring = False  # replaced by a newer bundle's: leaves once its routes are over
        self.channel: Any = None
        self.routes: dict[int, Route] = {}
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()
        self.stderr = bytearray()

    # ---------------------------------------------------------------- start and end

    def start(self, bundle_b64: str) -> None:
        """Open its channel and start it, in the background (the caller goes on at once)."""
        threading.Thread(target=self._run, args=(bundle_b64,), daemon=True,
                         name="outrig-live-agent").start()

    def _run(self, bundle_b64: str) -> None:
        argv = serve_argv(self.python, self.digest, self.workdir, bundle_b64, self.heartbeat)
        try:
            channel = self.link.open_session(window_size=LIVE_WINDOW, timeout=START_LIMIT)
            exec_pipelined(channel, shlex.join(argv))
        except Exception as exc:
            text = getattr(exc, "text", None)  # paramiko's ChannelException: the box said no
            self._fail(f"the box refused it a session channel ({text}; its sshd may limit "
                       "sessions per connection: MaxSessions)" if text else
                       f"no channel for it ({type(exc).__name__}: {exc})")
            return
        self.channel = channel
        self.heard()
        self._pump(channel, time.monotonic() + START_LIMIT)

    def _fail(self, why: str) -> None:
        with self.lock:
            if self.state in ("starting", "ready"):
                self.state = "failed" if self.state == "starting" else "ended"
                self.why = why

    def give_up(self, why: str) -> None:
        """Off for good on this keeper (the box needs its session for a command channel):
        no new request; it closes as soon as the requests it has are over."""
        with self.lock:
            self.state, self.why = "failed", why
        self.retire()

    def retire(self) -> None:
        """A newer bundle's live agent takes over: close once the last request is over."""
        self.retiring = True
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        with self.lock:
            idle = not self.routes
        if self.retiring and idle:
            self._close_channel()

    def close(self) -> None:
        """End it: its channel closes, its stdin on the box ends, it exits."""
        with self.lock:
            if self.state in ("starting", "ready"):
                self.state, self.why = "ended", self.why or "closed by the keeper"
        self._close_channel()

    def _close_channel(self) -> None:
        """Close the channel if it was opened: the box's live agent sees its stdin end."""
        if self.channel is not None:
            with contextlib.suppress(Exception):
                self.channel.close()

    def silent_after(self) -> float:
        """Silence after which it counts as stopped or starved (or its link dead): a few
        heartbeats and the link's delay (:func:`outrig.timing.live_silence_limit`)."""
        return live_silence_limit(self.heartbeat, self.rtt())

    def quiet(self) -> float:
        """Seconds since it last sent anything."""
        return time.monotonic() - self.last_frame

    def drop_silent(self, why: str) -> None:
        """It went silent while the link answered: off now (``ended``, with ``why``). The
        requests it had not started go the exec path (their deadline has passed on its clock,
        so it refuses them if it ever reads them); those it started end as lost contact."""
        with self.lock:
            if self.state != "ready":
                return
            self.state, self.why = "ended", why
            waiting = {rid: r for rid, r in self.routes.items() if not r.accepted}
            for rid in waiting:
                del self.routes[rid]
        for route in waiting.values():
            route.settled.set()
        self._close_channel()

    def usable(self, digest: str, python: str) -> bool:
        """Whether it can serve a request of this bundle and Python now."""
        return (self.state == "ready" and not self.retiring and self.digest == digest
                and self.python == python)

    def describe(self) -> dict[str, Any]:
        """What ``outrig connections`` shows of it."""
        with self.lock:
            routes = list(self.routes.values())
        return {"state": self.state, "why": self.why, "pid": self.pid, "served": self.served,
                "digest": self.digest, "requests_open": len(routes),
                "backlog": sum(r.backlog() for r in routes), "quiet": round(self.quiet(), 3)}

    # ---------------------------------------------------------------- the box's frames

    def _pump(self, channel: Any, ready_by: float) -> None:
        """Sort the box's frames to their requests until the channel ends."""
        frames = serve.FrameBuffer()
        channel.settimeout(TICK)
        try:
            while True:
                try:
                    data = channel.recv(65536)
                except TimeoutError:
                    self._keep_stderr(channel)
                    if not self.link_up():
                        break
                    if self.state == "starting" and time.monotonic() > ready_by:
                        self._fail(f"it did not say ready within {START_LIMIT:.0f} s")
                        break
                    continue
                if not data:
                    break
                self.heard()
                self.last_frame = time.monotonic()
                for kind, rid, payload in frames.feed(data):
                    self._dispatch(kind, rid, payload)
        except (OSError, EOFError, ValueError):
            pass
        finally:
            self._ended(channel)

    def _keep_stderr(self, channel: Any) -> None:
        with contextlib.suppress(Exception):
            while channel.recv_stderr_ready():
                chunk = channel.recv_stderr(65536)
                if not chunk:
                    break
                self.stderr.extend(chunk)
                del self.stderr[:-STDERR_KEPT]

    def _dispatch(self, kind: bytes, rid: int, payload: bytes) -> None:
        if kind == b"R":
            self._ready(payload)
            return
        if kind == b"h":
            self._clock(payload)
            return
        with self.lock:
            route = self.routes.get(rid)
            if route is not None and not route.accepted and kind in (b"a", b"x"):
                # started (``a``), or answered at once (a fork that failed); refused as too
                # late (EXPIRED): never started, the exec path serves it
                route.accepted = kind == b"a" or payload.strip() != str(serve.EXPIRED).encode()
                if not route.accepted:
                    del self.routes[rid]
                    route.discard()
                route.settled.set()
        if route is None or kind == b"a":
            return  # (frames before the answer wait in the route: a failed fork's stderr)
        if not route.send(kind, payload):
            self._drop(rid, route)  # the client is gone: the box closes the child's pipes
            return
        if kind == b"x":
            route.done = True
            self._forget(rid)

    def _clock(self, payload: bytes, clock: Any = None) -> None:
        """Its clock as a frame just brought it (``h``'s payload, or ``R``'s ``clock``)."""
        if clock is None and len(payload) == serve.CLOCK.size:
            clock = serve.CLOCK.unpack(payload)[0]
        if isinstance(clock, float):
            self.clock_offset = clock - time.monotonic()

    def _ready(self, payload: bytes) -> None:
        try:
            info = json.loads(payload)
        except ValueError:
            info = {}
        self._clock(b"", info.get("clock"))
        with self.lock:
            if info.get("digest") != self.digest:
                self.state = "failed"
                self.why = (f"the box runs bundle {info.get('digest')!r}, not "
                            f"{self.digest!r}")
            elif self.state == "starting":
                self.state = "ready"
                self.pid = info.get("pid") if isinstance(info.get("pid"), int) else None
        if self.state == "failed":
            self._close_channel()

    def _ended(self, channel: Any) -> None:
        """The channel is over: say why, end every open request the way the exec path
        would (the link lost, or the agent gone without a result)."""
        self._keep_stderr(channel)
        link = self.link_up()
        status = None
        with contextlib.suppress(Exception):
            if channel.status_event.wait(0.5 if link else 0):
                status = channel.recv_exit_status()
        told = [line for line in self.stderr.decode("utf-8", "replace").splitlines()
                if line.strip() and not line.startswith("debug")]  # (an sshd's -d noise)
        reason = told[-1].strip() if told else (
            f"exit status {status}" if status is not None and status >= 0
            else "killed, or its channel closed")
        with self.lock:
            if self.state == "starting":
                self.state, self.why = "failed", reason if link else "the link dropped"
            elif self.state == "ready":
                self.state = "ended"
                self.why = self.why or (reason if link else "the link dropped")
            routes, self.routes = dict(self.routes), {}
        for route in routes.values():
            if not route.accepted:  # never started on the box: the exec path serves it
                route.settled.set()
                continue
            if route.done:
                continue
            route.done = True
            # the client's lost contact: what was started may still run on the box (a
            # deploy's processes do), and a call safe to repeat is repeated (a follow
            # resumes by its cursors) on the exec path while a fresh live agent starts
            route.send(b"L", json.dumps({
                "why": f"the box's live agent ended: {self.why}", "silent": False}).encode()
                if link else self.lost())
        with contextlib.suppress(Exception):
            channel.close()

    # ---------------------------------------------------------------- requests

    def submit(self, route: Route, line: bytes, limit: float) -> int | None:
        """Send one request (its JSON line) that the box must start within ``limit`` seconds
        (on its own clock; read later, it is refused: :meth:`drop_silent`); its output goes
        to ``route`` once :attr:`Route.accepted`. ``None`` when the live agent is no longer
        there to take it (nothing was sent)."""
        offset = self.clock_offset
        if len(line) + serve.CLOCK.size > serve.MAX_PAYLOAD or offset is None:
            return None
        route.on_gone = lambda: self._drop(rid, route)
        with self.lock:
            if self.state != "ready":
                return None
            rid = next(self.ids)
            self.routes[rid] = route
            self.served += 1
        deadline = serve.CLOCK.pack(time.monotonic() + offset + limit)
        if not self.write(b"Q", rid, deadline + line):
            self._forget(rid)
            return None
        return rid

    def write(self, kind: bytes, rid: int, payload: bytes = b"") -> bool:
        """One frame to the box (split where longer than a frame may be; a ``Q`` never is)."""
        step = serve.MAX_PAYLOAD
        parts = [payload[i:i + step] for i in range(0, len(payload), step)] or [b""]
        try:
            with self.send_lock:
                for part in parts:
                    self.channel.sendall(serve.frame(kind, rid, part))
            return True
        except Exception:
            return False

    def relay_input(self, conn: socket.socket, rid: int, route: Route,
                    recv: Callable[[socket.socket], tuple[bytes, bytes] | None]) -> None:
        """Client → box for one request: stdin bytes and its end; the client leaving before
        the end closes the child's pipes on the box."""
        with contextlib.suppress(OSError):
            while True:
                frame = recv(conn)
                if frame is None:
                    break
                kind, payload = frame
                if kind == b"i":
                    self.write(b"i", rid, payload)
                elif kind == b"e":
                    self.write(b"e", rid)
        if not route.done:
            self._drop(rid, route)

    def _drop(self, rid: int, route: Route) -> None:
        route.done = True
        with self.lock:
            mine = self.routes.get(rid) is route
        if mine:
            self.write(b"c", rid)
            self._forget(rid)

    def forget(self, rid: int) -> None:
        """A request the box did not take (the exec path serves it): nothing more of it."""
        self._forget(rid)

    def _forget(self, rid: int) -> None:
        with self.lock:
            self.routes.pop(rid, None)
        self._close_if_idle()
