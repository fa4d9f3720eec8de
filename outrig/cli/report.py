"""``outrig metrics``, ``outrig plot``, ``outrig report``: a run drawn from the journal and
the log mirror (:mod:`outrig.ops.metrics`); no box is contacted.

Apart from :mod:`outrig.cli.run_tasks`, whose tasks reach a box: these read what this
workstation holds, so they work the same when the box is long gone.
"""

from __future__ import annotations

from typing import Any

from outrig.cli.flags import friendly, make_reporter
from outrig.cli.taskspec import task
from outrig.errors import ConfigError

RUN_HELP = ("the run id (repeat for several, overlaid and aligned by step); a migrated run "
            "brings the runs it was moved from and to")
METRIC_HELP = "only this metric, e.g. train/loss (repeat for several)"
LOG_HELP = ("the metrics' y axis on a log scale: a loss falling over decades stays readable "
            "at its end (values of 0 or below are left out, and said so)")


@task(
    auto_shortflags=False,
    iterable=["run", "metric"],
    help={"run": RUN_HELP, "metric": METRIC_HELP,
          "json": "print one JSON document {metrics, lines_parsed, runs: [{run_id, host, "
                  "playbook, chain, mirror, points: [{process, step, t, values}]}]}",
          "csv": "print CSV: run_id, host, process, step, time_utc, t, then one column per "
                 "metric"},
)
@friendly
def metrics(c: Any, run: list[str] | None = None, metric: list[str] | None = None,
            json: bool = False, csv: bool = False) -> None:
    """Export a run's metric series: every metric line its trainer printed.

    The series are parsed from the run's local log mirror (what tail-logs keeps) and the
    log tails status and watch receive, and kept in the journal with a cursor, so each call
    parses only new lines. Without --json or --csv: one row per metric (points, first,
    last, min, max). No box is contacted. See docs/logs-and-status.md.

    Examples:
        outrig metrics --run dflash-qwen36-20260101-120000
        outrig metrics --run R --csv > run.csv
        outrig metrics --run R --metric train/loss --json
    """
    from outrig.ops.metrics import metrics_export

    if json and csv:
        raise ConfigError("give one of --json and --csv, not both. Nothing was read.")
    metrics_export(make_reporter(False), list(run or []), metrics=list(metric or []),
                   fmt="json" if json else "csv" if csv else "table")


@task(
    auto_shortflags=False,
    iterable=["run", "metric"],
    help={"run": RUN_HELP,
          "metric": METRIC_HELP + " (default: train/loss, train/full_acc and train/eal)",
          "log": LOG_HELP,
          "json": "print the curves instead, one JSON document {curves: [{metric, run_id, "
                  "host, steps, values}]}"},
)
@friendly
def plot(c: Any, run: list[str] | None = None, metric: list[str] | None = None,
         log: bool = False, json: bool = False) -> None:
    """Draw a run's curves in the terminal, over the step.

    On a terminal with colour each metric is a chart as wide as the terminal (plotext), one
    colour per run. Without colour (a pipe, NO_COLOR) each metric is a sparkline and a table
    of evenly spread steps, which fits 80 columns. FORCE_COLOR draws the charts in a pipe.
    No box is contacted. See docs/logs-and-status.md.

    Examples:
        outrig plot --run dflash-qwen36-20260101-120000
        outrig plot --run A --run B --metric train/loss --metric train/eal
        outrig plot --run R --metric train/loss --log
    """
    from outrig.ops.metrics import plot as run_plot

    run_plot(make_reporter(json), list(run or []), metrics=list(metric or []), log=log)


@task(
    auto_shortflags=False,
    iterable=["run"],
    help={"run": RUN_HELP,
          "o": "the HTML file to write (default: outrig-report-RUN.html here)",
          "log": LOG_HELP,
          "json": "print one JSON line {report, bytes, runs, charts, events, points, "
                  "lines_parsed}"},
)
@friendly
def report(c: Any, run: list[str] | None = None, o: str | None = None, log: bool = False,
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
        outrig report --run A --run B -o compare.html
        outrig report --run R --log
    """
    from outrig.ops.metrics import write_report

    write_report(make_reporter(json), list(run or []), output=o, log=log)
