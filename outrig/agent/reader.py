"""The one reader of an agent's channel on the workstation.

Every caller that reads what an agent writes (an op's events and result, a file stream of
``send_files``, the log stream of ``follow``) reads it through :class:`ChannelReader`, so the
three things that decide how a read ends are decided once:

- **idle**: silence longer than the caller's limit (see :mod:`outrig.timing`) means the link
  or the box is gone: :class:`~outrig.errors.LinkLost`;
- **link alive**: a channel whose link is down ends the read at once, without waiting out the
  limit: :class:`~outrig.errors.LinkLost`;
- **crash**: the stream ended without a result. No exit status means the link dropped
  (:class:`~outrig.errors.LinkLost`); an exit status means the agent stopped, and its stderr
  says why (no Python, an old one, not Python at all, or a crash):
  :class:`~outrig.errors.RemoteError` with a ``kind`` the caller can branch on.

Callers decide what to do by the error's type and fields, never its text.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from outrig.errors import LinkLost, RemoteError
from outrig.inventory import Host
from outrig.transport import AgentChannel

Event = dict[str, Any]
EventHandler = Callable[[Event], None]
LAUNCHED_KEEPS_RUNNING = ("What was launched keeps running on the box; check with "
                          "`outrig status --host {host}`, and run the command again when the "
                          "link is back.")
# The same advice when the agent reported nothing launched: saying that something "keeps
# running" would send the user looking for processes that were never started.
NOTHING_LAUNCHED = ("The box reported nothing launched before contact was lost; check with "
                    "`outrig status --host {host}`, and run the command again when the link "
                    "is back.")


def parse_line(line: bytes) -> Event | None:
    """One line of agent output: its JSON event, an ``output`` event for a line that is not
    JSON (a stray print), or None for a blank line or JSON that is not an object."""
    line = line.strip()
    if not line:
        return None
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return {"event": "output", "line": line.decode("utf-8", "replace")}
    return event if isinstance(event, dict) else None


def take_events(buffer: bytearray) -> list[Event]:
    """The events of every complete line in ``buffer``, which keeps only the unfinished one."""
    events: list[Event] = []
    start = 0
    while True:
        end = buffer.find(b"\n", start)
        if end < 0:
            break
        event = parse_line(bytes(buffer[start:end]))
        start = end + 1
        if event is not None:
            events.append(event)
    del buffer[:start]
    return events


class ChannelReader:
    """Reads one agent channel until its end, under one idle limit.

    ``poll`` is how often silence is checked (and ``stop`` looked at); ``batch`` > 0 gathers
    what is already waiting into one chunk of up to that many bytes (one commit for many
    chunks); ``after`` is the sentence a lost link's error ends with (what to do next)."""

    def __init__(self, channel: AgentChannel, host: Host, idle_limit: float, *,
                 poll: float = 1.0, batch: int = 0, stop: threading.Event | None = None,
                 after: str = LAUNCHED_KEEPS_RUNNING) -> None:
        self.channel = channel
        self.host = host
        self.idle_limit = idle_limit
        self.poll = poll
        self.batch = batch
        self.stop = stop
        self.after = after.replace("{host}", host.name)
        self.default_after = after == LAUNCHED_KEEPS_RUNNING
        self.launched = 0  # ``launched`` events seen (the default advice depends on it)
        self.stopped = False  # the read ended because ``stop`` was set
        self.frames = 0  # JSON events seen: none means the agent never ran
        self.tail = b""  # an unfinished last line, kept for the crash report

    def chunks(self) -> Iterator[bytes]:
        """The channel's stdout as it comes, until EOF (or ``stop``); raises LinkLost on a
        silence past the limit or a link found down."""
        last_heard = time.monotonic()
        while True:
            if self.stop is not None and self.stop.is_set():
                self.stopped = True
                return
            data = self.channel.read(timeout=self.poll)
            if data is None:
                silent = time.monotonic() - last_heard
                alive = self.channel.alive()
                if silent > self.idle_limit or not alive:
                    raise self._silence(silent, alive)
                continue
            if data == b"":
                return
            last_heard = time.monotonic()
            if self.batch:
                data = self._gather(data)
            yield data

    def _gather(self, data: bytes) -> bytes:
        """``data`` plus whatever else is already waiting, up to :attr:`batch` bytes."""
        gathered = bytearray(data)
        while len(gathered) < self.batch:
            more = self.channel.read(timeout=0.0)
            if not more:
                break
            gathered += more
        return bytes(gathered)

    def _silence(self, silent: float, alive: bool) -> LinkLost:
        if not alive and self.channel.lost_why:
            return self.lost_contact()
        state = "may be down" if alive else "is down"
        return LinkLost(
            f"lost contact with the agent on {self.host.label()}: nothing heard for "
            f"{silent:.0f} s (limit {self.idle_limit:.0f} s) and the link {state}. "
            f"{self.advice()}", phase="stream", request_sent=True, silent=alive)

    def lost_contact(self) -> LinkLost:
        """The channel ended without an exit status: the link dropped, or the connector
        said why (the keeper found its link dead, or the box's live agent went)."""
        why = self.channel.lost_why or "the connection dropped"
        return LinkLost(f"lost contact with the agent on {self.host.label()} before it "
                        f"finished ({why}). {self.advice()}", phase="stream",
                        request_sent=True, silent=self.channel.lost_silent)

    def advice(self) -> str:
        """The sentence a lost link's error ends with: the caller's, or by default what
        the box reported launched (something keeps running, or nothing was reported)."""
        if self.default_after and not self.launched:
            return NOTHING_LAUNCHED.replace("{host}", self.host.name)
        return self.after

    def link_dropped(self) -> bool:
        """After EOF: whether the link ended (no exit status) rather than the command."""
        return not self.channel.alive() or self.channel.exit_status(timeout=5.0) in (None, -1)

    def events(self) -> Iterator[Event]:
        """Every event line, in order, until EOF."""
        buffer = bytearray()
        for chunk in self.chunks():
            buffer += chunk
            for event in take_events(buffer):
                if "t" in event:
                    self.frames += 1
                if event.get("event") == "launched":
                    self.launched += 1
                yield event
        self.tail = bytes(buffer)

    def result(self, on_event: EventHandler | None = None,
               seen: list[Event] | None = None) -> Event:
        """Events to ``on_event`` (and appended to ``seen``) until the ``result`` line, which
        is returned; a stream that ends without one raises :meth:`no_result`."""
        for event in self.events():
            if event.get("event") == "result":
                return event
            if seen is not None:
                seen.append(event)
            if on_event is not None:
                on_event(event)
        raise self.no_result()

    def no_result(self) -> RemoteError | LinkLost:
        """Why the stream ended without a result: the link, or the agent (with its stderr)."""
        channel, host = self.channel, self.host
        status = channel.exit_status(timeout=5.0)
        if not channel.alive() or status in (None, -1):
            # The channel ended with no exit status: the link dropped, not the agent.
            return self.lost_contact()
        return crash_error(host, status, channel.stderr_text().strip(), self.frames, self.tail)


def crash_error(host: Host, status: int | None, stderr: str, frames: int,
                tail: bytes) -> RemoteError:
    """The agent exited without a result: say which of the known reasons it was, from its
    exit status and what it printed (the only signals a process that never ran leaves)."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()][-12:]
    if status == 127 or ("not found" in stderr and host.python in stderr):
        return RemoteError(
            f"{host.label()} has no Python interpreter {host.python!r} (exit {status}). "
            "Install python3 (3.8 or newer) on the box, or set python: in the host file to "
            "an interpreter that exists there.",
            kind="no_python", excerpt=lines,
        )
    if "needs Python >= 3.8" in stderr:
        return RemoteError(
            f"{host.label()}: {lines[-1] if lines else 'Python too old'}. Set python: "
            "in the host file to a Python 3.8+ interpreter.", kind="old_python",
        )
    if not frames and status is not None and 0 <= status < 128 and "Traceback" not in stderr:
        # Not one event and no Python traceback: the agent never ran. The interpreter is
        # something else (/bin/false, a wrapper script, Python 2) or refused the bootstrap.
        output = (" and printed: " + " | ".join(lines[-3:])) if lines else " and no output"
        return RemoteError(
            f"{host.label()}: the interpreter {host.python!r} could not run the agent "
            f"(it exited with status {status}{output}). Set python: in the host file to a "
            "Python 3.8+ interpreter that exists on the box (e.g. python3); on the box, "
            f"`{host.python} -c 'import sys; print(sys.version)'` must print 3.8 or newer.",
            kind="bad_python", excerpt=lines)
    return RemoteError(
        f"the agent on {host.label()} stopped without a result (exit status {status}). "
        "This is a bug or the box killed it (out of memory?); its stderr follows.",
        kind="agent_crash", excerpt=lines or [tail.decode("utf-8", "replace")[-500:]],
    )
