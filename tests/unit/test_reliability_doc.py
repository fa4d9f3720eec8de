"""docs/reliability.md stays true: every row names tests, and every test it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"
TEST_ID = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def table_rows() -> list[str]:
    """The body rows of every table in the document (not headers or separators)."""
    rows = []
    for line in DOC.read_text().splitlines():
        if line.startswith("|") and not line.startswith("|---") and \
                not line.startswith("| fault or input"):
            rows.append(line)
    return rows


def test_every_row_names_at_least_one_test() -> None:
    rows = table_rows()
    assert rows, "docs/reliability.md has no table rows"
    missing = [row[:80] for row in rows if not TEST_ID.search(row.rsplit("|", 2)[-2])]
    assert missing == [], missing


def test_every_named_test_exists() -> None:
    named = {(path, name) for row in table_rows() for path, name in TEST_ID.findall(row)}
    absent = []
    for path, name in sorted(named):
        source = ROOT / path
        if not source.is_file() or not re.search(rf"^def {name}\(", source.read_text(), re.M):
            absent.append(f"{path}::{name}")
    assert absent == [], absent
