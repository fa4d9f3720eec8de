"""The launchers people paste into a process's ``command:`` (vLLM's OpenAI server, torchrun),
read for the flags that decide how many GPUs they use, and checked against ``gpus:``.

``flags.py`` holds the real parsers' flag names and aliases (a contract test keeps them
equal), ``reading.py`` reads an argv as those parsers would, ``checks.py`` turns what was read
into the plan's problems and notes. Pure: the planner (:mod:`outrig.plan`) calls it; nothing
here does I/O, and nothing here imports the playbook or the planner.
"""

from __future__ import annotations

from outrig.launchers.checks import Findings, check_launch
from outrig.launchers.reading import Launch, read_launch

__all__ = ["Findings", "Launch", "check_launch", "read_launch"]
