"""outrig's command line: the installed ``outrig`` command and ``inv`` in a checkout.

Both run the tasks of the one table :data:`TASKS`, as the collection :func:`make_collection`
makes of it (``tasks.py`` names it ``ns``); ``outrig`` is an Invoke
:class:`~invoke.program.Program` the way Fabric builds ``fab``. Each task turns flags into one
call into ``outrig.ops``; errors come back as one paragraph that says what failed, where, and
the fix (no traceback), with exit status 2 for bad input (nothing was sent) and 1 for failures
on or while reaching the box. Run ``outrig --list`` for the tasks and ``outrig --help TASK``
for each flag; docs/cli.md is the reference.

The package:

* the tasks, by what they act on: :mod:`outrig.cli.run_tasks` (deploy, plan, status, tail-logs,
  cleanup, watch, sync-checkpoints, migrate), :mod:`outrig.cli.list_runs` (runs),
  :mod:`outrig.cli.report` (metrics, plot, report),
  :mod:`outrig.cli.boxes` (check, provision,
  stage, exec, ssh, forward, connections), :mod:`outrig.cli.evaluate`,
  :mod:`outrig.cli.rentals` (rent, boxes, release),
  :mod:`outrig.cli.sandbox` (demo, sandbox-up, sandbox-down, sandbox-hang),
  :mod:`outrig.cli.starter` (init);
* what a command acts on, resolved once from ``--host``/``--run``/``--playbook``:
  :mod:`outrig.cli.targets` (one host, a sweep of hosts, a multi-node job);
* a task's work on a sweep, and its rows: :mod:`outrig.cli.sweep`, :mod:`outrig.cli.rows`;
* what the tasks share (help texts, :func:`friendly`): :mod:`outrig.cli.flags`.

Where values come from is :mod:`outrig.cli.settings`; the program itself (parse errors,
completion) is :mod:`outrig.cli.invoke_program`.

Start-up: :data:`program` is the launcher (:mod:`outrig.cli.launcher`), which answers
``outrig --version``, ``--list`` and ``--help`` from :data:`TASKS` before Invoke is
imported; the task modules declare their tasks with :func:`outrig.cli.taskspec.task`, so that
importing them imports no Invoke. Invoke's collection and program are made (and Invoke
imported, inside :func:`make_collection` and :func:`make_program`) only for a command that
is parsed, purely for start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from outrig import __version__
from outrig.cli.boxes import check, connections, exec_, forward, provision, ssh, stage_
from outrig.cli.evaluate import evaluate
from outrig.cli.flags import friendly
from outrig.cli.launcher import Launcher
from outrig.cli.list_runs import runs as runs_task  # named as the other tasks are (TASKS)
from outrig.cli.rentals import boxes as boxes_task  # the module outrig.cli.boxes keeps its name
from outrig.cli.rentals import release, rent
from outrig.cli.report import metrics, report
from outrig.cli.report import plot as plot_task
from outrig.cli.run_tasks import (
    cleanup,
    deploy,
    migrate,
    plan,
    status,
    sync_checkpoints,
    tail_logs,
    watch,
)
from outrig.cli.sandbox import demo, sandbox_down, sandbox_hang, sandbox_up
from outrig.cli.starter import init

if TYPE_CHECKING:
    from invoke.collection import Collection

    from outrig.cli.invoke_program import OutrigProgram

__all__ = ["TASKS", "friendly", "make_collection", "make_program", "program"]

TASKS = (deploy, plan, status, runs_task, tail_logs, metrics, plot_task, report, cleanup,
         provision, stage_, sync_checkpoints, migrate, watch, evaluate, check, exec_, ssh,
         forward, connections, rent, boxes_task, release, demo, sandbox_up, sandbox_down,
         sandbox_hang, init)


def make_collection(default_project: Path | None = None) -> Collection:
    """Invoke's collection of :data:`TASKS`; ``default_project`` is the project used when none
    is found upward from the current folder (``tasks.py`` passes its checkout)."""
    from outrig.cli.invoke_program import collection

    return collection(TASKS, default_project)


def make_program() -> OutrigProgram:
    """The Invoke program that parses and runs a command (what :data:`program` hands to)."""
    from outrig.cli.invoke_program import OutrigConfig, OutrigProgram

    return OutrigProgram(name="outrig", binary="outrig", binary_names=["outrig"],
                         namespace=make_collection(), version=__version__,
                         config_class=OutrigConfig)


program = Launcher(TASKS, make_program)
"""The ``outrig`` command (the console script runs ``program.run``)."""
