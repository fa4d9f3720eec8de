"""Reading logs: clean lines, tails read backwards from the end, a follower for new lines,
and the last lines holding a marker."""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Pattern

from .constants import FOLLOW_CHUNK, MAX_LINE_CHARS, TAIL_MAX_BYTES
from .events import redact


def clean_line(raw: bytes, secrets: Optional[List[str]] = None) -> str:
    """One log line for humans: decoded, last carriage-return segment (progress bars), secret
    values replaced (before the cap, so no prefix of one survives), capped."""
    text = raw.decode("utf-8", errors="replace").rstrip("\r")
    if "\r" in text:
        text = text.rsplit("\r", 1)[-1]
    if secrets:
        text = redact(text, secrets)
    if len(text) > MAX_LINE_CHARS:
        text = text[:MAX_LINE_CHARS] + "…"
    return text


def tail_lines(path: str, count: int, secrets: Optional[List[str]] = None) -> List[str]:
    """The last ``count`` lines of a file, reading blocks backwards from the end, with the
    ``secrets`` values redacted (every excerpt that leaves the log file goes through here).

    A multi-GB log is never read whole: at most TAIL_MAX_BYTES are scanned.
    """
    if count <= 0:
        return []
    chunks: List[bytes] = []
    pos = 0
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            pos = end
            newlines = 0
            while pos > 0 and newlines <= count and end - pos < TAIL_MAX_BYTES:
                size = min(8192, pos)
                pos -= size
                f.seek(pos)
                chunk = f.read(size)
                chunks.append(chunk)
                newlines += chunk.count(b"\n")
    except OSError:
        return []
    data = b"".join(reversed(chunks))
    if pos > 0 and b"\n" in data:
        data = data[data.index(b"\n") + 1 :]  # first line is probably cut
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [clean_line(x, secrets) for x in lines[-count:]]


class LogFollower:
    """Follows a log from a byte offset, yielding complete lines (partial last line kept)."""

    MAX_PARTIAL = 64 * 1024

    def __init__(self, path: str, offset: int, secrets: Optional[List[str]] = None) -> None:
        self.path = path
        self.secrets = secrets
        self.offset = offset
        self.partial = b""
        self.last_line = ""

    def read_new(self) -> List[str]:
        """New complete lines since the last call (at most FOLLOW_CHUNK bytes per call)."""
        try:
            with open(self.path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                if size < self.offset:  # truncated under us: start over
                    self.offset = 0
                    self.partial = b""
                if size == self.offset:
                    return []
                f.seek(self.offset)
                data = f.read(FOLLOW_CHUNK)
        except OSError:
            return []
        self.offset += len(data)
        data = self.partial + data
        pieces = data.split(b"\n")
        self.partial = pieces.pop()
        if len(self.partial) > self.MAX_PARTIAL:  # a huge line without newline: treat as a line
            pieces.append(self.partial)
            self.partial = b""
        lines = [clean_line(p, self.secrets) for p in pieces]
        for line in reversed(lines):
            if line.strip():
                self.last_line = line
                break
        return lines

    def flush(self) -> List[str]:
        """The unterminated last line as a line (the writer has exited)."""
        if not self.partial:
            return []
        line = clean_line(self.partial, self.secrets)
        self.partial = b""
        if line.strip():
            self.last_line = line
        return [line]

    def latest(self) -> str:
        """The most recent non-blank line seen (including an unfinished one)."""
        if self.partial.strip():
            return clean_line(self.partial, self.secrets)
        return self.last_line


PROGRESS_SCAN_MAX = 16 << 20  # status: how far back to look for marker lines
READY_SCAN_MAX = 4 << 20  # status: how much of a log's start may show its ready line


#
# What ``status`` adds for the workstation's progress parser and GPU table. The agent stays
# dumb: it ships raw text (the log's last bytes, the last line holding a marker) and facts
# (checkpoint dirs, HTTP answers); outrig/metrics/progress.py on the workstation does the parsing.


def tail_text(path: str, nbytes: int) -> str:
    """The last ``nbytes`` of a file as text, starting at a line boundary when possible."""
    if nbytes <= 0:
        return ""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - nbytes)
            f.seek(start)
            data = f.read(nbytes)
    except OSError:
        return ""
    if start > 0 and b"\n" in data:
        data = data[data.index(b"\n") + 1 :]
    return data.decode("utf-8", errors="replace")


def last_lines_containing(path: str, needles: List[str], scan_max: int = PROGRESS_SCAN_MAX,
                          secrets: Optional[List[str]] = None) -> Dict[str, Optional[str]]:
    """For each literal needle, the last line of the file containing it (scanning backwards,
    at most ``scan_max`` bytes, secret values redacted), or None."""
    found: Dict[str, Optional[str]] = {n: None for n in needles}
    todo = [n.encode("utf-8") for n in needles]
    if not todo:
        return found
    try:
        with open(path, "rb") as f:
            pos = f.seek(0, os.SEEK_END)
            carry = b""
            scanned = 0
            while todo and pos > 0 and scanned < scan_max:
                block = min(256 * 1024, pos)
                pos -= block
                f.seek(pos)
                data = f.read(block) + carry
                scanned += block
                lines = data.split(b"\n")
                carry = lines[0] if pos > 0 else b""
                body = lines[1:] if pos > 0 else lines
                for line in reversed(body):
                    for needle in list(todo):
                        if needle in line:
                            found[needle.decode("utf-8")] = clean_line(line, secrets)
                            todo.remove(needle)
    except OSError:
        pass
    return found


def first_match(path: str, regex: Pattern[str], scan_max: int = READY_SCAN_MAX) -> bool:
    """True when a line among the first ``scan_max`` bytes of the file matches ``regex``, read
    as deploy reads lines (:func:`clean_line`): the log readiness a deploy that did not wait
    (or is still waiting) has not recorded yet. A ready line comes early in a log, so the
    start of it is what is read, never a multi-GB file whole."""
    try:
        with open(path, "rb") as f:
            carry = b""
            scanned = 0
            while scanned < scan_max:
                data = f.read(min(256 * 1024, scan_max - scanned))
                if not data:
                    break
                scanned += len(data)
                lines = (carry + data).split(b"\n")
                carry = lines.pop()
                if any(regex.search(clean_line(line)) for line in lines):
                    return True
            return bool(carry) and regex.search(clean_line(carry)) is not None
    except OSError:
        return False
