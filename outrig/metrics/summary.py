"""A run's summary (``outrig metrics`` for people), kept beside its series.

Why: with nothing new since the last call, ``metrics`` printed the same table after reading
and merging every point again (a million points: several CPU seconds above the cost of
reading the store). The summary's figures (per metric its count, first, last, min and max;
the run's record count and step span) depend only on the series file and the run's served
evaluations, so they are kept in ``summary.json`` under the key of both: the points file's
inode, size and modification time (the store only appends, cuts or rewrites it, and each of
those changes the key) and the served points themselves (a few). A key that matches is the
table without reading a point; any other is computed from the points and kept again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from outrig.journal import atomic_write_json, read_json
from outrig.metrics.series import Point, RunData, RunRecord
from outrig.metrics.store import MetricStore

SUMMARY_FILE = "summary.json"
VERSION = 1


@dataclass
class RunSummary(RunRecord):
    """What the summary table shows of one run."""

    record: dict[str, Any]
    names: list[str] = field(default_factory=list)
    count: int = 0
    span: tuple[int, int] | None = None
    stats: dict[str, list[float]] = field(default_factory=dict)  # n, first, last, min, max
    mirror: str | None = None


def summarize(run: RunData) -> RunSummary:
    """The summary of a run's points (their finite values; the merged count)."""
    stats: dict[str, list[float]] = {}
    for name in run.names:
        values = run.values(name)
        if values:
            stats[name] = [len(values), values[0], values[-1], min(values), max(values)]
    return RunSummary(record=run.record, names=list(run.names), count=run.count(),
                      span=run.step_span(), stats=stats, mirror=run.mirror)


def summary_key(store: MetricStore, served: list[Point]) -> list[Any]:
    """What the summary depends on: the points file as it is now, and the served points."""
    try:
        info = store.path("points").stat()
        points: list[Any] = [info.st_ino, info.st_size, info.st_mtime_ns]
    except FileNotFoundError:
        points = []
    served_rows = [[p.process, p.step, p.t, sorted(p.values.items())] for p in served]
    return [VERSION, points, json.loads(json.dumps(served_rows, default=str))]


def cached_summary(store: MetricStore, key: list[Any], record: dict[str, Any],
                   mirror: str | None) -> RunSummary | None:
    """The kept summary when its key is ``key``; None when there is none or it is stale."""
    try:
        kept = read_json(store.root / SUMMARY_FILE)
    except OSError:
        return None
    if not isinstance(kept, dict) or kept.get("key") != key:
        return None
    try:
        span = kept.get("span")
        return RunSummary(record=record, names=[str(n) for n in kept["names"]],
                          count=int(kept["count"]),
                          span=(int(span[0]), int(span[1])) if span else None,
                          stats={str(k): [float(x) for x in v]
                                 for k, v in dict(kept["stats"]).items()},
                          mirror=mirror)
    except (KeyError, TypeError, ValueError, IndexError):
        return None  # damaged: computed again and kept over it


def keep_summary(store: MetricStore, key: list[Any], summary: RunSummary) -> None:
    """Keep ``summary`` under ``key`` (a journal that cannot be written only loses the
    shortcut: the table was already computed)."""
    try:
        atomic_write_json(store.root / SUMMARY_FILE, {
            "key": key, "names": summary.names, "count": summary.count,
            "span": list(summary.span) if summary.span else None, "stats": summary.stats})
    except OSError:
        pass
