"""The pipelined login: the ``ssh-userauth`` service request and the signed public-key login
leave in one flight, saving the round trip paramiko spends waiting for SERVICE_ACCEPT.

Why it is sound:
- The login is the very request paramiko itself sends (its own code builds and signs it, in
  :meth:`AuthHandler._parse_service_accept`), only sent without waiting for the accept. The
  server still checks the same signature over the same session id; nothing about the key,
  the method or the host key check changes. The host key has been checked against
  ``known_hosts`` before either message exists: paramiko's ``SSHClient.connect`` verifies it
  between the key exchange and the first call to ``auth_publickey``.
- RFC 4253 section 10: a server that refuses a service disconnects, so a login that follows
  a refused service request is dropped with the link; it never reaches anything.
- OpenSSH's sshd handles one packet after another in order: its handler for
  ``SERVICE_REQUEST`` (``input_service_request`` in auth2.c) installs the handler for
  ``USERAUTH_REQUEST`` before the next packet is read, so a login right behind the request is
  processed exactly as one that waited (auth2.c and dispatch.c, OpenSSH 9.2 to 10.x).
- RFC 4252 section 5 forbids a second *login* before the answer to the first; one login per
  flight is what is sent, and a second key still waits for the first one's answer.

Where it falls back to paramiko's own sequence (service request, wait, login): a method
other than ``publickey``; an RSA key before the server's ``server-sig-algs`` extension
arrived (paramiko picks the RSA signature algorithm from it, and that choice must not be
guessed); and every connection made with pipelining switched off (``pipeline_login`` False;
:class:`outrig.connectors.ssh.transport.SSHTransport` switches it off after a pipelined login was
cut, and ``OUTRIG_SSH_PIPELINE=0`` switches it off for good).

The session-channel open behind the first login (``early_channel``, on by default for a
command's connect, off with ``OUTRIG_SSH_PIPELINE=login`` or ``=0``;
:meth:`take_early_channel` hands it over) saves one more round trip. It is only sent to an
OpenSSH server: sshd reads the packets that follow a successful login from the same buffer
after authentication (``ssh_packet_get_state`` and ``ssh_packet_set_state`` in packet.c carry
the unread input from the pre-authentication process; ``server_loop2`` in serverloop.c
handles buffered packets first); after a refused login the open arrives before
authentication, where every message but a login meets ``dispatch_protocol_error``
(dispatch.c): an INFO line in sshd's log and SSH_MSG_UNIMPLEMENTED, the connection kept, so
the next key still gets its turn. The open is then forgotten and the command's channel is
opened the ordinary way. Dropbear ends the connection instead ("received message ... before
userauth"), which would take the next key's chance away: hence OpenSSH only. Not with
compression either: sshd switches ``zlib@openssh.com``'s decompression on once it has sent
the login's success, so an open the client compressed before seeing that answer would not
decompress (packet.c; outrig never asks for compression). The same handling was read in
OpenSSH's source from 9.2 to 10.5: the unread input still travels with the packet state from
``sshd-auth`` to ``sshd-session`` (``mm_send_keystate``, ``monitor_apply_keystate``), and
``server_loop2`` still handles buffered packets before it waits. The exec cannot
follow: its CHANNEL_REQUEST must name the server's channel number, which only the open's
confirmation brings (RFC 4254 section 5.1).

paramiko is imported lazily (inside :func:`pipelined_transport_class`), like everywhere in the
connectors: a command that never connects does not pay for it.
"""

from __future__ import annotations

import os
import threading
import time
from functools import cache
from typing import Any

from outrig.errors import ConfigError

PIPELINE_ENV = "OUTRIG_SSH_PIPELINE"
_PIPELINE_VALUES = {"": (True, True), "1": (True, True), "channel": (True, True),
                    "login": (True, False), "0": (False, False), "off": (False, False)}


def pipelining_wanted() -> tuple[bool, bool]:
    """Whether logins are pipelined, and whether a command's channel open goes right behind
    the login (``OUTRIG_SSH_PIPELINE``): unset, ``1`` or ``channel``: both (the default);
    ``login``: the login only, the open waits for its answer (what outrig did before, and the
    only layout in which a fault can be aimed between the two); ``0`` or ``off``: neither, for
    a box whose SSH server mishandles a login sent right behind its service request. Another
    value is refused before anything is sent: a misspelt switch must not quietly mean "on"."""
    value = os.environ.get(PIPELINE_ENV, "").strip().lower()
    if value not in _PIPELINE_VALUES:
        raise ConfigError(
            f"{PIPELINE_ENV}={value!r} is not one of 1, channel, login, 0, off. Unset it for "
            "the default (the login and the channel open pipelined), or set login or 0 (see "
            "docs/cli.md). Nothing was sent.")
    return _PIPELINE_VALUES[value]


# paramiko's private methods the pipelined login calls or overrides, by class. pyproject.toml
# bounds paramiko below its next major version; a release that renames one of these anyway
# must cost a round trip, never a login: see :func:`missing_private_api`.
PRIVATE_API = {
    "AuthHandler": ("_request_auth", "_parse_service_accept", "_get_key_type_and_bits",
                    "auth_publickey", "wait_for_response"),
    "Transport": ("_send_message", "_sanitize_window_size", "_sanitize_packet_size",
                  "_next_channel", "auth_publickey", "is_authenticated", "get_exception"),
    "Channel": ("_set_transport", "_set_window", "get_id"),
}
_noted_fallback = False


def missing_private_api(classes: dict[str, type[Any]]) -> list[str]:
    """``Class.method`` for each private method of :data:`PRIVATE_API` that ``classes`` (name
    → class) lack: what a paramiko release that reworked its internals took away."""
    return [f"{name}.{method}" for name, methods in PRIVATE_API.items()
            for method in methods if not callable(getattr(classes[name], method, None))]


def _note_fallback(missing: list[str]) -> None:
    """Say once per process that logins are no longer pipelined, and why: the connection
    still works (paramiko's own sequence), one round trip slower."""
    global _noted_fallback
    if _noted_fallback:
        return
    _noted_fallback = True
    import sys

    import paramiko
    print(f"note: paramiko {paramiko.__version__} lacks {', '.join(missing)}, which outrig's "
          "pipelined login uses; logging in with paramiko's own sequence (one round trip "
          "more per connect). Install the paramiko version pyproject.toml names to get it "
          "back.", file=sys.stderr, flush=True)


@cache
def pipelined_transport_class() -> type[Any]:
    """A ``paramiko.Transport`` whose public-key logins are pipelined (class built once).

    Where the installed paramiko lacks a private method this relies on
    (:func:`missing_private_api`), every login and channel open takes paramiko's own
    sequence instead, with a note: one round trip slower, never broken."""
    import paramiko
    from paramiko.auth_handler import AuthHandler
    from paramiko.channel import Channel

    unsupported = missing_private_api({"AuthHandler": AuthHandler,
                                       "Transport": paramiko.Transport, "Channel": Channel})

    # paramiko's private parts used here (_request_auth, _parse_service_accept, the
    # transport's _send_message and server_extensions) are not in its type stubs
    handler_base: Any = AuthHandler
    transport_base: Any = paramiko.Transport

    class PipelinedAuthHandler(_PipelinedLogin, handler_base):  # type: ignore[misc]
        """paramiko's handler, sending the login right behind the service request."""

    class PipelinedTransport(_PipelinedConnection, transport_base):  # type: ignore[misc]
        """paramiko's transport, pipelining its public-key logins (see
        :class:`_PipelinedConnection`)."""

        handler_class = PipelinedAuthHandler

    PipelinedTransport.unsupported = tuple(unsupported)
    return PipelinedTransport


# paramiko is imported lazily, so the two mixins below name no paramiko class: the factory
# above puts each in front of paramiko's own (its methods reach paramiko's through super())
_Mixin: Any = object


class _PipelinedLogin(_Mixin):  # type: ignore[misc]
    """What :func:`pipelined_transport_class` adds to paramiko's ``AuthHandler``: the
    login sent right behind the service request."""

    sent_login = False
    requested_at: float | None = None  # monotonic: the service request left
    accepted_at: float | None = None  # monotonic: SERVICE_ACCEPT arrived

    def _pipelinable(self) -> bool:
        if self.auth_method != "publickey" or self.private_key is None:
            return False
        key_type, _ = self._get_key_type_and_bits(self.private_key)
        # paramiko picks an RSA key's signature algorithm from that list: never guess it
        return "rsa" not in key_type or "server-sig-algs" in self.transport.server_extensions

    def _request_auth(self) -> None:
        from paramiko.common import cMSG_SERVICE_REQUEST
        from paramiko.message import Message

        if not self._pipelinable():
            super()._request_auth()
            return
        # set first: on a fast link the real accept may be read (by paramiko's thread)
        # before the login below is signed, and must not make paramiko send a second one
        self.sent_login = True
        message = Message()
        message.add_byte(cMSG_SERVICE_REQUEST)
        message.add_string("ssh-userauth")
        self.requested_at = time.monotonic()
        self.transport._send_message(message)
        # paramiko's own login, built, signed and sent by its own code, now
        accept = Message()
        accept.add_string("ssh-userauth")
        accept.rewind()
        super()._parse_service_accept(accept)

    def _parse_service_accept(self, m: Any) -> None:
        if not self.sent_login:
            super()._parse_service_accept(m)
            return
        service = m.get_text()
        if service == "ssh-userauth" and self.accepted_at is None:
            self.accepted_at = time.monotonic()


class _PipelinedConnection(_Mixin):  # type: ignore[misc]
    """What :func:`pipelined_transport_class` adds to paramiko's ``Transport``: it pipelines
    each public-key login while ``pipeline_login`` is set, and with
    ``early_channel`` the session-channel open right behind the first login (see
    :func:`take_early_channel`)."""

    pipeline_login = True
    early_channel = False  # also open a session channel behind the first login
    early_window: int | None = None  # its window (paramiko's default when None)
    pipelined_logins = 0  # logins sent right behind their service request (for tests)
    early_channels = 0  # channel opens sent behind a login (for tests)
    login_rtt: float | None = None  # service request to accept: exactly one round trip
    _early: tuple[Any, threading.Event] | None = None
    _early_tried = False
    handler_class: Any = None  # the pipelining AuthHandler (set by the factory)
    unsupported: tuple[str, ...] = ()  # private methods the installed paramiko lacks

    def _open_early(self) -> None:
        """paramiko's ``open_channel("session")`` without the wait for the answer."""
        from paramiko.channel import Channel
        from paramiko.common import cMSG_CHANNEL_OPEN
        from paramiko.message import Message

        with self.lock:
            window = self._sanitize_window_size(self.early_window)
            packet = self._sanitize_packet_size(None)
            chanid = self._next_channel()
            message = Message()
            message.add_byte(cMSG_CHANNEL_OPEN)
            message.add_string("session")
            message.add_int(chanid)
            message.add_int(window)
            message.add_int(packet)
            channel: Any = Channel(chanid)
            self._channels.put(chanid, channel)
            self.channel_events[chanid] = answered = threading.Event()
            self.channels_seen[chanid] = True
            channel._set_transport(self)
            channel._set_window(window, packet)
        self._early = (channel, answered)
        self.early_channels += 1
        self._send_message(message)

    def _drop_early(self) -> None:
        """The login it followed was refused: sshd dropped the open (it answers
        UNIMPLEMENTED before authentication), so forget the channel."""
        with self.lock:
            early, self._early = self._early, None
        if early is None:
            return
        with self.lock:
            chanid = early[0].get_id()
            self._channels.delete(chanid)
            self.channel_events.pop(chanid, None)

    def take_early_channel(self, timeout: float) -> Any:
        """The channel opened behind the login, once the server confirmed it (``None``
        when none was opened or it was dropped); waits like paramiko's ``open_channel``
        and fails as it does (``ChannelException`` on a refusal, ``SSHException``)."""
        with self.lock:  # one taker only: a keeper's spare and a command may both ask
            early, self._early = self._early, None
        if early is None:
            return None
        import paramiko

        channel, answered = early
        deadline = time.monotonic() + timeout
        while not answered.wait(0.1):
            if not self.active:
                raise self.get_exception() or paramiko.SSHException(
                    "Unable to open channel.")
            if time.monotonic() > deadline:
                raise paramiko.SSHException("Timeout opening channel.")
        if self._channels.get(channel.get_id()) is None:
            raise self.get_exception() or paramiko.SSHException("Unable to open channel.")
        return channel

    def auth_publickey(self, username: str, key: Any, event: Any = None) -> Any:
        import paramiko

        unsupported = list(self.unsupported)
        if unsupported:
            _note_fallback(unsupported)
        if not self.pipeline_login or unsupported:
            return super().auth_publickey(username, key, event)
        # paramiko's Transport.auth_publickey, with the pipelining handler
        if not self.active or not self.initial_kex_done:
            raise paramiko.SSHException("No existing session")
        done = event if event is not None else threading.Event()
        handler = self.handler_class(self)
        self.auth_handler = handler
        handler.auth_publickey(username, key, done)
        if handler.sent_login:
            self.pipelined_logins += 1
            # only OpenSSH's handling of an open before the login's answer is known
            # (processed after a success, answered UNIMPLEMENTED after a refusal);
            # Dropbear, for one, ends the connection on it when the key is refused
            # and never with compression: sshd turns zlib@openssh.com's decompression on
            # once it has sent the login's success, and an open compressed before that
            # answer was seen would not decompress (packet.c, OpenSSH 9.2 to 10.5)
            if self.early_channel and not self._early_tried and \
                    str(self.remote_version).startswith("SSH-2.0-OpenSSH_") and \
                    self.local_compression in (None, "none"):
                self._early_tried = True
                self._open_early()
        if event is not None:
            return []
        try:
            return handler.wait_for_response(done)
        finally:
            if handler.requested_at is not None and handler.accepted_at is not None:
                self.login_rtt = handler.accepted_at - handler.requested_at
            if not self.is_authenticated():
                self._drop_early()
