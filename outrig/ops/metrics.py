"""``outrig metrics``, ``outrig plot`` and ``outrig report``: a run drawn from what this
workstation already holds, without contacting any box.

Each command first brings the run's series up to date with its log mirror (only the bytes
past the cursor are parsed, :meth:`outrig.metrics.store.MetricStore.ingest_mirror`), then reads
the series, the GPU samples ``status`` and ``watch`` kept, the journal's record of the run,
its ``watch`` events and its ``evaluate`` results. A run that was migrated brings its chain
along (the run it came from and the one it went to, :func:`outrig.metrics.series.chain_ids`), so
its curve goes on across the move. The documents and drawings are pure:
:mod:`outrig.metrics.series`, :mod:`outrig.metrics.termplot`, :mod:`outrig.metrics.report`.
"""

from __future__ import annotations

import csv
import errno
import functools
import io
import math
import os
import time
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from outrig.console import Reporter
from outrig.errors import ConfigError, LocalWriteError
from outrig.evaluation.served import SERVED, served_points
from outrig.journal import Journal, atomic_write_text, read_json, utc_text
from outrig.logs.mirror import mirror_root
from outrig.metrics.report import render_html, report_document
from outrig.metrics.series import RunData, chain_ids, no_collection
from outrig.metrics.store import MetricStore
from outrig.metrics.summary import (
    RunSummary,
    cached_summary,
    keep_summary,
    summarize,
    summary_key,
)
from outrig.metrics.termplot import Curve, plot_lines
from outrig.ops.runs import head_run_id
from outrig.ops.watch_record import WATCH_DIR
from outrig.providers.ledger import annotate_costs
from outrig.redaction import ordered
from outrig.text.terminal import terminal_width

P = ParamSpec("P")
R = TypeVar("R")


def bulk(command: Callable[P, R]) -> Callable[P, R]:
    """A command that holds a run's every point: run with the cyclic collector paused
    (:func:`outrig.metrics.no_collection`; points, columns and rows hold no cycles)."""
    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with no_collection():
            return command(*args, **kwargs)
    return wrapper


DEFAULT_PLOT = ("train/loss", "train/full_acc", "train/eal")  # plot without --metric
BAD_WRITE = frozenset({errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR,
                       errno.EISDIR, errno.EROFS})


def select_chains(journal: Journal, run_ids: Sequence[str]) -> list[list[str]]:
    """Each ``--run`` with its chain (the runs it was moved from and to), in the order
    given; a run already in an earlier chain is not repeated. An id the journal does not
    know is bad input."""
    wanted = [head_run_id(journal, r) for r in run_ids if r]  # a job: its node 0's run
    if not wanted:
        raise ConfigError("--run or --host is needed: the run to show (e.g. --run dflash-"
                          "qwen36-20260101-120000), or the box whose current run to show "
                          "(--host, or host: in outrig.yaml); `outrig runs` lists the runs "
                          "the journal knows. Nothing was read.")
    records = {str(r.get("run_id")): r for r in journal.runs()}
    for run_id in wanted:
        if run_id not in records:
            raise ConfigError(f"--run {run_id}: the journal ({journal.root}) has no such run; "
                              "`outrig runs --all` lists the runs it knows. Nothing was "
                              "read.")
    chains: list[list[str]] = []
    seen: set[str] = set()
    for run_id in wanted:
        if run_id in seen:
            continue
        chain = [r for r in chain_ids(records, run_id) if r not in seen]
        seen.update(chain)
        chains.append(chain)
    return chains


NOT_RUN = frozenset({"not_on_box"})  # a deploy that never reached its box is no run to show


def current_run(journal: Journal, host: str, playbook: str | None) -> str:
    """The host's current run as this workstation knows it, without asking the box: the
    newest run the journal files under ``host`` (of ``playbook`` when one is given or
    configured) that reached its box. A deploy makes a new run and replaces the playbook's
    previous one, so the newest is the one ``status`` shows as current."""
    for record in journal.runs(host=host, playbook=playbook):
        run_id = record.get("run_id")
        if isinstance(run_id, str) and run_id and record.get("status") not in NOT_RUN:
            return run_id
    of = f" of playbook {playbook}" if playbook else ""
    raise ConfigError(f"--host {host}: the journal ({journal.root}) has no run{of} on it; "
                      f"`outrig runs --all` lists the runs it knows; give one with --run. "
                      "Nothing was read.")


def check_hosts(journal: Journal, run_ids: Sequence[str], host: str) -> None:
    """``--run`` with ``--host``: each run must be one the journal files under that host
    (a run id names its box already; a different one is a mistake to say, not to guess)."""
    for run_id in run_ids:
        record = journal.run(run_id)
        recorded = (record or {}).get("host")
        if record is not None and recorded != host:
            raise ConfigError(f"--run {run_id} ran on {recorded}, not on --host {host}: give "
                              "one of them (a run id already names its box). Nothing was "
                              "read.")


def _ingest(journal: Journal, run_id: str
            ) -> tuple[dict[str, Any], MetricStore, str | None, int]:
    """The run's record and store, its series first brought up to date with its mirror
    (where the mirror is, and how many of its lines were parsed for that)."""
    record = journal.run(run_id) or {"run_id": run_id}
    store = MetricStore(journal, run_id)
    host = str(record.get("host") or "")
    lines = 0
    mirror = mirror_root(journal, host, run_id) if host else None
    if host:
        created = record.get("created")
        ref = float(created) if isinstance(created, (int, float)) else None
        lines = store.ingest_mirror(host, ref).lines
    return record, store, str(mirror) if mirror else None, lines


def load_run(journal: Journal, run_id: str) -> tuple[RunData, int]:
    """The run's data, its series first brought up to date with its mirror; and how many
    lines of the mirror were parsed for that."""
    record, store, mirror, lines = _ingest(journal, run_id)
    # the run's evaluated checkpoints as the series served/acceptance_length
    points = store.points() + served_points(journal.evaluations(run_id=run_id))
    data = RunData(record=record, points=points, events=store.events(),
                   gpu=store.gpu_samples(), mirror=mirror)
    return data, lines


def load_summary(journal: Journal, run_id: str) -> tuple[RunSummary, int]:
    """The run's summary (:mod:`outrig.metrics.summary`): the kept one when neither its
    series nor its served evaluations changed since it was kept, else made from the
    points and kept. With nothing new this reads no point at all."""
    record, store, mirror, lines = _ingest(journal, run_id)
    served = served_points(journal.evaluations(run_id=run_id))
    key = summary_key(store, served)
    kept = cached_summary(store, key, record, mirror)
    if kept is not None:
        return kept, lines
    made = summarize(RunData(record=record, points=store.points() + served, mirror=mirror))
    keep_summary(store, key, made)
    return made, lines


def load_chains(journal: Journal, run_ids: Sequence[str]
                ) -> tuple[list[list[RunData]], int]:
    chains = select_chains(journal, run_ids)
    groups: list[list[RunData]] = []
    parsed = 0
    for chain in chains:
        group = []
        for run_id in chain:
            data, lines = load_run(journal, run_id)
            parsed += lines
            group.append(data)
        groups.append(group)
    return groups, parsed


def _say_empty(reporter: Reporter, runs: Sequence[RunData | RunSummary]) -> None:
    for run in runs:
        if not (run.points if isinstance(run, RunData) else run.count):
            reporter.info(f"• run {run.run_id} has no metric records yet: its log mirror "
                          f"({run.mirror}) has none. `outrig tail-logs --host {run.host} --run "
                          f"{run.run_id} --no-follow` fills the mirror; status and watch add "
                          "the records their log tails hold")


def _check_metrics(asked: Sequence[str], known: Sequence[str]) -> None:
    unknown = [m for m in asked if m not in known]
    if unknown:
        listed = ", ".join(known[:14]) + (", ..." if len(known) > 14 else "")
        raise ConfigError(f"--metric {unknown[0]}: no such metric in these runs"
                          + (f" (they have: {listed})" if known else " (they have none yet)")
                          + "; `outrig metrics --run R` lists them all. Nothing was drawn.")


# ----------------------------------------------------------------------------- metrics


@bulk
def metrics_export(reporter: Reporter, run_ids: Sequence[str], *, fmt: str = "table",
                   metrics: Sequence[str] = (), journal: Journal | None = None
                   ) -> dict[str, Any]:
    """``outrig metrics``: every point of the runs (and their chains), as one JSON document
    (``--json``), CSV (``--csv``: run, host, process, step, time, then one column per
    metric) or, for people, a table per run of each metric's count, first, last, min and
    max. Returns the document (each run's ``points`` filled only for ``--json``). A value
    that is not finite is the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` in the
    JSON (:data:`NOT_FINITE`), ``nan``/``inf`` in the CSV."""
    journal = journal or Journal()
    if fmt == "table":
        return _summary_table(reporter, journal, run_ids, metrics)
    groups, parsed = load_chains(journal, run_ids)
    runs = [run for group in groups for run in group]
    names = list(dict.fromkeys(n for run in runs for n in run.names))
    _check_metrics(metrics, names)
    names = list(metrics) or names
    doc: dict[str, Any] = {"metrics": names, "lines_parsed": parsed, "runs": []}
    for index, group in enumerate(groups):
        for run in group:
            doc["runs"].append({
                "run_id": run.run_id, "host": run.host, "playbook": run.record.get("playbook"),
                "chain": index, "mirror": run.mirror,
                # every point only where it is printed (--json): a million rows cost seconds
                "points": json_points(run, names) if fmt == "json" else []})
    if fmt == "json":
        reporter.out.write(_dumps(doc) + "\n")
    else:
        reporter.out.write(csv_text(runs, names))
    reporter.out.flush()
    return doc


def _summary_table(reporter: Reporter, journal: Journal, run_ids: Sequence[str],
                   metrics: Sequence[str]) -> dict[str, Any]:
    """``outrig metrics`` for people: the summary of each run of the chains, kept ones
    where nothing changed (:func:`load_summary`)."""
    doc: dict[str, Any] = {"metrics": [], "lines_parsed": 0, "runs": []}
    summaries: list[RunSummary] = []
    for index, chain in enumerate(select_chains(journal, run_ids)):
        for run_id in chain:
            summary, lines = load_summary(journal, run_id)
            doc["lines_parsed"] += lines
            summaries.append(summary)
            doc["runs"].append({
                "run_id": summary.run_id, "host": summary.host,
                "playbook": summary.record.get("playbook"), "chain": index,
                "mirror": summary.mirror, "points": []})
    names = list(dict.fromkeys(n for run in summaries for n in run.names))
    _check_metrics(metrics, names)
    doc["metrics"] = names = list(metrics) or names
    _say_empty(reporter, summaries)
    reporter.lines(summary_lines(summaries, names, reporter.width))
    reporter.out.flush()
    return doc


# A value that is not a finite number, as ``metrics --json`` writes it: JSON has no NaN or
# Infinity (jq and JSON.parse refuse Python's bare NaN), so these three strings, the names
# JavaScript's String() gives them; every finite value stays a number.
NOT_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def json_value(value: float) -> float | str:
    """A metric value for JSON: itself, or ``"NaN"``, ``"Infinity"``, ``"-Infinity"``."""
    return value if math.isfinite(value) else NOT_FINITE[repr(value)]


def json_points(run: RunData, names: Sequence[str]) -> list[dict[str, Any]]:
    """The run's points for ``metrics --json`` (a value that is not finite as a string)."""
    return [{"process": p, "step": s, "t": t,
             "values": {n: json_value(v) for n, v in zip(names, values, strict=True)
                        if v is not None}}
            for p, s, t, values in run.rows(names)
            if any(v is not None for v in values)]


def _dumps(doc: Any) -> str:
    import json

    return json.dumps(doc, default=str, allow_nan=False)


def csv_text(runs: Sequence[RunData], names: Sequence[str]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["run_id", "host", "process", "step", "time_utc", "t", *names])
    for run in runs:
        for process, step, t, values in run.rows(names):
            if all(v is None for v in values):
                continue
            writer.writerow([run.run_id, run.host, process, step,
                             "" if t is None else utc_text(t)[:19],
                             "" if t is None else f"{t:.3f}",
                             *("" if v is None else repr(v) for v in values)])
    return buffer.getvalue()


def summary_lines(runs: Sequence[RunSummary], names: Sequence[str], width: int) -> list[str]:
    """For people: per run its steps and one row per metric (points, first, last, min,
    max); the export itself is --json or --csv."""
    from outrig.text.layout import columns

    out: list[str] = []
    for run in runs:
        if out:
            out.append("")
        first_last = run.span
        span = (f"steps {first_last[0]}–{first_last[1]}" if first_last
                else "no metric records yet")
        out.append(f"run {run.run_id} ({run.record.get('playbook')}) on {run.host}: "
                   f"{run.count} records, {span}")
        rows = []
        for name in names:
            stats = run.stats.get(name)
            if stats:
                count, first, last, low, high = stats
                rows.append([name, str(int(count)), f"{first:.4g}", f"{last:.4g}",
                             f"{low:.4g}", f"{high:.4g}"])
        if rows:
            header, lines = columns(["metric", "points", "first", "last", "min", "max"], rows)
            out += ["  " + header, *("  " + line for line in lines)]
    out.append("(every point: --json or --csv)")
    return [line if len(line) <= width else line[: width - 1] + "…" for line in out]


# ----------------------------------------------------------------------------- plot


@bulk
def plot(reporter: Reporter, run_ids: Sequence[str], *, metrics: Sequence[str] = (),
         journal: Journal | None = None, width: int | None = None,
         colour: bool | None = None, log: bool = False) -> list[str]:
    """``outrig plot``: the curves of ``metrics`` (default: loss, full_acc and eal, those
    there are) of the runs and their chains, in the terminal (:mod:`outrig.metrics.termplot`);
    ``log``: on a log scale."""
    journal = journal or Journal()
    groups, _ = load_chains(journal, run_ids)
    runs = [run for group in groups for run in group]
    names = list(dict.fromkeys(n for run in runs for n in run.names))
    _check_metrics(metrics, names)
    chosen = list(metrics) or [m for m in DEFAULT_PLOT if m in names] or names[:1]
    _say_empty(reporter, runs)
    curves = [(metric, [Curve(run.label(), metric, run.pairs(metric)) for run in runs])
              for metric in chosen]
    if not reporter.json_mode:  # served beside the trainer's estimate, on its chart
        for metric, row in curves:
            if metric == "train/eal" and SERVED not in chosen:
                row += [Curve(f"{run.label()} served", SERVED, run.pairs(SERVED))
                        for run in runs if SERVED in run.names]
    if reporter.json_mode:
        reporter.emit_json({"curves": [
            {"metric": metric, "run_id": run.run_id, "host": run.host,
             "steps": [s for s, _ in curve.rows], "values": [v for _, v in curve.rows]}
            for metric, row in curves for run, curve in zip(runs, row, strict=True)]})
        return []
    lines = plot_lines(curves, width or terminal_width(reporter.out),
                       colour=reporter.colour if colour is None else colour, log=log)
    if not chosen:
        lines = ["nothing to plot yet"]
    for line in lines:
        reporter.out.write(line + "\n")
    reporter.out.flush()
    return lines


# ----------------------------------------------------------------------------- report


def asset(name: str) -> str:
    return (resources.files("outrig.metrics") / "report_assets" / name).read_text(encoding="utf-8")


def watch_events(journal: Journal, run_ids: set[str]) -> dict[str, list[dict[str, Any]]]:
    """The events of every saved ``watch`` (``<journal>/watches/``) about these runs."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted((journal.root / WATCH_DIR).glob("*.json")):
        data = read_json(path)
        for payload in (data or {}).get("events") or [] if isinstance(data, dict) else []:
            if isinstance(payload, dict) and payload.get("run_id") in run_ids:
                out.setdefault(str(payload["run_id"]), []).append(payload)
    return out


def plan_secrets(runs: Sequence[RunData]) -> list[str]:
    """The values (from this shell) of the secrets the runs' plans name."""
    names = {str(s) for run in runs for s in ((run.record.get("plan") or {}).get("secrets")
                                              or [])}
    return ordered(v for n in names if (v := os.environ.get(n)))


def default_output(run_ids: Sequence[str]) -> Path:
    return Path(f"outrig-report-{run_ids[0]}.html")


@bulk
def write_report(reporter: Reporter, run_ids: Sequence[str], *, output: str | None = None,
                 journal: Journal | None = None, now: float | None = None,
                 log: bool = False) -> dict[str, Any]:
    """``outrig report``: the HTML file (:mod:`outrig.metrics.report`); what it holds, returned
    (and printed with ``--json``)."""
    journal = journal or Journal()
    path = Path(output) if output else default_output([r for r in run_ids if r] or ["run"])
    _check_writable(path)
    groups, parsed = load_chains(journal, run_ids)
    runs = [run for group in groups for run in group]
    ids = {run.run_id for run in runs}
    evaluations = {rid: journal.evaluations(run_id=rid) for rid in ids}
    document = report_document(groups, now=time.time() if now is None else now,
                               evaluations=evaluations, watch_events=watch_events(journal, ids),
                               secrets=plan_secrets(runs), log_scale=log)
    annotate_costs(journal, [r for r in document.get("runs") or [] if not r.get("cost")],
                   time.time())  # a run on a box rented through outrig: its share so far
    html = render_html(document, uplot_js=asset("uPlot.iife.min.js"),
                       uplot_css=asset("uPlot.min.css"), page_js=asset("report.js"),
                       page_css=asset("report.css"))
    _write(path, html)
    size = len(html.encode())
    summary: dict[str, Any] = {"report": str(path), "bytes": size, "runs": sorted(ids),
               "charts": len(document["charts"]), "events": len(document["events"]),
               "points": sum(len(run.points) for run in runs), "lines_parsed": parsed}
    if reporter.json_mode:
        reporter.emit_json(summary)
    else:
        _say_empty(reporter, runs)
        reporter.success(f"wrote {path} ({size // 1024} KB): "
                         f"{len(runs)} run(s), {summary['charts']} chart(s) of metrics, "
                         f"{summary['events']} event(s); open it in a browser (it needs no "
                         "network)")
    return summary


def _refused(path: Path, exc: OSError) -> Exception:
    if exc.errno in BAD_WRITE:
        return ConfigError(f"-o {path}: cannot write there ({exc.strerror or exc}); give a "
                           "file in a folder you can write (e.g. -o ./report.html). Nothing "
                           "was written.")
    return LocalWriteError(f"writing the report {path} failed ({exc.strerror or exc}); free "
                           "space there or give another -o, then run report again.")


def _check_writable(path: Path) -> None:
    """Refuse an -o that cannot be written before any work (exit 2)."""
    if path.is_dir():
        raise ConfigError(f"-o {path}: that is a folder; give a file name (e.g. -o "
                          f"{path / 'report.html'}). Nothing was written.")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ConfigError(f"-o {path}: the folder {folder} does not exist; make it or give "
                          "another file. Nothing was written.")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"-o {path}: the folder {folder} is not writable by this user; "
                          "give a file in a folder you can write (e.g. -o ./report.html). "
                          "Nothing was written.")


def _write(path: Path, text: str) -> None:
    """Atomically (temp file + rename), 0600 when new: a report holds the commands and
    the log's paths."""
    try:
        atomic_write_text(path, text)
    except OSError as exc:
        raise _refused(path, exc) from None
