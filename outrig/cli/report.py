"""``outrig metrics``, ``outrig plot``, ``outrig report``: a run drawn from the journal and
the log mirror (:mod:`outrig.ops.metrics`); no box is contacted.

Apart from :mod:`outrig.cli.run_tasks`, whose tasks reach a box: these read what this
workstation holds, so they work the same when the box is long gone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outrig.cli.flags import PROJECT_HELP, friendly, make_reporter
from outrig.cli.settings import settings_for
from outrig.cli.taskspec import TaskContext, task
from outrig.errors import ConfigError

if TYPE_CHECKING:
    from outrig.console import Reporter

RUN_HELP = ("the run id (repeat for several, overlaid and aligned by step); a migrated run "
            "brings the runs it was moved from and to (default: the current run of --host)")
HOST_HELP = ("the box whose current run to show when --run is not given (its newest run in "
             "the journal; default: host: in outrig.yaml or OUTRIG_HOST); with --run, a check "
             "that the run is this box's")
PLAYBOOK_HELP = "without --run: the current run of this playbook on the host"


def chosen_runs(c: TaskContext, reporter: Reporter, run: list[str] | None, host: str | None,
                playbook: str | None, project: str | None) -> list[str]:
    """The ``--run`` ids, else the current run of ``--host`` (or the project's host) as
    the journal has it (:func:`outrig.ops.metrics.current_run`), said on stderr. No box
    is contacted."""
    from outrig.cli.targets import playbook_identity
    from outrig.inventory import HostBook
    from outrig.journal import Journal
    from outrig.ops.metrics import check_hosts, current_run

    runs = [r for r in run or [] if r]
    settings = settings_for(c, project)
    value, _ = settings.value("host", host)
    if value is None:
        return runs  # neither: select_chains says what is needed
    key = HostBook(settings.project.hosts_dir).filed_under(settings.host(str(value)))
    journal = Journal()
    if runs:
        if host:  # a configured host does not restrict an explicit --run
            check_hosts(journal, runs, key)
        return runs
    name, _ = settings.value("playbook", playbook)
    found = current_run(journal, key, playbook_identity(settings, name))
    reporter.info(f"run {found}: the current run of {key} in the journal (--run picks another; "
                  f"`outrig runs --host {key}` lists them)")
    return [found]
METRIC_HELP = "only this metric, e.g. train/loss (repeat for several)"
LOG_HELP = ("the metrics' y axis on a log scale: a loss falling over decades stays readable "
            "at its end (values of 0 or below are left out, and said so)")


@task(
    auto_shortflags=False,
    iterable=["run", "metric"],
    help={"run": RUN_HELP, "metric": METRIC_HELP, "host": HOST_HELP, "playbook": PLAYBOOK_HELP,
          "project": PROJECT_HELP,
          "json": "print one JSON document {metrics, lines_parsed, runs: [{run_id, host, "
                  "playbook, chain, mirror, points: [{process, step, t, values}]}]}",
          "csv": "print CSV: run_id, host, process, step, time_utc, t, then one column per "
                 "metric"},
)
@friendly
def metrics(c: TaskContext, run: list[str] | None = None, metric: list[str] | None = None,
            host: str | None = None, playbook: str | None = None, project: str | None = None,
            json: bool = False, csv: bool = False) -> None:
    """Export a run's metric series: every metric line its trainer printed.

    The series are parsed from the run's local log mirror (what tail-logs keeps) and the
    log tails status and watch receive, and kept in the journal with a cursor, so each call
    parses only new lines. Without --json or --csv: one row per metric (points, first,
    last, min, max). No box is contacted. See docs/logs-and-status.md.

    Examples:
        outrig metrics --run dflash-qwen36-20260101-120000
        outrig metrics --host uk-node
        outrig metrics --run R --csv > run.csv
        outrig metrics --run R --metric train/loss --json
    """
    from outrig.ops.metrics import metrics_export

    if json and csv:
        raise ConfigError("give one of --json and --csv, not both. Nothing was read.")
    reporter = make_reporter(False)
    metrics_export(reporter, chosen_runs(c, reporter, run, host, playbook, project),
                   metrics=list(metric or []), fmt="json" if json else "csv" if csv else "table")


@task(
    auto_shortflags=False,
    iterable=["run", "metric"],
    help={"run": RUN_HELP, "host": HOST_HELP, "playbook": PLAYBOOK_HELP, "project": PROJECT_HELP,
          "metric": METRIC_HELP + " (default: train/loss, train/full_acc and train/eal)",
          "log": LOG_HELP,
          "json": "print the curves instead, one JSON document {curves: [{metric, run_id, "
                  "host, steps, values}]}"},
)
@friendly
def plot(c: TaskContext, run: list[str] | None = None, metric: list[str] | None = None,
         host: str | None = None, playbook: str | None = None, project: str | None = None,
         log: bool = False, json: bool = False) -> None:
    """Draw a run's curves in the terminal, over the step.

    On a terminal with colour each metric is a chart as wide as the terminal (plotext), one
    colour per run. Without colour (a pipe, NO_COLOR) each metric is a sparkline and a table
    of evenly spread steps, which fits 80 columns. FORCE_COLOR draws the charts in a pipe.
    No box is contacted. See docs/logs-and-status.md.

    Examples:
        outrig plot --run dflash-qwen36-20260101-120000
        outrig plot --host uk-node
        outrig plot --run A --run B --metric train/loss --metric train/eal
        outrig plot --run R --metric train/loss --log
    """
    from outrig.ops.metrics import plot as run_plot

    reporter = make_reporter(json)
    run_plot(reporter, chosen_runs(c, reporter, run, host, playbook, project),
             metrics=list(metric or []), log=log)


@task(
    auto_shortflags=False,
    iterable=["run"],
    help={"run": RUN_HELP, "host": HOST_HELP, "playbook": PLAYBOOK_HELP, "project": PROJECT_HELP,
          "o": "the HTML file to write (default: outrig-report-RUN.html here)",
          "log": LOG_HELP,
          "json": "print one JSON line {report, bytes, runs, charts, events, points, "
                  "lines_parsed}"},
)
@friendly
def report(c: TaskContext, run: list[str] | None = None, o: str | None = None, log: bool = False,
           host: str | None = None, playbook: str | None = None, project: str | None = None,
           json: bool = False) -> None:
    """Write one self-contained HTML report of a run: identity, curves, GPUs, timeline.

    The file needs no network to open (the chart library is inlined): the run's playbook,
    host, GPUs and commands; every metric over step and over time; GPU memory and
    utilisation as status and watch sampled them; and the events (deploy, ready,
    checkpoints, suspect/dead, migrate and resume, evaluate results). Several runs, or a
    migrated run and its successor, overlay on the same axes, aligned by step. No box is
    contacted. See docs/logs-and-status.md.

    Examples:
        outrig report --run dflash-qwen36-20260101-120000
        outrig report --host uk-node
        outrig report --run A --run B -o compare.html
        outrig report --run R --log
    """
    from outrig.ops.metrics import write_report

    reporter = make_reporter(json)
    write_report(reporter, chosen_runs(c, reporter, run, host, playbook, project), output=o,
                 log=log)
