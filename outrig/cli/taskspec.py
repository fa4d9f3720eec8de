"""A task as its module declares it: the function and the keywords of Invoke's ``@task``,
held until Invoke is needed.

``outrig --list`` and ``outrig --help`` answer from the tasks' names and docstrings before
Invoke is imported (:mod:`outrig.cli.launcher`; Invoke alone takes about 0.1 s to import), so the
task modules of :mod:`outrig.cli` must be importable without it; Invoke's own
``@task`` imports all of Invoke. ``@task`` here keeps what Invoke's would be given, and
:func:`outrig.cli.invoke_program.collection` makes Invoke's tasks from it when a command is parsed.
The name is decided here, once: the collection is built with it, and the listing shows it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


class InvokeConfig(Protocol):
    """Invoke's merged configuration as outrig reads it: a value by its key, or the default."""

    def get(self, key: str, default: Any = None, /) -> Any: ...


class TaskContext(Protocol):
    """What a task takes from the context Invoke passes it first: the merged configuration
    (the user's and the system's invoke.yaml, the collection's defaults), where outrig looks
    for a setting no flag, variable or project file gave (:mod:`outrig.cli.settings`).
    Nothing else of Invoke's ``Context`` (``run``, ``sudo``, ``cd``) is used: a task reaches
    a box only through outrig's sessions, never through a local shell, and tests call tasks
    with any object that has a ``config``."""

    @property
    def config(self) -> InvokeConfig: ...


@dataclass(frozen=True)
class TaskSpec:
    """One task: its function and the keywords Invoke's ``@task`` takes (``help=``,
    ``iterable=``, ``auto_shortflags=``, ``name=``...). Calling it calls the function, as
    calling Invoke's task does."""

    body: Callable[..., Any]
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The command's name: ``name=`` when given, else the function's name with its
        inner underscores as dashes (``sandbox_up`` is ``sandbox-up``), Invoke's rule."""
        given = self.options.get("name")
        if given:
            return str(given)
        word = self.body.__name__
        inner = word.strip("_").replace("_", "-")
        start = len(word) - len(word.lstrip("_"))
        return word[:start] + inner + word[start + len(inner):]

    @property
    def summary(self) -> str:
        """The first line of the docstring (what Invoke's listing shows), else ``""``."""
        doc = self.body.__doc__ or ""
        return doc.lstrip().splitlines()[0] if doc.strip() else ""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.body(*args, **kwargs)


def task(**options: Any) -> Callable[[Callable[..., Any]], TaskSpec]:
    """``@task(...)`` over a task function, with the keywords of Invoke's ``@task``."""

    def declare(body: Callable[..., Any]) -> TaskSpec:
        return TaskSpec(body, dict(options))

    return declare
