"""How a failed SSH handshake is classified (refused key vs lost link), where it failed, and
which lost links are retried: decided on types and handshake state, never on message text."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import paramiko
import pytest

from outrig.connectors.ssh.transport import auth_refused, handshake_phase
from outrig.errors import ConnectError, LinkLost
from outrig.session import RERUN_SAFE_OPS, link_retry_allowed
from outrig.timing import retry_pause


@dataclass
class FakeHandler:
    auth_event: threading.Event = field(default_factory=threading.Event)


@dataclass
class FakeTransport:
    """The few attributes of a paramiko Transport the classifier reads."""

    active: bool = True
    authenticated: bool = False
    remote_version: str = "SSH-2.0-OpenSSH_9.6"
    session_id: bytes | None = b"id"
    server_disconnect: tuple[int, str] | None = None
    auth_handler: Any = field(default_factory=FakeHandler)

    def is_active(self) -> bool:
        return self.active

    def is_authenticated(self) -> bool:
        return self.authenticated


def answered() -> FakeHandler:
    handler = FakeHandler()
    handler.auth_event.set()
    return handler


# The message paramiko gives a dropped link during auth, which outrig used to call a refusal.
EOF_DURING_AUTH = paramiko.AuthenticationException(
    "Authentication failed: transport shut down or saw EOF")


@pytest.mark.parametrize("transport,refused", [
    (FakeTransport(auth_handler=answered()), True),  # the box said no to the last key
    (FakeTransport(active=False, server_disconnect=(2, "Too many authentication failures")),
     True),  # the box ended the session itself
    (FakeTransport(active=False), False),  # the link died before an answer
    (FakeTransport(), False),  # no answer yet (auth timeout): a silent link
    (FakeTransport(active=False, auth_handler=answered()), False),  # answered, then cut
    (None, False),
])
def test_a_refusal_is_the_box_answering_no(transport: Any, refused: bool) -> None:
    assert auth_refused(transport, EOF_DURING_AUTH) is refused


def test_a_method_the_box_does_not_allow_is_a_refusal() -> None:
    exc = paramiko.BadAuthenticationType("Bad authentication type", ["password"])
    assert auth_refused(FakeTransport(), exc)


@pytest.mark.parametrize("transport,phase", [
    (None, "connect"),
    (FakeTransport(remote_version=""), "banner"),
    (FakeTransport(session_id=None), "kex"),
    (FakeTransport(), "auth"),
    (FakeTransport(authenticated=True), "channel"),
])
def test_handshake_phase(transport: Any, phase: str) -> None:
    assert handshake_phase(transport) == phase


def test_retry_pauses_scale_with_rtt_and_are_bounded() -> None:
    assert 0.16 <= retry_pause(None, 1) <= 0.24
    assert 0.76 <= retry_pause(0.24, 1) <= 1.16  # 4 × 240 ms, ±20 %
    assert retry_pause(0.24, 2) > retry_pause(0.24, 1) * 0.8 * 2 / 1.2 - 1e-9
    assert retry_pause(5.0, 10) <= 12.0  # capped at 10 s (+20 % jitter)


def test_which_lost_links_are_rerun() -> None:
    sent = LinkLost("x", phase="stream", request_sent=True)
    unsent = LinkLost("x", phase="exec", request_sent=False)
    handshake = LinkLost("x", phase="auth")
    assert link_retry_allowed("status", sent) and link_retry_allowed("cleanup", sent)
    assert not link_retry_allowed("deploy", sent)  # it may have started processes
    assert link_retry_allowed("deploy", unsent)  # the agent never had the request
    assert not link_retry_allowed("status", handshake)  # the transport already retried it
    assert "deploy" not in RERUN_SAFE_OPS and isinstance(sent, ConnectError)
