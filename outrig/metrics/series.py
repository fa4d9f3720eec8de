"""A run's metrics as time series: the trainer's metric lines, parsed incrementally (pure).

:mod:`outrig.progress` reads the *latest* metric line of a log tail for ``status``;
here every metric record of a log becomes a point (step, time, values), so that ``outrig metrics``,
``plot`` and ``report`` can draw the whole run without the trainer being wired to anything.
The bytes come from the local mirror (:mod:`outrig.logs.mirror`) and from the log tails
``status`` and ``watch`` receive; where they are kept, with the cursor that makes a later
call parse only new lines, is :mod:`outrig.metrics.store`.

Why the parser works on bytes and holds the last record back: a rich record is wrapped over
several lines, so a chunk that ends at a line break may still end inside a record. Only
complete lines are looked at, and the last record of a chunk is consumed only when it is a
complete metric record (``global_step=`` is the last key speculators prints) or when the
chunk is final (an archived mirror segment); otherwise the cursor stays at its first byte
and the next call reads it again with its continuation.

Time: rich prints ``[HH:MM:SS]`` in the box's local time, and leaves it blank when it has
not changed. A time of day says neither the date nor the box's time zone, so it is placed
against a reference on this workstation's clock (:class:`Clock`): the first one after the
run's start (within the hour: time zones differ by whole hours), each later one after the
previous. A log tail from ``status`` is placed before the moment it arrived instead.

Validation records (``val/loss_epoch=..., epoch=0``, without ``global_step``) become points
at the last training step seen in the same log. Lines that mark what happened (a checkpoint
saved, a resume, an epoch started or completed, an interrupt) become events.
"""

from __future__ import annotations

import functools
import gc
import itertools
import math
import operator
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from outrig.progress import (
    EPOCH_RE,
    HEADER_RE,
    PAIR_RE,
    PATH_COLUMN_RE,
    STEP_KEY,
    join_pieces,
    parse_metric_line,
)

LOSS = "train/loss"
DAY = 86400.0
HOUR = 3600.0
BACKSTEP = 300.0  # a box clock stepping back this much (NTP) is not a new day
TIME_RE = re.compile(rb"^\s*\[(?:[^\]]*\s)?(\d{1,2}):(\d{2}):(\d{2})(?:[.,]\d+)?\]")
CHECKPOINT_RE = re.compile(r"(?:Interrupt c|C)heckpoint saved to '?(?P<path>[^'\s]+)'?")
RESUME_RE = re.compile(r"Resuming (?:mid-epoch from|training on) (?P<what>.+?)\.?$")
INTERRUPT_RE = re.compile(r"Received SIGTERM|Training interrupted")
SPARKS = "▁▂▃▄▅▆▇█"
FLOAT = frozenset({float})


@contextmanager
def no_collection() -> Iterator[None]:
    """The cyclic garbage collector paused while a run's points become objects and
    columns: a million points are millions of new dictionaries, tuples and iterators, none in
    a cycle, and the collector walked all of them again and again as they were made (a third
    of reading the store, five sixths of turning the values into columns). Restored after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass
class Point:
    """One metric record: the process that printed it, its step, its time (seconds since
    the epoch, None when it cannot be placed) and its values; ``source`` is ``log`` (the
    mirror) or ``status`` (a status or watch log tail)."""

    process: str
    step: int
    t: float | None
    values: dict[str, float]
    source: str = "log"

    def to_json(self) -> dict[str, Any]:
        return {"p": self.process, "s": self.step, "t": self.t, "v": self.values,
                "src": self.source}

    @classmethod
    def from_json(cls, data: Any) -> Point | None:
        if not isinstance(data, dict) or not isinstance(data.get("s"), int):
            return None
        values = data.get("v")
        if not isinstance(values, dict):
            return None
        t = data.get("t")
        if not set(map(type, values.values())) <= FLOAT:  # the usual row: all floats
            values = {str(k): float(v) for k, v in values.items()
                      if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return cls(process=str(data.get("p")), step=int(data["s"]),
                   t=float(t) if isinstance(t, (int, float)) else None,
                   values=values, source=str(data.get("src") or "log"))


@dataclass
class Event:
    """A line that marks a moment of the run: ``checkpoint`` (with ``path``), ``resume``,
    ``epoch`` (started/completed), ``interrupt``."""

    process: str
    kind: str
    step: int | None
    t: float | None
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"p": self.process, "kind": self.kind, "s": self.step, "t": self.t,
                "text": self.text}

    @classmethod
    def from_json(cls, data: Any) -> Event | None:
        if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
            return None
        step, t = data.get("s"), data.get("t")
        return cls(process=str(data.get("p")), kind=data["kind"],
                   step=step if isinstance(step, int) else None,
                   t=float(t) if isinstance(t, (int, float)) else None,
                   text=str(data.get("text") or ""))


@dataclass
class Clock:
    """Where the box's times of day fall on this workstation's clock. ``ref``: the first
    time of day is placed in the hour after it (the run's start); then ``last_t`` and
    ``last_tod`` (seconds into the box's day) place each next one after the previous.
    ``step``: the last training step seen (validation records are put there)."""

    ref: float | None = None
    last_t: float | None = None
    last_tod: float | None = None
    step: int | None = None

    def place(self, tod: float) -> float | None:
        if self.last_t is not None and self.last_tod is not None:
            delta = (tod - self.last_tod) % DAY
            if delta > DAY - BACKSTEP:
                delta -= DAY
            t: float | None = self.last_t + delta
        elif self.ref is not None:
            t = self.ref + (tod - self.ref) % HOUR
        else:
            return None
        self.last_t, self.last_tod = t, tod
        return t

    def to_json(self) -> dict[str, Any]:
        return {"ref": self.ref, "last_t": self.last_t, "last_tod": self.last_tod,
                "step": self.step}

    @classmethod
    def from_json(cls, data: Any, ref: float | None = None) -> Clock:
        if not isinstance(data, dict):
            return cls(ref=ref)

        def num(key: str) -> float | None:
            value = data.get(key)
            return float(value) if isinstance(value, (int, float)) else None

        step = data.get("step")
        return cls(ref=num("ref") if num("ref") is not None else ref, last_t=num("last_t"),
                   last_tod=num("last_tod"), step=step if isinstance(step, int) else None)


@dataclass
class Parsed:
    """What one chunk gave: points, events, how many bytes were consumed (the cursor moves
    by that much) and how many lines were looked at."""

    points: list[Point] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    consumed: int = 0
    lines: int = 0


@dataclass
class _Record:
    start: int
    pieces: list[str]
    tod: float | None


def _time_of_day(line: bytes) -> float | None:
    match = TIME_RE.match(line)
    if match is None:
        return None
    hours, minutes, seconds = (int(g) for g in match.groups())
    if hours > 23 or minutes > 59 or seconds > 60:
        return None
    return float(hours * 3600 + minutes * 60 + seconds)


def _records(data: bytes) -> tuple[list[_Record], int, int]:
    """The records of the complete lines of ``data`` (as :func:`outrig.progress.
    logical_lines` splits them, with each one's first byte and header time), the end of the
    last complete line, and how many lines there were."""
    end = data.rfind(b"\n") + 1
    records: list[_Record] = []
    pos = 0
    count = 0
    while pos < end:
        nl = data.index(b"\n", pos)
        raw = data[pos:nl]
        start, pos = pos, nl + 1
        count += 1
        line = raw.decode("utf-8", errors="replace").rstrip()
        if not line.strip():
            continue
        header = HEADER_RE.match(line)
        if header is not None:
            body = PATH_COLUMN_RE.sub("", line[header.end():]).strip()
            records.append(_Record(start, [body], _time_of_day(raw)))
        elif line[:1].isspace() and records:
            records[-1].pieces.append(PATH_COLUMN_RE.sub("", line).strip())
        else:
            records.append(_Record(start, [PATH_COLUMN_RE.sub("", line).strip()], None))
    return records, end, count


def validation_values(line: str) -> dict[str, float] | None:
    """``{key: value}`` of a validation record (``val/...=`` keys, no ``global_step``)."""
    pairs = {m.group("key"): float(m.group("val")) for m in PAIR_RE.finditer(line)}
    if STEP_KEY in pairs or not any(k.startswith("val/") for k in pairs):
        return None
    return pairs


def _event(process: str, line: str, step: int | None, t: float | None) -> Event | None:
    match = CHECKPOINT_RE.search(line)
    if match:
        return Event(process, "checkpoint", step, t, match.group("path"))
    match = RESUME_RE.search(line)
    if match:
        return Event(process, "resume", step, t, match.group("what"))
    match = EPOCH_RE.search(line)
    if match:
        return Event(process, "epoch", step, t,
                     f"epoch {match.group(1)}/{match.group(2)} {match.group(3)}")
    if INTERRUPT_RE.search(line):
        return Event(process, "interrupt", step, t, line[:160])
    return None


def _consume(process: str, record: _Record, clock: Clock, parsed: Parsed,
             source: str) -> None:
    t = clock.place(record.tod) if record.tod is not None else clock.last_t
    line = join_pieces(record.pieces)
    event = _event(process, line, clock.step, t)
    if event is not None:  # a resume line carries global_step= too: it is no metric record
        if event.kind == "resume":
            found = re.search(r"global_step=(\d+)", line)
            event.step = clock.step = int(found.group(1)) if found else clock.step
        parsed.events.append(event)
        return
    metrics = metric_values(line)
    if metrics is not None:
        step = int(metrics.pop(STEP_KEY))
        clock.step = step
        parsed.points.append(Point(process, step, t, metrics, source))
        return
    values = validation_values(line)
    if values is not None and clock.step is not None:
        parsed.points.append(Point(process, clock.step, t, values, source))


def metric_values(line: str) -> dict[str, float] | None:
    """A training metric record's values (:func:`outrig.progress.parse_metric_line`), or
    None for a line that only mentions ``global_step=`` among plain words (speculators'
    "Fast-skipping 3 batches ... epoch=0, global_step=3."): a record has ``group/name``
    keys."""
    pairs = parse_metric_line(line)
    if pairs is None or not any("/" in key for key in pairs):
        return None
    return pairs


def unfinished(line: str) -> bool:
    """Whether a record may still be growing: it holds ``group/name=`` pairs and has not
    reached its last key yet (``global_step=`` for a training record, ``epoch=`` for a
    validation record). Any other line is taken whole (it is no metric record)."""
    keys = [m.group("key") for m in PAIR_RE.finditer(line)]
    if not any("/" in key for key in keys) or STEP_KEY in keys:
        return False
    return not (all(k.startswith("val/") or k == "epoch" for k in keys) and "epoch" in keys)


def parse_chunk(process: str, data: bytes, clock: Clock, *, final: bool = False,
                source: str = "log") -> Parsed:
    """The points and events of ``data`` (which starts at a record's first byte), and how
    far to move the cursor. ``clock`` is advanced in place (save it with the cursor)."""
    records, end, lines = _records(data)
    parsed = Parsed(lines=lines)
    if not records:
        parsed.consumed = end
        return parsed
    last = records[-1]
    keep_last = final or not unfinished(join_pieces(last.pieces))
    for record in records if keep_last else records[:-1]:
        _consume(process, record, clock, parsed, source)
    parsed.consumed = end if keep_last else last.start
    return parsed


def tail_points(process: str, text: str, at: float) -> Parsed:
    """The points of a log tail that arrived at ``at`` (``status``, ``watch``): its first
    record is dropped (the tail may begin inside it), and its times are placed so that the
    newest time of day falls in the hour before ``at``. Records before the first time of
    day of the tail are left without a time."""
    data = text.encode("utf-8", errors="replace")
    if not data.endswith(b"\n"):
        data += b"\n"
    records, _, lines = _records(data)
    records = records[1:]
    tods = [r.tod for r in records if r.tod is not None]
    clock = Clock()
    parsed = Parsed(lines=lines)
    for record in records:
        if record.tod is not None and clock.last_t is None:
            span = sum(((b - a) % DAY for a, b in itertools.pairwise(tods)), 0.0)
            clock.last_t = at - (at - tods[-1]) % HOUR - span
            clock.last_tod = tods[0]
        _consume(process, record, clock, parsed, "status")
    return parsed


# --------------------------------------------------------------------------- series


def merged(points: Iterable[Point]) -> dict[tuple[str, int], Point]:
    """One point per (process, step), its values merged: a status tail's first, then the
    mirror's over them (the mirror is the whole log), and of two from the same source the
    later one (a trainer that went back to a checkpoint trains those steps again); a
    validation record adds its values to its step's."""
    given = list(points)
    ordered = given if all(p.source == "log" for p in given) else sorted(
        given, key=lambda p: p.source == "log")  # stable: order kept
    out: dict[tuple[str, int], Point] = {}
    copied: set[tuple[str, int]] = set()  # the caller's points are copied only to be changed
    for point in ordered:
        key = (point.process, point.step)
        before = out.get(key)
        if before is None:
            out[key] = point
            continue
        if key not in copied:
            before = out[key] = Point(before.process, before.step, before.t,
                                      dict(before.values), before.source)
            copied.add(key)
        before.values.update(point.values)
        before.t = point.t if point.t is not None else before.t
        before.source = point.source
    return out


def by_step(points: Iterable[Point], metric: str) -> list[tuple[int, float | None, float]]:
    """``(step, t, value)`` of one metric, one per step, sorted by step (see
    :func:`merged`; of several processes printing it, the steps of all)."""
    return steps_of(merged(points), metric)


def steps_of(table: dict[tuple[str, int], Point], metric: str
             ) -> list[tuple[int, float | None, float]]:
    """:func:`by_step` of a table :func:`merged` already made (a run's, once:
    :attr:`RunData.table`): merging a million points costs seconds, a lookup does not. NaN
    and ±Inf values are left out (nothing can draw or average them)."""
    rows = {}
    for (_, step), point in table.items():
        value = point.values.get(metric)
        if value is not None and math.isfinite(value):
            rows[step] = (step, point.t, value)
    return [rows[s] for s in sorted(rows)]


# The largest magnitude a chart draws (plot's plotext, the report's uPlot): both compute a
# range as max - min, which overflows to inf near 1e308 and then draws nothing (or raises);
# no real metric comes near. A value beyond it is left out of the chart, with a note.
DRAWN_LIMIT = 1e150


def drawable(value: float) -> bool:
    """Whether a chart can draw ``value`` (finite, within :data:`DRAWN_LIMIT`)."""
    return -DRAWN_LIMIT <= value <= DRAWN_LIMIT


def all_drawable(values: Sequence[float]) -> bool:
    """Whether :func:`drawable` holds for every one of ``values``, in C loops (a call per
    value cost a quarter of a second per million): the extremes within the limit and a
    finite sum (a NaN makes it NaN; ±1e150 a million times cannot overflow)."""
    if not values:
        return True
    return (min(values) >= -DRAWN_LIMIT and max(values) <= DRAWN_LIMIT
            and math.isfinite(sum(values)))


def left_out_note(rows: Sequence[tuple[int, float]]) -> str | None:
    """``2 value(s) beyond ±1e+150 not drawn (step 5 = 1e+308, step 9 = -1e+308)``: what a
    chart of ``(step, value)`` rows leaves out (:func:`drawable`), or None."""
    if all_drawable([v for _, v in rows]):
        return None
    out = [(s, v) for s, v in rows if not drawable(v)]
    if not out:
        return None
    shown = ", ".join(f"step {s} = {v:.3g}" for s, v in out[:3]) + (", ..." if len(out) > 3
                                                                     else "")
    return f"{len(out)} value(s) beyond ±{DRAWN_LIMIT:g} not drawn ({shown})"


def spread(times: Sequence[float | None]) -> list[float | None]:
    """Times with each run of equal ones spread over their second (rich prints whole
    seconds, and a fast trainer logs several steps in one): the i-th of n gets ``+ i/n``,
    so a time axis keeps every point apart and in step order."""
    out: list[float | None] = list(times)
    i = 0
    while i < len(out):
        j = i
        while j + 1 < len(out) and out[j + 1] is not None and out[j + 1] == out[i]:
            j += 1
        base = out[i]
        if base is not None and j > i:
            n = j - i + 1
            for k in range(n):
                out[i + k] = base + k / n
        i = j + 1
    return out


def metric_order(name: str) -> tuple[int, str]:
    """Loss first, then the acceptance metrics (full_acc, per position, eal), validation,
    learning rates, throughput, the rest."""
    position = re.search(r"position_(\d+)_acc", name)
    if name == LOSS:
        return 0, ""
    if name.startswith("train/full_acc"):
        return 1, ""
    if position and name.startswith("train/"):
        return 2, f"{int(position.group(1)):04d}"
    if name.startswith("train/eal"):
        return 3, ""
    if name.startswith("train/"):
        return 4, name
    if name.startswith("val/"):
        return 5, name
    if name.startswith("lr/"):
        return 6, name
    if name in ("profile/tokens_per_s", "profile/samples_per_s", "profile/step_ms"):
        return 7, name
    if name == "epoch":
        return 9, ""
    return 8, name


def metric_names(points: Iterable[Point]) -> list[str]:
    names: set[str] = set()
    for point in points:
        names.update(point.values)
    return sorted(names, key=metric_order)


def thin(rows: Sequence[Any], limit: int) -> list[Any]:
    """At most ``limit`` rows, evenly spread, the first and the last always kept (a report
    of a 100 000-step run stays a few hundred KB; the export keeps every row)."""
    if limit <= 0 or len(rows) <= limit:
        return list(rows)
    if limit == 1:
        return [rows[-1]]
    stride = (len(rows) - 1) / (limit - 1)
    return [rows[round(i * stride)] for i in range(limit)]


def sparkline(values: Sequence[float], width: int = 16) -> str:
    """``▇▆▅▃▂▂▁``: the shape of a series in ``width`` characters (each the mean of its
    share of the values), scaled between their minimum and maximum."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite or width <= 0:
        return ""
    if len(finite) > width:
        size = len(finite) / width
        finite = [sum(chunk) / len(chunk) for chunk in
                  (finite[int(i * size):max(int(i * size) + 1, int((i + 1) * size))]
                   for i in range(width))]
    low, high = min(finite), max(finite)
    if high - low <= 1e-12 * max(1.0, abs(high)):
        return SPARKS[len(SPARKS) // 2 - 1] * len(finite)
    top = len(SPARKS) - 1
    return "".join(SPARKS[round((v - low) / (high - low) * top)] for v in finite)


def iter_rows(points: Iterable[Point] | dict[tuple[str, int], Point], names: Sequence[str]
              ) -> Iterator[tuple[str, int, float | None, list[float | None]]]:
    """``(process, step, t, values in the order of names)``, by process then step: the
    rows of ``outrig metrics --csv`` (see :func:`merged`; a table it made is used as it
    is)."""
    table = points if isinstance(points, dict) else merged(points)
    for key in sorted(table):
        point = table[key]
        yield point.process, point.step, point.t, [point.values.get(n) for n in names]


class RunRecord:
    """A run's id and host, read from its journal ``record`` (what :class:`RunData` and the
    kept summary, :class:`outrig.metrics.summary.RunSummary`, both carry)."""

    record: dict[str, Any]

    @property
    def run_id(self) -> str:
        return str(self.record.get("run_id"))

    @property
    def host(self) -> str:
        return str(self.record.get("host"))


@dataclass
class RunData(RunRecord):
    """Everything drawn of one run: its journal record, its series, its log events, its
    GPU samples (``{t, gpus: [{i, used, total, util}]}``), and where its mirror is."""

    record: dict[str, Any]
    points: list[Point] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    gpu: list[dict[str, Any]] = field(default_factory=list)
    mirror: str | None = None

    def label(self) -> str:
        return f"{self.run_id} ({self.host})"

    @functools.cached_property
    def table(self) -> dict[tuple[str, int], Point]:
        """The points :func:`merged`, made once per run (every metric's series reads it)."""
        if self.in_order is not None:
            return {(p.process, p.step): p for p in self.in_order}
        return merged(self.points)

    @functools.cached_property
    def in_order(self) -> list[Point] | None:
        """The points themselves when they are already :attr:`table`'s values in step
        order: one process, each step once and rising (a trainer's log, the usual run), so
        nothing merges. None otherwise. A series is then read straight from the list (no
        table, no per-step dictionary): at a million points that is most of what drawing
        cost above reading the store."""
        points, steps = self.points, self._steps
        if not points or len(set(map(PROCESS, points))) != 1:
            return None
        return points if all(map(int.__lt__, steps, itertools.islice(steps, 1, None))) \
            else None

    @functools.cached_property
    def _steps(self) -> list[int]:
        return list(map(STEP, self.points))

    @functools.cached_property
    def _times(self) -> list[float | None]:
        return list(map(TIME, self.points))

    @functools.cached_property
    def _raw(self) -> dict[str, Sequence[float | None]]:
        """metric → its value at each point of :attr:`in_order` (None where a point lacks
        it). A trainer prints the same keys on every line: then the values are turned into
        columns in one pass in C, else a pass per metric."""
        dicts = list(map(VALUES, self.in_order or []))
        if not dicts:
            return {}
        keys = list(dicts[0])
        if all(map(keys.__eq__, map(list, dicts))):
            return dict(zip(keys, zip(*map(dict.values, dicts), strict=True), strict=True))
        return {n: list(map(operator.methodcaller("get", n), dicts))
                for n in set(itertools.chain.from_iterable(dicts))}

    @functools.cached_property
    def names(self) -> list[str]:
        """Every metric of the run, in :func:`metric_order` (the keys gathered in C)."""
        keys = self._raw if self.in_order is not None else set(
            itertools.chain.from_iterable(map(VALUES, self.points)))
        return sorted(keys, key=metric_order)

    def _column(self, metric: str) -> tuple[list[int], list[float | None], list[float]]:
        """Steps, times and values of ``metric``'s finite values in step order, from
        :attr:`in_order` (only when it is not None)."""
        values = self._raw.get(metric)
        if values is None:
            return [], [], []
        if None not in values and math.isfinite(sum(values)):  # type: ignore[arg-type]
            return self._steps, self._times, list(values)  # type: ignore[arg-type]
        keep = [i for i, v in enumerate(values) if v is not None and -math.inf < v < math.inf]
        steps, times = self._steps, self._times
        return ([steps[i] for i in keep], [times[i] for i in keep],
                [values[i] for i in keep])  # type: ignore[misc]

    @functools.cached_property
    def columns(self) -> dict[str, dict[int, tuple[int, float | None, float]]]:
        """metric → step → ``(step, t, value)``, the finite values of :attr:`table`, made in
        one pass over it (a pass per metric cost a second each at a million points)."""
        out: dict[str, dict[int, tuple[int, float | None, float]]] = {}
        for (_, step), point in self.table.items():
            for name, value in point.values.items():
                if -math.inf < value < math.inf:  # NaN fails both comparisons
                    column = out.get(name)
                    if column is None:
                        column = out[name] = {}
                    column[step] = (step, point.t, value)
        return out

    def series(self, metric: str) -> list[tuple[int, float | None, float]]:
        """``(step, t, value)`` of one metric, sorted by step (what :func:`by_step` gives,
        from :attr:`columns`)."""
        if self.in_order is not None:
            return list(zip(*self._column(metric), strict=True))
        column = self.columns.get(metric) or {}
        return [column[s] for s in sorted(column)]

    def pairs(self, metric: str) -> list[tuple[int, float]]:
        """``(step, value)`` of one metric, sorted by step (:meth:`series` without the
        time: what a chart draws)."""
        if self.in_order is not None:
            steps, _, values = self._column(metric)
            return list(zip(steps, values, strict=True))
        return [(s, v) for s, _, v in self.series(metric)]

    def column(self, metric: str) -> tuple[list[int], list[float | None], list[float]]:
        """:meth:`series` as three lists (steps, times, values): a chart that keeps a few
        thousand of a million points picks them by index, building no row per point."""
        if self.in_order is not None:
            return self._column(metric)
        rows = self.series(metric)
        return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]

    def values(self, metric: str) -> list[float]:
        """The finite values of one metric, in step order (:meth:`series`' values)."""
        if self.in_order is not None:
            return self._column(metric)[2]
        return [v for _, _, v in self.series(metric)]

    def rows(self, names: Sequence[str]
             ) -> Iterator[tuple[str, int, float | None, list[float | None]]]:
        """:func:`iter_rows` of the run, from :attr:`in_order` when the points need no
        merging."""
        if self.in_order is None:
            yield from iter_rows(self.table, names)
            return
        getters = [operator.methodcaller("get", n) for n in names]
        for point in self.in_order:
            values = point.values
            yield point.process, point.step, point.t, [get(values) for get in getters]

    def count(self) -> int:
        """How many (process, step) points the run has once merged."""
        return len(self.in_order) if self.in_order is not None else len(self.table)

    def step_span(self) -> tuple[int, int] | None:
        """The run's first and last step (None: no points)."""
        if not self.points:
            return None
        if self.in_order is not None:
            return self._steps[0], self._steps[-1]
        return min(self._steps), max(self._steps)


PROCESS = operator.attrgetter("process")
STEP = operator.attrgetter("step")
TIME = operator.attrgetter("t")
VALUES = operator.attrgetter("values")


def chain_ids(records: dict[str, dict[str, Any]], run_id: str) -> list[str]:
    """``run_id`` with the runs it was moved from and to (``migrated_from`` and
    ``moved_to`` in the journal), oldest first: a migrated run's curve goes on in its
    successor's. Ids the journal does not hold end the chain there."""
    before: list[str] = []
    seen = {run_id}
    current = records.get(run_id) or {}
    while True:
        back = current.get("migrated_from")
        older = back.get("run_id") if isinstance(back, dict) else None
        if older is None:  # a successor recorded only on the old run's side
            older = next((rid for rid, rec in records.items()
                          if isinstance(rec.get("moved_to"), dict)
                          and rec["moved_to"].get("run_id") == current.get("run_id")), None)
        if not isinstance(older, str) or older in seen or older not in records:
            break
        before.insert(0, older)
        seen.add(older)
        current = records[older]
    after: list[str] = []
    current = records.get(run_id) or {}
    while True:
        moved = current.get("moved_to")
        newer = moved.get("run_id") if isinstance(moved, dict) else None
        if not isinstance(newer, str) or newer in seen or newer not in records:
            break
        after.append(newer)
        seen.add(newer)
        current = records[newer]
    return [*before, run_id, *after]
