"""The ``ssh`` connector: one Fabric/Paramiko connection per box, reused for every agent call.

SSH specifics, and why:
- Connections are built from a real ``fabric.Config`` that has loaded ``~/.ssh/config``, so an
  alias means the same here as in ``ssh`` (the fabric#2111 pitfall: a cloned Invoke config
  silently skips it).
- Host keys: a new host's key is accepted and *recorded* (``accept-new``, like OpenSSH); a
  changed key is refused with the ``ssh-keygen -R`` fix. Checking is never disabled.
- Timeouts scale with the last measured RTT (kept in the journal; the rules are in
  :mod:`outrig.timing`): a 240 ms link and a LAN get different limits, and every limit is
  named in the error when it fires.
- RTT is measured for free from the session-channel open (exactly one round trip).
- The public-key login is pipelined behind the ``ssh-userauth`` service request (one round
  trip fewer per connect; :mod:`outrig.connectors.ssh.pipelined_login` says why that is sound and
  when it falls back), and so is a command's session-channel open behind the login (OpenSSH
  servers only); ``OUTRIG_SSH_PIPELINE=login`` keeps the open for after the login's answer,
  ``=0`` switches both off.
- Liveness from outside (``watch``, ``migrate``): a fresh TCP connect to the port and the SSH
  banner (:func:`probe_port`), and a confirming login on a connection of its own
  (:meth:`SSHTransport.confirm_alive`), never the open or the warm connection.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import logging
import os
import re
import select
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outrig.connectors.ssh.pipelined_login import pipelined_transport_class, pipelining_wanted
from outrig.connectors.ssh.preconnect import CLIENT_BANNER, EarlyConnect
from outrig.errors import (
    AuthenticationError,
    ConfigError,
    ConnectError,
    ConnectRefused,
    HostKeyError,
    LinkLost,
    OutrigError,
)
from outrig.inventory import Host
from outrig.timing import (
    channel_timeout_for,
    connect_timeout_for,
    keepalive_interval_for,
    retry_pause,
)
from outrig.transport import (
    SILENT_ATTEMPTS,
    AgentChannel,
    PeerAddress,
    RetryPolicy,
    Transport,
    known_hosts_path,
)
from outrig.watching.health import Observation

if TYPE_CHECKING:
    from outrig.hosts.ssh_config import SSHRoute

# paramiko logs its own tracebacks (banner timeouts, resets) through the root logger's
# last-resort handler; outrig reports those failures itself, in one paragraph.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False


def fingerprint(key: Any) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return f"{key.get_name()} SHA256:{base64.b64encode(digest).decode().rstrip('=')}"


def probe_port(host: str, port: int, timeout: float) -> tuple[Observation, Observation]:
    """A fresh TCP connect to the SSH port and its banner, within ``timeout`` in all: the
    ``tcp`` and ``banner`` observations. A port that accepts and then resets or closes (a
    stopped sshd behind a gateway) fails both; one that accepts and stays silent passes TCP
    only."""
    started = time.monotonic()
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        return (Observation(started, "tcp", False, why),
                Observation(time.monotonic(), "banner", False, "no TCP connection"))
    with sock:
        connected = time.monotonic()
        data = b""
        try:
            while b"\n" not in data and len(data) < 256:
                left = timeout - (time.monotonic() - started)
                if left <= 0:
                    raise TimeoutError
                sock.settimeout(left)
                chunk = sock.recv(256)
                if not chunk:
                    return (Observation(connected, "tcp", False, "closed at once"),
                            Observation(time.monotonic(), "banner", False, "closed"))
                data += chunk
        except TimeoutError:
            return (Observation(connected, "tcp", True),
                    Observation(time.monotonic(), "banner", False,
                                f"no SSH banner within {timeout:.1f}s"))
        except OSError as exc:
            return (Observation(connected, "tcp", False, f"reset ({exc.strerror or exc})"),
                    Observation(time.monotonic(), "banner", False, "reset"))
    ok = data.startswith(b"SSH-")
    return (Observation(connected, "tcp", True),
            Observation(time.monotonic(), "banner", ok,
                        "" if ok else "the port does not speak SSH"))


def retry_notice(error: str) -> str:
    """``error``'s gist for a retry notice: its first sentence, parenthesised asides removed,
    cut at its first colon unless what comes before is only the host's name."""
    previous = None
    while previous != error:
        previous, error = error, re.sub(r"\s*\([^()]*\)", "", error)
    first = re.split(r"\.\s|\.$", error, maxsplit=1)[0]
    head = first.partition(": ")[0]
    return (head if " " in head else first).strip()


def proxy_socket(route: SSHRoute) -> Any:
    """The socket-like end of the route's proxy command (paramiko runs it; it is ended when
    the connection closes)."""
    import paramiko

    assert route.proxy is not None
    return paramiko.ProxyCommand(shlex.join(route.proxy))


def probe_route(route: SSHRoute, timeout: float) -> tuple[Observation, Observation]:
    """:func:`probe_port` along the route: where the configuration names a proxy, the banner
    is read through a run of the proxy command (the ``tcp`` observation is then the
    command's), never from a direct connect."""
    if route.proxy is None:
        return probe_port(route.hostname, route.port, timeout)
    started = time.monotonic()
    try:
        child = subprocess.Popen(route.proxy, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        return (Observation(started, "tcp", False, f"the proxy command failed: {exc}"),
                Observation(time.monotonic(), "banner", False, "no proxy"))
    data = b""
    try:
        assert child.stdout is not None
        out = child.stdout.fileno()
        while b"\n" not in data and len(data) < 256:
            left = timeout - (time.monotonic() - started)
            if left <= 0 or not select.select([out], [], [], left)[0]:
                break
            chunk = os.read(out, 256)
            if not chunk:
                break
            data += chunk
    finally:
        child.kill()
        child.wait()
    ok = data.startswith(b"SSH-")
    detail = "" if ok else ("no SSH banner through the proxy within "
                            f"{timeout:.1f}s" if not data else "the route does not speak SSH")
    return (Observation(started, "tcp", bool(data), "" if data else f"via {route.proxy_source}"),
            Observation(time.monotonic(), "banner", ok, detail))


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
        except TimeoutError:
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
        except (TimeoutError, OSError):
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


PHASE_WORDS = {
    "connect": "the TCP connect", "banner": "the SSH banner exchange",
    "kex": "the key exchange", "auth": "authentication",
    "channel": "the session-channel open, just after authentication",
    "exec": "the start of the command", "stream": "the command's output",
}


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


def _watched_transport_factory(pipeline: bool = True, early_channel: bool = False,
                               early_window: int | None = None) -> Callable[..., Any]:
    """A paramiko Transport that remembers a DISCONNECT the server sent on purpose, and whose
    public-key login is pipelined when ``pipeline`` is set.

    paramiko turns both a dropped link and the server's own goodbye (``Too many
    authentication failures``) into the same "transport shut down or saw EOF"; the recorded
    message is what tells a refusal from a cut."""
    base = pipelined_transport_class()

    class WatchedTransport(base):  # type: ignore[misc,valid-type]
        server_disconnect: tuple[int, str] | None = None
        pipeline_login = pipeline

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # the identification line outrig sends, also when it was sent ahead with the TCP
            # connect (preconnect.py): it enters the key exchange's hash, so one value only
            self.local_version = CLIENT_BANNER

        def _parse_disconnect(self, m: Any) -> None:
            code = m.get_int()
            desc = m.get_text()
            self.server_disconnect = (int(code), str(desc))

    WatchedTransport.early_channel = early_channel
    WatchedTransport.early_window = early_window
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


def check_identity_file(host: Host) -> None:
    """Refuse an ``identity_file:`` that is not a readable file before anything is sent
    (exit 2): paramiko would fail on it in the middle of authentication, which looks like
    a link that went silent."""
    if not host.identity_file:
        return
    path = Path(host.identity_file).expanduser()
    where = f"{host.source}" if host.source else "the host file"
    if not path.exists():
        problem = "does not exist"
    elif not path.is_file():
        problem = "is not a file"
    elif not os.access(path, os.R_OK):
        problem = "cannot be read by this user"
    else:
        return
    raise ConfigError(
        f"{host.describe()}: the key file {path} (identity_file: in {where}) {problem}. "
        "Fix the path, or remove identity_file: to use ssh-agent and ~/.ssh's default keys. "
        "Nothing was sent.")


def keys_tried(conn: Any, exc: BaseException) -> str:
    """Which keys paramiko looked for, for a connect that offered none: the named key
    files, ssh-agent and ~/.ssh's defaults, and what paramiko said."""
    named = (getattr(conn, "connect_kwargs", None) or {}).get("key_filename") or []
    if isinstance(named, str):
        named = [named]
    parts = [f"{', '.join(map(str, named))} could not be loaded"] if named else []
    agent = "ssh-agent: SSH_AUTH_SOCK is not set" if not os.environ.get("SSH_AUTH_SOCK") \
        else "ssh-agent offered no usable key"
    defaults = [f"~/.ssh/id_{kind}" for kind in ("rsa", "ecdsa", "ed25519")]
    found = [d for d in defaults if Path(d).expanduser().is_file()]
    parts.append(agent)
    parts.append(f"default keys: {', '.join(found)} could not be used" if found else
                 f"no default key ({', '.join(defaults)}) exists")
    said = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return "; ".join(parts) + f" (paramiko: {said})"


class SSHTransport(Transport):
    """One Fabric connection to one box, opened lazily, reused for every agent call.

    Link failures before the agent's request is sent (TCP connect through the session-channel
    open) are retried here, a bounded number of times with RTT-scaled pauses: nothing has
    run on the box yet, so a retry is always safe. A refused key or a changed host key is
    never retried."""

    name = "ssh"

    def __init__(self, host: Host, *, rtt_hint: float | None = None,
                 notify: Callable[[str], None] | None = None,
                 attempts: int = RetryPolicy.refused, link_attempts: int = RetryPolicy.link,
                 channel_attempts: int = RetryPolicy.channel,
                 pipeline: bool | None = None, early_channel: bool | None = None) -> None:
        self.host = host
        # pipelined login (pipelined_login.py); off after a pipelined login was cut; and
        # the channel open behind it, for the connect a command makes (off after a failure)
        login, channel = pipelining_wanted()
        self.pipeline = login if pipeline is None else pipeline
        self.early_channel = self.pipeline and (channel if early_channel is None
                                                else early_channel)
        self._early_window: tuple[bool, int | None] = (False, None)  # for the next connect
        self.rtt_hint = rtt_hint
        self.rtt = None
        self.notify = notify
        self.retry = RetryPolicy(refused=max(1, attempts), link=max(1, link_attempts),
                                 channel=max(1, channel_attempts))
        self.connection: Any = None
        self._route: SSHRoute | None = None
        self.connect_seconds: float | None = None
        self.link_failures = 0  # link failures retried by this transport (for reports, tests)
        self.early_connects = 0  # connects whose TCP connect and banner left early (tests)
        self._tunnel_lock = threading.Lock()  # forwarded connections arrive on threads

    def route(self) -> SSHRoute:
        """Where the connection goes after the SSH configuration, read as OpenSSH reads it
        (:mod:`outrig.hosts.ssh_config`: ``Include``, ``Match``, a proxy from any file). Imported
        here: a command through a live keeper connects nothing and reads none of it."""
        from outrig.hosts.ssh_config import ssh_route

        return ssh_route(self.host.hostname, port=self.host.port, user=self.host.user)

    def _build(self, timeout: float, route: SSHRoute) -> Any:
        import fabric
        import paramiko

        # NOTE: the SSH configuration is read by outrig.hosts.ssh_config (paramiko's reading, which
        # Fabric would use, has no Include: a ProxyCommand kept in an included file was
        # skipped); Fabric is given an empty one and the route's values.
        config = fabric.Config(ssh_config=paramiko.SSHConfig())
        connect_kwargs: dict[str, Any] = {"banner_timeout": timeout, "auth_timeout": timeout,
                                          "transport_factory": _watched_transport_factory(
                                              self.pipeline, *self._early_window)}
        keys = [str(Path(self.host.identity_file).expanduser())] \
            if self.host.identity_file else []
        keys += [k for k in route.identity_files if k not in keys]
        if keys:
            connect_kwargs["key_filename"] = keys
        conn = fabric.Connection(host=route.hostname, user=route.user, port=route.port,
                                 config=config, gateway=False, connect_timeout=timeout,
                                 connect_kwargs=connect_kwargs)
        path = known_hosts_path(self.host)
        if path.is_file():
            conn.client.load_host_keys(str(path))
        conn.client.set_missing_host_key_policy(_AcceptNewPolicy(path, self.notify))
        return conn

    def _target(self, conn: Any) -> str:
        """``sandbox (root@127.0.0.1:44259)``: the host as named, then what the connection
        used (after ``~/.ssh/config``)."""
        user = getattr(conn, "user", None) or "?"
        via = f" via the {self._route.proxy_source}" if self._route and self._route.proxy else ""
        return self.host.label(f"{user}@{conn.host}:{conn.port}{via}")

    def connect_opening_channel(self) -> None:
        """:meth:`connect`, with a session-channel open sent behind the login where the
        pipelining allows it, for the caller to take with the paramiko transport's
        ``take_early_channel`` (a keeper's first spare channel)."""
        self._early_window = (self.early_channel and self.pipeline, None)
        try:
            self.connect()
        finally:
            self._early_window = (False, None)

    def connect(self) -> None:
        if self.connection is not None:
            return
        self.host.refuse_placeholder()  # an unedited starter host file: say so, send nothing
        check_identity_file(self.host)  # before the box is contacted: nothing to retry
        timeout, why = connect_timeout_for(self.host, self.rtt_hint)
        refused = silent = lost = 0
        attempt = 0
        route = self._route = self.route()  # one it cannot read fully is refused here
        # the first attempt's TCP connect and banner leave now, while Fabric and paramiko
        # load; never where the configuration names a proxy
        early = EarlyConnect(route.hostname, route.port, timeout) \
            if route.direct and route.hostname else None
        while True:
            attempt += 1
            conn = self._build(timeout, route)
            started = time.monotonic()
            try:
                if early is not None:
                    taken, early = early, None  # the first attempt's only, failed or not
                    self._adopt_early(taken, conn, timeout)
                if route.proxy is not None:  # a connection through it, never a direct one
                    conn.connect_kwargs["sock"] = proxy_socket(route)
                conn.open()
            except BaseException as exc:
                error = self._classify(conn, exc, timeout, why, time.monotonic() - started)
                conn.close()
                if isinstance(error, ConnectRefused):
                    refused += 1
                    if refused >= self.retry.refused:
                        raise error from None
                elif isinstance(error, LinkLost):
                    lost += 1
                    if error.phase == "auth" and self.pipeline:
                        # the fallback: should this server mishandle a pipelined login, the
                        # next attempts use paramiko's own sequence (one round trip more)
                        self.pipeline = False
                    silent += error.silent
                    if lost >= self.retry.link or silent >= min(self.retry.silent,
                                                             self.retry.refused):
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
            self._notice(str(error), pause)
            time.sleep(pause)

    def _adopt_early(self, early: EarlyConnect, conn: Any, timeout: float) -> None:
        """Give ``conn`` the socket connected ahead, or raise its connect's failure as this
        attempt's; when Fabric routes the connection elsewhere (a gateway, another address
        or port from ``~/.ssh/config``), close it unused and let ``conn`` connect itself."""
        if getattr(conn, "gateway", None) or (conn.host, int(conn.port or 22)) != early.address:
            early.discard()
            return
        sock, failure = early.take(timeout)
        if failure is not None:
            raise failure
        conn.connect_kwargs["sock"] = sock
        self.early_connects += 1

    def _notice(self, error: str, pause: float) -> None:
        """Tell the user a link failure is being retried (not an error yet), in a line: the
        error's first clause without its parentheses ("the link to sandbox dropped during
        authentication"; cutting at the first parenthesis dropped the verb)."""
        if self.notify is not None:
            self.notify(f"{retry_notice(error)}; retrying in {pause:.1f} s")

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
        phase = handshake_phase(transport)
        local = phase == "auth" and not getattr(transport, "auth_handler", None) \
            and transport is not None and transport.is_active()
        if local and isinstance(exc, OSError) and exc.filename:
            # a key file named by ~/.ssh/config (IdentityFile) that cannot be read
            return ConfigError(
                f"the key file {exc.filename} cannot be read ({exc.strerror or exc}): it is "
                f"named for {target} by identity_file: or an IdentityFile in ~/.ssh/config. "
                "Fix the path, or remove it to use ssh-agent and ~/.ssh's default keys. "
                "Nothing ran on the box.")
        if local and isinstance(exc, paramiko.SSHException):
            # paramiko offered no key at all (none found, or none could be loaded): the box
            # never refused anything and the link is fine, so this is neither a refusal to
            # retry nor a silence
            return AuthenticationError(
                f"no key was offered to {target}: {keys_tried(conn, exc)}. Set identity_file:"
                " in the host file (or IdentityFile in ~/.ssh/config), or load the key into "
                "ssh-agent (ssh-add KEY). Nothing ran on the box.")
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
            # A drop (reset, EOF) kills paramiko's transport; a silent link leaves it waiting.
            # paramiko's banner timeout ends its transport too, so a failure that took the
            # whole limit is a silence whatever the transport's state (it cost a limit).
            quiet = isinstance(exc, (TimeoutError, socket.timeout)) or bool(
                transport is not None and transport.is_active()) or spent >= 0.9 * timeout
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
            self._early_window = (self.early_channel and self.pipeline, window_size)
            try:
                self.connect()
            finally:
                self._early_window = (False, None)
            try:
                return self._open(argv, window_size)
            except LinkLost as exc:
                link = self.connection.transport if self.connection is not None else None
                if getattr(link, "early_channels", 0):
                    self.early_channel = False  # the next attempt opens it after the login
                self.close()
                silent += exc.silent  # each silence costs a whole limit: fewer of those
                if attempt >= self.retry.channel or silent >= SILENT_ATTEMPTS:
                    raise
                self.link_failures += 1
                pause = retry_pause(self.best_rtt, attempt)
                self._notice(str(exc), pause)
            time.sleep(pause)

    def _open(self, argv: list[str], window_size: int | None) -> AgentChannel:
        """Open one session channel and send the exec (pipelined, no reply awaited)."""
        import paramiko

        transport = self.connection.transport
        rtt = self.best_rtt
        if rtt is None:
            # the pipelined login's service accept took exactly one round trip; else the
            # handshake took at least 3 (banners, key exchange, login): an upper bound
            rtt = getattr(transport, "login_rtt", None)
        if rtt is None and self.connect_seconds is not None:
            rtt = self.connect_seconds / 3
        limit, why = channel_timeout_for(self.host, rtt)
        started = time.monotonic()
        host = self.host.label()
        early = None
        try:
            take = getattr(transport, "take_early_channel", None)
            early = take(limit) if take is not None else None
            channel = early if early is not None else \
                transport.open_session(window_size=window_size, timeout=limit)
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
        # The channel-open confirmation is exactly one round trip: a free RTT measurement;
        # one sent behind the login waited for the login too, and the service accept is used
        self.rtt = time.monotonic() - started if early is None else \
            getattr(transport, "login_rtt", None) or self.rtt
        transport.set_keepalive(keepalive_interval_for(self.rtt))
        try:
            exec_pipelined(channel, shlex.join(argv))
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise LinkLost(f"{host}: the link dropped while sending the command "
                           f"({type(exc).__name__}).", phase="exec") from None
        return _SSHChannel(channel, host)

    def probe(self, timeout: float) -> list[Observation]:
        """The ``tcp`` and ``banner`` observations of :func:`probe_route` along the
        configured route; the open connection is not used."""
        return list(probe_route(self.route(), timeout))

    def confirm_alive(self, timeout: float) -> Observation:
        """The fresh look a death needs (never the open or the warm connection): a TCP
        connect and the SSH banner within ``timeout``, then, when they answer, a whole SSH
        login with one attempt; ``ok`` when the box answered. A port that gives no banner
        within ``timeout`` fails without the SSH connect's own (longer) limit."""
        tcp, banner = probe_route(self.route(), timeout)
        if not banner.ok:
            return Observation(time.monotonic(), "confirm", False,
                               f"{banner.detail}" if tcp.ok else f"TCP: {tcp.detail}")
        # A plain SSHTransport even under KeptTransport: the login must be a new one.
        fresh = SSHTransport(self.host, rtt_hint=self.best_rtt, attempts=1, link_attempts=1,
                             channel_attempts=1)
        try:
            fresh.connect()
            return Observation(time.monotonic(), "confirm", True, "a fresh SSH login worked")
        except OutrigError as exc:
            return Observation(time.monotonic(), "confirm", False, str(exc).split(". ")[0])
        finally:
            with contextlib.suppress(Exception):
                fresh.close()

    def peer_address(self) -> PeerAddress:
        """What the connection really used (``~/.ssh/config`` may rename host, port and user);
        the host file's values before the first connect."""
        conn = self.connection
        if conn is None:
            return super().peer_address()
        return PeerAddress(str(conn.host), int(conn.port), conn.user)

    def open_tunnel(self, remote: tuple[str, int], origin: tuple[str, int],
                    timeout: float, on_reconnect: Callable[[], None]) -> Any:
        """A ``direct-tcpip`` channel to ``remote`` on this connection; when the link is
        found dead (now, or by the open failing) it reconnects once and tries again."""
        import paramiko

        for attempt in (1, 2):
            with self._tunnel_lock:
                link = self.connection.transport if self.connection is not None else None
                if link is None or not link.is_active():
                    if self.connection is not None:
                        on_reconnect()
                    self.close()
                    self.connect()
                    link = self.connection.transport
            try:
                return link.open_channel("direct-tcpip", remote, origin, timeout=timeout)
            except paramiko.ChannelException as exc:  # the box answered: nothing listens
                raise ConnectError(
                    f"the box refused {remote[0]}:{remote[1]} ({exc.text}); is the "
                    "process running? see outrig status") from None
            except (paramiko.SSHException, EOFError, OSError):
                with self._tunnel_lock:
                    if self.connection is not None and self.connection.transport is link:
                        self.close()  # the next attempt reconnects
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.connection is not None:
            try:
                self.connection.close()
            finally:
                self.connection = None
