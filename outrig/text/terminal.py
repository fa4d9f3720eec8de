"""How wide the terminal is that outrig writes to: what the prose outrig wraps itself (the
help, errors, notes) is wrapped to, so that no terminal cuts a word in two.

``COLUMNS`` wins when it holds a positive number (as in rich, which lays out the tables, and
in Python's ``shutil``); else the width of the stream when it is a terminal. The help is laid
out for 80 columns when neither says (:func:`terminal_width`, as Invoke did); a message is
then left whole on one line (:func:`wrap_width`), so that a log or a ``grep`` of the output
gets each error and note as one line.
"""

from __future__ import annotations

import os
import sys
from typing import IO

DEFAULT_WIDTH = 80


def terminal_width(stream: IO[str] | None = None) -> int:
    """Columns to lay text for ``stream`` (stdout when not given) out in: 80 when unknown."""
    known = wrap_width(stream)
    return DEFAULT_WIDTH if known is None else known


def wrap_width(stream: IO[str] | None = None) -> int | None:
    """Columns to wrap a message on ``stream`` to, or None (leave it whole) when ``stream``
    is not a terminal and ``COLUMNS`` does not say."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    stream = sys.stdout if stream is None else stream
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns or DEFAULT_WIDTH
    except (AttributeError, OSError, ValueError):
        pass
    return None
