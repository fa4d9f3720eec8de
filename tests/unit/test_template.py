"""${name} substitution: only defined names, per argv element, escapes."""

from __future__ import annotations

import pytest

from outrig.formats.template import UndefinedName, names_in, substitute


def test_defined_names_are_substituted() -> None:
    assert substitute("--dp ${dp} --tp ${ tp }", {"dp": 2, "tp": 1}) == "--dp 2 --tp 1"


def test_undefined_name_raises_with_every_missing_name() -> None:
    with pytest.raises(UndefinedName) as info:
        substitute("${VLLM_DP} ${port} ${other}", {"port": 1})
    assert info.value.names == ["VLLM_DP", "other"]


def test_escape_and_plain_dollar_are_literal() -> None:
    assert substitute("$${x} $HOME $", {}) == "${x} $HOME $"


def test_bad_reference_syntax_is_reported() -> None:
    with pytest.raises(UndefinedName) as info:
        substitute("${1abc}", {})
    assert info.value.bad_syntax == ["${1abc}"]


def test_values_with_metacharacters_are_inserted_verbatim() -> None:
    value = "'; rm -rf / #$(id)"
    assert substitute("--x=${v}", {"v": value}) == f"--x={value}"


def test_names_in_ignores_escapes() -> None:
    assert names_in("${a} $${b} ${c}") == ["a", "c"]


def test_bools_render_lowercase() -> None:
    assert substitute("${flag}", {"flag": True}) == "true"
