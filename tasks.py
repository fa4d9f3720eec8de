"""``inv`` in this checkout: the same tasks as the installed ``outrig`` command.

The tasks live in :mod:`outrig.cli`; this file only names the collection, with this checkout
as the project used when none is found upward from the current folder.
"""

from __future__ import annotations

from pathlib import Path

from outrig.cli import friendly, make_collection

__all__ = ["friendly", "ns"]

ns = make_collection(default_project=Path(__file__).resolve().parent)
