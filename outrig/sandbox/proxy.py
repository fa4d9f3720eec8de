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
"""

from __future__ import annotations

import contextlib
import ipaddress
import queue
import socket
import struct
import threading
import time
from types import TracebackType
from typing import List, Optional, Tuple, Type, Union

_POLL = 0.1  # how often blocked threads look at their stop flag
_CHUNK = 256 * 1024

_Item = Tuple[float, Optional[bytes]]  # (deliver_at, data); None data = EOF from the reader


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

    def __init__(self, proxy: LatencyProxy, client: socket.socket, upstream: socket.socket):
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._open_dirs = 2
        self.threads: List[threading.Thread] = []
        for src, dst, tag in ((client, upstream, "c2s"), (upstream, client, "s2c")):
            q: queue.Queue[_Item] = queue.Queue()
            self.threads.append(threading.Thread(
                target=self._reader, args=(src, q), name=f"proxy-{tag}-read", daemon=True))
            self.threads.append(threading.Thread(
                target=self._writer, args=(dst, q), name=f"proxy-{tag}-write", daemon=True))

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _reader(self, src: socket.socket, q: queue.Queue[_Item]) -> None:
        while not self.stop.is_set():
            try:
                data = src.recv(_CHUNK)
            except socket.timeout:
                continue
            except OSError:
                self.abort()
                return
            q.put((time.monotonic() + self.proxy.one_way_delay, data or None))
            if not data:
                return

    def _writer(self, dst: socket.socket, q: queue.Queue[_Item]) -> None:
        while not self.stop.is_set():
            try:
                deliver_at, data = q.get(timeout=_POLL)
            except queue.Empty:
                continue
            while not self.stop.is_set():
                wait = deliver_at - time.monotonic()
                if wait <= 0:
                    break
                time.sleep(min(wait, _POLL))
            if self.stop.is_set():
                return
            if data is None:  # the source half-closed: pass the FIN on, after the same delay
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                self._direction_done()
                return
            view = memoryview(data)
            while view and not self.stop.is_set():
                try:
                    sent = dst.send(view)
                except socket.timeout:
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

    def __init__(self, target_host: str, target_port: int, one_way_delay: float = 0.12) -> None:
        self.target_host = _check_loopback(target_host)
        self.target_port = int(target_port)
        if one_way_delay < 0:
            raise ValueError("one_way_delay must be >= 0")
        self.one_way_delay = float(one_way_delay)
        self._listener: Optional[socket.socket] = None
        self._accept_thread: Optional[threading.Thread] = None
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._conns: List[_Connection] = []
        self._port = 0
        self.accepted = 0  # total connections ever accepted (for tests counting reconnects)

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
        self.cut_all()

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if self._closed.is_set():
                _abort(client)
                return
            self._open(client)

    def _open(self, client: socket.socket) -> None:
        family = socket.AF_INET6 if ":" in self.target_host else socket.AF_INET
        upstream = socket.socket(family, socket.SOCK_STREAM)
        upstream.settimeout(5.0)
        target: Union[Tuple[str, int], Tuple[str, int, int, int]] = (
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
        conn = _Connection(self, client, upstream)
        with self._lock:
            self._conns.append(conn)
            self.accepted += 1
        conn.start()

    def _forget(self, conn: _Connection) -> None:
        with self._lock:
            if conn in self._conns:
                self._conns.remove(conn)
