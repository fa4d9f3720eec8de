"""Reading a process's argv as vLLM's or torchrun's parser would, for the flags that decide its
GPU count. Pure: the argv (already split like a shell, ``${names}`` substituted) in, a
:class:`Launch` out; nothing is run and nothing is read from disk.

What the real parsers accept, and this reader too: ``--flag value`` and ``--flag=value``, the
short aliases (``-tp 2``, ``-tp=2``), vLLM's ``--snake_case`` spelling of any long flag
(FlexibleArgumentParser turns ``_`` into ``-``), the last of a repeated flag. What it does not
follow (an abbreviated long flag, which argparse would accept, or ``--config FILE``) comes
back as ``unread``, so the plan can say that nothing was checked rather than pass it.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from outrig.launchers.flags import (
    SHELLS,
    TORCHRUN_BOOLEAN,
    TORCHRUN_ENV,
    TORCHRUN_MODULES,
    TORCHRUN_NNODES,
    TORCHRUN_NPROC,
    VLLM_BOOLEAN,
    VLLM_CONFIG,
    VLLM_MODULES,
    VLLM_SIZES,
    VLLM_SPANNING,
    WRAPPERS,
)

_PYTHON = re.compile(r"python[0-9.]*$")
# Python's own options that take a value (python -X dev -W error -m module ...)
_PYTHON_VALUED = frozenset({"-X", "-W", "-Q"})


@dataclass
class Launch:
    """What the command launches and the flags read from it.

    ``program``: ``vllm`` (its OpenAI server), ``torchrun``, ``shell`` (a script or
    ``bash -c``: unreadable) or ``""`` (anything else: nothing to read). ``flags``: dest → the
    value text as given (the last one wins); ``spelled``: dest → the flag as written, for
    messages. ``unread``: why what was read is not the whole story (a ``--config`` file, an
    abbreviated flag), or None."""

    program: str = ""
    flags: dict[str, str] = field(default_factory=dict)
    spelled: dict[str, str] = field(default_factory=dict)
    unread: str | None = None
    shell: str = ""


def read_launch(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Launch:
    """The launch ``argv`` describes (``env``: the process's environment, for torchrun's
    ``PET_*`` defaults)."""
    args = _unwrap(list(argv))
    if not args:
        return Launch()
    head = posixpath.basename(args[0])
    if head in SHELLS or head.endswith(".sh"):
        what = f"{head} -c" if "-c" in args[1:2] else head
        return Launch(program="shell", shell=what)
    if head == "vllm":
        return _vllm(args[2:]) if args[1:2] == ["serve"] else Launch()
    if head == "torchrun":
        return _torchrun(args[1:], env or {})
    if _PYTHON.match(head):
        module, rest = _python_module(args[1:])
        if module in VLLM_MODULES:
            sub = VLLM_MODULES[module]
            if not sub:
                return _vllm(rest)
            return _vllm(rest[1:]) if rest[:1] == [sub] else Launch()
        if module in TORCHRUN_MODULES:
            return _torchrun(rest, env or {})
    return Launch()


def _unwrap(args: list[str]) -> list[str]:
    """The command that ``env VAR=x``, ``nohup``, ``exec``, ``time`` and ``stdbuf`` run."""
    while args:
        head = posixpath.basename(args[0])
        if head == "env":
            args = args[1:]
            while args and (args[0].startswith("-") or "=" in args[0]):
                args = args[1:]
        elif head in WRAPPERS:
            args = args[1:]
            while args and args[0].startswith("-"):
                args = args[1:]
        else:
            return args
    return args


def _python_module(args: list[str]) -> tuple[str, list[str]]:
    """(module, its arguments) of ``python [options] -m module ...``; ("", []) for a script."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] == "-m":
            return (args[i + 1], args[i + 2:]) if i + 1 < len(args) else ("", [])
        if args[i].startswith("-m") and len(args[i]) > 2:  # python -mvllm...
            return args[i][2:], args[i + 1:]
        i += 2 if args[i] in _PYTHON_VALUED else 1
    return "", []


def _vllm(args: list[str]) -> Launch:
    launch = Launch(program="vllm")
    names = {**VLLM_SIZES, **VLLM_SPANNING}
    by_flag = {flag: dest for dest, flags in names.items() for flag in flags}
    long_flags = [flag for flag in by_flag if flag.startswith("--")]
    i = 0
    while i < len(args):
        token = args[i]
        flag, eq, inline = token.partition("=")
        if flag.startswith("--"):
            flag = "--" + flag[2:].replace("_", "-")  # FlexibleArgumentParser's spelling
        if flag == VLLM_CONFIG:
            launch.unread = (f"{VLLM_CONFIG} {inline or _at(args, i + 1)}: vLLM reads more "
                             "flags from that file, which outrig does not open")
        dest = by_flag.get(flag)
        if dest is None:
            partial = [f for f in long_flags if flag.startswith("--") and len(flag) > 3
                       and f.startswith(flag)]
            if partial and not launch.unread:
                launch.unread = (f"{token.partition('=')[0]} is an abbreviation vLLM may read "
                                 f"as {partial[0]} (write the flag in full)")
            i += 1
            continue
        launch.spelled[dest] = token.partition("=")[0]
        if flag in VLLM_BOOLEAN:
            launch.flags[dest] = "true"
            i += 1
        elif eq:
            launch.flags[dest] = inline
            i += 1
        else:
            launch.flags[dest] = _at(args, i + 1)
            i += 2
    return launch


def _torchrun(args: list[str], env: Mapping[str, str]) -> Launch:
    """torchrun's flags, up to its training script (or ``-m``'s module)."""
    launch = Launch(program="torchrun")
    for dest, name in TORCHRUN_ENV.items():
        if env.get(name):
            launch.flags[dest] = env[name]
            launch.spelled[dest] = name
    wanted = {**{f: "nproc_per_node" for f in TORCHRUN_NPROC},
              **{f: "nnodes" for f in TORCHRUN_NNODES}}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        flag, eq, inline = args[i].partition("=")
        if flag in TORCHRUN_BOOLEAN:
            i += 1
            continue
        value = inline if eq else _at(args, i + 1)
        if flag in wanted:
            launch.flags[wanted[flag]] = value
            launch.spelled[wanted[flag]] = flag
        i += 1 if eq else 2
    return launch


def _at(args: list[str], index: int) -> str:
    return args[index] if index < len(args) else ""
