"""The ``outrig`` program: Invoke's :class:`~invoke.program.Program` (as Fabric builds ``fab``)
with outrig's config name, the words after ``--`` kept as typed, Invoke's parse errors as one
paragraph with exit status 2, and completion of host and playbook names."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from invoke.config import Config, merge_dicts
from invoke.exceptions import Exit, ParseError
from invoke.parser.argument import Argument
from invoke.parser.context import ParserContext, translate_underscores
from invoke.parser.parser import Parser
from invoke.program import Program

from outrig.errors import CLOSED_PIPE_EXIT
from outrig.settings import SETTINGS, find_project

_REMAINDER: list[str] | None = None


def remainder_argv() -> list[str]:
    """The words after ``--`` exactly as typed (Invoke's parser joins them into one string,
    which would lose quoting): from :class:`OutrigProgram`, else this process's argv."""
    argv = _REMAINDER if _REMAINDER is not None else sys.argv
    return list(argv[argv.index("--") + 1:]) if "--" in argv else []


class OutrigConfig(Config):
    """Invoke's config with outrig's name: ``~/.outrig.yaml``, ``/etc/outrig.yaml`` and
    ``OUTRIG_*`` variables (for the keys in :data:`SETTINGS`)."""

    prefix = "outrig"

    @staticmethod
    def global_defaults() -> dict[str, Any]:
        defaults: dict[str, Any] = merge_dicts(Config.global_defaults(),
                                               dict.fromkeys(SETTINGS))
        return defaults


class OutrigProgram(Program):
    """``outrig``: Invoke's Program with the outrig collection, keeping the words after
    ``--`` as typed, and turning Invoke's parse errors into exit status 2 with the fix."""

    def run(self, argv: list[str] | None = None, exit: bool = True) -> None:
        """Invoke's run; a reader that goes away early (``outrig --help deploy | head``,
        ``outrig tail-logs ... | head``) ends the output quietly with status 141 (128 +
        SIGPIPE, as a shell reports it) instead of a traceback."""
        try:
            super().run(argv, exit)
        except BrokenPipeError:
            # Python's own advice: point stdout at /dev/null so the flush at exit cannot
            # raise a second time (docs.python.org, "Note on SIGPIPE").
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(CLOSED_PIPE_EXIT)

    def parse_core(self, argv: list[str] | None) -> None:
        global _REMAINDER
        words = list(sys.argv if argv is None else argv)
        _REMAINDER = words if "--" in words else []
        try:
            super().parse_core(argv)
        except ParseError as exc:
            raise Exit(parse_error_message(exc, self.binary_names[0]), code=2) from None

    def parse_cleanup(self) -> None:
        """``--complete`` (the shell completion scripts' call) also completes the values of
        --host (and --from, --to) and --playbook from the project; Invoke completes flags
        and task names."""
        if self.args.complete.value:
            names = value_candidates(self.core.remainder)
            if names is not None:
                print("\n".join(names))
                raise Exit
        super().parse_cleanup()

    def parse_tasks(self) -> None:
        missing = missing_value(self.core.unparsed, self._make_parser())
        if missing is not None:
            raise Exit(parse_error_message(missing, self.binary_names[0]), code=2)
        try:
            super().parse_tasks()
        except ParseError as exc:
            raise Exit(parse_error_message(exc, self.binary_names[0]), code=2) from None
        except ValueError as exc:  # a typed flag given a value of the wrong type
            raise Exit(f"error: {exc}; see `outrig --help TASK` for the flag's type", code=2) \
                from None


def missing_value(argv: list[str], parser: Parser) -> ParseError | None:
    """The first flag in ``argv`` that takes a value and was given none, as Invoke words it.

    Invoke refuses ``--lines`` at the end of a command line, but a repeatable flag
    (``iterable=``: ``--host``, ``--param``, ``--spare``) given without its value is taken as
    given no times, so ``outrig deploy --host`` would deploy to the configured host. This walks
    the words the way Invoke's parser does (a task name opens its flags; the word after a
    flag that takes a value is that value unless it is one of the task's flags) before it
    parses them, for every flag of every task alike."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    context: ParserContext | None = parser.initial
    waiting: Argument | None = None
    for word in words:
        flags = context.flags if context is not None else {}
        if waiting is not None:
            if word in flags or (context is not None and word in context.inverse_flags):
                break  # the next flag came where the value should be
            waiting = None
            continue
        if word in flags:
            flag = flags[word]
            if flag.takes_value and not flag.optional:
                waiting = flag
        elif word in parser.contexts:
            context = parser.contexts[word]
    if waiting is None:
        return None
    return ParseError(f"Flag {waiting!r} needed value and was not given one!", context)


VALUE_FLAGS = {"--host": "hosts", "--from": "hosts", "--to": "hosts",
               "--playbook": "playbooks"}


def value_candidates(invocation: str) -> list[str] | None:
    """Names for the flag being completed in ``invocation`` (``outrig deploy --host`` or
    ``outrig deploy --host uk``), or None when the word is not such a flag's value."""
    import shlex

    try:
        words = shlex.split(invocation)
    except ValueError:
        return None
    flag = next((w for w in words[-2:][::-1] if w in VALUE_FLAGS), None)
    if flag is None or (words[-1] != flag and (words[-2:-1] != [flag]
                                               or words[-1].startswith("-"))):
        return None
    root: Path | None = None
    if "--project" in words[:-1]:
        root = Path(words[words.index("--project") + 1]).expanduser()
    elif os.environ.get("OUTRIG_PROJECT"):
        root = Path(os.environ["OUTRIG_PROJECT"]).expanduser()
    else:
        root = find_project(Path.cwd())
    folder = (root or Path.cwd()) / VALUE_FLAGS[flag]
    if VALUE_FLAGS[flag] == "hosts":
        from outrig.inventory import host_files

        return host_files(folder)  # hosts/groups.yaml is not a host
    return sorted(p.stem for p in folder.glob("*.y*ml")) if folder.is_dir() else []


def parse_error_message(exc: ParseError, binary: str) -> str:
    """One paragraph: Invoke's complaint, which task it concerns, and how to see the flags."""
    context = getattr(exc, "context", None)
    name = getattr(context, "name", None)
    # Invoke names a flag by its repr ("<Argument: host>"); say it as typed: --host
    text = re.sub(r"<Argument: ([^,()> ]+)[^>]*>",
                  lambda m: "--" + translate_underscores(m.group(1)), str(exc)).rstrip(".!")
    if name in ("exec", "ssh") and text.startswith("No idea what"):
        fix = f"the command goes after --, e.g. `{binary} {name} --host NAME -- nvidia-smi`"
    elif name:
        fix = f"see `{binary} --help {name}` for its flags"
    else:
        fix = f"see `{binary} --list` for the tasks and `{binary} --help TASK` for their flags"
    return f"error: {text}; {fix}. Nothing was run."
