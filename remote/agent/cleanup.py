"""The ``cleanup`` op: stop runs (by id, playbook or all), sweep marked leftovers, wait for
their GPU memory, and (``force_foreign``) kill named foreign GPU holders."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, List, Optional, Set

from .constants import DEFAULT_STOP_GRACE, FULL_DISK_ERRNOS, JSONDict
from .events import Emitter, bad_request
from .gpus import (
    GPU_WAIT_DEFAULT_S,
    describe_pid,
    force_kill_foreign,
    gpu_audit,
    holder_line,
    wait_gpus_released,
)
from .layout import (
    Layout,
    all_pointers,
    ensure_workdir,
    list_run_ids,
    read_json,
    read_pointer,
    workdir_error,
)
from .lock import WorkdirLock
from .procs import read_stat, require_proc
from .stopping import Stopper, stop_run_by_id, valid_record
from .validation import Request, get_bool, get_num, get_opt_name, get_opt_str


def op_cleanup(req: Request, out: Emitter) -> JSONDict:
    """Stop the chosen run(s): run_id, else the playbook's current run, else (all) every run.

    Around the stop: a GPU audit before (who holds what, ours or foreign), the optional
    ``force_foreign`` pids the user named, then a bounded wait until no process of the stopped
    runs holds a GPU and the memory they held is back. ``dry_run`` only reports.
    """
    raw = req.raw
    playbook = get_opt_name(raw, "playbook", "")
    run_id = get_opt_name(raw, "run_id", "")
    everything = get_bool(raw, "all", "", False)
    dry_run = get_bool(raw, "dry_run", "", False)
    lock_timeout = get_num(raw, "lock_timeout", "", 10.0)
    gpu_timeout = get_num(raw, "gpu_timeout", "", GPU_WAIT_DEFAULT_S, positive=True)
    force = raw.get("force_foreign") or []
    if not isinstance(force, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in force
    ):
        raise bad_request("force_foreign: must be a list of positive pids")
    sweep_grace: Optional[float] = None
    if raw.get("stop_grace") is not None:  # extension: grace for the marker sweep
        sweep_grace = get_num(raw, "stop_grace", "", DEFAULT_STOP_GRACE)
    if run_id is None and playbook is None and not everything and not force:
        raise bad_request("cleanup: give run_id, playbook, all: true or force_foreign")
    layout = Layout(req.workdir)
    require_proc("cleanup stopped nothing (what was launched may still be running)")
    stopper = Stopper(out, layout=None if dry_run else layout)  # a dry run records nothing
    workdir_for_cleanup(layout, stopper)
    before = gpu_audit(layout, stopper)
    if run_id is not None:
        targets = [run_id]
    elif playbook is not None:
        current = read_pointer(layout, playbook)
        if current is None:
            out.warning(f"playbook {playbook} has no current run; nothing to stop")
        targets = [current] if current is not None else []
    elif everything:
        targets = runs_to_stop(layout)
    else:
        targets = []
    if dry_run:
        return {"dry_run": True, "runs": [would_stop(layout, rid, stopper) for rid in targets],
                "force_foreign": [describe_pid(p) for p in force], "gpus_before": before}
    with cleanup_lock(layout, lock_timeout, stopper):
        runs = []
        for rid in targets:
            out.step(f"stopping run {rid}")
            runs.append(stop_run_by_id(layout, rid, stopper, out, sweep_grace))
        forced = force_kill_foreign(force, stopper, out) if force else []
    if targets or force:
        out.step("checking that the GPUs are released")
    release = wait_gpus_released(layout, stopper, out, set(targets), before, gpu_timeout,
                                 extra_pids=set(force))
    unproven = unproven_holders(layout, targets, release["audit"], stopper)
    host_label = get_opt_str(raw, "host_label", "") or "HOST"
    if unproven:
        verdict = release["verdict"]
        verdict["released"] = False
        verdict["unproven"] = unproven
        verdict["message"] = (
            (str(verdict["message"]) + " " if verdict.get("message") else "")
            + f"{len(unproven)} process(es) started while the run was up hold its GPUs, and "
            "outrig cannot prove whether they are its own (no group, session, cgroup, marker "
            "or parent of the run leads to them), so they were left running: "
            + "; ".join(holder_line(h) for h in unproven)
            + f". If they are the run's, stop them with: outrig cleanup --host {host_label} "
            "--force-foreign "
            + " ".join(str(h["pid"]) for h in unproven))
    if stopper.unrecorded:
        out.warning("stopped, but could not record: " + "; ".join(stopper.unrecorded))
    return {"runs": runs, "forced": forced, "gpus_before": before,
            "gpus_after": release["audit"], "gpu": release["verdict"],
            "not_recorded": list(stopper.unrecorded)}


def workdir_for_cleanup(layout: Layout, stopper: Stopper) -> None:
    """Like ensure_workdir, but a full (or read-only) workdir does not stop a cleanup.

    The job that filled the disk is exactly what the user needs to stop; everything cleanup
    writes (run.json status, exit files, the lock note) is bookkeeping it can do without."""
    exc = workdir_error(layout)
    if exc is None:
        return
    if exc.errno not in FULL_DISK_ERRNOS or not os.path.isdir(layout.workdir):
        ensure_workdir(layout)  # raises the usual ``workdir`` error
        return
    stopper.out.warning(f"{layout.workdir} is not writable ({exc.strerror}): stopping anyway;"
                        " what cleanup records there may be lost")


@contextlib.contextmanager
def cleanup_lock(layout: Layout, timeout: float, stopper: Stopper) -> Iterator[None]:
    """The workdir lock for cleanup; a lock file that cannot be created (full disk) is noted
    and the stop goes on unlocked (a deploy cannot write there either)."""
    lock = WorkdirLock(layout, "cleanup", timeout)
    try:
        lock.__enter__()
    except OSError as exc:
        if exc.errno not in FULL_DISK_ERRNOS:
            raise
        stopper.unrecorded.append(f"the workdir lock {layout.lock} ({exc.strerror or exc}): "
                                  "stopped without holding it")
        yield
        return
    try:
        if lock.unrecorded:
            stopper.unrecorded.append(lock.unrecorded)
        yield
    finally:
        lock.__exit__(None, None, None)


def unproven_holders(layout: Layout, run_ids: List[str], audit: JSONDict,
                     stopper: Stopper) -> List[JSONDict]:
    """GPU holders that may be the stopped runs' but cannot be proven so.

    A process holding one of a run's GPUs, started after the run's first process (same boot),
    owned by no run: a child that cleared its markers and left the session, whose parent is
    gone. It is not killed (it cannot be proven ours), but cleanup must not call this done."""
    gpus: Set[int] = set()
    first: Optional[int] = None
    for run_id in run_ids:
        run: Any = None
        with contextlib.suppress(OSError, ValueError):
            run = read_json(layout.run_json(run_id))
        records = run.get("processes") if isinstance(run, dict) else None
        for rec in records if isinstance(records, list) else []:
            if not valid_record(rec) or rec.get("boot_id") not in (None, stopper.boot):
                continue
            first = rec["start_ticks"] if first is None else min(first, rec["start_ticks"])
            gpus |= {g for g in rec.get("gpus") or [] if isinstance(g, int)}
    if first is None or not gpus:
        return []
    out: List[JSONDict] = []
    for h in audit.get("holders") or []:
        if h.get("owner") is not None or h["pid"] in stopper.protected:
            continue
        on = {h["gpu_index"]} if h.get("gpu_index") is not None else set(h.get("devices") or [])
        st = read_stat(h["pid"])
        if on & gpus and st is not None and st.live() and st.start_ticks >= first:
            out.append(h)
    return out


def would_stop(layout: Layout, run_id: str, stopper: Stopper) -> JSONDict:
    """Dry run: what stopping ``run_id`` would signal (leaders, group members, marked)."""
    run = None
    with contextlib.suppress(OSError, ValueError):
        run = read_json(layout.run_json(run_id))
    procs: List[JSONDict] = []
    if isinstance(run, dict):
        for rec in run.get("processes") or []:
            if not valid_record(rec):
                continue
            state = stopper.leader_state(rec)
            members = sorted(stopper.members(run_id, rec, state)) if state != "reused" else []
            procs.append({"process": rec["name"], "pid": rec["pid"], "leader": state,
                          "members": members})
    return {"run_id": run_id, "processes": procs, "marked": sorted(stopper.marked(run_id)),
            "known": isinstance(run, dict)}


def runs_to_stop(layout: Layout) -> List[str]:
    """For ``all``: every run not already ``stopped`` (unreadable ones too), newest first."""
    ids = set(all_pointers(layout).values())
    for rid in list_run_ids(layout):
        try:
            run = read_json(layout.run_json(rid))
            if isinstance(run, dict) and run.get("status") == "stopped":
                continue
        except (OSError, ValueError):
            pass
        ids.add(rid)
    return sorted(ids, reverse=True)
