"""Errors and events: the expected failure type (:class:`AgentError`, reported as a failed
result), the JSON-line event writer, secret redaction."""

from __future__ import annotations

import json
import os
import time
import traceback
from typing import IO, Any, List, Optional

from .constants import FULL_DISK_ERRNOS, JSONDict
from .protocol import BAD_REQUEST, DISK, INTERNAL


class AgentError(Exception):
    """An expected failure, reported as ``{"ok": false, "error": {...}}`` (protocol kinds)."""

    def __init__(
        self,
        kind: str,
        message: str,
        process: Optional[str] = None,
        excerpt: Optional[List[str]] = None,
        exit_code: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.process = process
        self.excerpt = list(excerpt or [])
        self.exit_code = exit_code

    def to_json(self) -> JSONDict:
        """The ``error`` object of a failed result (and of a failed run.json)."""
        return {
            "kind": self.kind,
            "message": self.message,
            "process": self.process,
            "excerpt": self.excerpt,
            "exit_code": self.exit_code,
        }


def bad_request(message: str) -> AgentError:
    """Shorthand: the request itself is wrong; nothing was touched."""
    return AgentError(BAD_REQUEST, message)


class Emitter:
    """Writes one JSON event per line and flushes each, so the workstation sees progress live.

    If the channel is gone (the workstation disconnected), writes are dropped instead of
    aborting: the step still finishes and leaves run.json consistent on the box.
    """

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.broken = False

    def emit(self, event: str, **fields: Any) -> None:
        """Send ``{"event": event, "t": now, **fields}`` as one flushed line."""
        obj: JSONDict = {"event": event, "t": round(time.time(), 3)}
        obj.update(fields)
        if self.broken:
            return
        line = json.dumps(obj, default=str) + "\n"
        try:
            self.stream.write(line.encode("ascii"))
            self.stream.flush()
        except (OSError, ValueError):
            self.broken = True

    def step(self, msg: str) -> None:
        """A phase starts."""
        self.emit("step", msg=msg)

    def warning(self, msg: str) -> None:
        """Something the user should know about but that does not fail the step."""
        self.emit("warning", msg=msg)


def redact(line: str, secrets: List[str]) -> str:
    """A line with every secret value replaced by ``***`` (a child may echo its environment)."""
    for value in secrets:
        if value and value in line:
            line = line.replace(value, "***")
    return line


def internal_error(exc: BaseException, workdir: Optional[str] = None) -> AgentError:
    """An unexpected exception as an ``internal`` error: the traceback's last line.

    A full or read-only disk is not a bug: whatever op was writing (deploy's logs and run
    records, a transfer, a lock) gets the same ``disk`` error naming the cause and the way
    out, and cleanup is said to work on a full disk (it records what it can)."""
    if isinstance(exc, OSError) and exc.errno in FULL_DISK_ERRNOS:
        where = exc.filename or workdir or "the workdir"
        return AgentError(DISK, f"the box's disk is full or read-only writing {where} "
                          f"({os.strerror(exc.errno)}). Free space there (df -h; old runs' "
                          "logs and hidden-state files are the usual suspects); `outrig cleanup` "
                          "still stops running processes on a full disk")
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return AgentError(INTERNAL, last)
