"""The ``ssh`` connector with a warm connection: a keeper process per host holds the SSH link.

The first command to a host starts a small local keeper (:mod:`outrig.connectors.keeper.daemon`):
it opens the SSH connection (the same :class:`SSHTransport`, the same host-key and retry
rules), listens on a Unix socket, and exits after an idle time, like OpenSSH's
``ControlPersist``. Later commands to that host ask the keeper for one session channel over
that socket instead of connecting: a warm command waits 1 RTT on the link (the exec goes out
on the keeper's spare channel, opened ahead, and the agent's answer comes back), not the ~4-5
RTT of a handshake plus the channel open (measured: docs/watch.md).

Why a relay and not passing file descriptors: an SSH channel is not a file descriptor (its
bytes are encrypted inside the one TCP stream paramiko owns), so the keeper has to pump each
channel's stdin, stdout, stderr and exit status itself; the wire's framing does that, one
channel per socket connection, and costs only local copies.

The socket's place, the framing and the client's calls (``dial``, ``request``) are the keeper's
wire (:mod:`outrig.connectors.keeper.wire`), shared with the keeper process.

Safety: the socket lives in a 0700 folder of this user (``OUTRIG_RUNTIME_DIR``, else
``$XDG_RUNTIME_DIR/outrig``, else the state dir's ``run/``), is 0600, is checked for owner and
mode before it is used, and both ends check the other's uid with ``SO_PEERCRED``. A keeper
that is gone, whose link died, or that serves another address, user, key or host key is
detected on the first request and the command starts a fresh keeper (or, when that fails,
connects directly, with every error the plain connector gives).

No op knows about this: it is the connector the ``ssh`` row of ``CONNECTORS`` builds when
keeping is on (:func:`ssh_connector`).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from outrig.connectors.keeper import daemon as keeper
from outrig.connectors.keeper.wire import (
    MAX_FRAME,
    RUNTIME_ENV,
    SOCKET_PATH_MAX,
    KeeperGone,
    KeeperRefused,
    NoKeeper,
    UnsafePlace,
    check_socket_file,
    dial,
    identity,
    of_this_wire,
    peer_credentials,
    private_dir,
    recv_frame,
    request,
    runtime_dir,
    send_frame,
    socket_path,
)
from outrig.connectors.ssh.transport import SSHTransport, check_identity_file
from outrig.errors import ConfigError, ConnectError, LinkLost
from outrig.inventory import Host
from outrig.timing import channel_timeout_for, connect_timeout_for, keepalive_limit_for
from outrig.transport import AgentChannel, LiveRequest, PeerAddress, RetryPolicy, Transport

DEFAULT_KEEP_SECONDS = 600.0  # a keeper exits after this long without a channel
KEEP_ENV = "OUTRIG_KEEP_SECONDS"  # 0 turns keeping off (as --no-keep does)


# ------------------------------------------------------------------------------ settings


def env_keep_seconds() -> float | None:
    """``OUTRIG_KEEP_SECONDS`` as a number of seconds (``None`` when unset); a value that is
    not a number is a ConfigError naming the variable."""
    raw = os.environ.get(KEEP_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{KEEP_ENV}={raw!r}: must be a number of seconds (0 turns the "
                          "warm connection off)") from None
    return max(0.0, value)


def keep_seconds_for(host: Host, setting: float | None = None) -> float:
    """How long a keeper for ``host`` waits idle. ``setting`` is the command's own (the
    project's ``keep_seconds``: ``--no-keep``, ``OUTRIG_KEEP_SECONDS`` or ``keep_seconds:``
    in outrig.yaml, resolved once by :func:`outrig.cli.settings.settings_for`); without one,
    ``OUTRIG_KEEP_SECONDS`` (a library caller's), else the host file's ``keep_seconds:``,
    else 10 minutes. 0 turns keeping off."""
    if setting is not None:
        return max(0.0, setting)
    from_env = env_keep_seconds()
    if from_env is not None:
        return from_env
    if host.keep_seconds is not None:
        return max(0.0, host.keep_seconds)
    return DEFAULT_KEEP_SECONDS


def ssh_connector(host: Host, *, rtt_hint: float | None = None,
                  notify: Callable[[str], None] | None = None,
                  keep_seconds: float | None = None) -> Transport:
    """The ``ssh`` row's factory: a kept connection unless keeping is off for this host
    (``keep_seconds``: the command's setting, see :func:`keep_seconds_for`)."""
    keep = keep_seconds_for(host, keep_seconds)
    if keep <= 0:
        return SSHTransport(host, rtt_hint=rtt_hint, notify=notify)
    return KeptTransport(host, rtt_hint=rtt_hint, notify=notify, keep_seconds=keep)


# ------------------------------------------------------------------------------ the client


class _KeptChannel(AgentChannel):
    """One agent channel relayed by the keeper: frames from the socket are sorted by a
    reader thread into stdout chunks, stderr and the exit status."""

    def __init__(self, sock: socket.socket, host: str,
                 on_silent: Callable[[str], None] = lambda why: None) -> None:
        self.sock = sock
        self.host = host
        self.on_silent = on_silent  # the keeper found the link dead by silence: why
        self._err = bytearray()
        self._out: queue.Queue[bytes] = queue.Queue()
        self._out_eof = False
        self._status: int | None = None
        self._ended = threading.Event()  # the relay is over (exit status or link lost)
        self._link_lost = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, daemon=True,
                                        name="outrig-kept-channel")
        self._thread.start()

    def _pump(self) -> None:
        """Sort the keeper's frames until the exit status, a lost link or the socket's end."""
        try:
            while True:
                frame = recv_frame(self.sock)
                if frame is None:
                    break
                kind, payload = frame
                if kind == b"o":
                    self._out.put(payload)
                elif kind == b"r":
                    self._err.extend(payload)
                elif kind == b"x":
                    self._status = int(json.loads(payload))
                    break
                elif kind == b"L":
                    self._heard_lost(payload)
                    break
        except OSError:
            pass
        finally:
            if self._status is None:
                self._link_lost = True
            self._out.put(b"")
            self._ended.set()

    def _heard_lost(self, payload: bytes) -> None:
        """The keeper's word on a lost request: why (the link found dead by silence, the
        box's live agent gone) and whether by silence (then the fresh connection that
        follows spends one silent attempt fewer, as after a refused silent link)."""
        try:
            said = json.loads(payload) if payload else {}
        except ValueError:
            said = {}
        if isinstance(said, dict):
            self.lost_why = str(said.get("why") or "")
            self.lost_silent = said.get("silent") is True
        if self.lost_silent and self.lost_why:
            self.on_silent(self.lost_why)

    def write(self, data: bytes) -> None:
        try:
            with self._lock:
                for start in range(0, len(data), MAX_FRAME // 2):
                    send_frame(self.sock, b"i", data[start:start + MAX_FRAME // 2])
        except OSError as exc:
            raise LinkLost(f"the link to {self.host} dropped while sending (the keeper's "
                           f"socket: {type(exc).__name__}).", phase="stream",
                           request_sent=True) from None

    def read(self, timeout: float) -> bytes | None:
        if self._out_eof:
            return b""
        try:
            chunk = self._out.get(timeout=timeout)
        except queue.Empty:
            return None
        if not chunk:
            self._out_eof = True
        return chunk

    def stderr_text(self) -> str:
        self._ended.wait(2.0)
        return self._err.decode("utf-8", "replace")

    def exit_status(self, timeout: float = 5.0) -> int | None:
        self._ended.wait(timeout)
        return self._status

    def alive(self) -> bool:
        return not self._link_lost

    def close_input(self) -> None:
        with contextlib.suppress(OSError), self._lock:
            send_frame(self.sock, b"e")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class KeptTransport(SSHTransport):
    """:class:`SSHTransport` whose agent channels go through the host's keeper.

    ``start`` asks the keeper for a channel; with no live keeper it starts one (which makes
    the connection, so the first command pays one handshake, as before) and, when that
    fails, connects directly, which reports the failure exactly as the plain connector does.
    ``connect`` and ``open_tunnel`` (``outrig forward``) always use a direct connection."""

    def __init__(self, host: Host, *, rtt_hint: float | None = None,
                 notify: Callable[[str], None] | None = None,
                 keep_seconds: float = DEFAULT_KEEP_SECONDS) -> None:
        super().__init__(host, rtt_hint=rtt_hint, notify=notify)
        self.keep_seconds = keep_seconds
        self.direct = False  # set once the keeper cannot serve this command
        self.kept_channels = 0  # channels this transport got from a keeper (for tests)
        self.keepers_started = 0
        self.keepalive_probes = 0  # kept links probed before they were lent (for tests)
        self.live_calls = 0  # of the kept channels, those the live agent served (no exec)
        # why the kept link was found dead by silence, when it was: that silence spent one
        # of the silent connect attempts the fresh connection would otherwise have
        self.kept_silence = ""
        # the same, heard on a lent channel (the keeper found its link dead mid-call): it
        # becomes kept_silence for the next command's keeper request
        self.lost_silence = ""
        self._peer: PeerAddress | None = None

    def start(self, argv: list[str], *, window_size: int | None = None) -> AgentChannel:
        return self.start_agent(argv, None, window_size=window_size)

    def start_agent(self, argv: list[str], live: LiveRequest | None, *,
                    window_size: int | None = None) -> AgentChannel:
        """Through the keeper: its live agent serves ``live`` when it can (no channel open,
        no exec), else a channel of the kept link runs ``argv``; direct when no keeper can
        serve this command."""
        if not self.direct and self.connection is None:
            self.host.refuse_placeholder()  # before a keeper is asked or started for it
            check_identity_file(self.host)  # a missing key file: exit 2, no keeper started
            channel = self._via_keeper(argv, window_size, live)
            if channel is not None:
                return channel
        return super().start(argv, window_size=window_size)

    def _via_keeper(self, argv: list[str], window_size: int | None,
                    live: LiveRequest | None = None) -> AgentChannel | None:
        """A channel from a live keeper, starting one when none answers; ``None`` (and
        direct from now on) when no keeper can serve this command."""
        try:
            folder = private_dir()
        except (UnsafePlace, OSError) as exc:
            self._say(f"no warm connection: {exc}")
            self.direct = True
            return None
        path = socket_path(self.host, folder)
        if len(str(path)) > SOCKET_PATH_MAX:
            self._say(f"no warm connection: the socket path {path} is too long; set "
                      f"{RUNTIME_ENV} to a shorter folder")
            self.direct = True
            return None
        header: dict[str, Any] = {"op": "exec", "identity": identity(self.host),
                                  "argv": argv, "window": window_size}
        if live is not None:
            header["agent"] = {"request": live.line.decode(), "python": live.python,
                               "workdir": live.workdir, "digest": live.digest}
            if live.bundle is not None:  # the keeper starts a live agent of it
                header["agent"]["bundle"] = live.bundle
        # the keeper may probe its link, then open a channel, before it answers
        limit = keepalive_limit_for(self.host, self.best_rtt)[0] + \
            channel_timeout_for(self.host, self.best_rtt)[0]
        self.kept_silence, self.lost_silence = self.lost_silence, ""
        for fresh in (False, True):
            if fresh and not self._start_keeper(folder, path):
                break
            try:
                sock, body = request(path, header, limit + 5.0)
            except KeeperGone as exc:
                if fresh:
                    self._say(f"the fresh keeper did not answer ({exc}); connecting directly")
                    break
                if not isinstance(exc, NoKeeper):  # a first contact: nothing to say
                    self._drop_stale(path, str(exc))
                continue
            except KeeperRefused as exc:
                if exc.kind == "refused":
                    raise ConnectError(exc.args[0]) from None
                if exc.silent:
                    self.kept_silence = str(exc)
                self._say(f"warm connection not usable ({exc.kind}: {exc}); "
                          + ("connecting directly" if fresh else "starting a fresh one"))
                if fresh:
                    break
                self._drop_stale(path, "")  # said above
                continue
            except UnsafePlace as exc:
                self._say(f"no warm connection: {exc}")
                break
            self._took(body)
            self.kept_silence = ""  # a fresh keeper connected: the budget is whole again
            channel = _KeptChannel(sock, self.host.label(),
                                   on_silent=lambda why: setattr(self, "lost_silence", why))
            channel.live = body.get("live") is True
            self.live_calls += channel.live
            return channel
        self.direct = True
        return None

    def _took(self, body: dict[str, Any]) -> None:
        """Record what the keeper said about its link (RTT of this channel open, address)."""
        rtt = body.get("rtt")
        if isinstance(rtt, (int, float)):
            self.rtt = float(rtt)
        self.keepalive_probes += body.get("probed") is True
        peer = body.get("peer")
        if isinstance(peer, list) and len(peer) == 3:
            self._peer = PeerAddress(str(peer[0]), int(peer[1]), peer[2])
        self.kept_channels += 1

    def _drop_stale(self, path: Path, why: str) -> None:
        """Remove a keeper's socket that no longer answers (its process is gone); a keeper
        that refused because its link died removes its own. ``why`` is said unless empty."""
        if why:
            self._say(f"stale warm connection ({why}); starting a fresh one")
        with contextlib.suppress(OSError):
            check_socket_file(path)
            path.unlink()

    def _start_keeper(self, folder: Path, path: Path) -> bool:
        """Start a keeper and wait until it is connected and listening. It connects with this
        connector's retry policy and passes its notices on as they happen, so a failure to
        connect is raised here exactly as a direct connect raises it (same type, message
        and retries: a dead box costs no more than without keeping). ``False`` when the
        keeper could not be started at all (the command then connects directly)."""
        config = {"host": asdict(self.host), "rtt_hint": self.best_rtt,
                  "keep_seconds": self.keep_seconds, "socket": str(path),
                  "identity": identity(self.host), "retry": asdict(self.retry_now())}
        if threading.active_count() == 1:
            report = self._fork_keeper(config)
        else:
            report = self._spawn_keeper(config)
        if report is None:
            return False
        if report.get("ready"):
            self.keepers_started += 1
            seconds = report.get("connect_seconds")
            if isinstance(seconds, (int, float)):
                self.connect_seconds = float(seconds)
            return True
        error = rebuilt_error(report.get("error"))
        if isinstance(error, LinkLost) and self.kept_silence:
            raise LinkLost(f"{error} Before that, the warm connection's link was found dead: "
                           f"{self.kept_silence}.", phase=error.phase,
                           silent=error.silent) from None
        if error is not None:
            raise error
        self._say(f"no warm connection ({report.get('error') or 'the keeper said nothing'});"
                  " connecting directly")
        return False

    def _fork_keeper(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """Fork the keeper from this process (one thread only, so no lock is held by a
        thread the child would lack): it starts with everything already imported, and the
        first command costs what a direct connect costs."""
        read_end, write_end = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(read_end)
            os.close(write_end)
            self._say(f"cannot start a keeper ({exc}); connecting directly")
            return None
        if pid == 0:  # the child: never returns into the command
            try:
                os.close(read_end)
                keeper.launch(config, write_end)
            finally:
                os._exit(1)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as stream:
            try:
                return self._follow_start(stream)
            finally:
                os.waitpid(pid, 0)  # the intermediate process exits at once

    def _spawn_keeper(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """Start the keeper from this command's keeper launcher (when this process has
        other threads and must not fork); without one, as ``python -m
        outrig.connectors.keeper.daemon``."""
        report = LAUNCHER.launch(config)
        if report is None:
            return self._spawn_alone(config)
        with os.fdopen(report, "rb") as stream:
            return self._follow_start(stream)

    def _spawn_alone(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """Start the keeper as a process of its own, ``python -m
        outrig.connectors.keeper.daemon``."""
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "outrig.connectors.keeper.daemon"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/",
                start_new_session=True, close_fds=True)
        except OSError as exc:
            self._say(f"cannot start a keeper ({exc}); connecting directly")
            return None
        assert proc.stdin is not None and proc.stdout is not None
        with contextlib.suppress(OSError):
            proc.stdin.write(json.dumps(config).encode())
            proc.stdin.close()
        try:
            return self._follow_start(proc.stdout)
        finally:
            proc.stdout.close()
            proc.wait()  # the launcher exits at once; the keeper is its detached grandchild

    def _follow_start(self, stream: Any) -> dict[str, Any]:
        """Relay the keeper's notices until its final word (``ready`` or an error)."""
        limit, _ = connect_timeout_for(self.host, self.best_rtt)
        # every handshake attempt may use the whole limit, plus the pauses between them
        deadline = time.monotonic() + (self.retry.link + self.retry.refused) * (limit + 10.0)
        lines = _Lines(stream)
        while True:
            line = lines.next(max(0.0, deadline - time.monotonic()))
            if not line:
                return {}
            try:
                message = json.loads(line)
            except ValueError:
                return {}
            if "notice" in message:
                self._say(str(message["notice"]))
                continue
            return dict(message)

    def _say(self, text: str) -> None:
        if self.notify is not None:
            self.notify(text)

    def retry_now(self) -> RetryPolicy:
        """The retry policy of the next connect: one silent attempt fewer when the kept link
        was just found dead by silence, which took about as long as one (so that no command
        through the keeper takes longer to report a dead link than a direct one;
        :func:`outrig.timing.dead_link_limit`)."""
        if not self.kept_silence:
            return self.retry
        return replace(self.retry, silent=max(1, self.retry.silent - 1))

    def connect(self) -> None:
        """A direct connection (``outrig forward`` holds its tunnels on it; a command whose
        keeper could not serve it falls back to one)."""
        self.direct = True
        if self.connection is not None or not self.kept_silence:
            super().connect()
            return
        saved, self.retry = self.retry, self.retry_now()
        try:
            super().connect()
        finally:
            self.retry, self.kept_silence = saved, ""

    def open_tunnel(self, remote: tuple[str, int], origin: tuple[str, int],
                    timeout: float, on_reconnect: Callable[[], None]) -> Any:
        self.direct = True
        return super().open_tunnel(remote, origin, timeout, on_reconnect)

    def peer_address(self) -> PeerAddress:
        if self.connection is None and self._peer is not None:
            return self._peer
        return super().peer_address()


class KeeperLauncher:
    """This command's keeper launcher: one ``python -m outrig.connectors.keeper.launch``
    that starts a keeper per request, all of them in one hosting process
    (:mod:`outrig.connectors.keeper.launch`), shared by the command's threads.

    Why: a fan-out starts a keeper per host from a process with many threads, which must
    not fork; one interpreter per keeper would pay Python's start and paramiko's imports
    (about 0.25 s of CPU) once per host, 20 times for 20 hosts, on the workstation, and one
    process per keeper about 10 MiB each. The launcher pays them once; it leaves when the
    command ends or after :data:`IDLE_S` without a request, and a command that finds it gone
    starts a fresh one. The keepers stay, in their hosting process."""

    IDLE_S = 30.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self.started = 0  # launcher processes started (for tests)

    def launch(self, config: dict[str, Any]) -> int | None:
        """Ask the launcher for a keeper; the read end of its report pipe (what
        :meth:`KeptTransport._follow_start` reads), or ``None`` when no launcher can be had
        (the caller then starts the keeper on its own)."""
        read_end, write_end = os.pipe()
        message = json.dumps({"config": config, "env": dict(os.environ)}).encode()
        try:
            with self._lock:
                for _attempt in (1, 2):  # a launcher that just left on idle: a fresh one
                    sock = self._sock or self._start()
                    if sock is None:
                        break
                    try:
                        socket.send_fds(sock, [message], [write_end])
                        return read_end
                    except OSError:
                        self._drop()
        finally:
            os.close(write_end)
        os.close(read_end)
        return None

    def _start(self) -> socket.socket | None:
        """Start a launcher (its stdin is our socket pair's other end)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "outrig.connectors.keeper.launch",
                 str(self.IDLE_S)], stdin=theirs.fileno(), stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, cwd="/", start_new_session=True, close_fds=True)
        except OSError:
            ours.close()
            return None
        finally:
            theirs.close()
        self.started += 1
        self._sock = ours
        return ours

    def close(self, timeout: float = 10.0) -> None:
        """Let the launcher go now (it leaves at the end of its socket) and reap it; the
        keepers it started stay. A later request starts a fresh one."""
        with self._lock:
            proc = self._proc
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            self._proc = None
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout)

    def _drop(self) -> None:
        """Forget a launcher that no longer takes requests (reaped if it has ended)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            self._proc.poll()
            self._proc = None


LAUNCHER = KeeperLauncher()


class _Lines:
    """Lines from a child's stdout, each within a deadline (``b""`` at EOF or time-out)."""

    def __init__(self, stream: Any) -> None:
        self.fd = stream.fileno()
        self.buf = bytearray()

    def next(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.fd], [], [], max(0.0, left))
            if not ready:
                return b""
            chunk = os.read(self.fd, 4096)
            if not chunk:
                return b""
            self.buf.extend(chunk)
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf[:] = rest
        return line


def rebuilt_error(error: Any) -> Exception | None:
    """The keeper's connect failure as the exception a direct connect raises (``None`` for
    one that is not a connect failure: the command then connects directly)."""
    from outrig import errors

    if not isinstance(error, dict):
        return None
    message = str(error.get("message", ""))
    kind = error.get("type")
    if kind == "LinkLost":
        return errors.LinkLost(message, phase=str(error.get("phase") or "connect"),
                               silent=bool(error.get("silent")))
    known = {"ConnectRefused": errors.ConnectRefused, "HostKeyError": errors.HostKeyError,
             "AuthenticationError": errors.AuthenticationError,
             "ConnectError": errors.ConnectError, "ConfigError": errors.ConfigError}
    factory = known.get(str(kind))
    return factory(message) if factory is not None else None


# ------------------------------------------------------------------------------ listing


def keepers(folder: Path | None = None) -> list[dict[str, Any]]:
    """The live keepers of this user: each one's record plus ``idle_left`` and ``age`` as
    it reports them, with the pid recorded when it is the socket's own listener
    (``SO_PEERCRED``). Records and sockets whose keeper no longer answers are removed.
    Keepers of another wire are not among them (:func:`older_keepers`)."""
    found = []
    for record, sock_path in _records(folder, this_wire=True):
        try:
            recorded = json.loads(record.read_text()).get("pid")
            sock, body = request(sock_path, {"op": "info"}, 5.0)
        except (KeeperGone, ValueError, OSError):
            _forget(record, sock_path)
            continue
        except (KeeperRefused, UnsafePlace):
            continue
        pid, _uid = peer_credentials(sock)
        sock.close()
        if pid != recorded:
            continue  # a record that does not name the socket's own listener: never signalled
        body["pid"] = pid
        body["socket"] = str(sock_path)
        found.append(body)
    return found


def older_keepers(folder: Path | None = None) -> list[dict[str, Any]]:
    """The keepers an outrig of another wire left running (a record not of
    :data:`~outrig.connectors.keeper.wire.WIRE`): never spoken to, since their frames are not
    ours; each is its record (name, host, started), with ``older: True`` and the pid when it
    is the socket's own listener (``SO_PEERCRED`` needs a connection, not a frame). They close
    themselves after their idle time; ``outrig connections --close`` stops them by that pid.
    Records whose socket nobody listens on are removed, as :func:`keepers` does."""
    found = []
    for record, sock_path in _records(folder, this_wire=False):
        try:
            entry = json.loads(record.read_text())
            sock = dial(sock_path)
        except (KeeperGone, ValueError, OSError):
            _forget(record, sock_path)
            continue
        except UnsafePlace:
            continue
        pid, _uid = peer_credentials(sock)
        sock.close()
        if not isinstance(entry, dict) or pid != entry.get("pid"):
            continue
        found.append({"name": str(entry.get("name")), "host": str(entry.get("host")),
                      "hostname": entry.get("hostname"), "started": entry.get("started"),
                      "pid": pid, "socket": str(sock_path), "older": True})
    return found


def _records(folder: Path | None, *, this_wire: bool) -> list[tuple[Path, Path]]:
    """The keeper records (and their sockets' paths) in the runtime folder, checked private
    first: those of this wire, or those of any other."""
    place = folder or runtime_dir()
    if not place.is_dir():
        return []
    private_dir(place)
    return [(record, record.with_suffix(".sock")) for record in sorted(place.glob("*.json"))
            if of_this_wire(record) == this_wire]


def _forget(record: Path, sock_path: Path) -> None:
    """A keeper that is gone: its socket (when it is a keeper socket of this user) and its
    record go."""
    with contextlib.suppress(OSError):
        if sock_path.exists():
            check_socket_file(sock_path)
            sock_path.unlink()
        record.unlink()


def close_keepers(host: str | None = None, folder: Path | None = None) -> list[dict[str, Any]]:
    """Stop the live keepers (of ``host``: its ``--host`` name or address). A process whose
    keepers are all to stop gets SIGTERM, by the pid recorded and confirmed as the socket's
    own listener through ``SO_PEERCRED``; a keeper that shares its process with others that
    stay (a fan-out's hosting process) is asked on its socket to close; an older outrig's
    keeper in such a process is left to close itself (it speaks another wire)."""
    import signal

    found = keepers(folder) + older_keepers(folder)
    chosen = [e for e in found if host is None or host in (e.get("name"), e.get("host"),
                                                           e.get("hostname"))]
    closed = []
    for entry in chosen:
        pid = int(entry["pid"])
        alone = all(e in chosen for e in found if int(e["pid"]) == pid)
        if alone:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                closed.append(entry)
            continue
        if entry.get("older"):
            continue
        with contextlib.suppress(KeeperGone, KeeperRefused, UnsafePlace, OSError):
            sock, _ = request(Path(entry["socket"]), {"op": "close"}, 5.0)
            sock.close()
            closed.append(entry)
    return closed


def wait_closed(entry: dict[str, Any], timeout: float, folder: Path | None = None) -> bool:
    """Whether the keeper of ``entry`` (as :func:`keepers` or :func:`older_keepers` listed
    it) is gone within ``timeout``: its process, or, in a process that hosts others, that
    keeper (no keeper answers at its socket any more, or a fresh one that another command
    started). Only the listing of ``entry``'s own wire is read again at each look."""
    deadline = time.monotonic() + timeout
    pid, started = int(entry["pid"]), entry.get("started")
    listing = older_keepers if entry.get("older") else keepers
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if not any(e["socket"] == entry["socket"] and e["pid"] == pid
                   and e.get("started") == started for e in listing(folder)):
            return True
        time.sleep(0.05)
    return False


def wait_gone(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` is gone within ``timeout`` (our keepers are not our children:
    no zombie lingers)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False
