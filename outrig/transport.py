"""Transports: how bytes reach the agent. One SSH connection per host, or a local subprocess.

The rest of outrig sees only :class:`Transport.start` → :class:`AgentChannel` (write stdin,
read stdout with a timeout, read stderr, exit status). That narrow seam is what lets the same
agent protocol run over Fabric/Paramiko, over a local pipe (``--host local``), and in tests.

SSH specifics, and why:
- Connections are built from a real ``fabric.Config`` that has loaded ``~/.ssh/config``, so an
  alias means the same here as in ``ssh`` (the fabric#2111 pitfall: a cloned Invoke config
  silently skips it).
- Host keys: a new host's key is accepted and *recorded* (``accept-new``, like OpenSSH); a
  changed key is refused with the ``ssh-keygen -R`` fix. Checking is never disabled.
- Timeouts scale with the last measured RTT (kept in the journal): a 240 ms link and a LAN get
  different limits, and every limit is named in the error when it fires.
- RTT is measured for free from the session-channel open (exactly one round trip).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import logging
import os
import random
import selectors
import shlex
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

from outrig.errors import (
    AuthenticationError,
    ConnectError,
    ConnectRefused,
    HostKeyError,
    LinkLost,
    OutrigError,
)
from outrig.inventory import Host

DEFAULT_CONNECT_TIMEOUT = 15.0

# paramiko logs its own tracebacks (banner timeouts, resets) through the root logger's
# last-resort handler; outrig reports those failures itself, in one paragraph.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False


def _rtt_scaled(host: Host, rtt: float | None, floor: float, times: int,
                which: str) -> tuple[float, str]:
    """A limit and the sentence saying where it came from (for the error message): the host
    file's connect_timeout, else ``times`` × the measured RTT but never below ``floor``."""
    if host.connect_timeout is not None:
        return host.connect_timeout, "connect_timeout in the host file"
    if rtt is None:
        return DEFAULT_CONNECT_TIMEOUT, "default; no RTT measured yet for this host"
    return (max(floor, times * rtt),
            f"max({floor:g} s, {times} × {which} RTT {rtt * 1000:.0f} ms)")


def connect_timeout_for(host: Host, rtt: float | None) -> tuple[float, str]:
    """The connect limit and a sentence saying where it came from (for the error message)."""
    return _rtt_scaled(host, rtt, DEFAULT_CONNECT_TIMEOUT, 30, "last measured")


def keepalive_interval_for(rtt: float | None) -> int:
    """SSH keepalive period: a dead link shows within ~3 intervals, never fires on a slow one."""
    if rtt is None:
        return 10
    return max(5, round(10 * rtt))


def fingerprint(key: Any) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return f"{key.get_name()} SHA256:{base64.b64encode(digest).decode().rstrip('=')}"


class AgentChannel(ABC):
    """A running agent: its stdin, stdout and stderr."""

    @abstractmethod
    def write(self, data: bytes) -> None: ...

    @abstractmethod
    def read(self, timeout: float) -> bytes | None:
        """Up to 64 KiB of stdout; ``None`` when nothing came within ``timeout``; ``b""`` at EOF."""

    @abstractmethod
    def stderr_text(self) -> str: ...

    @abstractmethod
    def exit_status(self, timeout: float = 5.0) -> int | None: ...

    @abstractmethod
    def close(self) -> None: ...

    def alive(self) -> bool:
        """Whether the link under the channel is still up (SSH: the transport is active)."""
        return True

    def stderr_so_far(self) -> bytes:
        """Everything the command wrote to stderr until now (``exec`` streams it)."""
        return bytes(getattr(self, "_err", b""))

    def close_input(self) -> None:
        """Send EOF on the command's stdin (the end of a file stream)."""


class Transport(ABC):
    """One box. ``start`` runs a command there and returns its :class:`AgentChannel`."""

    host: Host
    rtt: float | None = None

    @abstractmethod
    def start(self, argv: list[str], *, window_size: int | None = None) -> AgentChannel:
        """Run ``argv``; ``window_size`` enlarges the receive window for bulk output."""

    def start_with_input(self, argv: list[str], data: bytes, *,
                         window_size: int | None = None) -> AgentChannel:
        """Start ``argv`` and write ``data`` to its stdin (added for ``tail-logs``).

        Transports may pipeline the two (SSH sends stdin without waiting for the exec reply,
        saving one round trip) and may open the channel with a larger receive window
        (``window_size`` bytes) for bulk output. The default is :meth:`start` + write.
        """
        channel = self.start(argv, window_size=window_size)
        channel.write(data)
        return channel

    def close(self) -> None:
        """Release the connection (idempotent)."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------- local


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
    """Runs the agent on this machine: ``--host local``, and the fast path in tests."""

    def __init__(self, host: Host) -> None:
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


# ----------------------------------------------------------------------------------------- ssh


class _SSHChannel(AgentChannel):
    def __init__(self, channel: Any, host: str = "the box") -> None:
        self.channel = channel
        self.host = host
        self._err = bytearray()

    def write(self, data: bytes) -> None:
        """Send ``data``; a dead link is a :class:`LinkLost`, whatever paramiko raised."""
        import paramiko

        try:
            self.channel.sendall(data)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise LinkLost(f"the link to {self.host} dropped while sending "
                           f"({type(exc).__name__}: {exc or 'closed'}).", phase="stream",
                           request_sent=True) from None

    def _drain_stderr(self) -> None:
        while self.channel.recv_stderr_ready():
            self._err.extend(self.channel.recv_stderr(65536))

    def read(self, timeout: float) -> bytes | None:
        self.channel.settimeout(timeout)
        try:
            data: bytes = self.channel.recv(65536)
        except (TimeoutError, socket.timeout):
            self._drain_stderr()
            return None
        self._drain_stderr()
        return data

    def stderr_text(self) -> str:
        self.channel.settimeout(2.0)
        try:
            while True:
                chunk = self.channel.recv_stderr(65536)
                if not chunk:
                    break
                self._err.extend(chunk)
        except (TimeoutError, socket.timeout, OSError):
            pass
        return self._err.decode("utf-8", "replace")

    def exit_status(self, timeout: float = 5.0) -> int | None:
        if self.channel.status_event.wait(timeout):
            return int(self.channel.recv_exit_status())
        return None

    def alive(self) -> bool:
        transport = self.channel.get_transport()
        return bool(transport is not None and transport.is_active())

    def close_input(self) -> None:
        with contextlib.suppress(Exception):
            self.channel.shutdown_write()

    def close(self) -> None:
        try:
            self.channel.close()
        except Exception:  # closing a channel on a dead transport may raise; nothing to do
            pass


class _AcceptNewPolicy:
    """OpenSSH's ``StrictHostKeyChecking=accept-new``: trust a host seen for the first time and
    record its key (appending one line, never rewriting the user's file); a *changed* key is
    rejected by paramiko itself before this policy is ever consulted."""

    def __init__(self, path: Path, notify: Callable[[str], None] | None) -> None:
        self.path = path
        self.notify = notify

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        fd = os.open(str(self.path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="ascii") as handle:
            handle.write(line)
        client.get_host_keys().add(hostname, key.get_name(), key)
        if self.notify:
            self.notify(f"new host {hostname}: recorded key {fingerprint(key)} in {self.path}")


def exec_pipelined(channel: Any, command: str) -> None:
    """``exec`` without waiting for the server's reply: saves one round trip per agent call.

    paramiko's ``exec_command`` asks for a reply and blocks on it (one RTT, 240 ms on the far
    box). OpenSSH processes a channel's messages in order, so the agent's stdin, written right
    after, reaches the command either way. A refused exec then shows as a channel that closes
    without a result, which the agent client reports with the exit status and stderr.
    """
    from paramiko.common import cMSG_CHANNEL_REQUEST
    from paramiko.message import Message

    message = Message()
    message.add_byte(cMSG_CHANNEL_REQUEST)
    message.add_int(channel.remote_chanid)
    message.add_string("exec")
    message.add_boolean(False)
    message.add_string(command)
    channel.transport._send_user_message(message)


def known_hosts_path(host: Host) -> Path:
    return Path(host.known_hosts or "~/.ssh/known_hosts").expanduser()


LINK_ATTEMPTS = 4  # handshakes per command when the link drops abruptly (reset, EOF)
SILENT_ATTEMPTS = 2  # of which at most this many may end in silence (each costs a timeout)
CHANNEL_ATTEMPTS = 4  # session-channel opens (each on a fresh connection after a drop)
CHANNEL_TIMEOUT_FLOOR = 5.0  # seconds; below this a loaded box's sshd may simply be slow
PHASE_WORDS = {
    "connect": "the TCP connect", "banner": "the SSH banner exchange",
    "kex": "the key exchange", "auth": "authentication",
    "channel": "the session-channel open, just after authentication",
    "exec": "the start of the command", "stream": "the command's output",
}


def retry_pause(rtt: float | None, attempt: int) -> float:
    """The wait before retry ``attempt`` (1-based) after a lost link: a few round trips,
    doubling, capped at 10 s, with jitter so that many workstations do not retry in step."""
    base = max(0.2, 4 * (rtt or 0.05))
    return float(min(base * 2 ** (attempt - 1), 10.0) * random.uniform(0.8, 1.2))


def channel_timeout_for(host: Host, rtt: float | None) -> tuple[float, str]:
    """How long a session-channel open may take once authenticated: one round trip, so a
    generous multiple of the measured RTT (never below a floor a loaded sshd can need)."""
    return _rtt_scaled(host, rtt, CHANNEL_TIMEOUT_FLOOR, 20, "measured")


def handshake_phase(transport: Any) -> str:
    """How far a (possibly failed) paramiko transport got: which phase a failure hit."""
    if transport is None:
        return "connect"
    if not getattr(transport, "remote_version", ""):
        return "banner"
    if getattr(transport, "session_id", None) is None:
        return "kex"
    if not transport.is_authenticated():
        return "auth"
    return "channel"


def _watched_transport_factory() -> Callable[..., Any]:
    """A paramiko Transport that remembers a DISCONNECT the server sent on purpose.

    paramiko turns both a dropped link and the server's own goodbye (``Too many
    authentication failures``) into the same "transport shut down or saw EOF"; the recorded
    message is what tells a refusal from a cut."""
    import paramiko

    class WatchedTransport(paramiko.Transport):
        server_disconnect: tuple[int, str] | None = None

        def _parse_disconnect(self, m: Any) -> None:
            code = m.get_int()
            desc = m.get_text()
            self.server_disconnect = (int(code), str(desc))

    return WatchedTransport


def auth_refused(transport: Any, exc: BaseException) -> bool:
    """Whether an AuthenticationException is the server's refusal (not a lost link): the
    server answered the last key with a failure, ended the session itself, or allows no
    method we have. A transport that died or went silent before answering is a lost link."""
    import paramiko

    if isinstance(exc, paramiko.BadAuthenticationType):
        return True
    if transport is None:
        return False
    if getattr(transport, "server_disconnect", None) is not None:
        return True
    handler = getattr(transport, "auth_handler", None)
    event = getattr(handler, "auth_event", None)
    answered = event is not None and event.is_set()
    return bool(answered and transport.is_active() and not transport.is_authenticated())


class SSHTransport(Transport):
    """One Fabric connection to one box, opened lazily, reused for every agent call.

    Link failures before the agent's request is sent (TCP connect through the session-channel
    open) are retried here, a bounded number of times with RTT-scaled pauses: nothing has
    run on the box yet, so a retry is always safe. A refused key or a changed host key is
    never retried."""

    def __init__(self, host: Host, *, rtt_hint: float | None = None,
                 notify: Callable[[str], None] | None = None, attempts: int = 2,
                 link_attempts: int = LINK_ATTEMPTS,
                 channel_attempts: int = CHANNEL_ATTEMPTS) -> None:
        self.host = host
        self.rtt_hint = rtt_hint
        self.rtt = None
        self.notify = notify
        self.attempts = max(1, attempts)
        self.link_attempts = max(1, link_attempts)
        self.channel_attempts = max(1, channel_attempts)
        self.connection: Any = None
        self.connect_seconds: float | None = None
        self.link_failures = 0  # link failures retried by this transport (for reports, tests)

    def _build(self, timeout: float) -> Any:
        import fabric

        # NOTE: a fresh fabric.Config loads ~/.ssh/config and /etc/ssh/ssh_config at init; a
        # cloned invoke config would not (fabric#2111), and aliases would silently resolve to
        # the local user on port 22.
        config = fabric.Config()
        connect_kwargs: dict[str, Any] = {"banner_timeout": timeout, "auth_timeout": timeout,
                                          "transport_factory": _watched_transport_factory()}
        if self.host.identity_file:
            connect_kwargs["key_filename"] = [str(Path(self.host.identity_file).expanduser())]
        conn = fabric.Connection(host=self.host.hostname, user=self.host.user,
                                 port=self.host.port, config=config,
                                 connect_timeout=timeout, connect_kwargs=connect_kwargs)
        path = known_hosts_path(self.host)
        if path.is_file():
            conn.client.load_host_keys(str(path))
        conn.client.set_missing_host_key_policy(_AcceptNewPolicy(path, self.notify))
        return conn

    def _target(self, conn: Any) -> str:
        user = getattr(conn, "user", None) or "?"
        return f"{user}@{conn.host}:{conn.port}"

    @property
    def best_rtt(self) -> float | None:
        """The measured RTT of this connection, else the last one recorded for the host."""
        return self.rtt if self.rtt is not None else self.rtt_hint

    def connect(self) -> None:
        if self.connection is not None:
            return
        timeout, why = connect_timeout_for(self.host, self.rtt_hint)
        refused = silent = lost = 0
        attempt = 0
        while True:
            attempt += 1
            conn = self._build(timeout)
            started = time.monotonic()
            try:
                conn.open()
            except BaseException as exc:
                error = self._classify(conn, exc, timeout, why, time.monotonic() - started)
                conn.close()
                if isinstance(error, ConnectRefused):
                    refused += 1
                    if refused >= self.attempts:
                        raise error from None
                elif isinstance(error, LinkLost):
                    lost += 1
                    silent += error.silent
                    if lost >= self.link_attempts or silent >= min(SILENT_ATTEMPTS,
                                                                   self.attempts):
                        raise LinkLost(f"{error} Tried {attempt} time(s).", phase=error.phase,
                                       silent=error.silent) from None
                    self.link_failures += 1
                else:
                    raise error from None
            else:
                self.connection = conn
                self.connect_seconds = time.monotonic() - started
                conn.transport.set_keepalive(keepalive_interval_for(self.rtt_hint))
                return
            pause = retry_pause(self.rtt_hint, attempt)
            self._notice(str(error).split(" (")[0], pause)
            time.sleep(pause)

    def _notice(self, what: str, pause: float) -> None:
        """Tell the user a link failure is being retried (not an error yet)."""
        if self.notify is not None:
            self.notify(f"{what}; retrying in {pause:.1f} s")

    def _classify(self, conn: Any, exc: BaseException, timeout: float, why: str,
                  spent: float) -> BaseException:
        """Turn what ``conn.open()`` raised into outrig's error, by type and by how far the
        handshake got (never by message text)."""
        import paramiko

        target = self._target(conn)
        transport = conn.client.get_transport()
        if not isinstance(exc, Exception):
            return exc  # KeyboardInterrupt and the like pass through unchanged
        if isinstance(exc, paramiko.BadHostKeyException):
            path = known_hosts_path(self.host)
            # paramiko reports the bare hostname; known_hosts keys non-22 ports as [h]:p
            name = conn.host if conn.port == 22 else f"[{conn.host}]:{conn.port}"
            return HostKeyError(
                f"the host key of {name} has CHANGED: it now offers "
                f"{fingerprint(exc.key)}, but {path} recorded {fingerprint(exc.expected_key)}."
                f" If the box was rebuilt or its address reused, remove the old key with "
                f"`ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(str(path))}` and retry;"
                " if not, someone may be intercepting the connection: do not continue.")
        if isinstance(exc, paramiko.AuthenticationException) and auth_refused(transport, exc):
            key = self.host.identity_file or "ssh-agent / ~/.ssh default keys"
            said = getattr(transport, "server_disconnect", None)
            reason = f"the box ended the session: {said[1]!r}" if said else str(exc)
            return AuthenticationError(
                f"authentication failed for {target} ({reason}); tried {key}. Check user: and "
                "identity_file: in the host file (or ~/.ssh/config), and that the public key "
                "is in the box's ~/.ssh/authorized_keys.")
        if isinstance(exc, socket.gaierror):
            return ConnectError(
                f"cannot resolve hostname {conn.host!r} ({exc.strerror}); fix hostname: in "
                "the host file or the alias in ~/.ssh/config")
        no_valid = paramiko.ssh_exception.NoValidConnectionsError
        if isinstance(exc, (ConnectionRefusedError, no_valid)):
            if isinstance(exc, no_valid) and not all(
                    getattr(e, "errno", None) == errno.ECONNREFUSED
                    for e in exc.errors.values()):
                return ConnectError(f"could not connect to {target}: {exc}")
            return ConnectRefused(
                f"connection refused by {target}: nothing listens on port {conn.port}. "
                "Is the box up and sshd running, and is port: right?")
        if isinstance(exc, (TimeoutError, socket.timeout, paramiko.SSHException, EOFError,
                            OSError)):
            phase = handshake_phase(transport)
            # A drop (reset, EOF) kills paramiko's transport; a silent link leaves it waiting.
            quiet = isinstance(exc, (TimeoutError, socket.timeout)) or bool(
                transport is not None and transport.is_active())
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            how = (f"went silent during {PHASE_WORDS[phase]}: nothing within the connect "
                   f"timeout of {timeout:g} s ({why})") if quiet else \
                f"dropped during {PHASE_WORDS[phase]} after {spent:.1f} s ({detail})"
            return LinkLost(
                f"the link to {target} {how}. Check that the box is up and the address and "
                "port are right; on a very slow link set connect_timeout: in the host file. "
                "Run the same command again when the link is back.", phase=phase,
                silent=quiet)
        return exc

    def start(self, argv: list[str], *, window_size: int | None = None) -> AgentChannel:
        attempt = silent = 0
        while True:
            attempt += 1
            self.connect()
            try:
                return self._open(argv, window_size)
            except LinkLost as exc:
                self.close()
                silent += exc.silent  # each silence costs a whole limit: fewer of those
                if attempt >= self.channel_attempts or silent >= SILENT_ATTEMPTS:
                    raise
                self.link_failures += 1
                pause = retry_pause(self.best_rtt, attempt)
                self._notice(str(exc).split(" (")[0], pause)
            time.sleep(pause)

    def _open(self, argv: list[str], window_size: int | None) -> AgentChannel:
        """Open one session channel and send the exec (pipelined, no reply awaited)."""
        import paramiko

        transport = self.connection.transport
        rtt = self.best_rtt
        if rtt is None and self.connect_seconds is not None:
            rtt = self.connect_seconds / 4  # the handshake is ≥4 round trips: an upper bound
        limit, why = channel_timeout_for(self.host, rtt)
        started = time.monotonic()
        host = self.host.describe()
        try:
            channel = transport.open_session(window_size=window_size, timeout=limit)
        except paramiko.ChannelException as exc:
            raise ConnectError(
                f"{host}: the box refused a session channel ({exc.text or exc.code}); its sshd "
                "may limit sessions (MaxSessions) or forbid commands for this key.") from None
        except Exception as exc:
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if transport.is_active():
                raise LinkLost(
                    f"{host}: the link went silent after authentication: no answer to the "
                    f"session-channel open within {limit:.3g} s ({why}). Run the same command "
                    "again when the link is back.", phase="channel", silent=True) from None
            raise LinkLost(
                f"{host}: the link dropped just after authentication, while opening a session "
                f"channel ({detail}). Run the same command again when the link is back.",
                phase="channel") from None
        # The channel-open confirmation is exactly one round trip: a free RTT measurement.
        self.rtt = time.monotonic() - started
        transport.set_keepalive(keepalive_interval_for(self.rtt))
        try:
            exec_pipelined(channel, shlex.join(argv))
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise LinkLost(f"{host}: the link dropped while sending the command "
                           f"({type(exc).__name__}).", phase="exec") from None
        return _SSHChannel(channel, host)

    def close(self) -> None:
        if self.connection is not None:
            try:
                self.connection.close()
            finally:
                self.connection = None


def transport_for(host: Host, *, rtt_hint: float | None = None,
                  notify: Callable[[str], None] | None = None) -> Transport:
    if host.is_local:
        return LocalTransport(host)
    return SSHTransport(host, rtt_hint=rtt_hint, notify=notify)
