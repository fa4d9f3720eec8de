"""A run's metric series in the journal: ``<state>/metrics/<run>/``, kept incrementally.

Files (0600, their folder 0700, like the rest of the journal):

* ``points.jsonl``: one metric record a line (:class:`outrig.metrics.series.Point`), appended;
* ``events.jsonl``: the lines that mark a moment (a checkpoint saved, a resume, an epoch);
* ``gpu.jsonl``: what ``status`` and ``watch`` saw of the run's GPUs (memory, utilisation);
* ``state.json``: per mirrored log, the inode and byte offset it was parsed up to, the
  archived segments already parsed, and the clock that places its times; the sizes of the
  three files; how many lines were parsed in all.

Why a cursor: a drafter run's log grows by megabytes an hour, and ``metrics``, ``plot``,
``report``, ``status`` and ``watch`` all want the series; each call parses only the bytes
past the cursor (:meth:`MetricStore.ingest_mirror`). Why this order (append, fsync, then
the state, atomically): a crash between the two leaves lines past the recorded sizes, which
the next call cuts before it appends, so no point is doubled or lost. Every change holds the
state file's lock (:func:`outrig.journal.record_lock`): a ``watch`` and a ``report`` at the
same time do not parse the same bytes twice.

A mirror segment is known by its inode (a rotation renames the file; the inode stays), so a
segment archived after the cursor was saved is finished from the cursor, then the new file
is read from its start. A damaged state file is moved aside (the journal's rule) and the
series is parsed again from the start of the mirror.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outrig.journal import (
    PRIVATE_FILE,
    Journal,
    atomic_write_json,
    journal_write_failed,
    make_private_dir,
    record_lock,
    safe_name,
)
from outrig.logs.mirror import MirrorStore, mirror_files, mirror_root
from outrig.metrics.series import (
    LOSS,
    Clock,
    Event,
    Point,
    parse_chunk,
    sparkline,
    tail_points,
    thin,
)
from outrig.redaction import ordered, redact_text

FILES = ("points", "events", "gpu")
TREND_KEEP = 128  # loss values kept in the state for the sparkline (thinned when twice that)
GPU_EVERY = 10.0  # seconds: at most one GPU sample this often (watch asks every few seconds)


@dataclass
class Ingest:
    """What one call added: lines parsed, points and events appended."""

    lines: int = 0
    points: int = 0
    events: int = 0


def metrics_root(journal: Journal, run_id: str) -> Path:
    return journal.root / "metrics" / safe_name(run_id)


class MetricStore:
    """The series of one run (see the module docstring)."""

    def __init__(self, journal: Journal, run_id: str) -> None:
        self.journal = journal
        self.run_id = run_id
        self.root = metrics_root(journal, run_id)
        self.state_file = self.root / "state.json"

    def path(self, name: str) -> Path:
        return self.root / f"{name}.jsonl"

    # -- the one way to change it

    @contextmanager
    def _changing(self) -> Iterator[dict[str, Any]]:
        """The state under its lock, the files cut back to the sizes it records; what the
        block appends (:meth:`_append`) is fsynced, then the state written."""
        try:
            with record_lock(self.state_file):
                state = self.journal.load(self.state_file) or {}
                if state.get("v") != 1:
                    state = {"v": 1, "run_id": self.run_id, "logs": {}, "tails": {},
                             "sizes": {}, "lines_parsed": 0}
                    for name in FILES:  # a new (or unreadable) state: start over
                        self.path(name).unlink(missing_ok=True)
                sizes = state.setdefault("sizes", {})
                for name in FILES:
                    self._cut(name, int(sizes.get(name) or 0))
                before = json.dumps(state, sort_keys=True, default=str)
                yield state
                for name in FILES:
                    path = self.path(name)
                    sizes[name] = path.stat().st_size if path.exists() else 0
                if json.dumps(state, sort_keys=True, default=str) == before and \
                        self.state_file.exists():
                    return  # nothing new (a watch asks every few seconds): no write
                state["updated"] = time.time()
                atomic_write_json(self.state_file, state)
        except OSError as exc:
            raise journal_write_failed(self.state_file, exc) from None

    def _cut(self, name: str, size: int) -> None:
        path = self.path(name)
        try:
            if path.stat().st_size > size:
                with open(path, "r+b") as handle:
                    handle.truncate(size)
        except FileNotFoundError:
            pass

    def _append(self, name: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        make_private_dir(self.root)
        fd = os.open(self.path(name), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                     PRIVATE_FILE)
        with os.fdopen(fd, "ab") as handle:
            handle.write(b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n"
                                  for r in rows))
            handle.flush()
            os.fsync(handle.fileno())

    # -- adding

    def ingest_mirror(self, host: str, ref: float | None) -> Ingest:
        """Parse the run's log mirror past the cursor (every process, every segment).
        ``ref``: the run's start on this workstation's clock (places the first time)."""
        mirror = MirrorStore(mirror_root(self.journal, host, self.run_id))
        if not mirror.cursor_file.exists() and not any(mirror.root.glob("*.log")):
            return Ingest()
        added = Ingest()
        with self._changing() as state:
            logs = state.setdefault("logs", {})
            points: list[Point] = []
            events: list[Event] = []
            for name, files in mirror_files(mirror).items():
                entry = logs.get(name) if isinstance(logs.get(name), dict) else {}
                clock = Clock.from_json(entry.get("clock"), ref)
                done = {int(i) for i in entry.get("done") or [] if isinstance(i, int)}
                inode, offset = entry.get("inode"), int(entry.get("offset") or 0)
                for index, (path, upto) in enumerate(files):
                    current = index == len(files) - 1
                    try:
                        info = path.stat()
                    except FileNotFoundError:
                        continue
                    if info.st_ino in done:
                        continue
                    start = offset if info.st_ino == inode else 0
                    end = info.st_size if upto is None else min(upto, info.st_size)
                    if start > end:  # not the bytes the cursor meant: read it whole
                        start = 0
                    with open(path, "rb") as handle:
                        handle.seek(start)
                        data = handle.read(end - start)
                    parsed = parse_chunk(name, data, clock, final=not current)
                    points += parsed.points
                    events += parsed.events
                    added.lines += parsed.lines
                    if current:
                        inode, offset = info.st_ino, start + parsed.consumed
                    else:
                        done.add(info.st_ino)
                logs[name] = {"inode": inode, "offset": offset, "done": sorted(done),
                              "clock": clock.to_json()}
            self._append("points", [p.to_json() for p in points])
            self._append("events", [e.to_json() for e in events])
            add_trend(state, points)
            state["lines_parsed"] = int(state.get("lines_parsed") or 0) + added.lines
            state["host"] = host
        added.points, added.events = len(points), len(events)
        return added

    def add_tail(self, tails: dict[str, str], at: float) -> int:
        """The metric records of the log tails a ``status`` or ``watch`` answer shipped
        (process → text, already redacted), those past each process's newest step known
        here; how many were added."""
        rows: list[dict[str, Any]] = []
        with self._changing() as state:
            known = state.setdefault("tails", {})
            logs = state.get("logs") or {}
            for process, text in tails.items():
                clock = (logs.get(process) or {}).get("clock") or {}
                newest = max(int(known.get(process, -1)), int(clock.get("step") or -1))
                fresh = [p for p in tail_points(process, text, at).points if p.step > newest]
                if fresh:
                    known[process] = max(p.step for p in fresh)
                    rows += [p.to_json() for p in fresh]
                    add_trend(state, fresh)
            self._append("points", rows)
        return len(rows)

    def add_gpu_sample(self, at: float, gpus: list[dict[str, Any]]) -> bool:
        """One sample of the run's GPUs (index, memory used and total in MiB, utilisation
        %), unless the last one is less than :data:`GPU_EVERY` seconds old."""
        if not gpus:
            return False
        with self._changing() as state:
            last = state.get("gpu_at")
            if isinstance(last, (int, float)) and 0 <= at - last < GPU_EVERY:
                return False
            self._append("gpu", [{"t": at, "gpus": gpus}])
            state["gpu_at"] = at
        return True

    # -- reading

    def _rows(self, name: str) -> Iterator[Any]:
        state = self.journal.load(self.state_file) or {}
        size = int((state.get("sizes") or {}).get(name) or 0)
        try:
            with open(self.path(name), "rb") as handle:
                data = handle.read(size)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise journal_write_failed(self.path(name), exc) from None
        lines = data.splitlines()
        try:  # one parse for the whole file: a million json.loads calls cost seconds
            yield from json.loads(b"[" + b",".join(ln for ln in lines if ln.strip()) + b"]")
            return
        except ValueError:
            pass  # a damaged line: each line on its own, the damaged one skipped
        for line in lines:
            try:
                yield json.loads(line)
            except ValueError:
                continue

    def points(self) -> list[Point]:
        return [p for p in map(Point.from_json, self._rows("points")) if p is not None]

    def events(self) -> list[Event]:
        return [e for e in map(Event.from_json, self._rows("events")) if e is not None]

    def gpu_samples(self) -> list[dict[str, Any]]:
        return [r for r in self._rows("gpu") if isinstance(r, dict)
                and isinstance(r.get("t"), (int, float)) and isinstance(r.get("gpus"), list)]

    def trend(self, process: str) -> list[tuple[int, float]]:
        """The loss of ``process`` as the state keeps it for the sparkline: (step, value),
        at most twice :data:`TREND_KEEP`, spread over the whole run; no points file read."""
        state = self.journal.load(self.state_file) or {}
        rows = ((state.get("trend") or {}).get(process)) or []
        return [(int(r[0]), float(r[1])) for r in rows
                if isinstance(r, list) and len(r) == 2]

    def lines_parsed(self) -> int:
        state = self.journal.load(self.state_file) or {}
        return int(state.get("lines_parsed") or 0)


def add_trend(state: dict[str, Any], points: list[Point]) -> None:
    """Merge the loss of ``points`` into the state's trend (per process, by step), thinned
    to :data:`TREND_KEEP` evenly spread values (the newest kept) when it reaches twice
    that: ``status`` and ``watch`` draw it without reading the points file."""
    trend = state.setdefault("trend", {})
    for process in {p.process for p in points}:
        known = {int(r[0]): float(r[1]) for r in trend.get(process) or []
                 if isinstance(r, list) and len(r) == 2}
        for point in points:
            if point.process == process and LOSS in point.values:
                known[point.step] = point.values[LOSS]
        rows = [[step, known[step]] for step in sorted(known)]
        trend[process] = thin(rows, TREND_KEEP) if len(rows) >= 2 * TREND_KEEP else rows


def loss_trends(journal: Journal, result: dict[str, Any], width: int = 12) -> None:
    """Give each process of an enriched ``status`` answer that has progress its loss
    sparkline (``progress.loss_trend``) from the journal's series, when it has two values
    or more."""
    for run in result.get("runs") or []:
        if not isinstance(run, dict) or not isinstance(run.get("run_id"), str):
            continue
        store = MetricStore(journal, run["run_id"])
        for proc in run.get("processes") or []:
            progress = proc.get("progress") if isinstance(proc, dict) else None
            if not isinstance(progress, dict):
                continue
            rows = store.trend(str(proc.get("name")))
            if len(rows) >= 2:
                progress["loss_trend"] = sparkline([v for _, v in rows], width)


def run_gpus(record: dict[str, Any] | None) -> set[int] | None:
    """The GPU indices a run's plan gave its processes (None: not known)."""
    plan = (record or {}).get("plan")
    procs = plan.get("processes") if isinstance(plan, dict) else None
    if not isinstance(procs, list):
        return None
    found = {int(g) for p in procs if isinstance(p, dict) for g in p.get("gpus") or []
             if isinstance(g, int)}
    return found or None


def gpu_rows(facts: dict[str, Any], wanted: set[int] | None) -> list[dict[str, Any]]:
    """The box's GPUs (the agent's ``facts.gpus``) as samples: index, memory used and
    total (MiB), utilisation (%); only ``wanted`` when given."""
    rows = []
    for gpu in facts.get("gpus") or []:
        if not isinstance(gpu, dict) or not isinstance(gpu.get("index"), int):
            continue
        if wanted is not None and gpu["index"] not in wanted:
            continue
        rows.append({"i": gpu["index"], "used": gpu.get("memory_used_mib"),
                     "total": gpu.get("memory_total_mib"), "util": gpu.get("utilization_pct")})
    return rows


def remember_samples(journal: Journal, result: dict[str, Any], at: float | None = None,
                     secret: Callable[[str], str | None] = os.environ.get) -> None:
    """Keep what a raw ``status`` answer (before :func:`outrig.ops.status.enrich_status`
    drops the log text) says of each run the journal knows: the metric records of each
    process's log tail, and its GPUs' memory and utilisation. Values of the run's secrets
    (``secret_keys``, from this shell) are redacted from the text first."""
    at = time.time() if at is None else at
    facts = result.get("facts") if isinstance(result.get("facts"), dict) else {}
    for run in result.get("runs") or []:
        if not isinstance(run, dict) or not isinstance(run.get("run_id"), str):
            continue
        record = journal.run(run["run_id"])
        if record is None:
            continue
        store = MetricStore(journal, run["run_id"])
        values = ordered(v for k in run.get("secret_keys") or [] if (v := secret(str(k))))
        tails = {str(p.get("name")): redact_text(p["tail_text"], values)
                 for p in run.get("processes") or []
                 if isinstance(p, dict) and isinstance(p.get("tail_text"), str)
                 and p["tail_text"]}
        if tails:
            store.add_tail(tails, at)
        if run.get("status") == "running":
            store.add_gpu_sample(at, gpu_rows(facts or {}, run_gpus(record)))
