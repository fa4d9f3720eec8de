"""The state a ``watch`` keeps in the journal (``<journal>/watches/``), and how a watch
started again finds and carries on the saved one (docs/cli.md "Which run a command means").

Apart from :mod:`outrig.ops.watch` (the loop that acts on the box) so that each holds one
concept: this module decides *which* run a watch follows and keeps its record; the loop
decides *what happens* to it."""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outrig.console import Reporter
from outrig.errors import ConfigError, OutrigError, RemoteError
from outrig.inventory import HostBook
from outrig.journal import Journal, atomic_write_json, read_json, safe_name
from outrig.ops.nodes import refuse_node_run
from outrig.ops.watch_lock import WatchLock
from outrig.session import HostSession, Project
from outrig.watching.health import DEFAULT_THRESHOLD

BEAT_EVERY = 30.0  # seconds: at most this long between two heartbeat lines on a terminal
WATCH_DIR = "watches"
EVENTS_KEPT = 200  # newest events kept in the watch's record


@dataclass
class WatchOptions:
    """The flags of ``watch``: spares in order, a run to follow (else the playbook's current
    run on the host), in-place restarts allowed after a crash (None: not given, so a
    carried-on watch keeps its own, a new one allows 0), the death threshold, a fixed probe
    period (tests; default: from the RTT) and the heartbeat line's interval (tests)."""

    spares: list[str] = field(default_factory=list)
    run_id: str | None = None
    restarts: int | None = None
    threshold: float = DEFAULT_THRESHOLD
    period: float | None = None
    beat_every: float = BEAT_EVERY


# ------------------------------------------------------------------------------ the record


def watch_file(journal: Journal, origin: str, playbook: str) -> Path:
    return journal.root / WATCH_DIR / f"{safe_name(playbook)}@{safe_name(origin)}.json"


def find_watch(journal: Journal, host: str, playbook: str) -> tuple[Path, dict[str, Any]] | None:
    """The unfinished watch of ``playbook`` that began on ``host`` or has moved to it."""
    for path in sorted((journal.root / WATCH_DIR).glob("*.json")):
        data = read_json(path)
        if (isinstance(data, dict) and data.get("playbook") == playbook
                and data.get("status") == "watching"
                and host in (data.get("origin"), data.get("host"))):
            return path, data
    return None


class WatchRecord:
    """The watch's state in the journal; every change is written at once (atomically)."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data
        self._lock = threading.Lock()  # the loop, its worker and the fencing thread write

    def __getitem__(self, key: str) -> Any:
        return self.data.get(key)

    def update(self, **fields: Any) -> None:
        with self._lock:
            self.data.update(fields)
            self.data["updated"] = time.time()
            atomic_write_json(self.path, self.data)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            copy: dict[str, Any] = json.loads(json.dumps(self.data, default=str))
        return copy

    def note(self, **fields: Any) -> None:
        """Change fields without writing (a frequent detail, saved with the next update)."""
        with self._lock:
            self.data.update(fields)

    def add_event(self, payload: dict[str, Any]) -> None:
        with self._lock:
            events = [*(self.data.get("events") or []), payload][-EVENTS_KEPT:]
        self.update(events=events)


def silent() -> Reporter:
    """The reporter of the watch's own sessions: their retry notices and "lost contact"
    warnings are what the health signals already judge, and a hung call that ends after the
    loop has moved on must not print into the watch's output."""
    return Reporter(quiet=True, err=_Discard())


class _Discard(io.StringIO):
    """A text stream that keeps nothing."""

    def write(self, text: str) -> int:
        return len(text)


@contextlib.contextmanager
def opened(session: HostSession) -> Iterator[HostSession]:
    """``with`` for a session whose reporter outlives it (the watch's own): closes the
    connection only."""
    try:
        yield session
    finally:
        with contextlib.suppress(Exception):
            session.transport.close()


def open_record(project: Project, journal: Journal, host_spec: str, playbook: str,
                options: WatchOptions, reporter: Reporter,
                lock: WatchLock | None = None) -> WatchRecord:
    """The watch's record, by docs/cli.md's rule ("Which run a command means").

    The run to follow is ``--run``, else the playbook's current run, asked of the box the
    saved watch follows now (it may have moved) or of ``host_spec``. A saved, unfinished
    watch of the playbook begun on or moved to ``host_spec`` is carried on only when it
    follows that same run (or when its box does not answer: a watch exists for a box that
    may be dead), and it says so; flags given on this command line replace what it saved
    (``--spare``, ``--restarts``). A saved watch of another run (one a redeploy stopped on
    purpose) is marked ``superseded`` and a new watch follows the current run with this
    command line's flags. ``lock`` claims the run (and the saved watch) before anything is
    written: a second watch of it is refused (:mod:`outrig.ops.watch_lock`)."""
    found = find_watch(journal, host_spec, playbook)
    saved = None if found is None else found[1]
    where = host_spec if saved is None else str(saved.get("host") or host_spec)
    # after a move, the run on the new box may be of another member of the playbook's family
    runs_of = playbook if saved is None else str(
        (journal.run(str(saved.get("run_id"))) or {}).get("playbook") or playbook)
    run_id = options.run_id
    if run_id is None:
        try:
            run_id = current_run(project, journal, where, runs_of, reporter)
        except ConfigError:
            raise
        except OutrigError as exc:  # the box does not answer
            if found is None:
                raise
            reporter.info(f"• {where} does not answer ({str(exc).split('. ')[0]}), so it "
                          f"cannot say which run of {playbook} is current: carrying on the "
                          "saved watch")
    if found is not None and (run_id is None or run_id == found[1].get("run_id")):
        if lock is not None:
            lock.claim(str(found[1].get("run_id")), found[0])
        return carry_on(found[0], found[1], playbook, options, reporter)
    assert run_id is not None
    if lock is not None:
        lock.claim(run_id, *([found[0]] if found else []), watch_file(journal, where, playbook))
    if found is not None:
        path, data = found
        WatchRecord(path, data).update(status="superseded", superseded_by=run_id)
        reporter.info(f"• the saved watch of {playbook} followed run {data.get('run_id')} on "
                      f"{data.get('host')}, which is not the run to follow now ({run_id}): "
                      "starting a new watch")
        host_spec = where
    refuse_node_run(journal, run_id, what="watch")
    record = WatchRecord(watch_file(journal, host_spec, playbook), {
        "origin": host_spec, "host": host_spec, "playbook": playbook, "run_id": run_id,
        "spares": list(options.spares), "restarts": options.restarts or 0,
        "restarts_used": 0, "mirrored": None, "mirror_tried": None, "moved": [],
        "events": [], "status": "watching", "started": time.time()})
    record.update()
    return record


def carry_on(path: Path, data: dict[str, Any], playbook: str, options: WatchOptions,
             reporter: Reporter) -> WatchRecord:
    """The saved watch, with this command line's ``--spare`` and ``--restarts`` where given
    (they win over what it saved), announced as carried on."""
    record = WatchRecord(path, data)
    changes: dict[str, Any] = {}
    if options.spares:
        changes["spares"] = list(options.spares)
    if options.restarts is not None:
        changes["restarts"] = options.restarts
    if changes:
        record.update(**changes)
    reporter.info(f"• carrying on the saved watch of {playbook} (begun on "
                  f"{data.get('origin')}): it follows the current run {data.get('run_id')} on "
                  f"{data.get('host')}; spares left "
                  f"{', '.join(record['spares'] or []) or 'none'}, restarts used "
                  f"{record['restarts_used'] or 0} of {record['restarts'] or 0}"
                  + (" (as this command line says)" if changes else ""))
    return record


def current_run(project: Project, journal: Journal, host_spec: str, playbook: str,
                reporter: Reporter) -> str:
    """The playbook's current run on the box (one ``status`` call)."""
    try:
        with opened(HostSession(project, host_spec, reporter, journal,
                                host=HostBook(project.hosts_dir)(host_spec))) as session:
            result = session.call("status", stream=False, playbook=playbook, log_lines=0)
    except RemoteError as exc:
        raise ConfigError(f"no run of {playbook} to watch on {host_spec} ({exc}); deploy it "
                          f"first (`outrig deploy --host {host_spec} --playbook "
                          f"{playbook}`) or name one with --run") from None
    runs = [r for r in result.get("runs") or [] if isinstance(r, dict)]
    if not runs or not isinstance(runs[0].get("run_id"), str):
        raise ConfigError(f"{host_spec} has no run of {playbook}; deploy it first "
                          f"(`outrig deploy --host {host_spec} --playbook {playbook}`)")
    return str(runs[0]["run_id"])
