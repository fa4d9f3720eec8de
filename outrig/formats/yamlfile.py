"""Load YAML while remembering where each key came from.

Users fix files by line number, so every error about a host file or playbook should say
``playbooks/x.yaml:12``. PyYAML's composed node tree carries marks; we walk it once and record
the line of every key path, then let the normal safe loader build the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from outrig.errors import ConfigError

KeyPath = tuple[object, ...]


@dataclass
class YamlDoc:
    """A loaded YAML mapping plus the source line (1-based) of each key path."""

    path: Path
    data: dict[str, Any]
    lines: dict[KeyPath, int] = field(default_factory=dict)
    text: str = ""  # the mapping as it was read (what a run's record keeps of its playbook)
    source: Path | None = None  # the file read, absolute

    def line_of(self, keypath: KeyPath) -> int | None:
        """The line of the deepest known prefix of ``keypath`` (errors often point inside)."""
        probe = tuple(keypath)
        while probe:
            if probe in self.lines:
                return self.lines[probe]
            probe = probe[:-1]
        return None

    def where(self, keypath: KeyPath) -> str:
        """``file:line: key.path`` for messages."""
        line = self.line_of(keypath)
        loc = f"{self.path}:{line}" if line else str(self.path)
        dotted = dotted_path(keypath)
        return f"{loc}: {dotted}" if dotted else loc


def dotted_path(keypath: KeyPath) -> str:
    """``("processes", "server", "gpus", 0)`` → ``processes.server.gpus[0]``."""
    out = ""
    for part in keypath:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _record_lines(node: yaml.Node, prefix: KeyPath, lines: dict[KeyPath, int],
                  source: Path, what: str) -> None:
    """Record the line of every key path; a key given twice in one mapping is an error (the
    loader would silently keep the last one: a second process of the same name, a second
    ``env:`` block, replace the first without a word)."""
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node)
            line = key_node.start_mark.line + 1
            if key in first and key != "<<":
                where = dotted_path((*prefix, key))
                raise ConfigError(
                    f"{source}:{line}: {where} is given twice in {what} (first at line "
                    f"{first[key]}); YAML would silently keep only the last one. Remove or "
                    "rename one of them.")
            first.setdefault(key, line)
            path = (*prefix, key)
            lines[path] = line
            _record_lines(value_node, path, lines, source, what)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            path = (*prefix, index)
            lines[path] = item.start_mark.line + 1
            _record_lines(item, path, lines, source, what)


def load_yaml(path: Path, *, what: str, text: str | None = None) -> YamlDoc:
    """Read ``path`` as a YAML mapping. ``what`` names the file's role in error messages.
    ``text``: the file's content as it was read earlier (a run's playbook as deployed, kept
    in the journal), parsed instead of the file, which messages still name."""
    if text is None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{what} {path} does not exist") from None
        except OSError as exc:
            raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = exc.problem or str(exc)
        raise ConfigError(
            f"{path}{line}: malformed YAML in {what}: {problem}. "
            "Fix the syntax at that line (indentation, a missing ':' or an unclosed quote)."
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: malformed YAML in {what}: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: a {what} must be a YAML mapping (key: value lines), "
            f"not a {type(data).__name__}"
        )
    lines: dict[KeyPath, int] = {}
    if node is not None:
        _record_lines(node, (), lines, _display(path), what)
    return YamlDoc(path=_display(path), data=data, lines=lines, text=text,
                   source=path.expanduser().absolute())


def _display(path: Path) -> Path:
    """Paths under the current folder are shown relative (``playbooks/x.yaml:12``)."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path


def validation_messages(doc: YamlDoc, errors: list[Any], *, prefix: KeyPath = ()) -> list[str]:
    """Turn pydantic ``ValidationError.errors()`` into ``file:line: key: problem`` lines."""
    out: list[str] = []
    for err in errors:
        loc = tuple(part for part in err.get("loc", ()) if not _is_union_tag(part))
        keypath = (*prefix, *loc)
        kind = err.get("type", "")
        if kind == "extra_forbidden":
            msg = "unknown key (not part of the format; check the spelling or remove it)"
        elif kind == "missing":
            msg = "required key is missing"
        else:
            msg = str(err.get("msg", "invalid value"))
        out.append(f"{doc.where(keypath)}: {msg}")
    return out


def _is_union_tag(part: object) -> bool:
    # pydantic puts the union member's type name into loc ("list[str]", "function-after[...]");
    # users never wrote those, so they only confuse the key path.
    return isinstance(part, str) and ("[" in part or part in {"str", "int", "float", "bool"})
