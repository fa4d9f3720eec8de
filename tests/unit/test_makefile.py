"""The checkout's two commands (README): `make demo` and `make test` each do their own set-up
(sshd where missing, .venv with outrig), and CI (`.ci/run`) is `make test`, so CI and a
developer run the same steps. Read with `make -n -B` (print every recipe, run none)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def planned(target: str) -> list[str]:
    """The commands ``make TARGET`` would run from nothing (every prerequisite out of date)."""
    done = subprocess.run(["make", "-n", "-B", "-C", str(REPO), target], capture_output=True,
                          text=True, timeout=60, check=True)
    return [line.strip() for line in done.stdout.splitlines()]


def position(lines: list[str], needle: str) -> int:
    return next(i for i, line in enumerate(lines) if needle in line)


SETUP = ["apt-get install -y -qq openssh-server openssh-client", "python3 -m venv .venv",
         "pip install -q -e '.[test]'"]


def test_make_test_sets_up_then_runs_the_checks_and_the_suite_in_order() -> None:
    lines = planned("test")
    steps = [*SETUP, ".ci/venvs", ".venv/bin/ruff check .", ".venv/bin/mypy",
             ".venv/bin/python -m pytest -q -n 2 --dist worksteal"]
    order = [position(lines, step) for step in steps]
    assert order == sorted(order), lines


def test_make_test_installs_chromium_for_the_report_test_before_the_suite() -> None:
    lines = planned("test")
    install = position(lines, "apt-get install -y -qq --no-install-recommends chromium")
    assert install < position(lines, ".venv/bin/python -m pytest")
    assert "command -v chromium" in "\n".join(lines[:install])  # only where it is missing


def test_make_demo_sets_up_then_runs_the_demo() -> None:
    lines = planned("demo")
    order = [position(lines, step) for step in [*SETUP, ".venv/bin/outrig demo"]]
    assert order == sorted(order), lines


def test_ci_runs_make_test() -> None:
    script = [line for line in (REPO / ".ci" / "run").read_text().splitlines()
              if line.strip() and not line.lstrip().startswith("#")]
    assert script[-1] == "exec make test"
    assert not any("pytest" in line or "ruff" in line for line in script)  # only behind make
