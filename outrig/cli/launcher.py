"""The installed ``outrig`` command's first step: ``outrig --version``, ``outrig --list`` and
``outrig --help`` (and ``outrig`` alone) are answered here, before Invoke is imported; a
plain command line (``outrig status --host box``: a task and its long flags, no Invoke
config file; :mod:`outrig.cli.plainargs`) runs its task here too, without Invoke; any other
command line goes to the Invoke program (:mod:`outrig.cli.invoke_program`).

Why: Invoke takes about 0.1 s to import (it imports ``unittest.mock``, and with it asyncio,
and its YAML loader), most of a start-up that should take a blink. The answers are made from
what the Invoke program's are made from, so they cannot go stale: the task table
(:data:`outrig.cli.TASKS`, whose modules import no Invoke, :mod:`outrig.cli.taskspec`), the
options below (:func:`outrig.cli.invoke_program.core_arguments` builds Invoke's from them) and the
same layout (:mod:`outrig.cli.helptext`). tests/unit/test_startup.py compares both programs' output.

It also keeps the command line as typed, for the words after ``--`` (:func:`remainder_argv`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Protocol

from outrig import __version__
from outrig.cli.helptext import Option, core_help_lines, task_list_lines
from outrig.cli.plainargs import PlainCall, PlainConfig, PlainContext, plain_call
from outrig.cli.taskspec import TaskSpec
from outrig.errors import CLOSED_PIPE_EXIT
from outrig.text.terminal import terminal_width

SUMMARY = ("Drive rented GPU boxes over SSH: deploy a job's processes, watch them, read "
           "their logs, move them to another box and clean up exactly what was started.")

CORE_OPTIONS = (
    Option(names=("complete",), kind="bool",
           help="print completion candidates for the words after -- (what the "
                "completion scripts call)"),
    Option(names=("help", "h"), takes_value=True, optional=True,
           help="show this help, or with a task name that task's description and options"),
    Option(names=("list", "l"), kind="bool", help="list the tasks, each with what it does"),
    Option(names=("print-completion-script",), takes_value=True,
           help="print the completion script for bash, zsh or fish (docs/cli.md, "
                "\"Shell completion\")"),
    Option(names=("version", "V"), kind="bool", help="print outrig's version"),
)
"""outrig's own options, in the order the help lists them (Invoke's Program would add its
shell-runner ones; outrig refuses those as unknown flags)."""

ANSWERS = {"--version": "version", "-V": "version", "--list": "list", "-l": "list",
           "--help": "help", "-h": "help"}
"""The command lines answered here: one of these words alone (or no word: the help)."""

_TYPED: list[str] | None = None


def keep_typed(words: Sequence[str]) -> None:
    """Keep the command line as typed, for :func:`remainder_argv`."""
    global _TYPED
    _TYPED = list(words)


def remainder_argv() -> list[str]:
    """The words after ``--`` exactly as typed (Invoke's parser joins them into one string,
    which would lose quoting): as the program kept them, else this process's argv."""
    argv = _TYPED if _TYPED is not None else sys.argv
    return list(argv[argv.index("--") + 1:]) if "--" in argv else []


def summaries(tasks: Sequence[TaskSpec]) -> list[tuple[str, str]]:
    """Each task's name and the first line of its docstring, by name."""
    return sorted((spec.name, spec.summary) for spec in tasks)


def help_lines(binary: str, tasks: Sequence[tuple[str, str]], width: int) -> list[str]:
    """``outrig --help``: the program's options and its tasks."""
    options = sorted(CORE_OPTIONS, key=lambda o: o.names[0])
    return core_help_lines(binary, SUMMARY, options, tasks, width)


def list_lines(tasks: Sequence[tuple[str, str]], width: int) -> list[str]:
    """``outrig --list``."""
    return task_list_lines(tasks, width)


def end_on_closed_pipe() -> None:
    """A reader that went away early (``outrig --list | head -1``): end quietly with status
    141 (128 + SIGPIPE, as a shell reports it) instead of a traceback. Python's own advice:
    point stdout at /dev/null so that the flush at exit cannot raise a second time
    (docs.python.org, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(CLOSED_PIPE_EXIT)


def run_plain(call: PlainCall, exit: bool = True) -> None:
    """Call a plain command line's task (:mod:`outrig.cli.plainargs`) the way Invoke's program
    would have: an ``Exit`` the task raises prints its message, if any, and exits with its
    code; Ctrl-C outside the task's own handling exits 1; a reader that went away early ends
    quietly (:func:`end_on_closed_pipe`)."""
    try:
        call.task(PlainContext(PlainConfig()), **call.kwargs)
    except BrokenPipeError:
        end_on_closed_pipe()
    except KeyboardInterrupt:
        sys.exit(1)
    except Exception as exc:
        # outrig's tasks raise Invoke's Exit (outrig.cli.flags.exit_with), which imports
        # Invoke's exceptions: if they were never imported, this is no Exit
        exceptions = sys.modules.get("invoke.exceptions")
        if exceptions is None or not isinstance(exc, exceptions.Exit):
            raise
        if exc.message:
            print(exc.message, file=sys.stderr)
        if exit:
            sys.exit(exc.code)


class Runs(Protocol):
    """The Invoke program, as far as the launcher uses it."""

    def run(self, argv: list[str] | None = None, exit: bool = True) -> None: ...


class Launcher:
    """``outrig``: answers ``--version``, ``--list`` and ``--help`` from ``tasks``; any other
    command line is run by the program ``make_program`` returns (made, and Invoke imported,
    only then)."""

    def __init__(self, tasks: Sequence[TaskSpec], make_program: Callable[[], Runs],
                 binary: str = "outrig", version: str = __version__, *,
                 plain: bool = True) -> None:
        self.tasks = tuple(tasks)
        self.make_program = make_program
        self.binary = binary
        self.version = version
        self.plain = plain

    def answer(self, words: Sequence[str]) -> list[str] | None:
        """The lines ``outrig WORDS`` prints when it is answered here, else None."""
        if len(words) > 1:
            return None
        wanted = ANSWERS.get(words[0]) if words else "help"
        if wanted == "version":
            return [f"{self.binary} {self.version}"]
        if wanted == "list":
            return list_lines(summaries(self.tasks), terminal_width(sys.stdout))
        if wanted == "help":
            return help_lines(self.binary, summaries(self.tasks), terminal_width(sys.stdout))
        return None

    def run(self, argv: list[str] | None = None, exit: bool = True) -> None:
        """Run ``outrig`` on ``argv`` (this process's when None; the first word is the
        program's name), exiting with its status as Invoke's Program does."""
        words = list(sys.argv if argv is None else argv)
        lines = self.answer(words[1:])
        if lines is None:
            call = plain_call(self.tasks, words[1:]) if self.plain else None
            if call is None:
                self.make_program().run(argv, exit)
            else:
                keep_typed(words)
                run_plain(call, exit)
            return
        try:
            print("\n".join(lines))
            sys.stdout.flush()
        except BrokenPipeError:
            end_on_closed_pipe()
        if exit:
            sys.exit(0)
