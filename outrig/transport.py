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

from outrig.errors import ConnectError, HostKeyError, OutrigError
from outrig.inventory import Host

DEFAULT_CONNECT_TIMEOUT = 15.0

# paramiko logs its own tracebacks (banner timeouts, resets) through the root logger's
# last-resort handler; outrig reports those failures itself, in one paragraph.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False


def connect_timeout_for(host: Host, rtt: float | None) -> tuple[float, str]:
    """The connect limit and a sentence saying where it came from (for the error message)."""
    if host.connect_timeout is not None:
        return host.connect_timeout, "connect_timeout in the host file"
    if rtt is None:
        return DEFAULT_CONNECT_TIMEOUT, "default; no RTT measured yet for this host"
    limit = max(DEFAULT_CONNECT_TIMEOUT, 30 * rtt)
    return limit, f"max({DEFAULT_CONNECT_TIMEOUT:g} s, 30 × last measured RTT {rtt * 1000:.0f} ms)"


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
    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self._err = bytearray()

    def write(self, data: bytes) -> None:
        self.channel.sendall(data)

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


class SSHTransport(Transport):
    """One Fabric connection to one box, opened lazily, reused for every agent call."""

    def __init__(self, host: Host, *, rtt_hint: float | None = None,
                 notify: Callable[[str], None] | None = None, attempts: int = 2) -> None:
        self.host = host
        self.rtt_hint = rtt_hint
        self.rtt = None
        self.notify = notify
        self.attempts = max(1, attempts)
        self.connection: Any = None
        self.connect_seconds: float | None = None

    def _build(self, timeout: float) -> Any:
        import fabric

        # NOTE: a fresh fabric.Config loads ~/.ssh/config and /etc/ssh/ssh_config at init; a
        # cloned invoke config would not (fabric#2111), and aliases would silently resolve to
        # the local user on port 22.
        config = fabric.Config()
        connect_kwargs: dict[str, Any] = {"banner_timeout": timeout, "auth_timeout": timeout}
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

    def connect(self) -> None:
        if self.connection is not None:
            return
        import paramiko

        timeout, why = connect_timeout_for(self.host, self.rtt_hint)
        last: BaseException | None = None
        for attempt in range(1, self.attempts + 1):
            conn = self._build(timeout)
            target = self._target(conn)
            started = time.monotonic()
            try:
                conn.open()
            except paramiko.BadHostKeyException as exc:
                conn.close()
                path = known_hosts_path(self.host)
                # paramiko reports the bare hostname; known_hosts keys non-22 ports as [h]:p
                name = conn.host if conn.port == 22 else f"[{conn.host}]:{conn.port}"
                raise HostKeyError(
                    f"the host key of {name} has CHANGED: it now offers "
                    f"{fingerprint(exc.key)}, but {path} recorded {fingerprint(exc.expected_key)}."
                    f" If the box was rebuilt or its address reused, remove the old key with "
                    f"`ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(str(path))}` and retry;"
                    " if not, someone may be intercepting the connection: do not continue."
                ) from None
            except paramiko.AuthenticationException as exc:
                conn.close()
                key = self.host.identity_file or "ssh-agent / ~/.ssh default keys"
                raise ConnectError(
                    f"authentication failed for {target} ({exc}); tried {key}. Check user: and "
                    "identity_file: in the host file (or ~/.ssh/config), and that the public key "
                    "is in the box's ~/.ssh/authorized_keys."
                ) from None
            except socket.gaierror as exc:
                conn.close()
                raise ConnectError(
                    f"cannot resolve hostname {conn.host!r} ({exc.strerror}); fix hostname: in "
                    "the host file or the alias in ~/.ssh/config"
                ) from None
            except (ConnectionRefusedError, paramiko.ssh_exception.NoValidConnectionsError) as exc:
                conn.close()
                if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and not all(
                        getattr(e, "errno", None) == errno.ECONNREFUSED
                        for e in exc.errors.values()):
                    raise ConnectError(f"could not connect to {target}: {exc}") from None
                last = ConnectionRefusedError()
                if attempt == self.attempts:
                    raise ConnectError(
                        f"connection refused by {target}: nothing listens on port {conn.port}. "
                        "Is the box up and sshd running, and is port: right?"
                    ) from None
            except (TimeoutError, socket.timeout, paramiko.SSHException, EOFError, OSError) as exc:
                conn.close()
                last = exc
                if attempt == self.attempts:
                    spent = time.monotonic() - started
                    raise ConnectError(
                        f"could not reach {target}: no SSH session within the connect timeout of "
                        f"{timeout:g} s ({why}); gave up after {attempt} attempt(s), the last "
                        f"after {spent:.1f} s ({type(exc).__name__}: {exc or 'timed out'}). Check "
                        "that the box is up and the address and port are right; on a very slow "
                        "link set connect_timeout: in the host file."
                    ) from None
            else:
                self.connection = conn
                self.connect_seconds = time.monotonic() - started
                conn.transport.set_keepalive(keepalive_interval_for(self.rtt_hint))
                return
            time.sleep(random.uniform(0.2, 1.0))  # jitter: rented boxes reboot, links flap
        raise ConnectError(f"could not connect to {self.host.describe()}: {last}")

    def start(self, argv: list[str], *, window_size: int | None = None) -> AgentChannel:
        self.connect()
        transport = self.connection.transport
        started = time.monotonic()
        try:
            channel = transport.open_session(
                window_size=window_size, timeout=connect_timeout_for(self.host, self.rtt)[0])
        except Exception as exc:
            raise ConnectError(f"{self.host.describe()}: could not open an SSH channel: {exc}") \
                from None
        # The channel-open confirmation is exactly one round trip: a free RTT measurement.
        self.rtt = time.monotonic() - started
        transport.set_keepalive(keepalive_interval_for(self.rtt))
        exec_pipelined(channel, shlex.join(argv))
        return _SSHChannel(channel)

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
