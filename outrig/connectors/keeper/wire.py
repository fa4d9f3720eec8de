"""The keeper's wire: where a warm connection's socket lives, and how both ends talk on it.

The client (:mod:`outrig.connectors.keeper.client`, in every command) and the keeper process
(:mod:`outrig.connectors.keeper.daemon`) import this module and not each other's, so the two ends
of one protocol share it from below.

- **Places.** The socket of a host's keeper is ``<folder>/<digest>.w2.sock`` with its
  record ``<digest>.w2.json`` beside it; the digest is of the host's :func:`identity`
  (address, port, user, key, known_hosts), so two commands share a keeper only for the same
  identity, and ``w2`` is the wire (:data:`WIRE`), so a command never speaks to a keeper of
  another framing: an older outrig's keeper (``<digest>.sock``, ``>cI`` frames) is left to
  close itself after its idle time (``outrig connections`` names it and ``--close`` stops it
  by its pid, which needs no frame). The folder is :func:`runtime_dir`, made and checked
  private by :func:`private_dir`; a socket file is checked by :func:`check_socket_file`
  before anyone connects to it.
- **Who is at the other end.** :func:`peer_credentials` (``SO_PEERCRED``): each end checks
  the other's uid.
- **Frames.** The live agent's own frames (``remote/agent/serve.py``: one type byte, a
  4-byte request id, a 4-byte length, then the payload; at most :data:`MAX_FRAME`), with
  the id always 0: one connection is one request. One codec means a frame the keeper relays
  from the box's live agent to a client is re-addressed, never re-encoded by a second set of
  rules (:func:`encode`, :func:`send_frame`, :func:`recv_frame`). A connection starts with
  the client's ``h`` (the request header, JSON) and the keeper's ``k`` (its answer, JSON)
  or ``f`` (a refusal: ``kind``, ``message`` and ``silent``). An ``exec`` then relays the
  channel: ``i`` (stdin bytes) and ``e`` (stdin's end) from the client; ``o`` (stdout),
  ``r`` (stderr), ``x`` (the exit status, JSON) and ``L`` (the link was lost) from the
  keeper.
- **The client's calls.** :func:`dial` and :func:`request`; their failures are
  :class:`KeeperGone` (nobody answers: start a fresh keeper), :class:`KeeperRefused` (the
  keeper said no) and :class:`UnsafePlace` (the folder or socket is not this user's alone).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import struct
from pathlib import Path
from typing import Any

from outrig.agent_code import serve
from outrig.errors import ConnectError
from outrig.inventory import Host
from outrig.journal import make_private_dir
from outrig.transport import known_hosts_path

RUNTIME_ENV = "OUTRIG_RUNTIME_DIR"
SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes; a longer path cannot be bound

WIRE = "w2"  # the framing's tag in socket and record names (1: ``>cI``, no tag)
HEADER = serve.FRAME  # kind, request id (0 here), payload length
MAX_FRAME = serve.MAX_PAYLOAD


# ------------------------------------------------------------------------------ places


def runtime_dir() -> Path:
    """The folder of keeper sockets and records (created 0700 by :func:`private_dir`)."""
    explicit = os.environ.get(RUNTIME_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        return Path(xdg) / "outrig"
    state = Path(os.environ.get("XDG_STATE_HOME") or "~/.local/state").expanduser()
    return state / "outrig" / "run"


class UnsafePlace(ConnectError):
    """The keeper folder or socket is not this user's alone: never used, never bound."""


def private_dir(path: Path | None = None) -> Path:
    """The runtime folder, made 0700 if new; refused when it is a symlink, another user's,
    or open to others (a socket there could be someone else's)."""
    folder = path or runtime_dir()
    make_private_dir(folder)  # its missing parents 0700 too (the state root among them)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() \
            or info.st_mode & 0o077:
        raise UnsafePlace(
            f"{folder} is not a private folder of this user (mode "
            f"{stat.S_IMODE(info.st_mode):o}, owner uid {info.st_uid}): outrig keeps no warm "
            f"connection there. Remove it, or set {RUNTIME_ENV} to a folder only you can open.")
    return folder


def identity(host: Host) -> dict[str, Any]:
    """What makes two commands share a connection: address, port, user, key and the
    known_hosts file (the host key it was checked against)."""
    return {"hostname": host.hostname, "port": host.port, "user": host.user,
            "identity_file": host.identity_file,
            "known_hosts": str(known_hosts_path(host))}


def key_of(host: Host) -> str:
    """The file-name stem of a host's keeper (a digest of its identity)."""
    text = json.dumps(identity(host), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def socket_path(host: Host, folder: Path) -> Path:
    """Where the keeper of ``host`` listens (its record: the same name, ``.json``)."""
    return folder / f"{key_of(host)}.{WIRE}.sock"


def of_this_wire(record: Path) -> bool:
    """Whether a keeper's record (``<digest>.<wire>.json``) names a keeper of this framing;
    a record of another is never spoken to, only listed and stopped by its pid."""
    return record.name.endswith(f".{WIRE}.json")


def check_socket_file(path: Path) -> None:
    """A socket this user owns, mode 0600; anything else is refused (never connected to)."""
    info = os.lstat(path)
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.getuid() \
            or stat.S_IMODE(info.st_mode) != 0o600:
        raise UnsafePlace(
            f"{path} is not a keeper socket of this user (mode "
            f"{stat.S_IMODE(info.st_mode):o}, owner uid {info.st_uid}): refused. Remove it "
            "(`outrig connections --close` does) to let outrig start a fresh keeper.")


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket (``SO_PEERCRED``)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


# ------------------------------------------------------------------------------ framing


def encode(kind: bytes, payload: bytes = b"") -> bytes:
    """One frame of the keeper's socket: the live agent's frame with request id 0."""
    return serve.frame(kind, 0, payload)


def send_frame(sock: socket.socket, kind: bytes, payload: bytes = b"") -> None:
    sock.sendall(encode(kind, payload))


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            return None
        buf.extend(chunk)
    return bytes(buf)


def recv_frame(sock: socket.socket) -> tuple[bytes, bytes] | None:
    """One frame, or ``None`` when the other end closed or sent garbage (a request id other
    than 0, a length over :data:`MAX_FRAME`)."""
    head = _recv_exact(sock, HEADER.size)
    if head is None:
        return None
    kind, rid, size = HEADER.unpack(head)
    if rid != 0 or size > MAX_FRAME:
        return None
    payload = _recv_exact(sock, size) if size else b""
    if payload is None:
        return None
    return kind, payload


def send_json(sock: socket.socket, kind: bytes, value: Any) -> None:
    send_frame(sock, kind, json.dumps(value).encode())


# ------------------------------------------------------------------------------ the client's calls


class KeeperRefused(Exception):
    """The keeper answered with a failure: ``kind`` is ``link`` (its SSH link is dead),
    ``stale`` (it serves another identity or host key) or ``refused`` (the box refused the
    channel, as a direct connection would be). ``silent``: the link was found dead by
    silence (a keepalive or channel open unanswered within its limit), which cost the time
    of one silent connect attempt; a link found closed cost nothing."""

    def __init__(self, kind: str, message: str, *, silent: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.silent = silent


class KeeperGone(Exception):
    """No keeper answers at the socket: none started, or its process is gone."""


class NoKeeper(KeeperGone):
    """There is no socket at all: no keeper was started for this host, or the last one
    exited and removed it. Nothing is stale then, so nothing is said about it."""


def dial(path: Path, timeout: float = 5.0) -> socket.socket:
    """Connect to a keeper socket after checking the file and, once connected, the peer's
    uid. :class:`KeeperGone` when nothing listens; :class:`UnsafePlace` when refused."""
    try:
        check_socket_file(path)
    except FileNotFoundError:
        raise NoKeeper(f"no keeper at {path}") from None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError) as exc:
        sock.close()
        raise KeeperGone(f"the keeper at {path} is gone ({type(exc).__name__})") from None
    except OSError:
        sock.close()
        raise
    _pid, uid = peer_credentials(sock)
    if uid != os.getuid():
        sock.close()
        raise UnsafePlace(f"{path} is served by uid {uid}, not this user: refused")
    return sock


def request(path: Path, header: dict[str, Any], timeout: float) -> tuple[socket.socket,
                                                                          dict[str, Any]]:
    """Send one request and read the keeper's answer: the open socket and the ``k`` body."""
    sock = dial(path)
    try:
        sock.settimeout(timeout)
        send_json(sock, b"h", header)
        frame = recv_frame(sock)
    except OSError as exc:
        sock.close()
        raise KeeperGone(f"the keeper at {path} did not answer ({type(exc).__name__})") \
            from None
    if frame is None:
        sock.close()
        raise KeeperGone(f"the keeper at {path} closed the connection without an answer")
    kind, payload = frame
    body = json.loads(payload or b"{}")
    if kind == b"f":
        sock.close()
        raise KeeperRefused(str(body.get("kind", "stale")), str(body.get("message", "")),
                            silent=body.get("silent") is True)
    sock.settimeout(None)
    return sock, body
