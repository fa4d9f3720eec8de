"""The ``replay`` connector: agent calls answered from a recording, with no box and no link.

Like httpx's ``MockTransport`` or pyinfra's fake connector, it stands where the SSH connector
stands, so an op's core (``status_on``, ``cleanup_on``, ``deploy_on``, ...) runs unchanged on
what a real agent once printed. A recording is made by :class:`RecordingConnector`, which
wraps a real connector (the local one in the tests) and keeps, per agent call, the bytes the
agent wrote to stdout, its stderr and its exit status.

A host file selects it with ``hostname: replay:FILE`` (FILE: a recording saved with
:func:`save`); a test can also hand a :class:`ReplayConnector` to a session directly.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from outrig.inventory import Host
from outrig.transport import AgentChannel, Transport

CHUNK = 4096  # replayed in small reads, so line assembly across reads is exercised too


@dataclass
class Recording:
    """One agent call as the box answered it. ``exit_status`` None: the link dropped."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: str = ""
    exit_status: int | None = 0

    def to_json(self) -> dict[str, object]:
        """The recording as JSON a reader can follow: stdout as its lines (the agent's JSON
        events, one a line; the last entry is what follows the last newline), or as base64
        when it is not UTF-8."""
        try:
            out: dict[str, object] = {"stdout_lines": bytes(self.stdout).decode("utf-8")
                                      .split("\n")}
        except UnicodeDecodeError:
            out = {"stdout_b64": base64.b64encode(bytes(self.stdout)).decode("ascii")}
        return {**out, "stderr": self.stderr, "exit_status": self.exit_status}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Recording:
        status = data.get("exit_status")
        lines = data.get("stdout_lines")
        stdout = ("\n".join(str(line) for line in lines).encode("utf-8")
                  if isinstance(lines, list) else base64.b64decode(str(data["stdout_b64"])))
        return cls(bytearray(stdout), str(data["stderr"]),
                   status if isinstance(status, int) else None)

    def events(self) -> list[dict[str, object]]:
        """The JSON events of the recorded stdout (for a test to look at or to pick)."""
        return [json.loads(line) for line in bytes(self.stdout).splitlines()
                if line.strip().startswith(b"{")]


def save(path: Path, calls: list[Recording]) -> Path:
    """Write ``calls`` where a ``hostname: replay:PATH`` host file can find them."""
    path.write_text(json.dumps([call.to_json() for call in calls]))
    return path


class _ReplayChannel(AgentChannel):
    """Hands out a recording's stdout, then EOF; keeps what the workstation wrote to it."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self.position = 0
        self.written = bytearray()

    def write(self, data: bytes) -> None:
        self.written += data

    def read(self, timeout: float) -> bytes | None:
        data = self.recording.stdout[self.position:self.position + CHUNK]
        self.position += len(data)
        return bytes(data)

    def stderr_text(self) -> str:
        return self.recording.stderr

    def exit_status(self, timeout: float = 5.0) -> int | None:
        return self.recording.exit_status

    def alive(self) -> bool:
        return self.recording.exit_status is not None

    def close(self) -> None:
        """Nothing to release."""


class ReplayConnector(Transport):
    """Answers each ``start`` with the next recorded call, in order."""

    name = "replay"

    def __init__(self, host: Host, *, rtt_hint: float | None = None,
                 notify: Callable[[str], None] | None = None,
                 keep_seconds: float | None = None,
                 calls: list[Recording] | None = None) -> None:
        self.host = host
        self.rtt = 0.0
        if calls is None:
            raw = json.loads(Path(host.hostname.split(":", 1)[1]).read_text())
            calls = [Recording.from_json(entry) for entry in raw]
        self.calls = list(calls)
        self.argvs: list[list[str]] = []  # what each start was asked to run

    def start(self, argv: list[str], *, window_size: int | None = None) -> AgentChannel:
        if not self.calls:
            raise AssertionError(f"{self.host.name}: no recorded agent call left to replay "
                                 f"(replayed {len(self.argvs)})")
        self.argvs.append(list(argv))
        return _ReplayChannel(self.calls.pop(0))


class _TeeChannel(AgentChannel):
    """A real channel whose output is also kept in a :class:`Recording`."""

    def __init__(self, inner: AgentChannel, recording: Recording) -> None:
        self.inner = inner
        self.recording = recording

    def write(self, data: bytes) -> None:
        self.inner.write(data)

    def read(self, timeout: float) -> bytes | None:
        data = self.inner.read(timeout)
        if data:
            self.recording.stdout += data
        return data

    def stderr_text(self) -> str:
        self.recording.stderr = self.inner.stderr_text()
        return self.recording.stderr

    def exit_status(self, timeout: float = 5.0) -> int | None:
        self.recording.exit_status = self.inner.exit_status(timeout)
        return self.recording.exit_status

    def alive(self) -> bool:
        return self.inner.alive()

    def close_input(self) -> None:
        self.inner.close_input()

    def close(self) -> None:
        self.inner.close()


class RecordingConnector(Transport):
    """Wraps a real connector and records every agent call made through it."""

    name = "recording"

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.host = inner.host
        self.calls: list[Recording] = []

    @property  # type: ignore[override]
    def rtt(self) -> float | None:
        return self.inner.rtt

    def start(self, argv: list[str], *, window_size: int | None = None) -> AgentChannel:
        recording = Recording()
        self.calls.append(recording)
        return _TeeChannel(self.inner.start(argv, window_size=window_size), recording)

    def close(self) -> None:
        self.inner.close()
