"""docs/reliability.md stays true: every test its tables name exists, and every row names one.

A row's test cell holds one or more `tests/<path>.py::<name>` references in backticks; each
must point at a file that defines a test function of that name (``def`` or ``async def``,
at module level or in a class). A row without a reference is a claim without proof.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reliability.md"
REF = re.compile(r"`(tests/[\w/.-]+\.py)::(\w+)`")


def table_rows(text: str) -> list[tuple[int, list[str]]]:
    """(line number, cells) of every table body row (header and separator rows skipped)."""
    rows: list[tuple[int, list[str]]] = []
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if not line.lstrip().startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
            continue
        following = lines[number] if number < len(lines) else ""
        if re.fullmatch(r"\s*\|(\s*:?-{3,}:?\s*\|)+\s*", following):
            continue  # a header row: the separator follows it
        rows.append((number, cells))
    return rows


def defines(path: Path, name: str) -> bool:
    return re.search(rf"^\s*(async\s+)?def {re.escape(name)}\(", path.read_text(),
                     re.MULTILINE) is not None


def test_the_doc_has_tables() -> None:
    assert DOC.is_file(), f"{DOC} is missing"
    assert table_rows(DOC.read_text()), "docs/reliability.md has no table rows"


def test_every_row_names_a_test_and_every_named_test_exists() -> None:
    problems = []
    for number, cells in table_rows(DOC.read_text()):
        refs = REF.findall(cells[-1])
        if not refs:
            problems.append(f"line {number}: no `tests/...::name` in the test cell")
        for file, name in refs:
            path = REPO / file
            if not path.is_file():
                problems.append(f"line {number}: {file} does not exist")
            elif not defines(path, name):
                problems.append(f"line {number}: {file} defines no test {name}")
    assert not problems, "docs/reliability.md:\n" + "\n".join(problems)


@pytest.mark.parametrize("cell,ok", [
    ("`tests/unit/test_reliability_doc.py::test_the_doc_has_tables`", True),
    ("`tests/unit/test_reliability_doc.py::test_not_here`", False),
    ("`tests/unit/nope.py::test_the_doc_has_tables`", False),
])
def test_the_checker_catches_a_missing_test(cell: str, ok: bool) -> None:
    (file, name), = REF.findall(cell)
    path = REPO / file
    assert (path.is_file() and defines(path, name)) is ok


def test_the_checker_reads_rows_but_not_headers() -> None:
    text = "| a | b | test |\n| --- | --- | --- |\n| x | y | z |\n"
    assert table_rows(text) == [(3, ["x", "y", "z"])]
