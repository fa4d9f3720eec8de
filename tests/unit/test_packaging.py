"""The wheel holds every package of outrig: pyproject.toml lists its packages by hand (the
agent's mapping to ``outrig._box`` needs that), so a new folder left off the list would
install an ``outrig`` that fails on its first import (``No module named 'outrig.hang'``).
The wheel tests find that too, but only in the slow tier; this finds it in a second."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_in_the_wheels_list() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {".".join(init.parent.relative_to(ROOT).parts)
             for init in (ROOT / "outrig").rglob("__init__.py")}
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"


def test_every_data_folder_is_in_the_wheels_list() -> None:
    """A folder of data files (``report_assets/``, ``evaluations/prompts/``) shipped through
    package-data but left off the packages list still lands in the wheel, and setuptools says
    so with a ``BuildBackendWarning`` ("Package would be ignored"): ~50 lines at the top of
    ``make demo`` on a fresh clone. Every folder under outrig/ and remote/ is listed."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {".".join(folder.relative_to(ROOT).parts)
             for folder in (ROOT / "outrig").rglob("*")
             if folder.is_dir() and folder.name != "__pycache__"}
    found |= {".".join(("outrig", "_box", *folder.relative_to(ROOT / "remote").parts))
              for folder in (ROOT / "remote").rglob("*")
              if folder.is_dir() and folder.name != "__pycache__"}
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
