"""``python -m outrig``: the ``outrig`` command, as the installed console script runs it
(handy with ``python -X importtime -m outrig --version``)."""

from __future__ import annotations

from outrig.cli import program

if __name__ == "__main__":
    program.run()
