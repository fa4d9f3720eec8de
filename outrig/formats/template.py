"""``${name}`` substitution from named, defined parameters only.

The hand-written launch scripts this replaces failed because a shell branch used ``$VLLM_DP``
before it was set: the shell silently substituted an empty string. Here a name that is not
defined is an error at plan time, before anything is sent.

Substitution happens *per argv element* after the command was split, so a value containing
spaces, quotes or ``; rm -rf`` stays one literal argument: there is no shell to inject into.
``$${`` escapes a literal ``${``; a ``$`` not followed by ``{`` is left alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_TOKEN = re.compile(r"\$\$\{|\$\{([^{}]*)\}")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class UndefinedName(LookupError):
    """A ``${name}`` that no parameter defines. ``names`` lists every one in the text."""

    def __init__(self, names: list[str], bad_syntax: list[str]) -> None:
        self.names = names
        self.bad_syntax = bad_syntax
        super().__init__(", ".join(names + bad_syntax))


def names_in(text: str) -> list[str]:
    """Every ``${name}`` referenced in ``text`` (escapes excluded), in order."""
    return [m.group(1).strip() for m in _TOKEN.finditer(text) if m.group(1) is not None]


def substitute(text: str, params: Mapping[str, object]) -> str:
    """Replace each ``${name}`` with ``str(params[name])``; raise :class:`UndefinedName`."""
    missing: list[str] = []
    bad: list[str] = []

    def repl(match: re.Match[str]) -> str:
        if match.group(1) is None:  # "$${" escape
            return "${"
        name = match.group(1).strip()
        if not _NAME.match(name):
            bad.append(match.group(0))
            return match.group(0)
        if name not in params:
            missing.append(name)
            return match.group(0)
        return render_scalar(params[name])

    out = _TOKEN.sub(repl, text)
    if missing or bad:
        raise UndefinedName(missing, bad)
    return out


def render_scalar(value: object) -> str:
    """How a parameter value appears in a command: YAML-ish for bools, plain otherwise."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    return str(value)
