"""``outrig plot``: a run's curves in the terminal (pure: text in, lines out).

With colour (a terminal, or ``FORCE_COLOR``), each metric is a chart drawn by plotext
(braille dots, one colour per run) as wide as the terminal. Without colour (a pipe, a log
file, ``NO_COLOR``), several curves in one monochrome chart cannot be told apart, so each
metric becomes what can: a line with its sparkline and last value per run, then a table of
evenly spread steps with each run's value, which fits 80 columns.

plotext is imported only here, when a chart is drawn (start-up of every other command stays
as it was); it is pure Python with no dependencies of its own.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from outrig.metrics.series import drawable, left_out_note, sparkline, thin

TABLE_ROWS = 12  # steps shown per metric without colour
CHART_HEIGHT = 16  # lines per chart
MIN_CHART_WIDTH = 40


@dataclass
class Curve:
    """One run's values of one metric: ``(step, value)`` rows in step order."""

    label: str
    metric: str
    rows: list[tuple[int, float]]


def _num(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    magnitude = abs(value)
    if magnitude and (magnitude < 1e-3 or magnitude >= 1e5):
        return f"{value:.2e}"
    return f"{value:.4g}"


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def positive(rows: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    """The rows a log scale can draw: finite values above 0."""
    return [(s, v) for s, v in rows if drawable(v) and v > 0]


def log_note(rows: Sequence[tuple[int, float]]) -> str | None:
    """What a log scale leaves out of a curve, said under it."""
    left = sum(1 for _, v in rows if drawable(v) and v <= 0)
    return f"{left} value(s) ≤ 0 not drawn on the log scale" if left else None


def table_lines(metric: str, curves: Sequence[Curve], width: int,
                log: bool = False) -> list[str]:
    """One metric without colour: a line per run (``[k]``, its label, sparkline, last
    value, steps), then a table of :data:`TABLE_ROWS` evenly spread steps with a column
    ``[k]`` per run (run ids are long and alike: the key keeps the columns narrow).
    ``log``: the sparkline follows log10 of the values above 0 (the table's numbers stay)."""
    out = [_fit(metric + (" (log scale)" if log else ""), width)]
    label_width = min(max(len(c.label) for c in curves), max(8, width // 3))
    for key, curve in enumerate(curves, 1):
        head = f"  [{key}] {curve.label[:label_width]:<{label_width}}  "
        if not curve.rows:
            out.append(_fit(head + "no values", width))
            continue
        spark_width = max(4, min(24, width - len(head) - 30))
        first, last = curve.rows[0], curve.rows[-1]
        drawn = ([math.log10(v) for _, v in positive(curve.rows)] if log
                 else [v for _, v in curve.rows])
        out.append(_fit(head + f"{sparkline(drawn, spark_width)}  "
                        f"last {_num(last[1])}  steps {first[0]}–{last[0]}", width))
    steps = sorted({s for c in curves for s, _ in c.rows})
    shown = thin(steps, TABLE_ROWS)
    if not shown:
        return out
    columns = max(1, min(len(curves), (width - 12) // 11))
    values = [dict(c.rows) for c in curves[:columns]]
    out.append(f"  {'step':>8}" + "".join(f" {f'[{k}]':>10}" for k in range(1, columns + 1)))
    for step in shown:
        out.append(f"  {step:>8}" + "".join(f" {_num(v.get(step)):>10}" for v in values))
    if len(curves) > columns:
        out.append(_fit(f"  ({len(curves) - columns} more run(s) not shown at this width)",
                        width))
    return out


def envelope(rows: Sequence[tuple[int, float]], buckets: int) -> list[tuple[int, float]]:
    """At most ``2 × buckets + 2`` rows that draw as ``rows`` do on a chart ``buckets`` dots
    wide: the rows cut into ``buckets`` runs in step order, each run's lowest and highest
    kept (in step order, and the first and last row), so a spike survives where an even
    stride would skip it. plotext draws every point it is given, and a terminal shows no
    more than two per dot."""
    if buckets <= 0 or len(rows) <= 2 * buckets:
        return list(rows)
    size = len(rows) / buckets
    out: list[tuple[int, float]] = []
    for i in range(buckets):
        run = rows[int(i * size):max(int(i * size) + 1, int((i + 1) * size))]
        low = min(range(len(run)), key=lambda k: run[k][1])
        high = max(range(len(run)), key=lambda k: run[k][1])
        keep = {low, high} | ({0} if i == 0 else set()) | (
            {len(run) - 1} if i == buckets - 1 else set())  # the ends stay where they are
        out += [run[k] for k in sorted(keep)]
    return out


def chart_lines(metric: str, curves: Sequence[Curve], width: int,
                height: int = CHART_HEIGHT, log: bool = False) -> list[str]:
    """One metric as a plotext chart, in colour, ``width`` columns wide; ``log``: the y axis
    on a log10 scale (a loss falling over decades stays readable at its end)."""
    import plotext as plt  # type: ignore[import-untyped]

    plt.clear_figure()
    plt.plotsize(max(MIN_CHART_WIDTH, width), height)
    plt.theme("pro")
    plt.title(metric + (" (log scale)" if log else ""))
    plt.xlabel("step")
    if log:
        plt.yscale("log")
    notes = []
    for curve in curves:
        kept = positive(curve.rows) if log else [(s, v) for s, v in curve.rows if drawable(v)]
        rows = envelope(kept, 2 * width)
        note = "; ".join(n for n in (left_out_note(curve.rows),
                                     log_note(curve.rows) if log else None) if n)
        if note:
            notes += textwrap.wrap(f"{curve.label}: {note}", max(20, width - 2),
                                   initial_indent="  ", subsequent_indent="    ")
        if rows:
            plt.plot([s for s, _ in rows], [v for _, v in rows],
                     label=curve.label, marker="braille")
    text: str = plt.build()
    plt.clear_figure()
    return text.rstrip("\n").split("\n") + notes


def plot_lines(curves_by_metric: Sequence[tuple[str, Sequence[Curve]]], width: int, *,
               colour: bool, log: bool = False) -> list[str]:
    """Every metric asked for, a chart each (colour) or a table each (no colour); ``log``:
    on a log scale."""
    out: list[str] = []
    for metric, curves in curves_by_metric:
        if out:
            out.append("")
        # plotext computes a range as max - min: a value near ±1e308 overflows it (it
        # raised OverflowError); such values are left out of the chart and named under it
        shown = [c for c in curves
                 if len(positive(c.rows) if log else [v for _, v in c.rows if drawable(v)])
                 >= 2]
        if colour and shown and width >= MIN_CHART_WIDTH:
            out += chart_lines(metric, shown, width, log=log)
        else:
            out += table_lines(metric, curves, width, log=log)
    return out
