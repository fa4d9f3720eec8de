"""The local journal: what outrig did, kept on the workstation.

The box can die at any moment; the journal is how the next command (or ``migrate``) knows which
run was where, what was planned and what the box looked like. It lives under
``$XDG_STATE_HOME/outrig`` (default ``~/.local/state/outrig``), with the log mirrors,
checkpoint mirrors, evaluations and (without ``XDG_RUNTIME_DIR``) the warm connections'
sockets.

Why each rule:

* Private, like ``~/.ssh``: the state root is made 0700 on first use (an existing one that
  others can open is tightened, with a note), folders made under it are 0700 and every file
  outrig writes there is 0600. Log mirrors hold whatever the processes printed.
* Atomic: every write is temp file + fsync + rename, so a crash or Ctrl-C never leaves half a
  JSON file.
* Locked: a record's read-merge-write holds ``fcntl.flock`` on the record's lock file
  (``.<name>.lock`` beside it), so two commands updating one record (a ``watch`` and a
  ``status``, two hosts of one job) never lose each other's keys.
* Never a traceback for a damaged file: a record that cannot be read (invalid UTF-8 or JSON,
  not an object, a folder where the file should be) is skipped with a warning naming it and
  moved aside (``<name>.unreadable-<time>``); a write that fails (a full disk) is a
  :class:`~outrig.errors.LocalWriteError` naming the file and the fix.

``outrig --list`` imports this module (through the text layout's time stamps), so
:mod:`tempfile` (with shutil, random and the compression modules it pulls in) is imported
where a file is written, purely for start-up.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from outrig.errors import LocalWriteError

RUN_ENDED = frozenset({"stopped", "finished", "exited"})  # a run state with nothing alive
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
FULL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
_PRIVATE_ROOTS: set[Path] = set()  # roots already checked by this process


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path("~/.local/state").expanduser())
    return Path(base) / "outrig"


def safe_name(text: str) -> str:
    """A host spec such as ``root@203.0.113.7:22`` as a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "host"


def stderr_note(text: str) -> None:
    """Where a journal says something when nobody gave it a reporter: stderr, one line (it
    is never stdout, which ``--json`` keeps for JSON)."""
    print(text, file=sys.stderr, flush=True)


def private_state_dir(root: Path | None = None,
                      notify: Callable[[str], None] = stderr_note) -> Path:
    """The state root (``root``, default :func:`state_dir`), created 0700 if it is missing.
    One that others can open (an older outrig made it 0755) is tightened once, with a note:
    it and every folder and file under it lose their group and other bits. Checked once per
    root and process; a root that cannot be made or changed is left for the write that
    needs it to report (:class:`~outrig.errors.LocalWriteError`)."""
    root = root or state_dir()
    if root in _PRIVATE_ROOTS:
        return root
    try:
        make_private_dir(root)
        info = os.stat(root)
    except OSError:
        return root
    _PRIVATE_ROOTS.add(root)
    if not stat.S_IMODE(info.st_mode) & 0o077:
        return root
    if info.st_uid != os.getuid():
        notify(f"warning: {root} (outrig's journal and log mirrors) is open to others (mode "
               f"{stat.S_IMODE(info.st_mode):o}) and belongs to uid {info.st_uid}, so outrig "
               "cannot tighten it; make it yours with mode 700, or set XDG_STATE_HOME")
        return root
    changed = _tighten(root)
    notify(f"note: made {root} private (mode {stat.S_IMODE(info.st_mode):o} → 700; "
           f"{changed} folder(s) and file(s) under it lost their group and other access): "
           "outrig's journal, log mirrors and checkpoint mirrors are this user's alone, "
           "like ~/.ssh")
    return root


def _tighten(root: Path) -> int:
    """Remove group and other bits from ``root`` and everything under it (symlinks are not
    followed); how many entries under it changed."""
    changed = 0
    with contextlib.suppress(OSError):
        os.chmod(root, stat.S_IMODE(os.stat(root).st_mode) & ~0o077)
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            try:
                info = os.lstat(path)
                if stat.S_ISLNK(info.st_mode) or not stat.S_IMODE(info.st_mode) & 0o077:
                    continue
                os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o077)
                changed += 1
            except OSError:
                continue
    return changed


def make_private_dir(path: Path) -> None:
    """``path`` and its missing parents as folders only this user can open
    (``Path.mkdir(parents=True)`` would make the parents with the default mode)."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made by another command just now
            folder.mkdir(mode=PRIVATE_DIR)


def atomic_write_text(path: Path, text: str) -> None:
    """``text`` as the file ``path`` (0600 when new, its missing folders 0700), atomically:
    a temp file beside it, fsynced, renamed over it, so a reader never sees half a file."""
    folder = path.parent if str(path.parent) else Path(".")
    make_private_dir(folder)
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(folder))  # 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    """``data`` as the JSON file ``path`` (0600, its folder 0700 if new), atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> Any | None:
    """The JSON in ``path``; None when it is missing, a folder, or not valid UTF-8 JSON
    (other local I/O errors are raised for the caller to name)."""
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (FileNotFoundError, IsADirectoryError, ValueError):
        return None


def journal_write_failed(path: Path, exc: OSError) -> LocalWriteError:
    """A journal write that failed, as one paragraph: the file, the cause and the fix."""
    why = exc.strerror or str(exc)
    if exc.errno in FULL_DISK_ERRNOS:
        head = (f"this workstation's disk is full or read-only writing outrig's journal "
                f"{path} ({why})")
    else:
        head = f"outrig cannot write its journal {path} ({why})"
    return LocalWriteError(
        f"{head}. This is this workstation, not the box: free space there (df -h "
        f"{path.parent}), or set XDG_STATE_HOME to a disk with room, then run the command "
        "again; nothing the box runs was affected.")


@contextlib.contextmanager
def record_lock(path: Path) -> Iterator[None]:
    """Hold ``fcntl.flock`` on the lock file of the record ``path`` (``.<name>.lock`` beside
    it, never removed: removing it would let two writers lock different files). Not the
    record itself: each write replaces the record's inode, and a lock on a replaced inode
    excludes nobody. flock is per open file, so threads of one process exclude each other
    too."""
    make_private_dir(path.parent)
    fd = os.open(path.parent / f".{path.name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                 PRIVATE_FILE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def utc_text(stamp: Any) -> str:
    """A journal time stamp (seconds since the epoch) for people: UTC, to the second."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(stamp)))
    except (TypeError, ValueError, OverflowError):
        return "an unknown time"


class Journal:
    """Runs and host facts, one JSON file each.

    ``notify`` is where the journal's warnings go (a record moved aside, the state root
    tightened); stderr by default."""

    def __init__(self, root: Path | None = None,
                 notify: Callable[[str], None] | None = None) -> None:
        self.root = root or state_dir()
        self.notify = notify or stderr_note
        private_state_dir(self.root, self.notify)

    # -- reading and writing one record

    def load(self, path: Path) -> dict[str, Any] | None:
        """The record in ``path``; None when there is none. One that cannot be read is
        skipped with a warning naming it, and moved aside so the next command is not
        warned again and a new record can take its place."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._unreadable(path, exc.strerror or str(exc))
            return None
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            self._unreadable(path, f"not UTF-8 at byte {exc.start}")
            return None
        except ValueError as exc:
            self._unreadable(path, f"not JSON: {exc}")
            return None
        if not isinstance(data, dict):
            self._unreadable(path, f"a JSON {type(data).__name__}, not an object")
            return None
        return data

    def _unreadable(self, path: Path, why: str) -> None:
        aside = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            path.rename(aside)
            where = f"moved aside to {aside.name}"
        except FileNotFoundError:
            return  # another command moved it aside just now
        except OSError as exc:
            where = f"could not be moved aside ({exc.strerror or exc})"
        self.notify(f"warning: skipped the unreadable journal record {path} ({why}); it was "
                    f"{where}. Nothing else in the journal is affected.")

    def _update(self, path: Path, change: Callable[[dict[str, Any]], None]) -> None:
        """Read-merge-write ``path`` under its lock: ``change`` edits the record (an empty
        one when there is none), which is then stamped with ``updated`` and written."""
        try:
            with record_lock(path):
                data = self.load(path) or {}
                change(data)
                data["updated"] = time.time()
                atomic_write_json(path, data)
        except OSError as exc:
            raise journal_write_failed(path, exc) from None

    def _merge(self, path: Path, record: dict[str, Any]) -> None:
        """Merge ``record`` into the record at ``path`` (a record is only ever added to, so a
        later step never loses what an earlier one wrote)."""
        self._update(path, lambda data: data.update(record))

    def _records(self, folder: str) -> Iterator[dict[str, Any]]:
        """Every readable record of one folder (``runs``, ``evaluations``, ``jobs``)."""
        for path in sorted((self.root / folder).glob("*.json")):
            data = self.load(path)
            if data is not None:
                yield data

    # -- hosts, runs, evaluations, jobs

    def host_path(self, host: str) -> Path:
        return self.root / "hosts" / f"{safe_name(host)}.json"

    def run_path(self, run_id: str) -> Path:
        return self.root / "runs" / f"{safe_name(run_id)}.json"

    def host_facts(self, host: str) -> dict[str, Any]:
        return self.load(self.host_path(host)) or {}

    def update_host(self, host: str, **facts: Any) -> None:
        self._merge(self.host_path(host), facts)

    def model_facts(self, host: str) -> dict[str, dict[str, Any]]:
        """model (path or hub id) → what the box's ``model_facts`` op said, with ``seen``."""
        models = self.host_facts(host).get("models")
        if not isinstance(models, dict):
            return {}
        return {str(k): v for k, v in models.items() if isinstance(v, dict)}

    def remember_models(self, host: str, reports: list[dict[str, Any]]) -> None:
        """Cache model facts per host: a model's layer count and size do not change, so a
        later plan can check layer ids and memory fit without contacting the box."""
        fresh = {report["model"]: {**report, "seen": time.time()} for report in reports
                 if isinstance(report.get("model"), str)}

        def add(data: dict[str, Any]) -> None:
            known = data.get("models")
            data["models"] = {**(known if isinstance(known, dict) else {}), **fresh}

        self._update(self.host_path(host), add)

    def record_run(self, run_id: str, record: dict[str, Any]) -> None:
        self._merge(self.run_path(run_id), record)

    def run(self, run_id: str) -> dict[str, Any] | None:
        return self.load(self.run_path(run_id))

    def runs(self, *, host: str | None = None, playbook: str | None = None) -> list[dict[str, Any]]:
        """Recorded runs, newest first."""
        out = []
        for data in self._records("runs"):
            if host is not None and data.get("host") != host:
                continue
            if playbook is not None and data.get("playbook") != playbook:
                continue
            out.append(data)
        out.sort(key=lambda r: (r.get("created", 0), r.get("run_id", "")), reverse=True)
        return out

    def rental_path(self, key: str) -> Path:
        return self.root / "rentals" / f"{safe_name(key)}.json"

    def record_rental(self, key: str, record: dict[str, Any]) -> None:
        """Merge into the record of one box rented through a provider
        (:mod:`outrig.providers.ledger` says what it holds)."""
        self._merge(self.rental_path(key), record)

    def rental(self, key: str) -> dict[str, Any] | None:
        return self.load(self.rental_path(key))

    def rentals(self) -> list[dict[str, Any]]:
        """Every rental record, oldest first."""
        out = list(self._records("rentals"))
        out.sort(key=lambda r: (r.get("created_at", 0), r.get("key", "")))
        return out

    def evaluation_path(self, eval_id: str) -> Path:
        return self.root / "evaluations" / f"{safe_name(eval_id)}.json"

    def record_evaluation(self, eval_id: str, record: dict[str, Any]) -> None:
        """One ``outrig evaluate`` result: its playbook, host, training run (``run_id``, when
        the drafter is a run's checkpoint), ``checkpoint`` (path, epoch, step), the numbers
        and ``at``. Kept apart from the run records, which the box's index reconciles."""
        self._merge(self.evaluation_path(eval_id), record)

    def evaluations(self, *, playbook: str | None = None, run_id: str | None = None,
                    host: str | None = None) -> list[dict[str, Any]]:
        """Recorded evaluations (of ``playbook``, of a run's checkpoints, on ``host``),
        newest first."""
        out = []
        for data in self._records("evaluations"):
            if ((playbook is not None and data.get("playbook") != playbook)
                    or (run_id is not None and data.get("run_id") != run_id)
                    or (host is not None and data.get("host") != host)):
                continue
            out.append(data)
        out.sort(key=lambda r: (float(r.get("at") or 0), str(r.get("eval_id"))), reverse=True)
        return out

    def baseline_path(self, key: str) -> Path:
        return self.root / "baselines" / f"{safe_name(key)}.json"

    def record_baseline(self, key: str, record: dict[str, Any]) -> None:
        """Keep one no-speculation baseline under its key (outrig.evaluation.baseline),
        replacing an earlier one of the same key."""
        path = self.baseline_path(key)
        try:
            atomic_write_json(path, record)
        except OSError as exc:
            raise journal_write_failed(path, exc) from None

    def baseline(self, key: str) -> dict[str, Any] | None:
        """The cached baseline of ``key``, or None."""
        return self.load(self.baseline_path(key))

    def job_path(self, job_id: str) -> Path:
        return self.root / "jobs" / f"{safe_name(job_id)}.json"

    def record_job(self, job_id: str, record: dict[str, Any]) -> None:
        """Merge ``record`` into a multi-node job's record: the id its nodes share, its
        playbook and ``nodes`` (``rank``, ``host``, ``run_id`` each). Each node's run keeps its
        own run record (``job_id`` and ``node_rank`` in it), so everything that works on one
        host's runs (status, reconcile, cleanup --run) works on each node unchanged."""
        self._merge(self.job_path(job_id), record)

    def job(self, job_id: str) -> dict[str, Any] | None:
        return self.load(self.job_path(job_id))

    def jobs(self, *, playbook: str | None = None) -> list[dict[str, Any]]:
        """Recorded multi-node jobs (of ``playbook``, if given), newest first."""
        out = [data for data in self._records("jobs")
               if playbook in (None, data.get("playbook"))]
        out.sort(key=lambda r: (r.get("created", 0), r.get("job_id", "")), reverse=True)
        return out

    def mark_moved(self, run_id: str, *, host: str, to_host: str, to_run_id: str,
                   at: float | None = None) -> None:
        """Record that ``run_id`` on ``host`` was moved to ``to_run_id`` on ``to_host``.

        Kept under its own key, ``moved_to``, apart from the box-reconciled ``status``: when
        the old box comes back and reports the run as running, :meth:`reconcile` sets
        ``status`` from the box and leaves ``moved_to`` alone, so the run is still known to be
        a second trainer that must be stopped (fenced)."""
        moved = {"host": to_host, "run_id": to_run_id, "at": time.time() if at is None else at}

        def mark(data: dict[str, Any]) -> None:
            if not data.get("host"):
                data.update({"run_id": run_id, "host": host})
            data["moved_to"] = moved

        self._update(self.run_path(run_id), mark)

    def mark_fenced(self, run_id: str, *, stopped: list[dict[str, Any]],
                    at: float | None = None) -> None:
        """Record that a moved run's processes are confirmed stopped (``stopped``: what was
        stopped and how; empty when nothing of it was running any more)."""
        self.record_run(run_id, {"fenced": {"at": time.time() if at is None else at,
                                            "stopped": stopped}})

    def moved_runs(self, host: str) -> list[dict[str, Any]]:
        """The host's runs that were moved to another box (fenced or not), newest first."""
        return [r for r in self.runs(host=host) if isinstance(r.get("moved_to"), dict)]

    def reconcile(self, host: str, box_runs: list[dict[str, Any]]) -> list[str]:
        """Bring the host's run records in line with the box's run index (the box is the
        truth): each run's ``status`` becomes the box's (``moved_to`` and ``fenced``, which
        the box cannot know, are left as they are), ``ran`` is kept once known, runs the
        journal lacks (deployed from elsewhere, or a lost journal) are added, and a deploy that
        never reached the box (``deploying``/``unknown`` here, absent there) is marked
        ``not_on_box``. When the index arrived is noted too (:meth:`note_runs_seen`). Returns
        the ids whose status changed."""
        known = {str(r.get("run_id")): r for r in self.runs(host=host)}
        changed: list[str] = []
        seen: set[str] = set()
        now = time.time()
        for item in box_runs:
            run_id = item.get("run_id")
            if not isinstance(run_id, str):
                continue
            seen.add(run_id)
            record = known.get(run_id)
            if record is None and self.run(run_id) is not None:
                continue  # filed under another host name: leave it to that host's contacts
            update: dict[str, Any] = {"status": item.get("status"), "box_seen": now,
                                      "ran": bool(item.get("ran"))
                                      or bool((record or {}).get("ran"))
                                      or (record or {}).get("status") in ("running", "finished")}
            for key in ("ready_at", "stopped_at", "ended_at"):
                if item.get(key) is not None:
                    update[key] = item[key]
            if record is None:
                update.update({"run_id": run_id, "host": host, "playbook": item.get("playbook"),
                               "created": item.get("created") or now, "source": "box"})
            elif (record.get("moved_to") and not record.get("fenced")
                  and not item.get("live") and update["status"] in RUN_ENDED):
                # a moved run the box says has ended: nothing of it to fence any more
                update["fenced"] = {"at": now, "stopped": [], "seen": update["status"]}
            elif record.get("status") == update["status"] and record.get("ran") == update["ran"]:
                continue
            self.record_run(run_id, update)
            changed.append(run_id)
        for run_id, record in known.items():
            if run_id not in seen and record.get("status") in ("deploying", "unknown"):
                self.record_run(run_id, {"status": "not_on_box", "box_seen": now})
                changed.append(run_id)
        self.note_runs_seen(host, sorted(seen), at=now)
        return changed

    # -- what a command last saw of a run (``outrig runs``, and status when the box is gone)

    def record_seen(self, run_id: str, seen: dict[str, Any]) -> None:
        """Keep what a ``status`` or a ``watch`` last saw of a run's progress, under
        ``last_seen``: ``at``, the trainer's ``step``, ``epoch`` and ``loss``, and the
        newest complete ``checkpoint`` (``name``, ``path``). A value not known this time (a
        log tail without a metric line) keeps the one seen before, so the record always
        holds the latest value of each; ``at`` says when the box last answered."""
        existing = self.run(run_id)
        if existing is None:
            return  # a run the journal has no record of: reconcile adds it, not this
        before = existing.get("last_seen")
        merged = dict(before) if isinstance(before, dict) else {}
        merged.update({k: v for k, v in seen.items() if v is not None})
        if merged != before:
            self.record_run(run_id, {"last_seen": merged})

    def note_runs_seen(self, host: str, run_ids: list[str], at: float | None = None) -> None:
        """The box's run index arrived (every contact that lists runs): remember when and
        which runs it listed, so ``outrig runs`` can say of each run when its state was last
        seen (``box_seen`` changes only with the state) and, for a box that no longer
        answers, since when it has not been."""
        self.update_host(host, runs_seen={"at": time.time() if at is None else at,
                                          "run_ids": sorted(set(run_ids))})

    def runs_seen(self, host: str) -> tuple[float | None, set[str]]:
        """When the host's run index last arrived and the runs it listed."""
        seen = self.host_facts(host).get("runs_seen")
        if not isinstance(seen, dict):
            return None, set()
        at = seen.get("at")
        ids = seen.get("run_ids")
        return (float(at) if isinstance(at, (int, float)) else None,
                {str(i) for i in ids} if isinstance(ids, list) else set())
