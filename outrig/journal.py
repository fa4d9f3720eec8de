"""The local journal: what outrig did, kept on the workstation.

The box can die at any moment; the journal is how the next command (or ``migrate``) knows which
run was where, what was planned and what the box looked like. It lives under
``$XDG_STATE_HOME/outrig`` (default ``~/.local/state/outrig``). Every write is atomic
(temp file + fsync + rename) so a crash or Ctrl-C never leaves half a JSON file.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path("~/.local/state").expanduser())
    return Path(base) / "outrig"


def safe_name(text: str) -> str:
    """A host spec such as ``root@1.2.3.4:22`` as a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "host"


def atomic_write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=True, default=str)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _merge_into(path: Path, record: dict[str, Any]) -> None:
    """Merge ``record`` into the JSON object at ``path`` (a record is only ever added to, so
    a later step never loses what an earlier one wrote), stamped with ``updated``."""
    existing = read_json(path)
    merged = existing if isinstance(existing, dict) else {}
    merged.update(record)
    merged["updated"] = time.time()
    atomic_write_json(path, merged)


def utc_text(stamp: Any) -> str:
    """A journal time stamp (seconds since the epoch) for people: UTC, to the second."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(stamp)))
    except (TypeError, ValueError, OverflowError):
        return "an unknown time"


class Journal:
    """Runs and host facts, one JSON file each."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or state_dir()

    def host_path(self, host: str) -> Path:
        return self.root / "hosts" / f"{safe_name(host)}.json"

    def run_path(self, run_id: str) -> Path:
        return self.root / "runs" / f"{safe_name(run_id)}.json"

    def host_facts(self, host: str) -> dict[str, Any]:
        data = read_json(self.host_path(host))
        return data if isinstance(data, dict) else {}

    def update_host(self, host: str, **facts: Any) -> None:
        data = self.host_facts(host)
        data.update(facts)
        data["updated"] = time.time()
        atomic_write_json(self.host_path(host), data)

    def model_facts(self, host: str) -> dict[str, dict[str, Any]]:
        """model (path or hub id) → what the box's ``model_facts`` op said, with ``seen``."""
        models = self.host_facts(host).get("models")
        if not isinstance(models, dict):
            return {}
        return {str(k): v for k, v in models.items() if isinstance(v, dict)}

    def remember_models(self, host: str, reports: list[dict[str, Any]]) -> None:
        """Cache model facts per host: a model's layer count and size do not change, so a
        later plan can check layer ids and memory fit without contacting the box."""
        models = self.model_facts(host)
        for report in reports:
            if isinstance(report.get("model"), str):
                models[report["model"]] = {**report, "seen": time.time()}
        self.update_host(host, models=models)

    def record_run(self, run_id: str, record: dict[str, Any]) -> None:
        _merge_into(self.run_path(run_id), record)

    def run(self, run_id: str) -> dict[str, Any] | None:
        data = read_json(self.run_path(run_id))
        return data if isinstance(data, dict) else None

    def runs(self, *, host: str | None = None, playbook: str | None = None) -> list[dict[str, Any]]:
        """Recorded runs, newest first."""
        out = []
        for path in (self.root / "runs").glob("*.json"):
            data = read_json(path)
            if not isinstance(data, dict):
                continue
            if host is not None and data.get("host") != host:
                continue
            if playbook is not None and data.get("playbook") != playbook:
                continue
            out.append(data)
        out.sort(key=lambda r: (r.get("created", 0), r.get("run_id", "")), reverse=True)
        return out

    def evaluation_path(self, eval_id: str) -> Path:
        return self.root / "evaluations" / f"{safe_name(eval_id)}.json"

    def record_evaluation(self, eval_id: str, record: dict[str, Any]) -> None:
        """One ``outrig evaluate`` result: its playbook, host, training run (``run_id``, when
        the drafter is a run's checkpoint), ``checkpoint`` (path, epoch, step), the numbers
        and ``at``. Kept apart from the run records, which the box's index reconciles."""
        _merge_into(self.evaluation_path(eval_id), record)

    def evaluations(self, *, playbook: str | None = None, run_id: str | None = None,
                    host: str | None = None) -> list[dict[str, Any]]:
        """Recorded evaluations (of ``playbook``, of a run's checkpoints, on ``host``),
        newest first."""
        out = []
        for path in (self.root / "evaluations").glob("*.json"):
            data = read_json(path)
            if not isinstance(data, dict):
                continue
            if ((playbook is not None and data.get("playbook") != playbook)
                    or (run_id is not None and data.get("run_id") != run_id)
                    or (host is not None and data.get("host") != host)):
                continue
            out.append(data)
        out.sort(key=lambda r: (float(r.get("at") or 0), str(r.get("eval_id"))), reverse=True)
        return out

    def job_path(self, job_id: str) -> Path:
        return self.root / "jobs" / f"{safe_name(job_id)}.json"

    def record_job(self, job_id: str, record: dict[str, Any]) -> None:
        """Merge ``record`` into a multi-node job's record: the id its nodes share, its
        playbook and ``nodes`` (``rank``, ``host``, ``run_id`` each). Each node's run keeps its
        own run record (``job_id`` and ``node_rank`` in it), so everything that works on one
        host's runs (status, reconcile, cleanup --run) works on each node unchanged."""
        _merge_into(self.job_path(job_id), record)

    def job(self, job_id: str) -> dict[str, Any] | None:
        data = read_json(self.job_path(job_id))
        return data if isinstance(data, dict) else None

    def jobs(self, *, playbook: str | None = None) -> list[dict[str, Any]]:
        """Recorded multi-node jobs (of ``playbook``, if given), newest first."""
        out = []
        for path in (self.root / "jobs").glob("*.json"):
            data = read_json(path)
            if isinstance(data, dict) and playbook in (None, data.get("playbook")):
                out.append(data)
        out.sort(key=lambda r: (r.get("created", 0), r.get("job_id", "")), reverse=True)
        return out

    def mark_moved(self, run_id: str, *, host: str, to_host: str, to_run_id: str,
                   at: float | None = None) -> None:
        """Record that ``run_id`` on ``host`` was moved to ``to_run_id`` on ``to_host``.

        Kept under its own key, ``moved_to``, apart from the box-reconciled ``status``: when
        the old box comes back and reports the run as running, :meth:`reconcile` sets
        ``status`` from the box and leaves ``moved_to`` alone, so the run is still known to be
        a second trainer that must be stopped (fenced)."""
        record: dict[str, Any] = {"moved_to": {"host": to_host, "run_id": to_run_id,
                                               "at": time.time() if at is None else at}}
        existing = self.run(run_id)
        if existing is None or not existing.get("host"):
            record.update({"run_id": run_id, "host": host})
        self.record_run(run_id, record)

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
        ``not_on_box``. Returns the ids whose status changed."""
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
            elif record.get("status") == update["status"] and record.get("ran") == update["ran"]:
                continue
            self.record_run(run_id, update)
            changed.append(run_id)
        for run_id, record in known.items():
            if run_id not in seen and record.get("status") in ("deploying", "unknown"):
                self.record_run(run_id, {"status": "not_on_box", "box_seen": now})
                changed.append(run_id)
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
