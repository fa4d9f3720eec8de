"""``outrig forward``: a local port that reaches a process's port on the box.

Each local connection gets its own SSH ``direct-tcpip`` channel on outrig's one connection to
the box. When that connection is found dead (the link dropped, the box's sshd restarted), the
next local connection reconnects first, so the forward stays up across reconnects for as long
as the command runs. The port is taken from the run's plan (the process's ``ready:`` port or
HTTP URL), so ``--process server`` is enough for the vLLM server.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import sys
import threading
from typing import Any
from urllib.parse import urlsplit

from outrig.console import Reporter
from outrig.errors import ConfigError, Interrupted
from outrig.inventory import Host
from outrig.journal import Journal, private_state_dir
from outrig.session import Project
from outrig.text.layout import paragraph
from outrig.text.terminal import wrap_width
from outrig.timing import FORWARD_OPEN_TIMEOUT
from outrig.transport import Transport, transport_for

PORT_MAX = 65535


def checked_port(value: int, flag: str, *, any_free: bool = False) -> int:
    """``value`` when it names a TCP port (1-65535; 0 too with ``any_free``, for "any free
    local port"); else a ConfigError naming the flag. Called before anything is sent: a port
    out of range would otherwise fail only after the box was contacted, deep in the socket
    library (``OverflowError``)."""
    low = 0 if any_free else 1
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= PORT_MAX:
        hint = " (0: any free port)" if any_free else ""
        raise ConfigError(f"{flag} {value!r} is not a TCP port: give a whole number from "
                          f"{low} to {PORT_MAX}{hint}. Nothing was sent.")
    return value


def process_port(journal: Journal, host: Host, process: str, *, run_id: str | None = None,
                 playbook: str | None = None) -> tuple[str, int, str]:
    """(address on the box, port, run id) of ``process`` in the chosen run's plan."""
    runs = journal.runs(host=host.name, playbook=playbook)
    if run_id is not None:
        runs = [r for r in runs if r.get("run_id") == run_id]
        if not runs:
            raise ConfigError(f"the journal has no run {run_id} on {host.name}; see "
                              f"`outrig status --host {host.name}` for its runs")
    else:
        runs = [r for r in runs if r.get("status") == "running"]
    names: set[str] = set()
    for run in runs:
        for proc in (run.get("plan") or {}).get("processes") or []:
            names.add(str(proc.get("name")))
            if proc.get("name") != process:
                continue
            ready = proc.get("ready") or {}
            where = f"the port of process {process} in run {run.get('run_id')}'s plan"
            if ready.get("port"):
                return "127.0.0.1", _plan_port(ready["port"], where), str(run.get("run_id"))
            if ready.get("http"):
                try:
                    url = urlsplit(str(ready["http"]))
                    port = url.port or (443 if url.scheme == "https" else 80)
                except ValueError:  # a port out of range in the recorded URL
                    port = -1
                return (url.hostname or "127.0.0.1", _plan_port(port, where),
                        str(run.get("run_id")))
            raise ConfigError(
                f"process {process} of run {run.get('run_id')} has no port in its ready: "
                "check, so outrig cannot tell which port it serves; pass --remote-port N")
    where = f"run {run_id}" if run_id else f"the running runs on {host.name}"
    raise ConfigError(
        f"no process {process!r} in {where} (processes there: "
        f"{', '.join(sorted(names)) or 'none; deploy first'}); name one with --process, "
        "or give --remote-port N")


def _plan_port(value: Any, where: str) -> int:
    """A port recorded in the journal's plan, checked like one given as a flag."""
    try:
        return checked_port(value, where)
    except ConfigError as exc:
        raise ConfigError(f"{exc} Pass --remote-port N instead.") from None


class Forwarder:
    """Accepts on a local socket and carries each connection over its own SSH channel."""

    def __init__(self, transport: Transport, remote: tuple[str, int],
                 listener: socket.socket, reporter: Reporter) -> None:
        self.transport = transport
        self.remote = remote
        self.listener = listener
        self.reporter = reporter

    def serve_forever(self) -> None:
        """Until interrupted: accept, and hand each connection to a thread."""
        while True:
            client, _ = self.listener.accept()
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _open(self, origin: tuple[str, int]) -> Any:
        """A channel to the remote port; the connector reconnects once when the link is dead."""
        return self.transport.open_tunnel(
            self.remote, origin, FORWARD_OPEN_TIMEOUT,
            lambda: self.reporter.info("the link to the box was lost; reconnecting"))

    def _handle(self, client: socket.socket) -> None:
        try:
            channel = self._open(client.getpeername())
        except Exception as exc:  # in a thread: say it, keep serving the others
            self.reporter.warn(f"a local connection was not forwarded: {exc}")
            client.close()
            return
        try:
            pump(client, channel)
        finally:
            channel.close()
            client.close()


def pump(client: socket.socket, channel: Any) -> None:
    """Copy both ways until either side closes. ``selectors`` (epoll), not ``select()``:
    a forward serving many connections passes 1024 file descriptors, which ``select()``
    cannot watch."""
    with selectors.DefaultSelector() as selector:
        selector.register(client, selectors.EVENT_READ, channel)
        selector.register(channel, selectors.EVENT_READ, client)
        while True:
            for key, _ in selector.select(60):
                source: Any = key.fileobj
                data = source.recv(65536)
                if not data:
                    return
                key.data.sendall(data)


def listen(port: int) -> socket.socket:
    """A listener on 127.0.0.1:``port`` (0: any free port); only this machine can use it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on 127.0.0.1:{port} ({exc.strerror}); pick another "
                          "--local-port, or 0 for any free one") from None
    sock.listen(16)
    return sock


def forward(project: Project, host: Host, reporter: Reporter, *,
            process: str | None = None, run_id: str | None = None,
            playbook: str | None = None, remote_port: int | None = None,
            local_port: int | None = None, journal: Journal | None = None) -> None:
    """Forward until Ctrl-C (then :class:`Interrupted`, exit 130, as every command ends on
    Ctrl-C); prints the local URL first (JSON: a ``forwarding`` event)."""
    if remote_port is not None:
        checked_port(remote_port, "--remote-port")
    if local_port is not None:
        checked_port(local_port, "--local-port", any_free=True)
    if host.is_local:
        raise ConfigError(f"{host.name} is 'local' (this machine): its ports are here "
                          "already; nothing to forward")
    if remote_port is not None:
        address, port, what = "127.0.0.1", remote_port, f"port {remote_port}"
    elif process is not None:
        address, port, run = process_port(journal or Journal(), host, process, run_id=run_id,
                                          playbook=playbook)
        what = f"process {process} of run {run}"
    else:
        raise ConfigError("say what to forward: --process NAME (its port comes from the "
                          "run's plan) or --remote-port N")
    private_state_dir()  # before a keeper makes its socket folder in it (without a journal)
    transport = transport_for(host, notify=reporter.info, keep_seconds=project.keep_seconds)
    transport.connect()  # fail here, before listening, when the box is unreachable
    listener = listen(port if local_port is None and _free(port) else (local_port or 0))
    mine = listener.getsockname()[1]
    url = f"http://127.0.0.1:{mine}/"
    # the same number was wanted and is taken here: say so, a URL with another port that
    # nobody mentioned reads like a mistake (or is missed, and the old port is tried)
    moved = local_port is None and mine != port
    why = (f" (port {port} is taken on this machine, so the local port is {mine}; "
           "--local-port N picks another)") if moved else ""
    try:  # from the first word printed: a Ctrl-C the moment the URL shows is this one too
        reporter.emit_json({"event": "forwarding", "url": url, "local_port": mine,
                            "remote": f"{address}:{port}", "what": what,
                            "local_port_moved_from": port if moved else None})
        if not reporter.json_mode:
            print(paragraph(f"{url} → {address}:{port} on {host.label()} ({what}){why}; "
                            "Ctrl-C stops", wrap_width(sys.stdout)), flush=True)
        Forwarder(transport, (address, port), listener, reporter).serve_forever()
    except KeyboardInterrupt:
        raise Interrupted(f"forward stopped (Ctrl-C): {url} no longer reaches {what}; "
                          "what runs on the box goes on") from None
    finally:
        listener.close()
        transport.close()


def _free(port: int) -> bool:
    """Whether 127.0.0.1:``port`` can be listened on here (the same number is easiest)."""
    with contextlib.closing(socket.socket()) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
