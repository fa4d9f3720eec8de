"""Keepalives on a kept link: whether the box still answers, within a limit.

The keeper asks before it lends a link that has been quiet, while it lends one that turns
quiet, and whenever its live agent is silent (is it the link, or the agent?). One keepalive is
in flight at a time (paramiko's transport has one reply slot for global requests); every
caller that asks meanwhile shares its answer (:class:`Ping`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any


class Ping:
    """One keepalive: ``done`` once answered (``rtt`` set) or not within ``limit``
    (``rtt`` None); ``why`` names the limit."""

    def __init__(self, limit: float, why: str) -> None:
        self.limit, self.why = limit, why
        self.done = threading.Event()
        self.rtt: float | None = None

    def failed(self) -> bool:
        return self.done.is_set() and self.rtt is None

    def answered(self) -> bool:
        return self.done.is_set() and self.rtt is not None

    def failure(self) -> str:
        return (f"the kept SSH link gave no answer to a keepalive within {self.limit:.3g} s "
                f"({self.why})")


class Pinger:
    """The keepalives of one link; ``heard`` is called on each answer, ``failed`` with why
    when one goes unanswered (the link is dead, whoever asked)."""

    def __init__(self, heard: Callable[[], None], failed: Callable[[str], None]) -> None:
        self.heard = heard
        self.failed = failed
        self.lock = threading.Lock()
        self.current: Ping | None = None
        self.sent = 0

    def ping(self, link: Any, limit: float, why: str) -> Ping:
        """The keepalive in flight, else a new one sent now (answered on its own thread)."""
        with self.lock:
            if self.current is not None and not self.current.done.is_set():
                return self.current
            ping = self.current = Ping(limit, why)
            self.sent += 1
        threading.Thread(target=self._run, args=(link, ping), daemon=True,
                         name="outrig-ping").start()
        return ping

    def _run(self, link: Any, ping: Ping) -> None:
        rtt = None
        with contextlib.suppress(Exception):
            rtt = keepalive(link, ping.limit) if link is not None else None
        if rtt is not None:
            self.heard()
        else:
            self.failed(ping.failure())
        ping.rtt = rtt
        ping.done.set()


def keepalive(link: Any, limit: float) -> float | None:
    """One ``keepalive@openssh.com`` global request on ``link`` that wants a reply (OpenSSH
    answers it, with a failure, as ``ServerAliveInterval`` relies on): the seconds the box
    took to answer, or ``None`` when no answer came within ``limit`` or the link closed.
    Why not paramiko's: its keepalive asks for no reply (so it never sees a dead link), and
    its ``global_request`` waits without a limit. The send runs on a thread of its own: on a
    dead link it may block (a key exchange under way), and the limit must still hold."""
    from paramiko.common import cMSG_GLOBAL_REQUEST
    from paramiko.message import Message

    answered = threading.Event()
    link.completion_event = answered  # set by the box's reply, success or failure alike
    message = Message()
    message.add_byte(cMSG_GLOBAL_REQUEST)
    message.add_string("keepalive@openssh.com")
    message.add_boolean(True)
    started = time.monotonic()
    threading.Thread(target=_send_quietly, args=(link, message), daemon=True,
                     name="outrig-keepalive").start()
    deadline = started + limit
    while not answered.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
        if not link.is_active() or time.monotonic() >= deadline:
            return None
    return time.monotonic() - started


def _send_quietly(link: Any, message: Any) -> None:
    with contextlib.suppress(Exception):  # a dead link: the unanswered wait says so
        link._send_user_message(message)
