"""Plain command lines run without Invoke: ``outrig status --host box --json`` parsed here,
from the task's own signature, and its task called with a context that holds what Invoke's
config would.

Why: a warm command through a live keeper costs one round trip on the link, and importing
Invoke (with ``unittest.mock``, asyncio and its own copy of PyYAML) costs about a fifth of a
round trip more on every start. Invoke stays the parser of anything that is not plain:
:func:`plain_call` answers None for a command line it does not read exactly as Invoke would,
and the launcher then hands it to the Invoke program unchanged. What is plain:

* the first word is a task's name, every other word a long flag of that task, ``--flag
  VALUE`` or ``--flag=VALUE`` for one that takes a value, ``--flag`` alone for a switch (a
  bool that defaults to False);
* a flag that takes one value is given once; a repeatable one (``iterable=``) any number of
  times;
* no ``--help``/``-h``, no short flag, no ``--``, no second task, no value that starts with
  ``-`` (Invoke would read it as a flag), no empty value;
* no Invoke configuration file exists (``/etc/outrig.*``, ``~/.outrig.*``): with none, what
  Invoke's config holds for outrig's keys is the ``OUTRIG_*`` variables alone
  (:class:`PlainConfig`).

tests/unit/test_plainargs.py parses each task's command lines both ways and compares.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outrig.cli.taskspec import TaskSpec
from outrig.formats.project_file import SETTINGS

CONFIG_SUFFIXES = ("yaml", "yml", "json", "py")
"""The suffixes Invoke's config looks for (invoke/config.py, ``_file_suffixes``)."""


def config_files(prefix: str = "outrig") -> list[Path]:
    """Invoke's system and user configuration files for ``prefix``
    (``/etc/outrig.yaml`` ... ``~/.outrig.py``; invoke/config.py, ``load_system`` and
    ``load_user``), whether they exist or not."""
    return [Path(f"{base}{prefix}.{suffix}").expanduser()
            for base in ("/etc/", "~/.") for suffix in CONFIG_SUFFIXES]


class PlainConfig:
    """What Invoke's merged config holds for outrig when no configuration file exists: the
    keys of :data:`~outrig.cli.settings.SETTINGS` from their ``OUTRIG_*`` variables (Invoke's
    env loader sets the keys its defaults name, as text), else None; any other key None."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.values = {key: env.get(f"OUTRIG_{key.upper()}") for key in SETTINGS}

    def get(self, key: str, default: Any = None) -> Any:
        value = self.values.get(key)
        return default if value is None else value


@dataclass(frozen=True)
class PlainContext:
    """The context a task gets here in place of Invoke's: outrig's tasks read only its
    ``config`` (:func:`outrig.cli.settings.settings_for`)."""

    config: PlainConfig


@dataclass(frozen=True)
class PlainCall:
    """One task and the keyword arguments Invoke would call it with."""

    task: TaskSpec
    kwargs: dict[str, Any]


def _signature(spec: TaskSpec) -> tuple[dict[str, tuple[str, str]], dict[str, Any]] | None:
    """The task's flags, ``--flag`` → (parameter, kind ``switch``, ``value`` or ``list``), and
    the keyword arguments Invoke passes when none is given (each parameter's default; ``[]``
    for a repeatable one), from one reading of its signature; None when a parameter is of a
    kind this parser leaves to Invoke (no default, so positional; a bool that defaults to
    True; a number)."""
    if spec.options.get("positional") or spec.options.get("optional") or \
            spec.options.get("auto_shortflags", True):
        return None
    iterable = set(spec.options.get("iterable") or ())
    flags: dict[str, tuple[str, str]] = {}
    defaults: dict[str, Any] = {}
    for name, param in list(inspect.signature(spec.body).parameters.items())[1:]:
        default = param.default
        if name in iterable:
            kind, default = "list", []
        elif default is False:
            kind = "switch"
        elif default is None or isinstance(default, str):
            kind = "value"
        else:
            return None
        defaults[name] = default
        word = name.strip("_").replace("_", "-")
        if len(word) > 1:  # a one-letter name is Invoke's short flag (-o): left to Invoke
            flags["--" + word] = (name, kind)
    return flags, defaults


def plain_call(tasks: Sequence[TaskSpec], words: Sequence[str],
               config_paths: Sequence[Path] | None = None) -> PlainCall | None:
    """The call ``outrig WORDS`` makes, when the command line is plain (the module's rules);
    None for anything Invoke must parse. (``--help`` and ``--`` are no task's flag.) The
    command line is read first, the configuration files looked for last."""
    spec = next((t for t in tasks if t.name == words[0]), None) if words else None
    signature = _signature(spec) if spec is not None else None
    if spec is None or signature is None:
        return None
    flags, kwargs = signature
    given: set[str] = set()
    rest = list(words[1:])
    while rest:
        word = rest.pop(0)
        flag, eq, value = word.partition("=")
        if flag not in flags:
            return None
        name, kind = flags[flag]
        if kind == "switch":
            if eq or name in given:
                return None
            kwargs[name] = True
        else:
            if not eq:
                if not rest:
                    return None
                value = rest.pop(0)
            if not value or value.startswith("-"):
                return None
            if kind == "list":
                kwargs[name].append(value)
            elif name in given:
                return None
            else:
                kwargs[name] = value
        given.add(name)
    paths = config_files() if config_paths is None else config_paths
    if any(path.exists() for path in paths):
        return None
    return PlainCall(spec, kwargs)
