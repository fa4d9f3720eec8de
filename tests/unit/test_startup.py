"""Start-up: ``outrig --version``, ``--help``, ``--list`` (and ``outrig`` alone) are answered
before Invoke is imported (outrig/cli/launcher.py), from the same task table, options and layout
as the Invoke program's answers; a command that is parsed imports Invoke and the task table,
and the console (rich), the playbook models (pydantic), SSH (paramiko), the planner and the
recipes only when a task runs. Asserted on the modules a fresh interpreter holds (which, and
how many), never on how long it took; the warm path (a command through a live keeper, no
paramiko) is tests/integration/test_warm.py's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from outrig.cli import TASKS, make_collection, program
from outrig.transfer import STREAMS
from tests.support.cli import outrig

HEAVY = ("rich", "pydantic", "paramiko", "fabric", "outrig.plan", "outrig.recipes",
         "outrig.console", "outrig.playbook", "outrig.session", "outrig.ops")
BEFORE_INVOKE = ("invoke", "yaml", "outrig.cli.invoke_program")  # what the launcher answers without

PROBE = """
import json, sys
bare = sorted(sys.modules)
from outrig.cli import program
try:
    program.run(["outrig", *sys.argv[1:]])
except SystemExit:
    pass
print(json.dumps([bare, sorted(sys.modules)]), file=sys.stderr)
"""

START_BUDGET = 60
"""Modules ``outrig --version`` / ``--list`` / ``--help`` may add to a bare interpreter's
(about 40 now, outrig's own included; Invoke alone adds about 100)."""


def imported_by(*args: str) -> tuple[list[str], list[str]]:
    """A fresh ``outrig ARGS``: the modules the bare interpreter held, and those it held
    after the command (stderr's last line lists both)."""
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          timeout=120)
    bare, after = json.loads(proc.stderr.strip().splitlines()[-1])
    return bare, after


def loaded_by(*args: str, among: tuple[str, ...] = HEAVY) -> list[str]:
    """The modules of ``among`` (and their submodules) a fresh ``outrig ARGS`` loaded."""
    _, modules = imported_by(*args)
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in among)]


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["--list"], ["--help", "deploy"],
                                  []])
def test_version_help_and_list_import_none_of_the_heavy_modules(args: list[str]) -> None:
    assert loaded_by(*args) == []


@pytest.mark.parametrize("args", [["--version"], ["-V"], ["--help"], ["-h"], ["--list"],
                                  ["-l"], []])
def test_version_help_and_list_are_answered_before_invoke_is_imported(
        args: list[str]) -> None:
    bare, after = imported_by(*args)
    assert loaded_by(*args, among=BEFORE_INVOKE) == []
    added = sorted(set(after) - set(bare))
    assert len(added) <= START_BUDGET, added


def test_a_parsed_command_does_import_invoke() -> None:
    """The probe can fail: ``--help TASK`` is parsed by Invoke (its flags are Invoke's)."""
    assert "invoke" in loaded_by("--help", "deploy", among=BEFORE_INVOKE)


def test_a_command_that_plans_nothing_imports_no_planner_and_no_ssh() -> None:
    """``status`` imports its op, the session and the transports' front (the task runs and
    refuses the unknown host), but neither the planner nor the recipes, nor SSH: a host with
    a live keeper is reached through it (tests/integration/test_warm_startup.py)."""
    among = ("outrig.plan", "outrig.recipes", "outrig.playbook", "paramiko", "fabric")
    _, after = imported_by("status", "--host", "no-such-host")
    assert "outrig.ops.status" in after and "outrig.session" in after
    assert loaded_by("status", "--host", "no-such-host", among=among) == []


def test_a_task_that_runs_does_import_them() -> None:
    """The probe can fail: a task that plans (``plan`` with no project) loads the planner."""
    assert "outrig.console" in loaded_by("plan", "--playbook", "nosuch")


@pytest.mark.parametrize("args", [["--list"], ["--help"], [], ["--version"]])
def test_the_launchers_answer_is_the_invoke_programs(
        args: list[str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the launcher prints is what Invoke's program (outrig/cli/invoke_program.py, parsing the
    same command line) prints: the same tasks, summaries, options and layout."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = outrig(args, capsys, version=program.version)
    assert code == 0, err
    answer = program.answer(args)
    assert answer is not None and out == "\n".join(answer) + "\n"


def test_the_task_table_names_every_task_as_invoke_would() -> None:
    """The launcher lists each task under its spec's name, the collection is built with it,
    and it is the name Invoke itself gives the task (``name=``, else the function's name with
    dashes)."""
    from invoke.collection import Collection
    from invoke.tasks import Task

    collection = make_collection()
    invokes_own = Collection(*(Task(spec.body, **spec.options) for spec in TASKS))
    assert sorted(spec.name for spec in TASKS) == sorted(collection.task_names) \
        == sorted(invokes_own.task_names)
    for spec in TASKS:
        assert collection[spec.name].body is spec.body


def test_anything_else_goes_to_the_invoke_program() -> None:
    for args in (["--help", "deploy"], ["--list", "--version"], ["status"], ["--bogus"]):
        assert program.answer(args) is None


def test_python_dash_m_outrig_is_the_command() -> None:
    """``python -m outrig`` (outrig/__main__.py) runs the same launcher as the console
    script: its answers, and its exit status for a refused command line."""
    from outrig import __version__

    done = subprocess.run([sys.executable, "-m", "outrig", "--version"], capture_output=True,
                          text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, f"outrig {__version__}\n"), done.stderr
    refused = subprocess.run([sys.executable, "-m", "outrig", "--bogus"], capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2 and "--bogus" in refused.stderr


def test_stage_help_names_the_default_number_of_streams() -> None:
    stage = make_collection()["stage"]
    assert f"(default {STREAMS})" in stage.__dict__["_outrig_help"]["streams"]
