"""The TCP connect and the client's SSH banner, sent while the SSH stack is still being loaded.

Why: a cold command's first network step waits for nothing of paramiko's. Before this, the
TCP connect and the client's banner left only after Fabric and paramiko were imported and
Fabric had read ``~/.ssh/config`` (about 0.15-0.2 s of a 2-core machine), and the server's
key exchange cannot begin before its sshd has read the client's banner (OpenSSH sends its
KEXINIT right after it). Started first, on a thread, the connect and the banner travel while
the imports run: on a real link that is the TCP handshake's round trip and the banner's half
of the next one taken off the clock, up to the time the imports take.

What is sent is exactly what paramiko would send first (RFC 4253 section 4.2: the
identification line), under outrig's name (:data:`CLIENT_BANNER`), which the connection's
paramiko transport then takes as its own (``local_version``: the line also enters the key
exchange's hash, so both must be the same); :class:`BannerSentSocket` keeps paramiko from
writing it a second time. Nothing else is sent ahead: the key exchange, the host key check
and the login are paramiko's, unchanged.

Where it goes: to the address and port the SSH configuration gives the host, read first as
OpenSSH reads it (:func:`outrig.hosts.ssh_config.ssh_route`: ``Include``, ``Match``, ``HostName``,
``Port``; pure Python, about a millisecond). When it is not used (the connect goes the
ordinary way): where that configuration sends the connection through a proxy
(``ProxyCommand``, ``ProxyJump``, from any file): then nothing connects to the box directly,
early or late; and on every later attempt of the same command (only the first one starts
ahead). A failure of the early connect (refused, silent, unreachable) is the first attempt's
failure, classified and retried exactly as one from paramiko's own connect.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

from outrig import __version__

CLIENT_BANNER = f"SSH-2.0-outrig_{__version__}"
BANNER_LINE = f"{CLIENT_BANNER}\r\n".encode()  # what goes on the wire


class EarlyConnect:
    """One TCP connect and banner to ``(host, port)``, begun at construction on a thread."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.address = (host, port)
        self.sock: socket.socket | None = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._taken = False
        self._lock = threading.Lock()
        threading.Thread(target=self._run, args=(timeout,), name="outrig-early-connect",
                         daemon=True).start()

    def _run(self, timeout: float) -> None:
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection(self.address, timeout=timeout)
            sock.sendall(BANNER_LINE)
        except BaseException as exc:  # kept for the attempt that takes it
            if sock is not None:
                sock.close()
            self.error = exc
        else:
            with self._lock:
                if self._taken:  # nobody waits for it any more
                    sock.close()
                else:
                    self.sock = sock
        finally:
            self._done.set()

    def take(self, timeout: float) -> tuple[Any, BaseException | None]:
        """``(socket, None)`` once connected with the banner sent (wrapped so that paramiko
        does not send the banner again), ``(None, error)`` when the connect failed, or
        ``(None, TimeoutError)`` when it had not finished within ``timeout``; only once."""
        finished = self._done.wait(timeout)
        first, sock = self._claim()
        if not first:
            return None, None  # handed over (or discarded) before
        if sock is not None:
            return BannerSentSocket(sock, BANNER_LINE), None
        if not finished:
            return None, TimeoutError(f"timed out connecting to {self.address[0]} port "
                                      f"{self.address[1]}")
        return None, self.error

    def discard(self) -> None:
        """Close the early socket unused (the connection goes elsewhere)."""
        _first, sock = self._claim()
        if sock is not None:
            sock.close()

    def _claim(self) -> tuple[bool, socket.socket | None]:
        """Mark it taken (a socket connected later is closed by its thread): whether this
        was the first claim, and the socket connected so far, now ours alone."""
        with self._lock:
            first, self._taken = not self._taken, True
            sock, self.sock = self.sock, None
        return first, sock


class BannerSentSocket:
    """A connected socket whose first bytes written are the banner already sent: those are
    taken as sent, everything else goes to the socket (paramiko's ``Packetizer`` writes the
    banner first, with ``send``)."""

    def __init__(self, sock: socket.socket, sent: bytes) -> None:
        self._sock = sock
        self._sent = sent

    def send(self, data: bytes) -> int:
        if self._sent:
            if not self._sent.startswith(bytes(data[:len(self._sent)])):
                raise OSError("the SSH banner written differs from the one sent ahead")
            taken = min(len(data), len(self._sent))
            self._sent = self._sent[taken:]
            return taken
        return self._sock.send(data)

    def sendall(self, data: bytes) -> None:
        while data:
            data = data[self.send(data):]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)
