"""The ``outrig`` program: Invoke's :class:`~invoke.program.Program` (as Fabric builds ``fab``)
with outrig's config name, the words after ``--`` kept as typed, Invoke's parse errors as one
paragraph with exit status 2, completion of host and playbook names, and outrig's own help.

Fabric's ``fab`` is a Program subclass that overrides :meth:`~invoke.program.Program.
core_args`; so is this one, but where ``fab`` adds options, ``outrig`` keeps only the ones
that mean something for it (``--help``, ``--list``, ``--version``, ``--complete``,
``--print-completion-script``). Invoke's shell-runner options (``--echo``, ``--pty``,
``--hide``, ``--dry``, ``--warn-only``, ``--command-timeout``, ``--prompt-for-sudo-password``,
``--config``, ``--write-pyc``, ``--debug``) and its task-tree listing options
(``--list-depth``, ``--list-format``) are gone, so they are refused as unknown flags; the
Program methods that read them (:meth:`parse_core`, :meth:`parse_cleanup`,
:meth:`update_config`) are overridden to match. The help itself is laid out by
:mod:`outrig.cli.helptext`.

Imported by every command that is not answered before Invoke (``outrig --version``,
``--list`` and ``--help`` are: :mod:`outrig.cli.launcher`, which holds outrig's own options, the
summary and the help's wording, so that both programs print the same). It imports Invoke,
:mod:`outrig.cli.settings` (light), the text layout and nothing of the ops;
:func:`value_candidates` imports the inventory only when completing, purely for start-up.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from invoke.collection import Collection
from invoke.completion.complete import complete, print_completion_script
from invoke.config import Config, merge_dicts
from invoke.exceptions import Exit, ParseError
from invoke.parser.argument import Argument
from invoke.parser.context import ParserContext, translate_underscores
from invoke.parser.parser import Parser
from invoke.program import Program
from invoke.tasks import Task
from invoke.util import helpline

from outrig.cli.helptext import Option, task_help_lines
from outrig.cli.launcher import CORE_OPTIONS, end_on_closed_pipe, help_lines, keep_typed, list_lines
from outrig.cli.taskspec import TaskSpec
from outrig.errors import closest, did_you_mean
from outrig.formats.project_file import SETTINGS, find_project
from outrig.text.layout import paragraph
from outrig.text.terminal import terminal_width, wrap_width


class OutrigConfig(Config):
    """Invoke's config with outrig's name: ``~/.outrig.yaml``, ``/etc/outrig.yaml`` and
    ``OUTRIG_*`` variables (for the keys in :data:`SETTINGS`)."""

    prefix = "outrig"

    @staticmethod
    def global_defaults() -> dict[str, Any]:
        defaults: dict[str, Any] = merge_dicts(Config.global_defaults(),
                                               dict.fromkeys(SETTINGS))
        return defaults


def core_arguments() -> list[Argument]:
    """outrig's own options (:data:`outrig.cli.launcher.CORE_OPTIONS`) as Invoke's arguments: a
    switch is a bool that defaults to False, any other takes a string."""
    return [Argument(names=o.names, kind=bool, default=False, help=o.help)
            if o.kind == "bool" else
            Argument(names=o.names, kind=str, default=None if o.optional else "",
                     optional=o.optional, help=o.help)
            for o in CORE_OPTIONS]


def collection(tasks: Sequence[TaskSpec], default_project: Path | None = None) -> Collection:
    """Invoke's collection of ``tasks``, each under the name its spec gives;
    ``default_project`` is the project used when none is found upward from the current
    folder (``tasks.py`` passes its checkout)."""
    made = Collection()
    for spec in tasks:
        made.add_task(Task(spec.body, **spec.options), name=spec.name)
    made.configure({"project": str(default_project) if default_project else None})
    keep_help(made)  # before any parser takes the help texts out of the tasks
    return made


def keep_help(collection: Any) -> None:
    """Give every task of ``collection`` its flags' help texts back.

    Invoke takes each help text out of its task (``Task.help.pop``) when it builds a parser
    for it, so every parser after the first (:func:`missing_value`'s, then the one
    ``--help TASK`` reads) had none: the first call keeps a copy on the task, and every call
    puts that copy back. :func:`collection` calls it before any parser is built."""
    for task in collection.tasks.values():
        kept = task.__dict__.setdefault("_outrig_help", dict(task.help))
        task.help = dict(kept)
    for sub in collection.collections.values():
        keep_help(sub)


def option(argument: Argument) -> Option:
    """Invoke's argument as the help shows it."""
    inverse = argument.kind is bool and argument.default is True
    return Option(names=tuple(argument.names), help=argument.help or "",
                  takes_value=bool(argument.takes_value), optional=bool(argument.optional),
                  repeatable=argument.kind is list, inverse=inverse,
                  kind=getattr(argument.kind, "__name__", "str"))


def refusal(text: str) -> Exit:
    """An exit-2 refusal whose one paragraph is wrapped to the terminal (stderr's)."""
    return Exit(paragraph(text, wrap_width(sys.stderr)), code=2)


class OutrigProgram(Program):
    """``outrig``: Invoke's Program with the outrig collection and outrig's own options and
    help, keeping the words after ``--`` as typed, and turning Invoke's parse errors into
    exit status 2 with the fix."""

    def core_args(self) -> list[Argument]:
        return core_arguments()

    def _make_parser(self) -> Parser:
        keep_help(self.collection)
        return super()._make_parser()

    def _tasks_parser(self) -> Parser | None:
        """The tasks' parser before the tasks were parsed (a core flag Invoke did not know,
        ``outrig --hots``: the closest of the tasks' flags is what was meant); None where
        the collection is not there yet."""
        if self.namespace is None:
            return None
        self.collection = self.namespace
        return self._make_parser()

    def run(self, argv: list[str] | None = None, exit: bool = True) -> None:
        """Invoke's run; a reader that goes away early (``outrig --help deploy | head``,
        ``outrig tail-logs ... | head``) ends the output quietly with status 141 (128 +
        SIGPIPE, as a shell reports it) instead of a traceback."""
        try:
            super().run(argv, exit)
        except BrokenPipeError:
            end_on_closed_pipe()

    def parse_core(self, argv: list[str] | None) -> None:
        """Invoke's, for outrig's options: ``--version`` and ``--print-completion-script``
        answer here, before the tasks are looked at. (Invoke's also read ``--debug`` and
        ``--write-pyc``; outrig has neither. Invoke then turns bytecode writing off, so that
        a project's ``tasks.py`` leaves no ``__pycache__`` behind; outrig loads no tasks
        file, and leaves Python's default: with it off, every module a task imports when it
        runs (the console, the ops, the transports) was compiled from source on every
        command where outrig is installed from source, about 0.4 s of a warm ``status``.)"""
        keep_typed(sys.argv if argv is None else argv)
        self.normalize_argv(argv)
        try:
            self.parse_core_args()
        except ParseError as exc:
            raise refusal(parse_error_message(exc, self.binary_names[0],
                                              self._tasks_parser())) from None
        if self.args.version.value:
            self.print_version()
            raise Exit
        if self.args["print-completion-script"].value:
            print_completion_script(shell=self.args["print-completion-script"].value,
                                    names=self.binary_names)
            raise Exit

    def parse_cleanup(self) -> None:
        """Invoke's, for outrig's options: ``--help [TASK]``, ``--list``, ``--complete``, else
        the help when no task was named. ``--complete`` (the shell completion scripts' call)
        also completes the values of --host (and --from, --to) and --playbook from the
        project; Invoke completes flags and task names."""
        binary = self.binary_names[0]
        if self.args.complete.value:
            names = value_candidates(self.core.remainder)
            if names is not None:
                print("\n".join(names))
                raise Exit
        wanted = self.args.help.value
        if wanted is True:
            self.print_help()
            raise Exit
        if wanted:
            if wanted not in self.parser.contexts:
                hint = did_you_mean(wanted, self.parser.contexts)
                raise refusal(f"error: no task is named {wanted!r}.{hint} See `{binary} "
                              "--list` for the tasks. Nothing was run.")
            self.print_task_help(wanted)
            raise Exit
        if self.args.list.value:
            self.list_tasks()
            raise Exit
        if self.args.version.value:  # after a task (`plan -V`), as --help and -l are there
            self.print_version()
            raise Exit
        if self.args.complete.value:
            complete(names=self.binary_names, core=self.core,
                     initial_context=self.initial_context, collection=self.collection,
                     parser=self._make_parser())
        if not self.tasks and not self.collection.default:
            self.no_tasks_given()

    def update_config(self, merge: bool = True) -> None:
        """Invoke's merges what its shell-runner flags and ``--config`` file said; outrig has
        neither, so only the merge is left."""
        if merge:
            self.config.merge()

    def parse_tasks(self) -> None:
        parser = self._make_parser()
        missing = missing_value(self.core.unparsed, parser)
        if missing is not None:
            raise refusal(parse_error_message(missing, self.binary_names[0], parser))
        twice = given_twice(self.core.unparsed, parser)
        if twice is not None:
            raise refusal(twice)
        try:
            super().parse_tasks()
        except ParseError as exc:
            raise refusal(parse_error_message(exc, self.binary_names[0], parser)) from None
        except ValueError as exc:  # a typed flag given a value of the wrong type
            raise refusal(f"error: {exc}; see `outrig --help TASK` for the flag's type") \
                from None
        if len(self.tasks) > 1:  # Invoke would run each in turn: `runs ... cleanup ...`
            names = " and ".join(f"`{task.name}`" for task in self.tasks)
            raise refusal(f"error: {names} are {len(self.tasks)} tasks on one command line; "
                          f"{self.binary_names[0]} runs one task per command: run them one "
                          "after the other. Nothing was run.")

    # --- the help (laid out by outrig.cli.helptext) ----------------------------------------
    def task_summaries(self) -> list[tuple[str, str]]:
        """Each task's name and the first line of its docstring."""
        return [(name, helpline(task) or "")
                for name, task in sorted(self.collection.tasks.items())]

    def print_help(self) -> None:
        print("\n".join(help_lines(self.binary_names[0], self.task_summaries(),
                                   terminal_width(sys.stdout))))

    def print_task_help(self, name: str) -> None:
        context = self.parser.contexts[name]
        options = [option(a) for a in context.args.values()]
        doc = inspect.getdoc(self.collection[name]) or ""
        print("\n".join(task_help_lines(self.binary_names[0], name, doc, options,
                                        terminal_width(sys.stdout))))

    def list_tasks(self) -> None:
        print("\n".join(list_lines(self.task_summaries(), terminal_width(sys.stdout))))


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


def given_twice(argv: list[str], parser: Parser) -> str | None:
    """The refusal for a flag that takes one value and was given two (``--playbook a
    --playbook b``: Invoke said "No idea what 'b' is"), else None. The words are walked as
    :func:`missing_value` walks them; a repeatable flag may come any number of times."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    context: ParserContext | None = parser.initial
    seen: dict[str, str] = {}
    pending: Argument | None = None
    for word in words:
        flags = context.flags if context is not None else {}
        if pending is not None and word not in flags:
            refused = _second_value(seen, pending, word)
            if refused is not None:
                return refused
            pending = None
            continue
        pending = None
        name, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
        flag = flags.get(name)
        if flag is not None and flag.takes_value and not flag.optional:
            if not eq:
                pending = flag
                continue
            refused = _second_value(seen, flag, value)
            if refused is not None:
                return refused
        elif word in parser.contexts:
            context, seen = parser.contexts[word], {}
    return None


def _second_value(seen: dict[str, str], flag: Argument, value: str) -> str | None:
    """Note ``flag``'s value; the refusal when it already had one (and takes one only)."""
    name = str(flag.name)
    if flag.kind is list:
        return None
    if name not in seen:
        seen[name] = value
        return None
    typed = ("--" if len(name) > 1 else "-") + translate_underscores(name)
    return (f"error: {typed} given twice ({seen[name]!r} and {value!r}); give it once. "
            "Nothing was run.")


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


def parse_error_message(exc: ParseError, binary: str, parser: Parser | None = None) -> str:
    """One paragraph: Invoke's complaint, which task it concerns, the closest task or flag
    to a word it did not know (``parser``: the tasks' parser), and how to see the flags."""
    context = getattr(exc, "context", None)
    name = getattr(context, "name", None)
    # Invoke names a flag by its repr ("<Argument: host>"); say it as typed: --host, -o
    text = re.sub(r"<Argument: ([^,()> ]+)[^>]*>",
                  lambda m: ("-" if len(m.group(1)) == 1 else "--")
                  + translate_underscores(m.group(1)), str(exc)).rstrip(".!")
    unknown = re.match(r"No idea what '(.*)' is$", text)
    if unknown and parser is not None:
        text += _meant(unknown.group(1), context, parser)
    if name in ("exec", "ssh") and text.startswith("No idea what"):
        fix = f"the command goes after --, e.g. `{binary} {name} --host NAME -- nvidia-smi`"
    elif name:
        fix = f"see `{binary} --help {name}` for its flags"
    else:
        fix = f"see `{binary} --list` for the tasks and `{binary} --help TASK` for their flags"
    return f"error: {text}; {fix}. Nothing was run."


def _meant(word: str, context: ParserContext | None, parser: Parser) -> str:
    """`` (did you mean 'X'?)``: a flag of the task for a word that looks like a flag, else a
    task name; "" when nothing is close."""
    if word.startswith("-"):
        where = context if context is not None else parser.initial
        flags = where.flags if where is not None else {}
        inverse = where.inverse_flags if where is not None else {}
        known = [f for f in [*flags, *inverse] if f.startswith("--")]
        typed = word.partition("=")[0]
        if getattr(context, "name", None) is None and not closest(typed, known):
            # no task given: the flag may be a task's (`outrig --hots`), which goes after it
            tasks = sorted(n for n, c in parser.contexts.items()
                           if any(closest(typed, [f]) for f in c.flags))
            name = closest(typed, sorted({f for n in tasks for f in parser.contexts[n].flags
                                          if f.startswith("--")}))
            if name:
                users = [n for n in tasks if name in parser.contexts[n].flags]
                task = "status" if "status" in users else users[0]
                return (f" (did you mean {name!r}? It is a task's flag and goes after the"
                        f" task: `outrig {task} {name} ...`)")
    else:
        known, typed = list(parser.contexts), word
    name = closest(typed, known)
    return f" (did you mean {name!r}?)" if name else ""
