"""A loopback TCP proxy that adds latency and can cut connections, to imitate the real link.

Why: the boxes outrig drives sit ~240 ms RTT away, and outrig's design (one exec per step,
timeouts from measured RTT, reconnects) only shows its worth under that latency. Tests and
``inv demo`` put this proxy between outrig and the sandbox sshd: every chunk read on one side
is delivered on the other ``one_way_delay`` seconds later, in order, without throttling
throughput (delay, not bandwidth, is what hurts SSH round trips). ``cut_all()`` resets every
live connection, like a NAT timeout or a box that vanished, while still accepting new ones.

Each connection has two directions; each direction has a reader thread that stamps chunks with
their delivery time and a writer thread that sleeps until then and sends. Sockets use short
timeouts so every thread notices ``close()``/``cut_all()`` within ~0.1 s.

Faults (:class:`Fault`, armed with :meth:`LatencyProxy.inject`) strike one chosen connection
at a chosen SSH phase or byte: ``cut`` (RST both sides), ``blackhole`` (forward nothing more,
never close) or ``stall`` (hold everything for a while, then go on); ``jitter`` adds a random
extra delay per chunk (order kept). How the proxy knows the phase without decrypting anything
(:class:`PhaseTracker`): it reads the cleartext banner lines, then parses the cleartext binary
packets of the key exchange up to the client's NEWKEYS; after that it counts the client's
*flights* (client bytes sent after the server last spoke). With OpenSSH and plain paramiko,
flight 1 is the ``ssh-userauth`` service request, 2 the public-key login, 3 the
session-channel open and 4 the (pipelined) exec; with outrig's pipelined login
(:mod:`outrig.connectors.ssh.pipelined_login`) flight 1 carries the service request and the login,
and by default the channel open too, and flight 2 is the exec; with the open kept for after
the login's answer (``OUTRIG_SSH_PIPELINE=login``) 2 is the channel open and 3 the exec. The
tracker tells a pipelined login from a lone service request by flight 1's size: a service
request alone is one packet of at most ~112 bytes, a signed login adds 150 or more. Whether
the open rode along cannot be told from the encrypted bytes, so the proxy is told
(``early_channel``; by default what the client in this process's environment does, read at
each accept).
``stream`` is the server's bytes after the exec. A client that authenticates differently
(several keys, keyboard-interactive) shifts the later flights, so tests check
:attr:`LatencyProxy.fired` to see where a fault actually struck.

Round trips are counted per connection (:attr:`PhaseTracker.turns`, :meth:`LatencyProxy.tracker`):
a *turn* is a run of client bytes that begins after the proxy has handed the client new
server bytes, so it counts the times the client may have waited for the server (from its
banner to the end), and :attr:`PhaseTracker.turn_of` says in which turn each phase began (and
:attr:`PhaseTracker.flight_turns` that of each flight after NEWKEYS).
Bytes a client sends without waiting (a pipelined message) stay in the turn they follow.

Whole-proxy faults act on every connection at once, live ones and those accepted meanwhile,
while they stay open: :meth:`LatencyProxy.stall_all` forwards nothing for N seconds and then
delivers everything held, in order (a link that froze and came back);
:meth:`LatencyProxy.blackhole_all` forwards nothing until :meth:`LatencyProxy.restore` (a
link gone for good, or until restored: TCP's retransmissions then deliver what was held,
which is what holding the bytes here imitates). Neither ever closes a connection.
"""

from __future__ import annotations

import contextlib
import ipaddress
import queue
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass
from types import TracebackType

from outrig.connectors.ssh.pipelined_login import pipelining_wanted

_POLL = 0.1  # how often blocked threads look at their stop flag
_PAUSE_WAIT = 10.0  # blackhole_all(drop_new): the most it waits for the accept thread to pause
_CHUNK = 256 * 1024

_CUT = b"<cut>"  # queue marker (compared by identity): reset the connection when delivered
_Item = tuple[float, bytes | None]  # (deliver_at, data); None data = EOF from the reader

PHASES = ("tcp", "banner", "kex", "auth", "channel", "exec", "stream", "byte")
ACTIONS = ("cut", "blackhole", "stall")
_NEWKEYS = 21  # SSH_MSG_NEWKEYS: the last cleartext packet of the key exchange
# The most bytes a lone ``ssh-userauth`` service request takes on the wire (one packet: 22
# bytes of payload and length, padding to the block, a MAC of up to 64 bytes): a first
# flight longer than this carries the login as well (a pipelined login)
SERVICE_REQUEST_MAX = 160


@dataclass
class Fault:
    """One fault for one connection.

    ``phase``: where it strikes: ``tcp`` (at accept, before any byte), ``banner`` (the server's
    first byte), ``kex`` (the client's first byte after its banner line), ``auth``, ``channel``,
    ``exec`` (the client's first byte of that phase, which is not delivered), ``stream`` (after
    ``after_bytes`` bytes of the server's answer to the exec), or ``byte`` (after
    ``after_bytes`` bytes in ``direction``, ``"c2s"`` or ``"s2c"``).
    ``action``: ``cut``, ``blackhole`` or ``stall`` (for ``seconds``).
    ``connection``: the 1-based number of the accepted connection it strikes; ``None``: the
    next connection accepted after :meth:`LatencyProxy.inject`.
    """

    phase: str = "stream"
    action: str = "cut"
    after_bytes: int = 0
    direction: str = "s2c"
    seconds: float = 0.0
    connection: int | None = None

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"Fault phase {self.phase!r} is not one of {', '.join(PHASES)}")
        if self.action not in ACTIONS:
            raise ValueError(f"Fault action {self.action!r} is not one of {', '.join(ACTIONS)}")
        if self.direction not in ("c2s", "s2c"):
            raise ValueError("Fault direction must be 'c2s' or 's2c'")
        if self.after_bytes < 0 or self.seconds < 0:
            raise ValueError("Fault after_bytes and seconds must be >= 0")


class PhaseTracker:
    """Where one connection's SSH exchange is, seen from the proxy (see the module docstring).

    ``feed(direction, data)`` returns ``{phase: offset}`` for each phase whose first byte lies
    in ``data`` (``offset`` into ``data``). Thread-safe: both readers call it."""

    def __init__(self, early_channel: bool = False) -> None:
        self._lock = threading.Lock()
        self.early_channel = early_channel  # a pipelined login's flight carries the open too
        self.phase = "tcp"
        self._banner_done = False  # the client's banner line has ended
        self._kex = False
        self._packets = bytearray()  # client cleartext packets not yet complete
        self._newkeys = False
        self._server_spoke = True  # since the client's last post-kex bytes
        self.flights = 0
        self.first_flight_bytes = 0
        self.pipelined_login: bool | None = None  # known once flight 2 begins
        self.counted = {"c2s": 0, "s2c": 0}
        self.stream_bytes = 0
        self.turns = 0  # client turns (see the module docstring)
        self.turn_of: dict[str, int] = {}  # phase -> the turn in which it began
        self.flight_turns: list[int] = []  # the turn of each encrypted client flight
        self._handed = 0  # server chunks handed to the client
        self._handed_seen = -1  # ... as of the client's last bytes

    def handed_to_client(self) -> None:
        """The proxy is handing the client a chunk of the server's bytes (called before the
        send, so that a client's answer is never read before its cause is counted)."""
        with self._lock:
            self._handed += 1

    def feed(self, direction: str, data: bytes) -> dict[str, int]:
        with self._lock:
            found: dict[str, int] = {}
            if direction == "s2c":
                self._feed_server(data, found)
            else:
                self._feed_client(data, found)
            self.counted[direction] += len(data)
            return found

    def _enter(self, phase: str, offset: int, found: dict[str, int]) -> None:
        found.setdefault(phase, offset)
        self.turn_of.setdefault(phase, self.turns)
        self.phase = phase

    def _flight_names(self) -> dict[int, str]:
        """The phase each client flight after NEWKEYS begins (the module docstring)."""
        if not self.pipelined_login:
            return {1: "auth", 3: "channel", 4: "exec"}
        return {1: "auth", 2: "exec"} if self.early_channel else \
            {1: "auth", 2: "channel", 3: "exec"}

    def _exec_flight(self) -> int:
        return max(self._flight_names())

    def _feed_server(self, data: bytes, found: dict[str, int]) -> None:
        if self.counted["s2c"] == 0 and data:
            self._enter("banner", 0, found)
        if self._newkeys:
            self._server_spoke = True
        if self.flights >= self._exec_flight() and data:
            if self.stream_bytes == 0:
                self._enter("stream", 0, found)
            self.stream_bytes += len(data)

    def _feed_client(self, data: bytes, found: dict[str, int]) -> None:
        if data and self._handed != self._handed_seen:
            self.turns += 1
            self._handed_seen = self._handed
        pos = 0
        if not self._banner_done:
            end = data.find(b"\n")
            if end < 0:
                return  # still inside the client's banner line
            self._banner_done = True
            pos = end + 1
        if not self._newkeys:
            if pos < len(data) and not self._kex:
                self._kex = True
                self._enter("kex", pos, found)
            pos = self._parse_cleartext(data, pos)
            if not self._newkeys:
                return
        if pos < len(data) and self._server_spoke:
            self._server_spoke = False
            self.flights += 1
            self.flight_turns.append(self.turns)
            if self.flights == 2:
                self.pipelined_login = self.first_flight_bytes > SERVICE_REQUEST_MAX
            names = self._flight_names()
            if self.flights in names:
                self._enter(names[self.flights], pos, found)
        if self.flights == 1:
            self.first_flight_bytes += len(data) - pos

    def _parse_cleartext(self, data: bytes, pos: int) -> int:
        """Walk the key exchange's cleartext packets; return where encrypted bytes begin."""
        self._packets += data[pos:]
        offset = 0
        while len(self._packets) - offset >= 6:
            length = int(struct.unpack(">I", bytes(self._packets[offset:offset + 4]))[0])
            if len(self._packets) - offset < 4 + length:
                break
            kind = self._packets[offset + 5]
            offset += 4 + length
            if kind == _NEWKEYS:
                self._newkeys = True
                rest = len(self._packets) - offset  # bytes past NEWKEYS: already encrypted
                del self._packets[:]
                return len(data) - rest
        del self._packets[:offset]
        return len(data)


def _check_loopback(host: str) -> str:
    """Return a connectable loopback address for ``host`` or raise ValueError: the proxy is a
    test tool and must never become a relay to anywhere else."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            f"LatencyProxy target {host!r} is not an IP address; use 127.0.0.1 or ::1"
        ) from None
    if not addr.is_loopback:
        raise ValueError(
            f"LatencyProxy only forwards to loopback (127.0.0.0/8, ::1), not {host}"
        )
    return str(addr)


def _abort(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), waking any thread blocked reading it first."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


class _Connection:
    """One proxied client connection: two directions, four threads."""

    def __init__(self, proxy: LatencyProxy, client: socket.socket, upstream: socket.socket,
                 number: int = 0, fault: Fault | None = None):
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.number = number
        self.fault = fault
        self.tracker = PhaseTracker(proxy.expects_early_channel())
        self.silenced = False  # a blackhole struck: read and drop everything from now on
        self.hold_until = 0.0  # a stall struck: deliver nothing before this time
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._open_dirs = 2
        self.threads: list[threading.Thread] = []
        for src, dst, tag in ((client, upstream, "c2s"), (upstream, client, "s2c")):
            q: queue.Queue[_Item] = queue.Queue()
            self.threads.append(threading.Thread(
                target=self._reader, args=(src, q, tag), name=f"proxy-{tag}-read", daemon=True))
            self.threads.append(threading.Thread(
                target=self._writer, args=(dst, q), name=f"proxy-{tag}-write", daemon=True))

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _reader(self, src: socket.socket, q: queue.Queue[_Item], direction: str) -> None:
        while not self.stop.is_set():
            try:
                data = src.recv(_CHUNK)
            except TimeoutError:
                continue
            except OSError:
                self.abort()
                return
            if self.silenced:
                if not data:
                    return
                continue  # a blackhole: the bytes vanish, the sockets stay open
            strike = self._strike_at(direction, data)
            if strike is not None:
                if strike:
                    q.put((self.proxy.deliver_at(), data[:strike]))
                if self._strike(q):
                    return
                data = data[strike:]
                if self.silenced:
                    continue
                if not data:
                    continue
            q.put((self.proxy.deliver_at(), data or None))
            if not data:
                return

    def _strike_at(self, direction: str, data: bytes) -> int | None:
        """Where in ``data`` this connection's fault strikes, if it does in this chunk."""
        before = self.tracker.counted[direction]
        stream_before = self.tracker.stream_bytes
        entered = self.tracker.feed(direction, data)
        fault = self.fault
        if fault is None or not data:
            return None
        if fault.phase == "byte":
            if direction != fault.direction:
                return None
            at = fault.after_bytes - before
            return at if 0 <= at < len(data) else None
        if fault.phase not in entered:
            if fault.phase == "stream" and direction == "s2c" and stream_before:
                at = fault.after_bytes - stream_before
                return at if 0 <= at < len(data) else None
            return None
        at = entered[fault.phase] + (fault.after_bytes if fault.phase == "stream" else 0)
        return at if at < len(data) else None

    def _strike(self, q: queue.Queue[_Item]) -> bool:
        """Apply the fault (once); True when this reader must stop."""
        fault, self.fault = self.fault, None
        assert fault is not None
        self.proxy._fired(self, fault)
        if fault.action == "cut":
            self.silenced = True  # nothing more is forwarded; the reset follows the prefix
            q.put((self.proxy.deliver_at(), _CUT))
            return False
        if fault.action == "blackhole":
            self.silenced = True
            return False
        self.hold_until = time.monotonic() + fault.seconds
        return False

    def _writer(self, dst: socket.socket, q: queue.Queue[_Item]) -> None:
        while not self.stop.is_set():
            try:
                deliver_at, data = q.get(timeout=_POLL)
            except queue.Empty:
                continue
            while not self.stop.is_set():
                wait = max(deliver_at, self.hold_until, self.proxy.held_until()) \
                    - time.monotonic()
                if wait <= 0:
                    break
                time.sleep(min(wait, _POLL))
            if self.stop.is_set():
                return
            if data is _CUT:
                self.abort()
                return
            if data is None:  # the source half-closed: pass the FIN on, after the same delay
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                self._direction_done()
                return
            if dst is self.client:
                self.tracker.handed_to_client()
            view = memoryview(data)
            while view and not self.stop.is_set():
                try:
                    sent = dst.send(view)
                except TimeoutError:
                    continue
                except OSError:
                    self.abort()
                    return
                view = view[sent:]

    def _direction_done(self) -> None:
        with self._lock:
            self._open_dirs -= 1
            done = self._open_dirs == 0
        if done:
            self.finish()

    def finish(self) -> None:
        """Both sides closed cleanly: release the sockets normally."""
        self.stop.set()
        for s in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                s.close()
        self.proxy._forget(self)

    def abort(self) -> None:
        """Reset both sides at once (an error on one side, ``cut_all`` or ``close``)."""
        self.stop.set()
        _abort(self.client)
        _abort(self.upstream)
        self.proxy._forget(self)

    def join(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for t in self.threads:
            if t is not threading.current_thread() and t.is_alive():
                t.join(max(0.0, end - time.monotonic()))


class LatencyProxy:
    """TCP proxy on 127.0.0.1 (random port) to a loopback target, with one-way delay.

    RTT through it is ``2 * one_way_delay`` plus the target's own time. Use as a context
    manager or call :meth:`close`; all threads are daemonic and stop within ~0.1 s of close.
    """

    def __init__(self, target_host: str, target_port: int, one_way_delay: float = 0.12, *,
                 jitter: float = 0.0, seed: int | None = None,
                 early_channel: bool | None = None) -> None:
        self.target_host = _check_loopback(target_host)
        self.early_channel = early_channel  # None: as this process's environment says
        if jitter < 0:
            raise ValueError("jitter must be >= 0")
        self.jitter = float(jitter)
        self._random = random.Random(seed)
        self._faults: list[Fault] = []
        self.fired: list[tuple[int, str, str]] = []  # (connection, phase, action) struck
        self.trackers: dict[int, PhaseTracker] = {}  # connection number -> its tracker
        self._held: list[socket.socket] = []  # clients blackholed at accept
        self.target_port = int(target_port)
        if one_way_delay < 0:
            raise ValueError("one_way_delay must be >= 0")
        self.one_way_delay = float(one_way_delay)
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._conns: list[_Connection] = []
        self._port = 0
        self.accepted = 0  # total connections ever accepted (for tests counting reconnects)
        self._stall_until = 0.0  # stall_all: nothing is delivered before this time
        self._blackholed = False  # blackhole_all: nothing is delivered until restore()
        self._accepting = threading.Event()  # cleared: new connections are not answered
        self._accepting.set()
        # set by the accept thread while it is not inside accept() (see blackhole_all)
        self._accept_paused = threading.Event()
        self._fillers: list[socket.socket] = []  # fill the accept queue while not accepting

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> LatencyProxy:
        """Bind 127.0.0.1 on a free port and start accepting. Returns self."""
        if self._listener is not None:
            return self
        lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind(("127.0.0.1", 0))
        lst.listen(128)
        lst.settimeout(_POLL)
        self._listener = lst
        self._port = lst.getsockname()[1]
        self._accept_thread = threading.Thread(target=self._accept_loop, name="proxy-accept",
                                               daemon=True)
        self._accept_thread.start()
        return self

    @property
    def port(self) -> int:
        """The local port to connect to (valid after :meth:`start`)."""
        if not self._port:
            raise RuntimeError("LatencyProxy.port read before start()")
        return self._port

    def expects_early_channel(self) -> bool:
        """Whether a pipelined login's flight carries the channel open too: as set, else as
        a client started from this process's environment sends it (read now, at accept)."""
        if self.early_channel is not None:
            return self.early_channel
        return pipelining_wanted()[1]

    def tracker(self, number: int) -> PhaseTracker:
        """The phase tracker of the ``number``-th connection accepted (1-based): its phases,
        flights and turns."""
        with self._lock:
            return self.trackers[number]

    @property
    def connections(self) -> int:
        """How many proxied connections are live now."""
        with self._lock:
            return len(self._conns)

    def set_delay(self, seconds: float) -> None:
        """Change the one-way delay for bytes read from now on (order is still preserved)."""
        if seconds < 0:
            raise ValueError("delay must be >= 0")
        self.one_way_delay = float(seconds)

    def set_jitter(self, seconds: float) -> None:
        """Add up to ``seconds`` of random extra one-way delay per chunk (order is kept)."""
        if seconds < 0:
            raise ValueError("jitter must be >= 0")
        self.jitter = float(seconds)

    def stall_all(self, seconds: float) -> None:
        """Forward nothing for ``seconds`` on every connection (live, or accepted meanwhile),
        without closing any; then deliver what was held, in order, and go on."""
        if seconds < 0:
            raise ValueError("a stall lasts >= 0 seconds")
        self._stall_until = max(self._stall_until, time.monotonic() + seconds)

    def blackhole_all(self, *, drop_new: bool = False) -> None:
        """Forward nothing on any connection, live or new, and close none, until
        :meth:`restore`. New connections are accepted and held (what a gateway in front of
        a gone box does); with ``drop_new`` they get no answer at all, their connect times
        out, as on a link that is down: the proxy stops accepting and fills its accept
        queue (listen backlog 0) with one connection of its own, so the kernel drops the
        SYNs of the rest."""
        self._blackholed = True
        if drop_new and self._listener is not None and not self._fillers:
            self._accepting.clear()
            # The accept thread may be inside accept() right now: it would take the filler
            # off the queue and leave room for one real connect. Wait until it has left.
            self._accept_paused.wait(_PAUSE_WAIT)
            self._listener.listen(0)
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError, OSError):
                filler.connect(("127.0.0.1", self.port))
            self._fillers.append(filler)

    def restore(self) -> None:
        """End :meth:`blackhole_all` and any :meth:`stall_all`: held bytes flow again and
        new connections are answered."""
        self._blackholed = False
        self._stall_until = 0.0
        if self._listener is not None and not self._accepting.is_set():
            with contextlib.suppress(OSError):
                self._listener.listen(128)
            self._accepting.set()
        fillers, self._fillers = self._fillers, []
        for filler in fillers:
            _abort(filler)

    def held_until(self) -> float:
        """Until when the whole proxy holds every byte (``inf`` while blackholed)."""
        return float("inf") if self._blackholed else self._stall_until

    def deliver_at(self) -> float:
        """When a chunk read now is delivered: the delay plus this chunk's jitter."""
        extra = self._random.uniform(0.0, self.jitter) if self.jitter else 0.0
        return time.monotonic() + self.one_way_delay + extra

    def inject(self, *faults: Fault) -> None:
        """Arm faults; each strikes one connection (see :class:`Fault`) and is then spent."""
        with self._lock:
            self._faults.extend(faults)

    def disarm(self) -> int:
        """Drop the faults not yet given to a connection; returns how many."""
        with self._lock:
            dropped, self._faults = len(self._faults), []
        return dropped

    def _take_fault(self, number: int) -> Fault | None:
        with self._lock:
            for i, fault in enumerate(self._faults):
                if fault.connection in (None, number):
                    return self._faults.pop(i)
        return None

    def _fired(self, conn: _Connection | None, fault: Fault, number: int = 0) -> None:
        with self._lock:
            self.fired.append((conn.number if conn else number, fault.phase, fault.action))

    def cut_all(self) -> int:
        """Reset every live connection on both sides (RST), keep listening; returns how many."""
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            c.abort()
        for c in conns:
            c.join(1.0)
        return len(conns)

    def close(self) -> None:
        """Stop listening, reset all connections and join every thread. Idempotent."""
        self._closed.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
        if self._accept_thread is not None:
            self._accept_thread.join(2.0)
        with self._lock:
            held, self._held = self._held, []
        for sock in [*held, *self._fillers]:
            _abort(sock)
        self._fillers = []
        self.cut_all()

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None,
                 exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            # cleared before the check, so that blackhole_all never sees a stale "paused"
            # while this thread is about to enter accept()
            self._accept_paused.clear()
            if not self._accepting.is_set():
                self._accept_paused.set()
                self._closed.wait(_POLL)
                continue
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._closed.is_set():
                _abort(client)
                return
            self._open(client)

    def _open(self, client: socket.socket) -> None:
        with self._lock:
            self.accepted += 1
            number = self.accepted
        fault = self._take_fault(number)
        if fault is not None and fault.phase == "tcp" and fault.action != "stall":
            self._fired(None, fault, number)
            if fault.action == "cut":
                _abort(client)
            else:
                with self._lock:
                    self._held.append(client)  # accepted, never read, never closed
            return
        family = socket.AF_INET6 if ":" in self.target_host else socket.AF_INET
        upstream = socket.socket(family, socket.SOCK_STREAM)
        upstream.settimeout(5.0)
        target: tuple[str, int] | tuple[str, int, int, int] = (
            self.target_host, self.target_port)
        try:
            upstream.connect(target)
        except OSError:
            # Target down: refuse like a dead box would, with a reset.
            _abort(upstream)
            _abort(client)
            return
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(_POLL)
        conn = _Connection(self, client, upstream, number, fault)
        if fault is not None and fault.phase == "tcp":  # a stall before the first byte
            conn.fault = None
            self._fired(conn, fault)
            conn.hold_until = time.monotonic() + fault.seconds
        with self._lock:
            self._conns.append(conn)
            self.trackers[number] = conn.tracker
        conn.start()

    def _forget(self, conn: _Connection) -> None:
        with self._lock:
            if conn in self._conns:
                self._conns.remove(conn)
