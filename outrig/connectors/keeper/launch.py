"""Starting the keepers of a command with threads (a fan-out): one launcher, one hosting process.

``python -m outrig.connectors.keeper.launch IDLE`` is the launcher
(:class:`outrig.connectors.keeper.client.KeeperLauncher` starts it, one per command): stdin is a
socket of launch requests, one datagram each (``SOCK_SEQPACKET``): the JSON ``{"config", "env"}``
with the write end of the keeper's report pipe attached.

Why a launcher: a command with several threads must not fork itself, and a fresh ``python
-m`` per keeper pays the interpreter and paramiko's imports (about 0.25 s of CPU) once per
host. The launcher pays them once per command.

Why one process for the command's keepers, not one each: a kept host costs a process of its
own about 10 MiB that it does not share (the pages of the interpreter's objects it touches,
copied on write after the fork); in one process those are paid once and each further host
adds its connection's own state (bench/fanout_bench.py measures both, per host). So the
launcher forks, on its first request, one detached **hosting** process (:func:`host`) and
hands it each request with its report pipe; the hosting process runs each keeper on a thread
of its own (:func:`outrig.connectors.keeper.daemon.run`), each with its own socket, record, link and
live agent, exactly as a keeper alone. It leaves once the launcher is gone and its last keeper
has ended; SIGTERM stops them all (``outrig connections --close`` without ``--host``), the
keeper's ``close`` request one of them (with ``--host``). A command with one thread (one host)
forks its keeper itself and never comes here.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import threading
from typing import Any

from outrig.connectors.keeper.daemon import TICK, Keeper, run

LAUNCH_MAX = 1 << 20  # one launch request (configuration and environment), bytes


def serve_launches(sock: socket.socket, idle: float) -> int:
    """Hand each launch request to this command's hosting process, until the command closes
    its end or ``idle`` seconds pass without a request. Before leaving on idle it shuts its
    end, so a command sending meanwhile gets EPIPE (and starts a fresh launcher) and nothing
    already queued is dropped."""
    warm_up()
    hosting = Hosting()
    try:
        while True:
            ready, _, _ = select.select([sock], [], [], idle)
            if not ready:
                sock.shutdown(socket.SHUT_RD)
                sock.setblocking(False)
                while _serve_one(sock, hosting):
                    pass
                return 0
            if not _serve_one(sock, hosting):
                return 0
    finally:
        hosting.close()


def warm_up() -> None:
    """Import here, once, what every keeper needs (the connector imports paramiko and
    Fabric only when it connects), and freeze the objects made so far out of the garbage
    collector's reach: the hosting process forked from here neither imports them again nor
    copies the pages a collection would touch (about 0.1 s of CPU per keeper, measured)."""
    import gc

    import fabric
    import paramiko

    fabric.Config()  # loads the rest of Invoke's and Fabric's configuration machinery
    del paramiko
    gc.freeze()


def _serve_one(sock: socket.socket, hosting: Hosting) -> bool:
    """Serve one queued request; ``False`` at the end (the command closed, or none left)."""
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, LAUNCH_MAX, 1)
    except (BlockingIOError, OSError):
        return False
    if not data:
        for fd in fds:
            os.close(fd)
        return False
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        return True
    try:
        env = dict(json.loads(data)["env"])  # the hosting process reads the config
    except (ValueError, KeyError, TypeError):
        os.close(fds[0])
        return True
    hosting.hand(data, fds[0], env)
    return True


class Hosting:
    """The launcher's end of its hosting process: started on the first request, and again
    when the last one has left (or a request comes with another environment)."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.env: dict[str, str] | None = None

    def hand(self, data: bytes, report_fd: int, env: dict[str, str]) -> None:
        """Pass one request and its report pipe on (the hosting process owns the pipe then);
        a request that no hosting process takes is closed: its command connects directly."""
        try:
            for _attempt in (1, 2):
                if self.sock is None or env != self.env:
                    self.close()
                    self.sock, self.env = start_host(env), env
                try:
                    socket.send_fds(self.sock, [data], [report_fd])
                    return
                except OSError:  # it left (its keepers all ended): a fresh one
                    self.close()
        finally:
            os.close(report_fd)

    def close(self) -> None:
        """Let the hosting process know no more requests come (it keeps its keepers)."""
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None


def start_host(env: dict[str, str]) -> socket.socket:
    """Fork the hosting process, detached (a new session, then a second fork: nobody's
    child), with the command's environment; our end of its request socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            os.setsid()
            if os.fork() > 0:
                os._exit(0)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            keep = {0, 1, 2, theirs.fileno()}
            for name in os.listdir("/proc/self/fd"):  # the launcher's files stay its own
                if int(name) not in keep:
                    with contextlib.suppress(OSError):
                        os.close(int(name))
            os.environ.clear()
            os.environ.update(env)
            os._exit(host(theirs))
        finally:
            os._exit(1)
    theirs.close()
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)  # the intermediate process exits at once
    return ours


def host(sock: socket.socket) -> int:
    """The hosting process: a keeper thread per request, until the launcher is gone and the
    last keeper has ended. SIGTERM stops every keeper here."""
    keepers: list[Keeper] = []
    lock = threading.Lock()
    signalled = False

    def stop_all(*_: Any) -> None:
        # A signal handler only sets a flag; the loop below stops the keepers. It must take
        # no lock, not even an Event's (``Event.set`` takes its condition's): a second SIGTERM
        # that comes while the first one's handler holds one runs the handler again on the
        # same thread, and these locks are not re-entrant (seen: a hosting process asleep on
        # one for good, its keepers gone).
        nonlocal signalled
        signalled = True

    def stop_keepers() -> None:
        with lock:
            for keeper in keepers:
                keeper.stop.set()

    def started(keeper: Keeper) -> None:
        # a keeper that comes in after the loop's stop_keepers (on its own thread) stops
        # itself: the flag is set before the loop looks at it
        with lock:
            keepers.append(keeper)
        if signalled:
            keeper.stop.set()

    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threads: list[threading.Thread] = []
    taking = True
    sock.settimeout(TICK)
    while taking or any(t.is_alive() for t in threads):
        if not taking or signalled:
            taking = False
            if signalled:
                stop_keepers()
            for thread in threads:
                thread.join(TICK)
            threads = [t for t in threads if t.is_alive()]
            continue
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, LAUNCH_MAX, 1)
        except TimeoutError:
            threads = [t for t in threads if t.is_alive()]
            continue
        except OSError:
            taking = False
            continue
        if not data or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            taking = bool(data)
            continue
        try:
            config = dict(json.loads(data)["config"])
        except (ValueError, KeyError, TypeError):
            os.close(fds[0])
            continue
        thread = threading.Thread(target=_keep, args=(config, fds[0], started),
                                  daemon=True, name=f"outrig-keeper-{len(threads)}")
        thread.start()
        threads.append(thread)
    return 0


def _keep(config: dict[str, Any], report_fd: int, started: Any) -> None:
    with contextlib.suppress(Exception):  # one keeper's end never ends the others
        run(config, os.fdopen(report_fd, "w"), started=started)


def main() -> int:
    """``python -m outrig.connectors.keeper.launch [IDLE]``: stdin is the request socket."""
    idle = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    return serve_launches(socket.socket(fileno=0), idle)


if __name__ == "__main__":
    sys.exit(main())
