"""The help as text: ``outrig --help``, ``outrig --help TASK`` and ``outrig --list``, laid
out for a terminal of a given width (pure: :class:`outrig.cli.invoke_program.OutrigProgram` gathers
the flags and prints the lines).

A task's help reads like a finished tool's: ``Usage: outrig deploy [options]``, the task's
docstring as its description (prose wrapped to the width, indented blocks such as examples
kept as written), then one row per option with the name of its value (``--max-parallel N``,
``--host HOST``) and ``(repeatable)`` for a flag that may be given several times. Every flag
of outrig takes its value as a string (numbers are parsed by the task, for a clear error),
so the kind alone would name every value STRING: :data:`VALUE_NAMES` names the values whose
flag name says too little, and any other is the flag's name in capitals (``--run RUN``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from outrig.text.layout import wrapped

VALUE_NAMES = {
    "host": "HOST", "from": "HOST", "to": "HOST", "spare": "HOST",
    "playbook": "NAME", "process": "NAME", "name": "NAME",
    "param": "KEY=VALUE",
    "lines": "N", "max-parallel": "N", "requests": "N", "restarts": "N", "streams": "N",
    "deadline": "SECONDS", "timeout": "SECONDS", "threshold": "SECONDS", "delay": "MS",
    "every": "SECONDS", "template": "NAME",
    "local-port": "PORT", "remote-port": "PORT",
    "project": "DIR", "host-file": "PATH", "checkpoint": "PATH",
    "force-foreign": "PID", "grep": "REGEX", "print-completion-script": "SHELL",
    "help": "TASK", "o": "FILE", "metric": "NAME",
    "model": "PATH", "speculative": "JSON", "prompts": "FILE", "python": "PATH",
    "baseline": "cached|fresh", "sweep-k": "K,K,...", "card": "FILE.md",
    "dataset": "NAME[:CATEGORY]", "dataset-path": "PATH",
}
"""Value names where the generic one (the flag's name in capitals) would say too little."""

KIND_NAMES = {"int": "N", "float": "NUMBER"}

USAGE_TAILS = {"exec": "-- COMMAND [ARG...]", "ssh": "[-- COMMAND [ARG...]]", "release": "BOX"}
"""What follows a task's options on its usage line, for the tasks that take words after --
(and ``release``, whose box is a positional word)."""

INDENT = "  "
BLOCK_INDENT = 4  # how far the docstrings indent their examples
GAP = 2  # spaces between an option and its help
WIDEST_NAME = 24  # an option wider than this has its help start on the line under it


@dataclass(frozen=True)
class Option:
    """One flag as the help shows it (gathered from Invoke's argument by the program)."""

    names: tuple[str, ...]  # as declared: ("host",), ("help", "h")
    help: str = ""
    takes_value: bool = False
    optional: bool = False  # the value may be left out (``--help [TASK]``)
    repeatable: bool = False  # an ``iterable=`` flag
    inverse: bool = False  # a switch that is on by default: ``--[no-]NAME``
    kind: str = "str"

    @property
    def spec(self) -> str:
        """``-h, --help [TASK]``: the short names first, then the long one with its value."""
        short = [f"-{n}" for n in self.names if len(n) == 1]
        long = [n for n in self.names if len(n) > 1]
        flags = short + [f"--[no-]{n}" if self.inverse else f"--{n}" for n in long]
        text = ", ".join(flags)
        if self.takes_value:
            value = value_name(long[0] if long else self.names[0], self.kind)
            text += f" [{value}]" if self.optional else f" {value}"
        return text

    @property
    def text(self) -> str:
        """The help string, and ``(repeatable)`` for a flag that may be given several times
        (unless its help says so already: "(repeat for several)")."""
        text = " ".join(self.help.split())
        said = "(repeat for several" in text
        return f"{text} (repeatable)" if self.repeatable and not said else text


def value_name(flag: str, kind: str = "str") -> str:
    """The name of ``--FLAG``'s value in the help: the table's, else one from its kind, else
    the flag's name in capitals."""
    if flag in VALUE_NAMES:
        return VALUE_NAMES[flag]
    return KIND_NAMES.get(kind, flag.upper().replace("-", "_"))


def option_lines(options: Sequence[Option], width: int) -> list[str]:
    """Each option on its row, its help wrapped in the column beside it (or under it, for
    an option wider than :data:`WIDEST_NAME`)."""
    if not options:
        return [INDENT + "none"]
    column = min(max(len(o.spec) for o in options), WIDEST_NAME) + len(INDENT) + GAP
    out: list[str] = []
    for option in options:
        head = INDENT + option.spec
        if not option.text:
            out.append(head)
            continue
        if len(head) + GAP > column:
            out.append(head)
            out.extend(wrapped(option.text, width, indent=" " * column))
            continue
        out.extend(wrapped(option.text, width, indent=head.ljust(column),
                           later=" " * column))
    return out


def _inline(text: str) -> str:
    """A docstring's reST literals (````interrupted/````) as a terminal shows code."""
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def _block_line(line: str, width: int) -> list[str]:
    """A line of an indented block (an example command) two columns in, as the options are.
    One still too wide goes on before one of its flags (a flag stays with its value), the
    continuation four columns further in, as one would write the command by hand."""
    body = line.lstrip()
    lead = INDENT + " " * max(len(line) - len(body) - BLOCK_INDENT, 0)
    if len(lead) + len(body) <= width:
        return [lead + body]
    groups: list[str] = []
    for word in body.split(" "):
        if groups and not (word.startswith("-") and len(word) > 1):
            groups[-1] += " " + word
        else:
            groups.append(word)
    out = [lead + groups[0]]
    for group in groups[1:]:
        if len(out[-1]) + 1 + len(group) <= width:
            out[-1] += " " + group
        else:
            out.append(lead + "    " + group)
    return out


def description_lines(doc: str, width: int) -> list[str]:
    """A docstring as the help's description: its prose paragraphs wrapped to ``width``,
    its indented lines (examples, commands) and the lines that open them (``Examples:``)
    kept as written, two columns in (:func:`_block_line`)."""
    out: list[str] = []
    prose: list[str] = []

    def flush() -> None:
        if prose:
            out.extend(wrapped(" ".join(prose), width, indent=""))
            prose.clear()

    lines = _inline(doc).strip("\n").splitlines()
    for number, line in enumerate(lines):
        following = lines[number + 1] if number + 1 < len(lines) else ""
        if not line.strip():
            flush()
            out.append("")
        elif line[:1].isspace():
            flush()
            out.extend(_block_line(line.rstrip(), width))
        elif line.rstrip().endswith(":") and following[:1].isspace():
            flush()
            out.append(line.rstrip())  # "Examples:" over its indented block
        else:
            prose.append(line.strip())
    flush()
    return out


def task_help_lines(binary: str, task: str, doc: str, options: Sequence[Option],
                    width: int) -> list[str]:
    """``outrig --help TASK``."""
    usage = f"Usage: {binary} {task} [options]"
    if task in USAGE_TAILS:
        usage += " " + USAGE_TAILS[task]
    lines = [usage, ""]
    if doc.strip():
        lines += [*description_lines(doc, width), ""]
    lines += ["Options:", *option_lines(options, width), ""]
    return lines


def task_list_lines(tasks: Sequence[tuple[str, str]], width: int,
                    heading: str = "Tasks:") -> list[str]:
    """The tasks, each with its one-line summary wrapped beside it."""
    column = max((len(name) for name, _ in tasks), default=0) + len(INDENT) + GAP
    out = [heading]
    for name, summary in tasks:
        out.extend(wrapped(summary or "", width, indent=(INDENT + name).ljust(column),
                           later=" " * column))
    return out


def core_help_lines(binary: str, summary: str, options: Sequence[Option],
                    tasks: Sequence[tuple[str, str]], width: int) -> list[str]:
    """``outrig --help`` (and ``outrig`` alone): the program's own options and its tasks."""
    lines = [f"Usage: {binary} TASK [options]",
             f"       {binary} --help TASK | --list | --version", ""]
    if summary:
        lines += [*wrapped(summary, width, indent=""), ""]
    lines += ["Options:", *option_lines(options, width), ""]
    lines += [*task_list_lines(tasks, width), ""]
    lines += wrapped(f"`{binary} --help TASK` describes a task and its options; docs/cli.md "
                     "is the reference.", width, indent="")
    return lines
