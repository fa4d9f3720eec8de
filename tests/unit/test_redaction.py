"""The workstation's redaction of secret values (outrig/redaction.py)."""

from __future__ import annotations

from outrig.redaction import ordered, redact_bytes, redact_text, redact_tree, safe_cut


def test_longest_value_first_and_empty_values_ignored() -> None:
    secrets = ordered(["abc", "", "abcdef", "abc"])
    assert secrets == ["abcdef", "abc"]
    assert redact_text("x abcdef y abc", secrets) == "x *** y ***"
    assert redact_bytes(b"abcdefabc", [s.encode() for s in secrets]) == b"******"


def test_a_document_keeps_its_shape_and_the_original() -> None:
    doc = {"model": "org/m", "checkpoint": {"path": "/ckpt/tok_SECRET/7"},
           "runs": ["a", ("tok_SECRET", 3)], "tok_SECRET": 1.5, "n": None}
    out = redact_tree(doc, ["tok_SECRET"])
    assert out == {"model": "org/m", "checkpoint": {"path": "/ckpt/***/7"},
                   "runs": ["a", ("***", 3)], "***": 1.5, "n": None}
    assert doc["checkpoint"] == {"path": "/ckpt/tok_SECRET/7"}


def test_a_cut_never_splits_a_secret() -> None:
    value = b"SECRET"
    data = b"...SECRET..SEC"
    cut = safe_cut(data, [value], len(data))
    assert data[:cut] == b"...SECRET"  # the tail ("..SEC") may still start a secret
    assert safe_cut(b"xxSECRET", [value], 5) == 2  # a cut at 5 would split it: before it
    assert safe_cut(b"abc", [], 3) == 3
