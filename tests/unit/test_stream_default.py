"""The default number of parallel transfer streams is one constant (outrig.transfer.STREAMS):
no function and no flag parser spells its own number."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "outrig"


def literal_stream_defaults() -> list[str]:
    """``file:line`` of every ``streams`` parameter or ``number(..., "streams", N)`` whose
    default is a literal instead of the constant."""
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.posonlyargs + node.args.args
                defaults = [None] * (len(args) - len(node.args.defaults)) + node.args.defaults
                pairs = [*zip(args, defaults, strict=True),
                         *zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)]
                found += [where for arg, default in pairs
                          if arg.arg == "streams" and isinstance(default, ast.Constant)
                          and default.value is not None]
            if isinstance(node, ast.Call) and any(
                    isinstance(a, ast.Constant) and a.value == "streams" for a in node.args):
                found += [where for a in node.args
                          if isinstance(a, ast.Constant) and isinstance(a.value, int)]
    return found


def test_no_literal_default_for_the_stream_count() -> None:
    assert literal_stream_defaults() == []
