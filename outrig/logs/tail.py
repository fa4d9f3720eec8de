"""Exactly-once log following, the pure part: cursors, framing, segments and line splitting.

The agent's ``follow`` op (remote/agent/follow.py, docs/logs-and-status.md) sends raw bytes of each
log as ``chunk`` events that carry the file's inode and the byte offset of their first byte.
This module decides, without any I/O, what each event means for one process:

- which bytes are new for the local mirror (offsets at or past the cursor; anything before it
  was already made durable and is dropped, which is what makes a resume exactly-once);
- when the mirror must start a new *segment* (the remote file was rotated or truncated, or
  ``--lines`` skipped ahead of what we have), so a mirror file always equals one contiguous
  byte range of one remote file;
- which complete lines to show (a partial last line waits for its newline, across chunks and
  across reconnects).

The I/O layer (:mod:`outrig.ops.logs`) writes the mirror bytes, fsyncs, and only then persists
the cursor; this module never advances a durable cursor by itself (``pending`` vs ``cursor``).
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from outrig.errors import RemoteError
from outrig.redaction import redact_bytes, safe_cut

MAX_PARTIAL = 64 * 1024  # a "line" longer than this without a newline is shown in pieces
NEW_SEGMENT_REASONS = frozenset({"rotated", "truncated", "created"})


class FramingError(RemoteError):
    """The agent's stream contradicts itself (a gap, an unknown process, bad base64)."""


@dataclass(frozen=True)
class Cursor:
    """What the mirror holds of one remote log.

    ``inode`` identifies the remote file; the mirror file holds its bytes ``[base, offset)``
    (box offsets: where the agent resumes), with the secrets in them replaced by ``***``.
    ``redacted`` is how many bytes fewer the mirror file holds than that range (negative
    when a value shorter than ``***`` was replaced): the mirror's own size, which a resume
    truncates it to, is :attr:`size`. Without secrets it is 0 and mirror position ``k`` is
    remote offset ``base + k``. ``segments`` counts the mirror files archived before this
    one (rotations, truncations, ``--lines`` jumps).
    """

    inode: int
    offset: int
    base: int = 0
    segments: int = 0
    redacted: int = 0

    @property
    def size(self) -> int:
        """Bytes in the mirror file of this segment."""
        return self.offset - self.base - self.redacted

    def to_json(self) -> dict[str, int]:
        return {"inode": self.inode, "offset": self.offset, "base": self.base,
                "segments": self.segments, "redacted": self.redacted}

    @classmethod
    def from_json(cls, raw: Any) -> Cursor | None:
        """A cursor from the journal, or None when the entry is malformed (start afresh)."""
        if not isinstance(raw, dict):
            return None
        try:
            values = [raw["inode"], raw["offset"], raw.get("base", 0), raw.get("segments", 0)]
        except KeyError:
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            return None
        redacted = raw.get("redacted", 0)
        if not isinstance(redacted, int) or isinstance(redacted, bool):
            return None
        inode, offset, base, segments = values
        cursor = cls(inode, offset, base, segments, redacted)
        if base > offset or cursor.size < 0:
            return None
        return cursor

    def wire(self) -> dict[str, int]:
        """What the agent needs: the file and where to resume."""
        return {"inode": self.inode, "offset": self.offset}


@dataclass(frozen=True)
class Chunk:
    """One decoded ``chunk`` event."""

    process: str
    inode: int
    offset: int
    data: bytes


def decode_chunk(event: dict[str, Any]) -> Chunk:
    """Decode a ``chunk`` event (base64, optionally zlib) and check its declared size."""
    try:
        process = str(event["process"])
        inode = int(event["inode"])
        offset = int(event["offset"])
        payload = base64.b64decode(event["data_b64"], validate=True)
        data = zlib.decompress(payload) if event.get("z") else payload
    except (KeyError, TypeError, ValueError, binascii.Error, zlib.error) as exc:
        raise FramingError(f"malformed chunk event from the agent: {exc}",
                           kind="framing") from None
    size = event.get("size")
    if isinstance(size, int) and size != len(data):
        raise FramingError(f"chunk for {process} at offset {offset} says {size} bytes but "
                           f"decodes to {len(data)}", kind="framing")
    return Chunk(process, inode, offset, data)


@dataclass
class Applied:
    """What one event means for the mirror and the screen."""

    mirror: bytes = b""  # append to the current mirror segment
    reset: bool = False  # the pending cursor was replaced: a new (empty) segment starts
    new_segment: bool = False  # ... and the current mirror file holds bytes: archive it
    lines: list[str] = field(default_factory=list)  # complete lines to show


def clean_display(line: str) -> str:
    """A line for humans: drop a trailing CR and show only the last CR-separated segment
    (progress bars redraw themselves with CR)."""
    line = line.rstrip("\r")
    if "\r" in line:
        line = line.rsplit("\r", 1)[-1]
    return line


class LineSplitter:
    """Bytes in, complete decoded lines out; the unterminated tail waits for more."""

    def __init__(self, partial: bytes = b"") -> None:
        self.partial = partial

    def feed(self, data: bytes) -> list[str]:
        if not data:
            return []
        pieces = (self.partial + data).split(b"\n")
        self.partial = pieces.pop()
        if len(self.partial) > MAX_PARTIAL:
            pieces.append(self.partial)
            self.partial = b""
        return [p.decode("utf-8", errors="replace") for p in pieces]

    def flush(self) -> list[str]:
        """The unterminated last line as a line (``--no-follow`` ends, or the writer is gone)."""
        if not self.partial:
            return []
        line = self.partial.decode("utf-8", errors="replace")
        self.partial = b""
        return [line]


class StreamState:
    """One process's stream: the durable cursor, the pending (written, not yet durable)
    cursor, where the next chunk must start, and the line splitter for display.

    With ``secrets`` (UTF-8 values, longest first) the mirror gets whole lines only, each
    redacted: the bytes of an unfinished line are ``held`` (not in the mirror, not in the
    cursor; the agent sends them again on a resume), so a value split across two chunks is
    still replaced. Without, the mirror is a byte-exact copy, written as the bytes come."""

    def __init__(self, name: str, cursor: Cursor | None = None, partial: bytes = b"",
                 secrets: Sequence[bytes] = ()) -> None:
        self.name = name
        self.cursor = cursor  # durable: persisted in the journal
        self.pending = cursor  # advanced by chunks; becomes durable on commit()
        self.secrets = tuple(secrets)
        self.held = b""  # with secrets: received bytes past ``pending.offset`` not mirrored
        self.expect: int | None = None  # offset the next chunk must carry (None: not open)
        self.show_from = 0
        # The splitter continues from the durable cursor: the mirror's unterminated last line.
        self.shown_to: int | None = cursor.offset if cursor is not None else None
        self.splitter = LineSplitter(partial if cursor is not None else b"")

    def on_open(self, inode: int, offset: int, display_from: int, reason: str) -> Applied:
        """The agent (re)opened the file at ``offset``: continue the mirror or start a segment."""
        cur = self.pending
        keep = (cur is not None and reason not in NEW_SEGMENT_REASONS and cur.inode == inode
                and cur.base <= offset <= cur.offset)
        applied = Applied()
        if not keep:
            segments = cur.segments + 1 if cur is not None and cur.offset > cur.base else (
                cur.segments if cur is not None else 0)
            applied.reset = True
            applied.new_segment = cur is not None and cur.offset > cur.base
            self.pending = Cursor(inode, offset, offset, segments)
            self.cursor = self.pending  # the caller makes this durable before anything else
        self.expect = offset
        self.held = b""  # the agent sends from ``offset`` <= pending.offset: again if held
        self.show_from = max(display_from, offset)
        if self.shown_to != self.show_from:
            self.splitter = LineSplitter()  # a jump: the old partial line does not continue
        self.shown_to = self.show_from
        return applied

    def on_chunk(self, chunk: Chunk) -> Applied:
        """Mirror bytes and display lines for one chunk (gaps are a :class:`FramingError`)."""
        cur = self.pending
        if self.expect is None or cur is None:
            raise FramingError(f"chunk for {self.name} before the agent opened its log",
                               kind="framing")
        if chunk.inode != cur.inode or chunk.offset != self.expect:
            raise FramingError(
                f"chunk for {self.name} at inode {chunk.inode} offset {chunk.offset}, expected "
                f"inode {cur.inode} offset {self.expect}: the stream has a gap", kind="framing")
        end = chunk.offset + len(chunk.data)
        self.expect = end
        applied = Applied()
        received = cur.offset + len(self.held)  # box offset of the first byte not yet taken
        if end > received and self.secrets:
            data = self.held + chunk.data[max(0, received - chunk.offset):]
            taken, self.held, applied.mirror = mirror_lines(data, self.secrets)
            self.pending = replace(cur, offset=cur.offset + taken,
                                   redacted=cur.redacted + taken - len(applied.mirror))
        elif end > received:
            applied.mirror = chunk.data[max(0, cur.offset - chunk.offset):]
            self.pending = replace(cur, offset=end)
        if end > self.show_from:
            shown = chunk.data[max(0, self.show_from - chunk.offset):]
            applied.lines = self.splitter.feed(shown)
            self.show_from = end
            self.shown_to = end
        return applied

    def commit(self) -> None:
        """The I/O layer made the pending bytes durable."""
        self.cursor = self.pending

    def flush(self) -> list[str]:
        return self.splitter.flush()


def mirror_lines(data: bytes, secrets: Sequence[bytes]) -> tuple[int, bytes, bytes]:
    """(bytes of ``data`` taken, bytes held, what the mirror gets) for received ``data``
    with secrets: every whole line, redacted; the unfinished last line is held, unless it
    grew past ``MAX_PARTIAL`` (a runaway line), of which everything is taken but the tail
    that may still be the start of a secret."""
    cut = data.rfind(b"\n") + 1
    if len(data) - cut > MAX_PARTIAL:
        cut = safe_cut(data, secrets, len(data))
    return cut, data[cut:], redact_bytes(data[:cut], secrets)


def partial_tail(data: bytes) -> bytes:
    """The unterminated last line of a mirror's tail (what continues on the next resume)."""
    if b"\n" not in data:
        return data if len(data) <= MAX_PARTIAL else b""
    return data[data.rindex(b"\n") + 1:]
