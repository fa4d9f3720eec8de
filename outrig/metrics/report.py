"""``outrig report``: one self-contained HTML file of one or more runs (pure: no I/O).

What it holds: each run's identity (playbook, host, GPUs, the commands of its processes),
the curves of every metric over step and over time (metrics of one family, such as the
per-position accuracies or the learning rates, share a chart), the GPU memory and
utilisation ``status`` and ``watch`` sampled, and a timeline of events (deploy, ready,
checkpoints, suspect/dead, migrate and resume, ``evaluate`` results with the acceptance per
position). Several runs overlay on the same axes, aligned by step; a migrated run and its
successor form one chain, whose time axis runs from the chain's first deploy, so the curve
goes on across the move.

Why one file with everything inlined: a report is mailed, attached to an issue, opened on
a laptop on a train. The charts are drawn by uPlot (MIT, 50 KB, no dependencies; vendored
in ``outrig/metrics/report_assets/`` with its licence, docs/logs-and-status.md says why), inlined
with the data as JSON; nothing is fetched when it is opened. Every text from the box or the
journal reaches the page through ``textContent``, never as markup, and the JSON is escaped
so that no ``</script>`` in a log line can end its element.

The page sets ``window.outrigReport`` to what it drew (each chart's series and points,
the events, any error), which the browser test reads.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Sequence
from typing import Any

from outrig.journal import utc_text
from outrig.metrics.series import (
    RunData,
    drawable,
    left_out_note,
    metric_names,
    metric_order,
    spread,
    thin,
)
from outrig.redaction import redact_text

POINTS_PER_SERIES = 1500  # thinned to this many per run and metric (first and last kept)
FAMILIES = (  # (pattern, chart title): metrics matching one pattern share a chart
    (re.compile(r"^train/position_\d+_acc$"), "train/position_k_acc: accuracy per position"),
    (re.compile(r"^val/position_\d+_acc_epoch$"),
     "val/position_k_acc_epoch: validation accuracy per position"),
    (re.compile(r"^lr/"), "lr: learning rates"),
    # what training estimates and what vLLM accepts, on one chart (outrig/evaluation/served.py)
    (re.compile(r"^(train/eal|served/acceptance_length)$"), "train/eal"),
    (re.compile(r"^profile/memory_mb/"), "profile/memory_mb: memory per phase (MB)"),
    (re.compile(r"^profile/\w+_ms$"), "profile/*_ms: time per phase (ms)"),
)


def chart_groups(names: Sequence[str]) -> list[dict[str, Any]]:
    """The charts: one per metric, except that a family (:data:`FAMILIES`) shares one;
    in :func:`outrig.metrics.series.metric_order`."""
    charts: list[dict[str, Any]] = []
    families: dict[str, dict[str, Any]] = {}
    for name in sorted(names, key=metric_order):
        title = next((t for pattern, t in FAMILIES if pattern.search(name)), None)
        if title is None:
            charts.append({"title": name, "metrics": [name]})
        elif title in families:
            families[title]["metrics"].append(name)
        else:
            families[title] = {"title": title, "metrics": [name]}
            charts.append(families[title])
    for index, chart in enumerate(charts):
        chart["id"] = f"c{index}"
    return charts


def _origin(group: Sequence[RunData]) -> float | None:
    """Where a chain's time axis starts: its first run's deploy, else its first point."""
    created = group[0].record.get("created")
    if isinstance(created, (int, float)):
        return float(created)
    times = [p.t for run in group for p in run.points if p.t is not None]
    return min(times) if times else None


def _hours(t: float | None, origin: float | None) -> float | None:
    if t is None or origin is None:
        return None
    return round((t - origin) / 3600.0, 6)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(float(value)) else None


def identity(run: RunData, secrets: Sequence[str]) -> dict[str, Any]:
    """Who the run is: playbook, host, GPUs and each process's command (secret values
    this shell has replaced by ``***``)."""
    record = run.record
    plan: dict[str, Any] = record["plan"] if isinstance(record.get("plan"), dict) else {}
    facts: dict[str, Any] = plan["facts"] if isinstance(plan.get("facts"), dict) else {}
    processes = []
    for proc in plan.get("processes") or []:
        if not isinstance(proc, dict):
            continue
        argv = [str(a) for a in proc.get("argv") or []]
        gpus: list[int] = [g for g in proc.get("gpus") or [] if isinstance(g, int)]
        processes.append({"name": str(proc.get("name")),
                          "gpus": gpus,
                          "command": redact_text(shlex.join(argv), secrets),
                          "cwd": proc.get("cwd")})
    totals = {g.get("i"): g.get("total") for sample in run.gpu for g in sample["gpus"]
              if isinstance(g, dict)}
    return {
        "run_id": run.run_id, "label": run.label(), "host": run.host,
        "playbook": record.get("playbook"), "status": record.get("status"),
        "created": _number(record.get("created")), "ready_at": _number(record.get("ready_at")),
        "gpu_count": facts.get("gpu_count"), "gpu_memory_mib": facts.get("gpu_memory_mib"),
        "gpus_used": sorted({g for p in processes for g in p["gpus"] or []}),
        "gpu_totals": {str(k): v for k, v in sorted(totals.items(), key=lambda kv: str(kv[0]))},
        "processes": processes, "moved_to": record.get("moved_to"),
        "migrated_from": record.get("migrated_from"), "fenced": record.get("fenced"),
        "mirror": run.mirror, "points": len(run.table),
        "test_mode": record.get("test_mode"),
        "cost": record.get("cost") if isinstance(record.get("cost"), dict) else None,
    }


def _series(run: RunData, metric: str, origin: float | None) -> dict[str, Any]:
    """One metric of one run as the page draws it: thinned, and without the values no
    chart can draw (:func:`outrig.metrics.series.drawable`), which ``note`` lists instead."""
    every = run.series(metric)
    note = left_out_note([(s, v) for s, _, v in every])
    rows = thin([r for r in every if drawable(r[2])] if note else every, POINTS_PER_SERIES)
    out: dict[str, Any] = {"s": [r[0] for r in rows],
                           "t": [_hours(t, origin) for t in spread([r[1] for r in rows])],
                           "v": [r[2] for r in rows]}
    if note:
        out["note"] = note
    return out


def _gpu_series(run: RunData, origin: float | None) -> dict[str, dict[str, list[Any]]]:
    out: dict[str, dict[str, list[Any]]] = {}
    for sample in thin(run.gpu, POINTS_PER_SERIES):
        x = _hours(float(sample["t"]), origin)
        for gpu in sample["gpus"]:
            if not isinstance(gpu, dict):
                continue
            entry = out.setdefault(str(gpu.get("i")), {"t": [], "used": [], "util": []})
            entry["t"].append(x)
            entry["used"].append(_number(gpu.get("used")))
            entry["util"].append(_number(gpu.get("util")))
    return out


def _event(t: Any, run: RunData, origin: float | None, kind: str, text: str,
           step: int | None = None) -> dict[str, Any] | None:
    stamp = _number(t)
    if stamp is None:
        return None
    return {"t": stamp, "x": _hours(stamp, origin), "when": utc_text(stamp),
            "run_id": run.run_id, "kind": kind, "text": text, "step": step}


NO_TIME = "no time printed"


def timeline_order(event: dict[str, Any]) -> tuple[int, float]:
    """Events with a time by their time; then those whose line had none, in the order their
    log printed them (the sort is stable), which is their step's order too."""
    if event["t"] is not None:
        return 0, float(event["t"])
    return 1, 0.0


def _fmt(value: Any) -> str:
    number = _number(value)
    return "-" if number is None else f"{number:.3g}"


def run_events(run: RunData, origin: float | None, evaluations: Sequence[dict[str, Any]],
               watch_events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The timeline of one run: from its journal record (deploy, ready, stop, move,
    fencing), its log (checkpoints, resume, epochs, interrupts), ``watch`` (suspect, dead,
    migrating, resumed, ...) and ``evaluate``."""
    record = run.record
    found: list[dict[str, Any] | None] = [
        _event(record.get("created"), run, origin, "deploy",
               f"deployed {record.get('playbook')} on {run.host}"),
        _event(record.get("ready_at"), run, origin, "ready", "every process ready"),
        _event(record.get("stopped_at"), run, origin, "stopped", "stopped"),
        _event(record.get("ended_at"), run, origin, "ended",
               f"ended ({record.get('status')})"),
    ]
    moved = record.get("moved_to")
    if isinstance(moved, dict):
        found.append(_event(moved.get("at"), run, origin, "migrate",
                            f"moved to {moved.get('host')} as {moved.get('run_id')}"))
    fenced = record.get("fenced")
    if isinstance(fenced, dict):
        found.append(_event(fenced.get("at"), run, origin, "fenced",
                            "its processes confirmed stopped on the old box"))
    for event in run.events:
        # a trainer that prints no times still marks its checkpoints and epochs: kept, in
        # the log's order, saying so (they were dropped: 21 such events, 2 shown)
        found.append(_event(event.t, run, origin, event.kind, event.text, event.step)
                     if event.t is not None else
                     {"t": None, "x": None, "when": NO_TIME, "run_id": run.run_id,
                      "kind": event.kind, "text": event.text, "step": event.step})
    for payload in watch_events:
        why = payload.get("why") or payload.get("to") or ""
        found.append(_event(payload.get("time"), run, origin, str(payload.get("event")),
                            f"watch: {payload.get('event')}" + (f": {why}" if why else "")))
    for ev in evaluations:
        per = " ".join(_fmt(p) for p in ev.get("per_position") or []) or "-"
        checkpoint = (ev.get("checkpoint") or {}) if isinstance(ev.get("checkpoint"), dict) \
            else {}
        found.append(_event(ev.get("at"), run, origin, "evaluate",
                            f"evaluate {checkpoint.get('path') or ev.get('method') or ''}: "
                            f"acceptance length {_fmt(ev.get('acceptance_length'))}, "
                            f"per position {per}, speedup {_fmt(ev.get('speedup'))}×",
                            checkpoint.get("step") if isinstance(checkpoint.get("step"), int)
                            else None))
    return [e for e in found if e is not None]


def report_document(groups: Sequence[Sequence[RunData]], *, now: float,
                    evaluations: dict[str, list[dict[str, Any]]] | None = None,
                    watch_events: dict[str, list[dict[str, Any]]] | None = None,
                    secrets: Sequence[str] = (), log_scale: bool = False) -> dict[str, Any]:
    """The report's data (what the page draws; also ``report --json``). ``log_scale``: the
    metric charts' y axes on a log10 scale (values ≤ 0 left out, said under each chart)."""
    evaluations = evaluations or {}
    watch_events = watch_events or {}
    runs, series, gpu, events, evals = [], {}, {}, [], []
    names: list[str] = []
    for index, group in enumerate(groups):
        origin = _origin(group)
        for run in group:
            names += [n for n in metric_names(run.points) if n not in names]
            runs.append({**identity(run, secrets), "group": index, "origin": origin})
            gpu[run.run_id] = _gpu_series(run, origin)
            events += run_events(run, origin, evaluations.get(run.run_id) or [],
                                 watch_events.get(run.run_id) or [])
            for ev in evaluations.get(run.run_id) or []:
                per = [_number(p) for p in ev.get("per_position") or []]
                if per:
                    evals.append({"run_id": run.run_id, "at": utc_text(ev.get("at")),
                                  "label": f"{run.run_id} {ev.get('eval_id') or ''}".strip(),
                                  "per_position": per,
                                  "acceptance_length": _number(ev.get("acceptance_length"))})
    charts = chart_groups(names)
    for run_group in groups:
        for run in run_group:
            origin = next(r["origin"] for r in runs if r["run_id"] == run.run_id)
            series[run.run_id] = {n: _series(run, n, origin) for n in names}
    for chart in charts:  # what a chart leaves out, said under it
        notes = [f"{run['run_id']} {metric}: {s['note']}" for run in runs
                 for metric in chart["metrics"]
                 if (s := series[run["run_id"]].get(metric)) and s.get("note")]
        if log_scale:
            notes += [f"{run['run_id']} {metric}: {below} value(s) ≤ 0 not drawn on the log "
                      "scale" for run in runs for metric in chart["metrics"]
                      if (below := sum(1 for v in (series[run["run_id"]].get(metric) or {})
                                       .get("v", []) if v <= 0))]
        if notes:
            chart["note"] = "; ".join(notes)
    events.sort(key=timeline_order)
    title = "outrig report: " + ", ".join(r["run_id"] for r in runs)
    return {"title": title, "generated": utc_text(now), "runs": runs, "charts": charts,
            "series": series, "gpu": gpu, "events": events, "evaluations": evals,
            "log_scale": log_scale}


def _json_for_script(data: Any) -> str:
    """JSON that cannot end its ``<script>`` element early (``<`` as ``\\u003c``)."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_html(document: dict[str, Any], *, uplot_js: str, uplot_css: str,
                page_js: str, page_css: str) -> str:
    """The page: the document as JSON, uPlot and the page's own script and style inlined."""
    title = document["title"].replace("&", "&amp;").replace("<", "&lt;")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n"
        f"<title>{title}</title>\n"
        f"<style>{uplot_css}</style>\n<style>{page_css}</style>\n</head><body>\n"
        "<main id=\"report\"><noscript>This report draws its charts with JavaScript; "
        "the data is in the outrig-data element of this file.</noscript></main>\n"
        "<script type=\"application/json\" id=\"outrig-data\">"
        f"{_json_for_script(document)}</script>\n"
        f"<script>{uplot_js}</script>\n<script>{page_js}</script>\n</body></html>\n")
