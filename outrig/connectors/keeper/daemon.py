"""The keeper process behind a warm connection (``python -m outrig.connectors.keeper.daemon``).

Started by :class:`outrig.connectors.keeper.client.KeptTransport` with its configuration as JSON on
stdin. It detaches (double fork: it is nobody's child, so no zombie waits on a command that
has ended), connects with :class:`SSHTransport` (one attempt: the command that started it
retries directly), listens on its Unix socket, says ``{"ready": true}`` on stdout, and then
relays one channel per socket connection until it has been idle for ``keep_seconds``, its
link dies, or it gets SIGTERM (``outrig connections --close``).

Requests (frames of the keeper's wire, :mod:`outrig.connectors.keeper.wire`): ``exec`` (open
a session channel, exec argv pipelined, then relay ``i``/``e`` in and ``o``/``r``/``x``/``L``
out), ``info`` (host, age, idle time left, keepalives sent, how long the box has been quiet
and after how long a quiet link is probed). Every request is refused unless the peer's uid is
this process's and its identity is the one this keeper serves.

A kept link not heard from for more than a few RTTs is probed before a channel on it is lent
(:meth:`Keeper.probe`: a keepalive the box must answer within a few-RTT limit,
:func:`outrig.timing.keepalive_limit_for`). Why: a TCP connection that died while idle shows
nothing until something is sent, and the spare channel opened ahead skips the channel open's
own limit; without the probe a command on a dead link would send its exec into the void and
wait out the mid-call limit (a minute) before reconnecting. A link found silent is refused as
``silent``, and the command's fresh connection then gets one silent attempt fewer, so a dead
link is reported no later than by a direct connection (:func:`outrig.timing.dead_link_limit`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from outrig.connectors.keeper.link_probe import Ping, Pinger
from outrig.connectors.keeper.live import LiveAgent, Route, heartbeat_for
from outrig.connectors.keeper.wire import (
    peer_credentials,
    recv_frame,
    send_frame,
    send_json,
)
from outrig.connectors.ssh.transport import SSHTransport, _SSHChannel, exec_pipelined
from outrig.errors import ConnectError, LinkLost
from outrig.inventory import Host
from outrig.timing import channel_timeout_for, keepalive_limit_for, probe_idle_after
from outrig.transport import RetryPolicy, known_hosts_path, needs_own_channel

TICK = 1.0  # seconds between the keeper's checks of its link, idle time and socket
DRAIN_S = 3.0  # seconds a keeper whose link died waits for its requests to be told
WATCH_TICK = 0.1  # seconds between the watch's looks at the live agent's silence
ROOM_ATTEMPTS = 4  # channel opens refused by the box, while the keeper frees its own channels
ROOM_PAUSE = 0.2  # seconds, times the attempt number, for the box to free a session


class Keeper:
    """One host's SSH connection and the socket that lends its channels."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.host = Host(**config["host"])
        self.identity = config["identity"]
        self.keep_seconds = float(config["keep_seconds"])
        self.path = Path(config["socket"])
        self.record = self.path.with_suffix(".json")
        self.report: Any = None  # the starting command's pipe, until ready
        self.transport = SSHTransport(self.host, rtt_hint=config.get("rtt_hint"),
                                      notify=self.notice)
        self.transport.retry = RetryPolicy(**config.get("retry", {}))
        self.started = time.time()
        self.last_used = time.monotonic()
        self.active = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.signalled = False  # set by run()'s SIGTERM handler, which takes no lock
        self.listener: socket.socket | None = None
        self.inode = 0
        self.server_key = b""
        self.spare: Any = None  # one session channel opened ahead, with its open's RTT
        self.spare_rtt: float | None = None
        self.spare_lock = threading.Lock()
        self.no_spare = False  # the box allows too few sessions to keep one ahead
        self.last_heard = time.monotonic()  # when the box last showed it was there
        self.probe_lock = threading.Lock()
        self.probes = 0  # keepalives sent before lending (for ``info`` and tests)
        self.pinger = Pinger(self.heard, self.link_dead)  # every keepalive, one at a time
        self.dead_why = ""  # set once the link was found dead by silence: what every
        #                     request lent on it is told (and the next command's connect)
        self.live: LiveAgent | None = None  # the box's resident agent (connectors/keeper/live.py)
        self.live_lock = threading.Lock()
        # the last agent bundle relayed, by digest: restarts a live agent that died
        self.bundle: tuple[str, str] = ("", "")

    # ---------------------------------------------------------------- start and stop

    def notice(self, text: str) -> None:
        """A connect notice (retrying, new host key), passed on to the starting command
        at once, as the plain connector would show it."""
        self.say({"notice": text})

    def say(self, message: dict[str, Any]) -> None:
        if self.report is not None:
            with contextlib.suppress(OSError, ValueError):
                self.report.write(json.dumps(message) + "\n")
                self.report.flush()

    def open(self) -> None:
        """Connect, then bind the socket (0600 through the umask) and write the record. The
        connect sends a session-channel open behind the login (where the pipelining allows
        it): it becomes the first spare channel, so that the starting command's exec leaves
        one round trip sooner, and the keeper's connection has the same layout on the wire as
        a direct command's."""
        self.transport.connect_opening_channel()
        self.heard()
        link = self.transport.connection.transport
        self.server_key = link.get_remote_server_key().asbytes()
        os.umask(0o177)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        listener.bind(str(temp))
        listener.listen(16)
        os.replace(temp, self.path)  # a stale socket of a dead keeper is replaced at once
        self.inode = os.lstat(self.path).st_ino
        self.listener = listener
        record = {"pid": os.getpid(), "name": self.host.name, "host": self.host.describe(),
                  "hostname": self.host.hostname, "started": self.started,
                  "keep_seconds": self.keep_seconds}
        temp_record = self.record.with_name(f".{self.record.name}.{os.getpid()}")
        temp_record.write_text(json.dumps(record))
        os.replace(temp_record, self.record)

    def owns_socket(self) -> bool:
        """Whether the socket path is still ours (a fresher keeper may have replaced it)."""
        try:
            return os.lstat(self.path).st_ino == self.inode
        except OSError:
            return False

    def link_up(self) -> bool:
        conn = self.transport.connection
        return bool(conn is not None and conn.transport is not None
                    and conn.transport.is_active())

    def close(self) -> None:
        """Remove the socket and record if they are still ours, then drop the link."""
        self.close_listener()
        if self.live is not None:
            self.live.close()
        with contextlib.suppress(Exception):
            self.transport.close()

    def close_listener(self) -> None:
        """No request more: the socket and record go (if still ours), the listener closes."""
        if self.owns_socket():
            with contextlib.suppress(OSError):
                self.path.unlink()
            with contextlib.suppress(OSError, ValueError):
                if json.loads(self.record.read_text()).get("pid") == os.getpid():
                    self.record.unlink()
        if self.listener is not None:
            self.listener.close()

    def heard(self) -> None:
        """The box just showed it is there (a channel's output, a channel opened, an answered
        keepalive): no probe is needed for the next few RTTs."""
        self.last_heard = time.monotonic()

    def probe(self) -> tuple[float | None, str]:
        """Whether the link can be lent: ``(rtt, "")`` when it answered a keepalive now
        (``rtt`` is ``None`` when it was heard from within a few RTTs and not probed), else
        ``(None, why)`` naming the limit that fired. One probe at a time: a command that
        waited for another's finds the link just heard from."""
        with self.probe_lock:
            rtt = self.transport.best_rtt
            if time.monotonic() - self.last_heard <= probe_idle_after(rtt):
                return None, ""
            self.probes += 1
            ping = self.ping()
            ping.done.wait()
            if ping.rtt is None:
                return None, self.dead_why or ping.failure()
            return ping.rtt, ""

    def ping(self) -> Ping:
        """A keepalive on the link now (or the one in flight): a :class:`Ping`."""
        limit, why = keepalive_limit_for(self.host, self.transport.best_rtt)
        conn = self.transport.connection
        return self.pinger.ping(conn.transport if conn is not None else None, limit, why)

    def link_dead(self, why: str) -> None:
        """The link gave no answer within its limit: every request on it ends now as lost
        contact, told ``why`` (``silent``: the command's fresh connection spends one silent
        attempt fewer), and the keeper leaves."""
        if not self.dead_why:
            self.dead_why = why
        self.stop.set()
        with contextlib.suppress(Exception):
            self.transport.connection.transport.close()

    def lost(self) -> bytes:
        """The ``L`` frame's payload: why the link is gone, and whether by silence."""
        return json.dumps({"why": self.dead_why or "the kept SSH link dropped",
                           "silent": bool(self.dead_why)}).encode()

    def watch(self) -> None:
        """While it serves: a live agent silent for a few heartbeats (busy or idle) is
        probed with a keepalive; unanswered, the link is dead (:meth:`link_dead`, through
        the pinger); answered, the live agent is stopped or starved and is dropped
        (:meth:`LiveAgent.drop_silent`). Why here: a command waits on what it was lent with
        the mid-call limit, a minute; the keeper knows within a few heartbeats."""
        while not self.stop.wait(WATCH_TICK):
            live = self.live
            if live is None or live.state != "ready" or live.quiet() <= live.silent_after() \
                    or not self.link_up():
                continue
            ping = self.ping()
            ping.done.wait()
            if ping.rtt is None:
                return
            if live.quiet() > live.silent_after():
                live.drop_silent(f"silent for {live.quiet():.1f} s while the link answered: "
                                 "stopped or starved on the box")

    def idle_left(self) -> float:
        with self.lock:
            if self.active:
                return self.keep_seconds
            return max(0.0, self.keep_seconds - (time.monotonic() - self.last_used))

    # ---------------------------------------------------------------- serving

    def serve(self) -> None:
        """Accept requests until idle, link down, socket taken over, or SIGTERM."""
        assert self.listener is not None
        self.listener.settimeout(TICK)
        self.refill()
        threading.Thread(target=self.watch, daemon=True, name="outrig-keeper-watch").start()
        while not self.stop.is_set():
            if self.signalled:  # SIGTERM, alone in its process (run)
                self.stop.set()
                break
            if not self.link_up() or self.idle_left() <= 0:
                break
            if not self.owns_socket() and not self.active:
                break
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()
        if self.dead_why:  # let the requests lent on the dead link hear why (``L``)
            self.close_listener()
            deadline = time.monotonic() + DRAIN_S
            while self.active and time.monotonic() < deadline:
                time.sleep(0.05)

    def handle(self, conn: socket.socket) -> None:
        """One request on one socket connection."""
        try:
            _pid, uid = peer_credentials(conn)
            if uid != os.getuid():
                return  # never answer another user
            conn.settimeout(30.0)
            frame = recv_frame(conn)
            if frame is None or frame[0] != b"h":
                return
            header = json.loads(frame[1])
            if header.get("op") == "info":
                send_json(conn, b"k", {"name": self.host.name, "host": self.host.describe(),
                                       "hostname": self.host.hostname,
                                       "started": self.started,
                                       "age": time.time() - self.started,
                                       "idle_left": self.idle_left(),
                                       "keep_seconds": self.keep_seconds,
                                       "link_up": self.link_up(), "probes": self.probes,
                                       "quiet": time.monotonic() - self.last_heard,
                                       "probe_after": probe_idle_after(
                                           self.transport.best_rtt),
                                       "live": (self.live.describe()
                                                if self.live is not None else None)})
            elif header.get("op") == "exec":
                self.exec(conn, header)
            elif header.get("op") == "close":  # ``outrig connections --close --host``
                self.stop.set()
                send_json(conn, b"k", {"closing": True})
        except (OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def refuse(self, conn: socket.socket, kind: str, message: str, *,
               silent: bool = False) -> None:
        send_json(conn, b"f", {"kind": kind, "message": message, "silent": silent})

    def host_key_current(self) -> bool:
        """Whether known_hosts still holds the key this connection was checked against (a
        user who ran ``ssh-keygen -R`` for a rebuilt box gets a fresh connection)."""
        import paramiko

        path = known_hosts_path(self.host)
        conn = self.transport.connection
        name = conn.host if conn.port == 22 else f"[{conn.host}]:{conn.port}"
        try:
            keys = paramiko.HostKeys(str(path)).lookup(name)
        except (OSError, paramiko.SSHException):
            return False
        return keys is not None and any(k.asbytes() == self.server_key for k in keys.values())

    def exec(self, conn: socket.socket, header: dict[str, Any]) -> None:
        """Open a channel for ``argv`` and relay it; refuse when this keeper cannot serve."""
        if header.get("identity") != self.identity:
            self.refuse(conn, "stale", "this keeper serves another address, user or key")
            return
        if not self.link_up():
            self.refuse(conn, "link", "the keeper's SSH link is down")
            self.stop.set()
            return
        if not self.host_key_current():
            self.refuse(conn, "stale", "the host key in known_hosts changed since this "
                        "keeper connected")
            self.stop.set()
            return
        with self.lock:
            self.active += 1
        try:
            probed, why = self.probe()
            if why:
                self.refuse(conn, "link", why, silent=True)
                self.stop.set()
                return
            live = self.live_for(header)
            if live is not None and self.serve_live(conn, live, header, probed):
                return
            if self.dead_why or not self.link_up():  # found dead while the live agent waited
                self.refuse(conn, "link", self.dead_why or "the keeper's SSH link is down",
                            silent=bool(self.dead_why))
                self.stop.set()
                return
            try:
                channel = self.open_channel_making_room(header)
            except LinkLost as exc:
                self.refuse(conn, "link", str(exc), silent=exc.silent)
                self.stop.set()
                return
            except ConnectError as exc:
                self.refuse(conn, "refused", str(exc))
                return
            if probed is not None:
                self.transport.rtt = probed  # fresher than the spare's open
            elif header.get("agent") is not None:  # (not beside a bulk transfer's stream)
                self.ping()  # a link that died a moment ago is found in the keepalive limit
            conn.settimeout(None)
            send_json(conn, b"k", self.answer(probed, live=False))
            self.consider_live(header)
            Relay(conn, channel, self.link_up, self.heard, self.lost).run()
        finally:
            with self.lock:
                self.active -= 1
                self.last_used = time.monotonic()

    def answer(self, probed: float | None, *, live: bool) -> dict[str, Any]:
        """The ``k`` body of a lent request: the link's RTT, whether it was probed now, the
        address it really reaches, and whether the live agent serves it."""
        conn = self.transport.connection
        return {"rtt": self.transport.rtt, "probed": probed is not None, "live": live,
                "peer": [str(conn.host), int(conn.port), conn.user]}

    # ---------------------------------------------------------------- the live agent

    def live_for(self, header: dict[str, Any]) -> LiveAgent | None:
        """The live agent that can serve this request now, if any: it is ready, runs the
        request's own bundle and Python, and the request wants no larger window than its
        channel has (connectors/keeper/live.py)."""
        agent = header.get("agent")
        window = header.get("window")
        live = self.live
        if not isinstance(agent, dict) or live is None:
            return None
        if needs_own_channel(window=window if isinstance(window, int) else None):
            return None
        if not live.usable(str(agent.get("digest")), str(agent.get("python"))):
            return None
        return live

    def serve_live(self, conn: socket.socket, live: LiveAgent, header: dict[str, Any],
                   probed: float | None) -> bool:
        """Serve the request on the live agent: send it, answer the client, relay its stdin
        while the box's frames go straight to it. ``False`` (nothing sent, nothing said)
        when the live agent could not take it: the exec path serves it then."""
        line = str(header["agent"].get("request", "")).encode()
        route = Route(conn)
        limit = live.silent_after()
        rid = live.submit(route, line, limit)
        if rid is None:
            return False
        if not self.started_by(live, route, limit):
            live.forget(rid)
            return False
        if probed is not None:
            self.transport.rtt = probed
        send_json(conn, b"k", self.answer(probed, live=True))
        route.start()  # the box's frames follow the answer
        live.relay_input(conn, rid, route, recv_frame)
        return True

    def started_by(self, live: LiveAgent, route: Route, limit: float) -> bool:
        """Whether the live agent started the request (its ``a``) before its deadline,
        ``limit`` seconds. A keepalive goes out beside the request: on a link that died
        just before (heard from a moment ago, so lent unprobed), its silence is found in
        the keepalive limit, as a probe would have found it. Not started, with the link
        answering: the agent is stopped or starved and is dropped; either way the request
        is not run there (it refuses it after its deadline) and the caller goes on."""
        ping = self.ping()
        deadline = time.monotonic() + limit
        while not route.settled.wait(0.02):
            if ping.failed():  # the link is dead (the pinger said so: link_dead)
                break
            if time.monotonic() >= deadline and (ping.answered() or not self.link_up()):
                live.drop_silent(f"it started no request within {limit:.1f} s while the "
                                 "link answered: stopped or starved on the box")
                break
        return route.accepted

    def consider_live(self, header: dict[str, Any]) -> None:
        """After an agent call went the exec path: start a live agent of its bundle when
        there is none for it (none yet, the last one died, or it runs another bundle, which
        then retires). One that failed to start for this bundle is not tried again: this
        keeper's calls keep the exec path, and ``connections`` says why."""
        agent = header.get("agent")
        if not isinstance(agent, dict):
            return
        digest, python = str(agent.get("digest")), str(agent.get("python"))
        bundle = agent.get("bundle")
        if isinstance(bundle, str) and bundle:
            self.bundle = (digest, bundle)  # the request carried it (it rode in the command)
        with self.live_lock:
            old = self.live
            if old is not None and old.digest == digest and old.python == python \
                    and old.state in ("starting", "ready", "failed"):
                return
            if self.bundle[0] != digest or not self.link_up():
                return
            self.live = LiveAgent(self.transport.connection.transport, python=python,
                                  digest=digest, workdir=str(agent.get("workdir", "")),
                                  heartbeat=heartbeat_for(self.transport.best_rtt),
                                  heard=self.heard, link_up=self.link_up, lost=self.lost,
                                  rtt=lambda: self.transport.best_rtt)
            self.live.start(self.bundle[1])
        if old is not None:
            old.retire()

    def open_channel_making_room(self, header: dict[str, Any]) -> Any:
        """:meth:`open_channel`; when the box refuses it while this keeper holds channels of
        its own (the spare, the live agent's), give those up and try again. Why: a box whose
        sshd allows few sessions per connection (``MaxSessions``) must serve the command's
        channel before the keeper's conveniences; the live agent is then off for good (and
        ``connections`` says so), and no spare is kept ahead."""
        for attempt in range(ROOM_ATTEMPTS):
            try:
                return self.open_channel(header)
            except LinkLost:
                raise
            except ConnectError:
                freed = self.make_room()
                if attempt == ROOM_ATTEMPTS - 1 or (not freed and attempt > 0):
                    raise
                time.sleep(ROOM_PAUSE * (attempt + 1))  # sshd frees a session once its
        raise AssertionError("unreachable")          # process has exited

    def make_room(self) -> bool:
        """Close the spare channel and the live agent (whether either was held)."""
        self.no_spare = True
        with self.spare_lock:
            spare, self.spare = self.spare, None
        if spare is not None:
            with contextlib.suppress(Exception):
                spare.close()
        live = self.live
        if live is not None and live.state in ("starting", "ready"):
            live.give_up("the box refused a session channel beside it (its sshd allows too "
                         "few sessions per connection: MaxSessions)")
            return True
        return spare is not None

    def open_channel(self, header: dict[str, Any]) -> Any:
        """The session channel with the exec sent. The spare channel opened ahead saves the
        open's round trip (a warm command then costs the exec and the answer); without one,
        or for a larger window, the connector's own ``_open`` (which measures the RTT and
        classifies a failure)."""
        argv = [str(a) for a in header["argv"]]
        window = header.get("window")
        if not isinstance(window, int):
            spare = self.take_spare()
            if spare is not None:
                self.refill()
                try:
                    exec_pipelined(spare, shlex.join(argv))
                except Exception as exc:
                    raise LinkLost(f"the link dropped while sending the command "
                                   f"({type(exc).__name__}).", phase="exec") from None
                return spare
        channel = self.transport._open(argv, window if isinstance(window, int) else None)
        assert isinstance(channel, _SSHChannel)
        self.heard()
        return channel.channel

    def take_spare(self) -> Any:
        """The spare channel if it is still usable (link up, not closed by the box)."""
        with self.spare_lock:
            spare, self.spare = self.spare, None
        if spare is None or spare.closed or not self.link_up():
            return None
        self.transport.rtt = self.spare_rtt
        return spare

    def refill(self) -> None:
        """Open the next spare channel in the background (one round trip, off the clock of
        any command)."""
        threading.Thread(target=self._open_spare, daemon=True).start()

    def _open_spare(self) -> None:
        link = self.transport.connection.transport if self.link_up() else None
        if link is None or self.no_spare:
            return
        limit, _ = channel_timeout_for(self.host, self.transport.best_rtt)
        started = time.monotonic()
        try:
            # the open sent behind the login, if the connect sent one; else a fresh open
            channel = link.take_early_channel(limit) if hasattr(link, "take_early_channel") \
                else None
            rtt = getattr(link, "login_rtt", None) if channel is not None else None
            if channel is None:
                channel = link.open_session(timeout=limit)
        except Exception:  # the next command opens its own channel and reports the failure
            return
        self.heard()
        with self.spare_lock:
            if self.spare is None:
                self.spare = channel
                self.spare_rtt = rtt if rtt is not None else time.monotonic() - started
                return
        with contextlib.suppress(Exception):
            channel.close()


class Relay:
    """Pump one SSH channel to one socket connection and back."""

    def __init__(self, conn: socket.socket, channel: Any, link_up: Callable[[], bool],
                 heard: Callable[[], None], lost: Callable[[], bytes]) -> None:
        self.conn = conn
        self.channel = channel
        self.link_up = link_up
        self.heard = heard  # called whenever the box's bytes arrive
        self.lost = lost  # the ``L`` payload: why the link is gone
        self.send_lock = threading.Lock()

    def send(self, kind: bytes, payload: bytes = b"") -> None:
        with self.send_lock:
            send_frame(self.conn, kind, payload)

    def inbound(self) -> None:
        """Socket → channel: stdin data and EOF; the socket closing closes the channel."""
        try:
            while True:
                frame = recv_frame(self.conn)
                if frame is None:
                    break
                kind, payload = frame
                if kind == b"i":
                    self.channel.sendall(payload)
                elif kind == b"e":
                    self.channel.shutdown_write()
        except Exception:  # a dead link or a gone client: the channel is over either way
            pass
        with contextlib.suppress(Exception):
            self.channel.close()

    def drain_stderr(self) -> None:
        while self.channel.recv_stderr_ready():
            data = self.channel.recv_stderr(65536)
            if not data:
                break
            self.send(b"r", data)

    def run(self) -> None:
        """Channel → socket: stdout, stderr, then the exit status (or ``L``: link lost)."""
        threading.Thread(target=self.inbound, daemon=True).start()
        try:
            self.channel.settimeout(TICK)
            while True:
                try:
                    data = self.channel.recv(65536)
                except TimeoutError:
                    self.drain_stderr()
                    if not self.link_up():
                        self.send(b"L", self.lost())
                        return
                    continue
                self.heard()
                self.drain_stderr()
                self.send(b"o", data)
                if not data:
                    break
            while not self.channel.status_event.wait(TICK):
                if not self.link_up() or self.channel.closed:
                    break
            self.channel.settimeout(2.0)
            with contextlib.suppress(Exception):
                while True:
                    chunk = self.channel.recv_stderr(65536)
                    if not chunk:
                        break
                    self.send(b"r", chunk)
            if self.channel.status_event.is_set():
                self.heard()
                self.send(b"x", json.dumps(int(self.channel.recv_exit_status())).encode())
            else:
                self.send(b"L", self.lost())
        except OSError:
            pass  # the client went away: closing the socket closes the channel
        finally:
            with contextlib.suppress(Exception):
                self.channel.close()


def error_report(exc: BaseException) -> dict[str, Any]:
    """A connect failure as the starting command re-raises it: type, message and fields."""
    return {"ready": False, "error": {
        "type": type(exc).__name__, "message": str(exc),
        "phase": getattr(exc, "phase", None), "silent": bool(getattr(exc, "silent", False))}}


def launch(config: dict[str, Any], report_fd: int) -> None:
    """Become the keeper: a new session, then a second fork so that it is nobody's child
    (adopted by init: no zombie waits on a command that has ended); the caller waits for
    the intermediate process, which exits at once. Never returns."""
    with contextlib.suppress(OSError):
        os.setsid()  # already a session leader when started by Popen(start_new_session)
    if os.fork() > 0:
        os._exit(0)
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        keep = {report_fd, 0, 1, 2}
        for name in os.listdir("/proc/self/fd"):  # the command's files stay the command's
            fd = int(name)
            if fd not in keep:
                with contextlib.suppress(OSError):
                    os.close(fd)
        os._exit(run(config, os.fdopen(report_fd, "w")))
    finally:
        os._exit(1)


def run(config: dict[str, Any], report: Any, *,
        started: Callable[[Keeper], None] | None = None) -> int:
    """Connect, say ready (or the error) on ``report``, then serve until done. Alone in its
    process (``started`` is None), SIGTERM stops it; in a process hosting several keepers
    (:mod:`outrig.connectors.keeper.launch`), ``started`` hands it to the host, whose own
    SIGTERM stops them all."""
    keeper = Keeper(config)
    keeper.report = report
    try:
        keeper.open()
    except Exception as exc:  # the starting command raises it (or connects directly)
        keeper.say(error_report(exc))
        report.close()
        keeper.close()
        return 1
    if started is None:
        # the handler takes no lock (Event.set takes its condition's, which the main thread
        # or a second SIGTERM's handler may hold): it sets a flag that serve() acts on
        signal.signal(signal.SIGTERM, lambda *_: setattr(keeper, "signalled", True))
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        started(keeper)
    keeper.say({"ready": True, "pid": os.getpid(),
                "connect_seconds": keeper.transport.connect_seconds})
    report.close()
    keeper.report = None
    try:
        keeper.serve()
    finally:
        keeper.close()
    return 0


def main() -> int:
    """``python -m outrig.connectors.keeper.daemon``: the configuration on stdin, reports on
    stdout (used when the starting process cannot simply fork: it has other threads, and no
    launcher could be had; :mod:`outrig.connectors.keeper.launch` is the usual way)."""
    config = json.loads(sys.stdin.read())
    launch(config, os.dup(1))
    return 1


if __name__ == "__main__":
    sys.exit(main())
