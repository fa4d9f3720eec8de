"""Runs: which run a request means, its secrets' names, each process's state, and the run
index (the ``runs`` event) that the workstation's journal follows."""

from __future__ import annotations

import contextlib
import os
import re
import time
from typing import List, Optional, Set, Tuple

from .constants import JSONDict
from .events import AgentError, Emitter, bad_request
from .layout import Layout, all_pointers, list_run_ids, read_json, read_pointer
from .logs import first_match, tail_lines
from .probes import probe_http, probe_port, read_exit_file
from .procs import proc_problem
from .stopping import Stopper, valid_record
from .validation import Request


def run_secrets(run: JSONDict, stopper: Stopper) -> List[str]:
    """The values of a run's secrets, read from its live processes' environments (the box keeps
    only their names, ``secret_keys``), so that log text shipped from the box is redacted. A run
    whose processes are all gone yields nothing here; the workstation redacts with its own."""
    values: Set[str] = set()
    for rec in run.get("processes") or []:
        keys = rec.get("secret_keys") if isinstance(rec, dict) else None
        if not keys or not valid_record(rec) or stopper.leader_state(rec) != "alive":
            continue
        try:
            with open(f"/proc/{rec['pid']}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        for item in environ:
            key, _, value = item.decode("utf-8", "replace").partition("=")
            if key in keys and value:
                values.add(value)
    return sorted(values, key=len, reverse=True)


def run_secret_keys(run: JSONDict) -> List[str]:
    """Names of the secrets a run's processes were given (never their values)."""
    keys: Set[str] = set()
    for rec in run.get("processes") or []:
        names = rec.get("secret_keys") if isinstance(rec, dict) else None
        if isinstance(names, list):
            keys.update(k for k in names if isinstance(k, str))
    return sorted(keys)


def process_state(rec: JSONDict, stopper: Stopper, log_lines: int,
                  secrets: Optional[List[str]] = None) -> JSONDict:
    """One process's state for ``status``: running / exited / killed / gone."""
    now = time.time()
    state = "gone"
    exit_code: Optional[int] = None
    sig: Optional[int] = None
    uptime: Optional[float] = None
    ready: Optional[bool] = None
    if valid_record(rec) and stopper.leader_state(rec) == "alive":
        state = "running"
        started = rec.get("started_at")
        if isinstance(started, (int, float)):
            uptime = round(now - started, 1)
        spec = rec.get("ready")
        if isinstance(spec, dict):
            checks = []
            if isinstance(spec.get("http"), str):
                checks.append(probe_http(spec["http"]))
            port = spec.get("port")
            if isinstance(port, int) and not isinstance(port, bool):
                checks.append(probe_port(port))
            if isinstance(spec.get("log"), str):
                checks.append(log_ready(rec, spec["log"]))
            if checks:
                ready = all(checks)
    else:
        exit_file = rec.get("exit_file")
        status = read_exit_file(exit_file) if isinstance(exit_file, str) else None
        if status is not None:
            exit_code, sig = status
            state = "killed" if sig is not None else "exited"
    log = rec.get("log")
    stopped_by = rec.get("stopped_by") if state != "running" else None
    return {
        "name": rec.get("name"),
        "pid": rec.get("pid"),
        "state": state,
        "exit_code": exit_code,
        "signal": sig,
        # who ended it when outrig did (cleanup, redeploy): the signal alone reads as a crash
        "stopped_by": stopped_by if isinstance(stopped_by, str) else None,
        "uptime": uptime,
        "ready": ready,
        "log_tail": tail_lines(log, log_lines, secrets) if isinstance(log, str) else [],
    }


def log_ready(rec: JSONDict, pattern: str) -> bool:
    """Whether a process with a ``ready.log`` pattern has become ready: once printed, a ready
    line stays true (unlike a port, nothing to re-check). The deploy that saw it recorded
    ``outcome: ready``; a deploy with ``wait: false`` (or one still running) did not, so the
    start of the log is searched as the deploy would have."""
    if rec.get("outcome") == "ready":
        return True
    log = rec.get("log")
    try:
        regex = re.compile(pattern)
    except re.error:
        return False
    return isinstance(log, str) and first_match(log, regex)


def resolve_run(layout: Layout, playbook: Optional[str], run_id: Optional[str]) -> str:
    """The run named by run_id, else by the playbook's current pointer (``not_found``)."""
    if run_id is not None:
        if not os.path.isdir(layout.run_dir(run_id)):
            raise AgentError("not_found", f"no run {run_id} in {layout.runs}")
        return run_id
    assert playbook is not None
    current = read_pointer(layout, playbook)
    if current is None:
        raise AgentError("not_found", f"playbook {playbook} has no current run in {layout.workdir}")
    return current


def the_current_run(layout: Layout, stopper: Stopper) -> str:
    """The run a request without run_id or playbook means (docs/cli.md, "Which run a
    command means"): the box's only current run (a playbook's current pointer) if it has
    one; else, of its current runs, the one that is live, that is, one with a process
    alive now (:func:`run_truth`: state ``running``). A run that failed or finished beside
    it, such as another playbook's whose process exited at start, is not a candidate then.
    None or several live: a ``bad_request`` that lists each current run with its state and
    the run id and playbook that pick it."""
    pointers = all_pointers(layout)
    if len(pointers) == 1:
        return next(iter(pointers.values()))
    if not pointers:
        raise AgentError("not_found", f"no current run in {layout.workdir}; give a run id")
    states = {}
    for playbook, rid in pointers.items():
        try:
            run = read_json(layout.run_json(rid))
        except (OSError, ValueError):
            run = None
        states[playbook] = (run_truth(run, stopper)[0] if isinstance(run, dict)
                            and isinstance(run.get("processes"), list) else "unknown")
    live = [pointers[pb] for pb, state in states.items() if state == "running"]
    if len(live) == 1:
        return live[0]
    listing = "; ".join(f"{rid} (playbook {pb}, {states[pb]})"
                        for pb, rid in sorted(pointers.items()))
    why = f"{len(live)} of them live" if live else "none of them live"
    raise bad_request(f"several current runs, {why}: {listing}; say which with --run RUN_ID "
                      "or --playbook NAME")


RUN_INDEX_OPS = ("deploy", "cleanup", "status", "logs", "check")  # ops that report runs
RUN_INDEX_MAX = 100  # newest run directories reported per call


def run_truth(run: JSONDict, stopper: Stopper) -> Tuple[str, bool, int]:
    """(state, ran, live processes) of one run as the box sees it now.

    run.json says what the deploy or cleanup that last touched it recorded; a cut deploy leaves
    ``launching`` and a crash after the deploy leaves ``running``. The processes decide:
    anything of it alive is ``running``; otherwise its exit files say ``finished`` (every
    process exited 0), ``exited`` (one failed or was killed) or ``gone`` (no exit recorded:
    the box rebooted or the wrapper was killed). ``stopped`` and ``failed`` stay. ``ran``: the
    deploy succeeded (``ready_at``), or something of it is still running."""
    recorded = str(run.get("status") or "unknown")
    records = [r for r in run.get("processes") or [] if valid_record(r)]
    live = sum(1 for r in records if stopper.leader_state(r) == "alive")
    ran = bool(run.get("ready_at")) or recorded in ("running", "finished") or live > 0
    if recorded in ("stopped", "failed") or (live == 0 and not records):
        return recorded, ran, live
    if live:
        return "running", ran, live
    codes = []
    for rec in records:
        path = rec.get("exit_file")
        status = read_exit_file(path) if isinstance(path, str) else None
        codes.append(status)
    if any(c is None for c in codes):
        return "gone", ran, 0
    if all(c is not None and c[0] == 0 and c[1] is None for c in codes):
        return "finished", ran, 0
    return "exited", ran, 0


def run_index(layout: Layout, stopper: Stopper) -> List[JSONDict]:
    """The newest runs in the workdir with their true state (see :func:`run_truth`), so that
    the workstation's journal can follow the box, which is the truth, on every contact."""
    dated = []
    for rid in list_run_ids(layout):
        with contextlib.suppress(OSError):
            dated.append((os.stat(layout.run_dir(rid)).st_mtime, rid))
    out: List[JSONDict] = []
    for _, rid in sorted(dated, reverse=True)[:RUN_INDEX_MAX]:
        try:
            run = read_json(layout.run_json(rid))
        except (OSError, ValueError):
            run = None
        if not isinstance(run, dict) or not isinstance(run.get("processes"), list):
            out.append({"run_id": rid, "status": "unknown", "ran": False, "live": 0})
            continue
        state, ran, live = run_truth(run, stopper)
        out.append({"run_id": rid, "playbook": run.get("playbook"), "status": state,
                    "recorded": run.get("status"), "created": run.get("created"),
                    "ready_at": run.get("ready_at"), "stopped_at": run.get("stopped_at"),
                    "ended_at": None if live else ended_at(run), "ran": ran, "live": live})
    return out


def ended_at(run: JSONDict) -> Optional[float]:
    """When the run's last process ended (the newest ``ended`` of its exit files), or None
    while one has no exit file: what ``outrig runs`` measures a finished run's length by."""
    ends: List[float] = []
    for rec in run.get("processes") or []:
        path = rec.get("exit_file") if valid_record(rec) else None
        try:
            data = read_json(path) if isinstance(path, str) else None
        except (OSError, ValueError):
            data = None
        ended = data.get("ended") if isinstance(data, dict) else None
        if not isinstance(ended, (int, float)) or isinstance(ended, bool):
            return None
        ends.append(float(ended))
    return round(max(ends), 3) if ends else None


def census_run(layout: Layout, run_id: str, stopper: Stopper) -> None:
    """Every contact records the run's live processes as seen (pid + start time), so what
    renames itself or leaves the session later is still the run's at cleanup."""
    with contextlib.suppress(OSError, ValueError):
        run = read_json(layout.run_json(run_id))
        if isinstance(run, dict) and isinstance(run.get("processes"), list):
            stopper.census(run_id, run["processes"])


def report_runs(req: Optional[Request], out: Emitter) -> None:
    """Emit the ``runs`` event (the run index) before the result of the ops that touch runs,
    whether they succeeded or not; the index never makes an op fail."""
    if req is None or req.op not in RUN_INDEX_OPS:
        return
    if proc_problem() is not None:
        return  # without /proc every run would look gone: no index rather than a false one
    layout = Layout(req.workdir)
    if not os.path.isdir(layout.runs):
        return
    try:
        stopper = Stopper(out, layout=layout)
        runs = run_index(layout, stopper)
        for item in runs:
            if item.get("live"):  # (status records a dead leader's orphans itself)
                census_run(layout, str(item["run_id"]), stopper)
    except (OSError, ValueError) as exc:
        out.warning(f"could not list the runs in {layout.runs}: {exc}")
        return
    out.emit("runs", workdir=layout.workdir, runs=runs)
