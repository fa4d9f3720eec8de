"""Start-up: ``outrig --version``, ``--help`` and ``--list`` import Invoke and the task table
only. The console (rich), the playbook models (pydantic), SSH (paramiko), the planner and
the recipes are imported when a task runs. Asserted on the modules a fresh interpreter
holds, never on how long it took."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from outrig.cli import make_collection
from outrig.transfer import STREAMS

HEAVY = ("rich", "pydantic", "paramiko", "fabric", "outrig.plan", "outrig.recipes",
         "outrig.console", "outrig.playbook", "outrig.session", "outrig.ops")

PROBE = """
import json, sys
from outrig.cli import program
try:
    program.run(["outrig", *sys.argv[1:]])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def loaded_by(*args: str) -> list[str]:
    """The heavy modules loaded by a fresh ``outrig ARGS`` (stderr's last line lists all)."""
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          timeout=120)
    modules = json.loads(proc.stderr.strip().splitlines()[-1])
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["--list"], ["--help", "deploy"],
                                  []])
def test_version_help_and_list_import_none_of_the_heavy_modules(args: list[str]) -> None:
    assert loaded_by(*args) == []


def test_a_task_that_runs_does_import_them() -> None:
    """The probe can fail: a task that plans (``plan`` with no project) loads the planner."""
    assert "outrig.console" in loaded_by("plan", "--playbook", "nosuch")


def test_stage_help_names_the_default_number_of_streams() -> None:
    stage = make_collection()["stage"]
    assert f"(default {STREAMS})" in stage.__dict__["_outrig_help"]["streams"]
