"""Connectors: how bytes reach the agent on a box. The seam every op stands on.

The rest of outrig sees only :meth:`Transport.start` → :class:`AgentChannel` (write stdin,
read stdout with a timeout, read stderr, exit status), plus the few facts about the link that
ops need (:attr:`Transport.rtt`, :attr:`Transport.connect_seconds`, :meth:`peer_address`,
:attr:`retry`, :meth:`reconnect`), and the two looks at liveness that ``watch`` and ``migrate``
take (:meth:`Transport.probe`, :meth:`Transport.confirm_alive`). No op looks at a connector's
type or private attributes, so the same agent protocol runs over SSH, a local pipe
(``--host local``), and a recording replayed in tests, and a new connector gets ``watch`` and
``migrate`` by answering those two.

A connector is one module with one :class:`Transport` subclass, and one line in
:data:`CONNECTORS` that says which hosts it serves. The table is ordered: the first entry whose
test accepts the host wins, and ``ssh`` (last) takes every host nobody else claimed.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outrig.errors import ConfigError
from outrig.inventory import Host
from outrig.watching.health import Observation

LINK_ATTEMPTS = 4  # handshakes per command when the link drops abruptly (reset, EOF)
SILENT_ATTEMPTS = 2  # of which at most this many may end in silence (each costs a timeout)
CHANNEL_ATTEMPTS = 4  # session-channel opens (each on a fresh connection after a drop)


class AgentChannel(ABC):
    """A running agent: its stdin, stdout and stderr."""

    live = False  # served by a live agent (:meth:`Transport.start_agent`): the request is in
    #               already, so nothing of it goes on stdin
    lost_why = ""  # why contact was lost, where the connector was told (the keeper's ``L``)
    lost_silent = False  # ... and whether the link was found dead by silence

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


@dataclass(frozen=True)
class RetryPolicy:
    """How many times a connector tries before it gives up on a link fault. Nothing has run
    on the box before the channel is open, so these retries are always safe.

    ``refused``: connects refused by the box (nothing listens yet); ``link``: handshakes cut
    by a drop; ``channel``: session-channel opens; ``silent``: handshakes that may end in
    silence (each costs a whole connect limit; a kept link already found silent spends one).
    A caller that does its own retrying with pauses (migrate's probe of the old box) sets
    ``dataclasses.replace(retry, refused=1)``."""

    refused: int = 2
    link: int = LINK_ATTEMPTS
    channel: int = CHANNEL_ATTEMPTS
    silent: int = SILENT_ATTEMPTS


LIVE_WINDOW = 32 << 20  # the live channel's receive window: the log stream's (ops/logs.py)
# Ops that keep a channel of their own even where a live agent could serve them: their files
# stream on stdin/stdout in bulk, and the channel's one open is nothing next to the transfer,
# while on the live agent's shared channel a large upload would queue the other calls' frames.
OWN_CHANNEL_OPS = frozenset({"send_files", "recv_files"})


def needs_own_channel(*, op: str | None = None, window: int | None = None) -> bool:
    """The one rule for an agent call that a live agent does not serve, asked by each side
    with what it knows: the command of its op (a bulk transfer), the keeper of the window
    the call asks for (larger than the live channel's)."""
    return op in OWN_CHANNEL_OPS or (window is not None and window > LIVE_WINDOW)


@dataclass(frozen=True)
class LiveRequest:
    """An agent call as a live agent on the box runs it, without an exec
    (``outrig/connectors/keeper/live.py``): the request line, and the bundle and Python it needs."""

    line: bytes
    python: str
    workdir: str
    digest: str
    bundle: str | None = None  # the bundle (base64) when it rode in this call's command line


@dataclass(frozen=True)
class PeerAddress:
    """Where another box reaches this one over SSH (for box-to-box copies): the address,
    port and user the connection really used, after ``~/.ssh/config`` aliases."""

    host: str
    port: int
    user: str | None


class Transport(ABC):
    """One box, reached by one connector. ``start`` runs a command there and returns its
    :class:`AgentChannel`."""

    name = "abstract"  # the connector's name in CONNECTORS
    host: Host
    rtt: float | None = None  # measured on this connection, seconds
    rtt_hint: float | None = None  # the last RTT the journal knows for this host
    connect_seconds: float | None = None  # how long the last connect took (None: none made)
    retry: RetryPolicy = RetryPolicy()

    @abstractmethod
    def start(self, argv: list[str], *, window_size: int | None = None) -> AgentChannel:
        """Run ``argv``; ``window_size`` enlarges the receive window for bulk output."""

    def start_agent(self, argv: list[str], live: LiveRequest | None, *,
                    window_size: int | None = None) -> AgentChannel:
        """Start an agent call: ``argv`` (the exec path's command). A connector with a live
        agent on the box may serve ``live`` there instead; the channel's ``live`` is then
        true, and the request is already in (nothing of it is to be written to stdin)."""
        return self.start(argv, window_size=window_size)

    def connect(self) -> None:
        """Open the link now (connectors also connect on the first :meth:`start`); a
        connector without a link has nothing to do."""

    @property
    def best_rtt(self) -> float | None:
        """The measured RTT of this connection, else the last one recorded for the host."""
        return self.rtt if self.rtt is not None else self.rtt_hint

    def peer_address(self) -> PeerAddress:
        """Where another box would ssh to reach this one. The host file's values, unless the
        connector knows better (the SSH connector: what its connection resolved)."""
        return PeerAddress(self.host.hostname, self.host.port or 22, self.host.user)

    def reconnect(self) -> None:
        """Drop the connection (a dead one, after a lost link); the next :meth:`start`
        connects afresh, with the RTT measured so far as its hint."""
        if self.rtt is not None:
            self.rtt_hint = self.rtt
        self.close()

    def probe(self, timeout: float) -> list[Observation]:
        """A fresh look at the box from outside, without logging in and never over the open
        connection, within ``timeout``: one :class:`~outrig.watching.health.Observation` per
        signal the connector can see (``tcp``: the box's door accepted a connection; ``banner``: the
        server behind it spoke). ``watch`` takes one every probe period, ``migrate`` one after
        its logins failed, and fencing one before it logs in to a box a run left.

        Like pyinfra's ``BaseConnector``, the base states the capability and a connector that
        has it answers: this one is refused, so no watch judges a box it cannot see."""
        raise ConfigError(f"{self.host.describe()}: the {self.name} connector cannot look at "
                          "a box from outside, which watch and migrate need; use an SSH host")

    def confirm_alive(self, timeout: float) -> Observation:
        """The ``confirm`` observation a death needs (:func:`outrig.watching.health.judge`): a fresh
        connection and login made only for this, never the warm one; ``ok`` when the box
        answered. ``timeout`` bounds the look at the door before the login (which has its
        own limits). Refused here, as :meth:`probe` is."""
        raise ConfigError(f"{self.host.describe()}: the {self.name} connector cannot confirm "
                          "that a box is alive, which watch needs; use an SSH host")

    def open_tunnel(self, remote: tuple[str, int], origin: tuple[str, int],
                    timeout: float, on_reconnect: Callable[[], None]) -> Any:
        """A byte channel to ``remote`` as seen from the box (``outrig forward``)."""
        from outrig.errors import ConfigError

        raise ConfigError(f"{self.host.label()}: the {self.name} connector cannot forward "
                          "ports; forwarding needs an SSH host")

    def close(self) -> None:
        """Release the connection (idempotent)."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


ConnectorFactory = Callable[..., Transport]


@dataclass(frozen=True)
class Registration:
    """One row of :data:`CONNECTORS`: a name, ``module:Class``, and which hosts it serves."""

    name: str
    target: str
    serves: Callable[[Host], bool]

    def load(self) -> ConnectorFactory:
        """The connector class (imported on first use: paramiko only when SSH is used)."""
        module, _, attr = self.target.partition(":")
        factory: ConnectorFactory = getattr(importlib.import_module(module), attr)
        return factory


def _scheme(prefix: str) -> Callable[[Host], bool]:
    """Hosts whose ``hostname:`` starts with ``prefix:`` (``replay:...``, ``docker:...``)."""
    return lambda host: host.hostname.startswith(prefix + ":")


CONNECTORS: list[Registration] = [
    Registration("local", "outrig.connectors.local:LocalTransport", lambda h: h.is_local),
    # SSH, through the host's warm connection unless keeping is off (connectors/keeper/client.py)
    Registration("ssh", "outrig.connectors.keeper.client:ssh_connector", lambda h: True),
]


def register(name: str, target: str, *, scheme: str | None = None) -> None:
    """Add a connector before the ``ssh`` catch-all; it serves ``hostname: SCHEME:...``."""
    CONNECTORS.insert(len(CONNECTORS) - 1, Registration(name, target, _scheme(scheme or name)))


def connector_for(host: Host) -> Registration:
    """The first registered connector that serves ``host``."""
    return next(entry for entry in CONNECTORS if entry.serves(host))


def transport_for(host: Host, *, rtt_hint: float | None = None,
                  notify: Callable[[str], None] | None = None,
                  keep_seconds: float | None = None) -> Transport:
    """Open (lazily: nothing is sent yet) the connector that serves ``host``. Every
    connector is built with the same arguments: ``rtt_hint`` (the journal's last RTT),
    ``notify`` (where notices go) and ``keep_seconds`` (the command's warm-connection
    setting, :attr:`outrig.session.Project.keep_seconds`; ``None``: not set by the command);
    a connector ignores what does not apply to it."""
    return connector_for(host).load()(host, rtt_hint=rtt_hint, notify=notify,
                                      keep_seconds=keep_seconds)


def known_hosts_path(host: Host) -> Path:
    """The known_hosts file outrig checks and records this host's key in."""
    return Path(host.known_hosts or "~/.ssh/known_hosts").expanduser()
