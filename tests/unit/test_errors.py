"""outrig.errors draws the whole exception tree in its docstring; the drawing and the classes
must agree, and a refused key must not pass for a connection failure anywhere it is caught."""

from __future__ import annotations

import importlib
import pkgutil
import re

import outrig
from outrig import errors
from outrig.errors import AuthenticationError, AuthRefused, ConnectError, OutrigError

# "    │   ├── Name [Builtin]   words" → depth (4 characters a level) and name.
TREE_LINE = re.compile(r"^    ((?:[│ ]   )*)(?:[├└]── )?([A-Z]\w+)(?: \[(\w+)\])?\s")


def drawn_tree() -> dict[str, tuple[str | None, str | None]]:
    """name → (parent in the drawing, builtin named in brackets)."""
    doc = errors.__doc__ or ""
    block = doc.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    parents: list[str] = []
    out: dict[str, tuple[str | None, str | None]] = {}
    for line in block.splitlines():
        match = TREE_LINE.match(line)
        assert match, f"not a tree line: {line!r}"
        depth = len(match.group(1)) // 4 + (1 if "──" in line else 0)
        del parents[depth:]
        out[match.group(2)] = (parents[-1] if parents else None, match.group(3))
        parents.append(match.group(2))
    return out


def every_error_class() -> dict[str, type[BaseException]]:
    """OutrigError and every subclass defined anywhere in the package."""
    for module in pkgutil.walk_packages(outrig.__path__, "outrig."):
        importlib.import_module(module.name)
    found: dict[str, type[BaseException]] = {}
    todo: list[type[BaseException]] = [OutrigError]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("outrig"):
            found[cls.__name__] = cls
        todo.extend(cls.__subclasses__())
    return found


def test_the_docstring_draws_every_error_class_under_its_real_parent() -> None:
    drawn = drawn_tree()
    classes = every_error_class()
    assert set(drawn) == set(classes), "draw the missing classes / remove the extra ones"
    for name, (parent, builtin) in drawn.items():
        cls = classes[name]
        outrig_bases = [b.__name__ for b in cls.__bases__ if b.__module__.startswith("outrig")]
        assert outrig_bases == ([parent] if parent else []), name
        builtins = [b.__name__ for b in cls.__bases__ if b.__module__ == "builtins"
                    and b is not Exception]
        assert builtins == ([builtin] if builtin else []), name


def test_a_refused_key_is_not_a_connection_failure() -> None:
    assert AuthRefused is AuthenticationError
    assert issubclass(AuthenticationError, OutrigError)
    # Code that handles a lost link or a refused connection catches these; a refused key
    # must go past all of them.
    assert not issubclass(AuthenticationError, (ConnectError, ConnectionError, OSError))
