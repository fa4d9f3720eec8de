"""Secret values kept out of what outrig writes on the workstation.

A playbook's ``secrets:`` (``HF_TOKEN``...) reach the processes' environment only, but a
process may print one. The box redacts what it sends in its own messages (error excerpts,
``status`` tails); what comes back as raw bytes (``tail-logs``' stream) and what outrig
composes here (an ``evaluate`` document) is redacted here, with the values this shell has,
before it is shown *or stored*: the log mirror, the journal and every printed line get
``***`` where a value was. Values are matched exactly, longest first (a value that contains
another is replaced whole). A value with a line break in it is matched only inside one
mirror write (the mirror is written in whole lines).

Pure: no I/O; the callers decide where the values come from.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar, cast

MASK = "***"
T = TypeVar("T")


def ordered(values: Iterable[str]) -> list[str]:
    """The distinct non-empty values, longest first (the order every replacement uses)."""
    return sorted({v for v in values if v}, key=len, reverse=True)


def redact_text(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every value in ``secrets`` (see :func:`ordered`) replaced by ``***``."""
    for value in secrets:
        if value and value in text:
            text = text.replace(value, MASK)
    return text


def redact_bytes(data: bytes, secrets: Sequence[bytes]) -> bytes:
    """:func:`redact_text` for bytes (the values UTF-8 encoded, longest first)."""
    for value in secrets:
        if value and value in data:
            data = data.replace(value, MASK.encode())
    return data


def redact_tree(value: T, secrets: Sequence[str]) -> T:
    """A JSON-like document (dicts, lists, tuples, strings, numbers) with every string,
    keys too, redacted; a copy of the same shape, the original is left as it is."""
    if not secrets:
        return value
    out: Any = value
    if isinstance(value, str):
        out = redact_text(value, secrets)
    elif isinstance(value, dict):
        out = {redact_tree(k, secrets): redact_tree(v, secrets) for k, v in value.items()}
    elif isinstance(value, (list, tuple)):
        out = type(value)(redact_tree(v, secrets) for v in value)
    return cast(T, out)


def safe_cut(data: bytes, secrets: Sequence[bytes], limit: int) -> int:
    """The largest cut ``c <= limit`` of ``data`` that no occurrence of a secret straddles
    (an occurrence starting before ``c`` ends by ``c``): what may be redacted and written
    now, the rest held until more bytes come. Cutting at ``len(data) - longest + 1`` or
    before guarantees that every occurrence starting before the cut is wholly in ``data``."""
    longest = max((len(v) for v in secrets), default=0)
    cut = max(0, min(limit, len(data) - longest + 1 if longest else len(data)))
    moved = True
    while moved:
        moved = False
        for value in secrets:
            if not value:
                continue
            start = data.find(value, max(0, cut - len(value) + 1))
            while start != -1 and start < cut:
                if start + len(value) > cut:
                    cut, moved = start, True
                    break
                start = data.find(value, start + 1)
    return cut
