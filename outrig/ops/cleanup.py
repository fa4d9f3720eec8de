"""``inv cleanup``: stop exactly what outrig started, prove the GPUs are free, touch nothing else.

One agent call does it all on the box (docs/cleanup.md): a GPU audit (every GPU-holding pid,
ours or foreign), the stop (SIGTERM to each recorded leader, its grace, then SIGKILL of its
group, session and marked stragglers), ``--force-foreign`` pids if the user named any, and a
bounded wait until no process of ours holds a GPU and the memory is back. There is no
pattern-based kill anywhere: ownership is proven by record, group/session or run marker.

Fencing is a cleanup selection too: the runs a migrate moved away from a box and that are not
stopped yet (:mod:`outrig.moves`), each stopped by its recorded id (:func:`fence_on`).
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from typing import Any

from outrig.console import Reporter, had_ended
from outrig.errors import ConfigError, OutrigError
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.journal import utc_text as when
from outrig.moves import moved_runs, stopped_processes
from outrig.session import HostSession, Project, host_session
from outrig.text.layout import audit_gpus, gpu_summary_lines, visible
from outrig.watching.notify import Notifier

HOW = {"term": "exited on SIGTERM", "kill": "killed (SIGKILL)", "gone": "was not running",
       "reused": "pid reused by another process: untouched", "refused": "refused"}


class CleanupIncomplete(OutrigError):
    """Something of ours still holds a GPU, or its memory did not come back."""


def cleanup(project: Project, host_spec: str, reporter: Reporter, *, run_id: str | None = None,
            playbook: str | None = None, all_runs: bool = False,
            force_foreign: Sequence[int | str] = (), dry_run: bool = False,
            timeout: float = 60.0, journal: Journal | None = None,
            book: HostBook | None = None) -> dict[str, Any]:
    """Stop the selected run(s) (and any ``force_foreign`` pids); raise when GPUs stay held.

    With no selection at all, the runs a migrate moved away from this box and that are not
    fenced yet are the selection (see :func:`fence_on`): they are stopped, each by its
    recorded id, and marked fenced. With none of those either, it is the usual error."""
    if not (run_id or playbook or all_runs or force_foreign):
        return cleanup_moved(project, host_spec, reporter, dry_run=dry_run, timeout=timeout,
                             journal=journal, book=book)
    check_selection(run_id, playbook, all_runs, force_foreign, timeout)
    with host_session(project, host_spec, reporter, journal, book=book) as session:
        return cleanup_on(session, run_id=run_id, playbook=playbook, all_runs=all_runs,
                          force_foreign=force_foreign, dry_run=dry_run, timeout=timeout)


def cleanup_moved(project: Project, host_spec: str, reporter: Reporter, *, dry_run: bool,
                  timeout: float, journal: Journal | None = None,
                  book: HostBook | None = None) -> dict[str, Any]:
    """``cleanup --host OLD`` with no selection: stop (fence) the runs moved away from OLD.

    Why this is the default there: after a migrate, the old box's run is a second trainer
    that costs money and writes checkpoints of its own; the warning every command to that box
    prints names exactly this command."""
    with host_session(project, host_spec, reporter, journal, book=book) as session:
        pending = moved_runs(session.journal, session.host.name)
        if not pending:
            raise ConfigError(
                "say what to clean up: --run ID, --playbook NAME, --all, or --force-foreign "
                f"PID (no run was moved away from {host_spec} and left unstopped, which is "
                "what cleanup stops when no run is named). Nothing was sent.")
        if timeout <= 0:
            raise ConfigError("--timeout must be a positive number of seconds")
        ids = ", ".join(str(r.get("run_id")) for r in pending)
        reporter.info(f"• no run named: stopping the run(s) moved away from {host_spec} "
                      f"and not stopped yet: {ids}")
        if dry_run:
            session.moved_warned = True
            runs = [cleanup_on(session, run_id=str(r.get("run_id")), dry_run=True,
                               timeout=timeout, missing_ok=True) for r in pending]
            return {"dry_run": True, "moved": [r.get("run_id") for r in pending],
                    "runs": [run for result in runs for run in result.get("runs") or []]}
        fenced = fence_on(session, timeout=timeout)
        reporter.success(f"fenced {len(fenced)} moved run(s) on {host_spec}: "
                         f"{', '.join(fenced)}")
        return {"fenced": fenced}


def check_selection(run_id: str | None, playbook: str | None, all_runs: bool,
                    force_foreign: Sequence[int | str], timeout: float) -> list[int]:
    """The ``--force-foreign`` pids, once the selection is known to be sound (nothing is
    sent otherwise): exactly one of run, playbook and all, or foreign pids alone."""
    if sum(bool(x) for x in (run_id, playbook, all_runs)) > 1:
        raise ConfigError("give at most one of --run, --playbook and --all")
    if not (run_id or playbook or all_runs or force_foreign):
        raise ConfigError("say what to clean up: --run ID, --playbook NAME, --all, or "
                          "--force-foreign PID")
    pids = []
    for pid in force_foreign:
        try:
            value = int(pid)
        except (TypeError, ValueError):
            raise ConfigError(f"--force-foreign {pid!r}: not a process id") from None
        if value <= 1:
            raise ConfigError(f"--force-foreign {value}: not a process id that may be killed")
        pids.append(value)
    if timeout <= 0:
        raise ConfigError("--timeout must be a positive number of seconds")
    return pids


def cleanup_on(session: HostSession, *, run_id: str | None = None,
               playbook: str | None = None, all_runs: bool = False,
               force_foreign: Sequence[int | str] = (), dry_run: bool = False,
               timeout: float = 60.0, missing_ok: bool = False) -> dict[str, Any]:
    """:func:`cleanup` on an open session (``playbook`` is the name runs are filed under).

    ``missing_ok``: a ``run_id`` the box has no record of, and no process of which carries
    its marker, is not an error but simply not running (fencing a run of a box that lost its
    workdir)."""
    pids = check_selection(run_id, playbook, all_runs, force_foreign, timeout)
    reporter, journal, host_spec = session.reporter, session.journal, session.host_spec
    if all_runs and not dry_run:
        session.moved_warned = True  # it stops them: "cleanup stops it" would be stale
    started = time.monotonic()
    result = session.call("cleanup", run_id=run_id, playbook=playbook, all=all_runs,
                          force_foreign=pids, dry_run=dry_run, gpu_timeout=timeout,
                          lock_timeout=10)
    result["seconds"] = round(time.monotonic() - started, 3)
    if run_id and not missing_ok:
        unknown_run(result, run_id, host_spec)
    if not dry_run:
        for run in result.get("runs") or []:
            if journal.run(str(run.get("run_id"))) is not None:
                journal.record_run(str(run.get("run_id")), {"status": "stopped"})
    if reporter.json_mode:
        reporter.emit_json(result)
    elif dry_run:
        print_dry_run(reporter, result)
    else:
        print_report(reporter, result)
    verdict = result.get("gpu") or {}
    if not dry_run and verdict and not verdict.get("released", True):
        raise CleanupIncomplete(f"cleanup on {host_spec} is incomplete: {verdict.get('message')}")
    if not dry_run:
        fence_stopped(journal, result, every=all_runs, host=session.host.name)
    return result


def fence_on(session: HostSession, notifier: Notifier | None = None, *,
             timeout: float = 60.0) -> list[str]:
    """Stop every moved, not-yet-fenced run on the session's box; return their run ids.

    Each run is stopped exactly, by its recorded id (the agent's ``cleanup`` op, as
    ``cleanup --run``), then marked fenced in the journal and, with a ``notifier``, reported
    as the ``fenced`` event. A run the box has no record of and no process of which carries
    its marker is not running there: it is fenced with nothing stopped. A cleanup that cannot
    free the GPUs raises (:class:`CleanupIncomplete`) and the run stays
    unfenced, so the next contact tries again. ``timeout``: how long to wait for the GPU
    memory to come back (as ``cleanup --timeout``)."""
    journal, host = session.journal, session.host.name
    pending = moved_runs(journal, host)
    session.moved_warned = True  # acting on it: the session's "moved" warning would repeat it
    fenced: list[str] = []
    for record in pending:
        run_id = str(record.get("run_id"))
        moved = record.get("moved_to") or {}
        session.reporter.info(f"• fencing run {run_id} on {session.host_spec}: it was moved to "
                              f"{moved.get('host')} at {when(moved.get('at'))}")
        result = cleanup_on(session, run_id=run_id, timeout=timeout, missing_ok=True)
        stopped = [p for run in result.get("runs") or [] if run.get("run_id") == run_id
                   for p in stopped_processes(run)]
        journal.mark_fenced(run_id, stopped=stopped)
        fenced.append(run_id)
        if notifier is not None:
            notifier.send("fenced", host=host, run_id=run_id, playbook=record.get("playbook"),
                          moved_to=moved, stopped=stopped)
    return fenced


def fence_stopped(journal: Journal, result: dict[str, Any], *, every: bool = False,
                  host: str | None = None) -> None:
    """Mark fenced every run a migrate moved away that this cleanup stopped (whatever the
    selection was): its processes are confirmed stopped, so the "moved" warning ends.
    ``every`` (``cleanup --all``, which stops every outrig run on the box, by record and by
    marker, and succeeded): every moved run of ``host`` is stopped too, listed in the
    result or not (a run the box no longer has a record of is not running there)."""
    listed = set()
    for run in result.get("runs") or []:
        listed.add(str(run.get("run_id")))
        record = journal.run(str(run.get("run_id")))
        if record is not None and record.get("moved_to") and not record.get("fenced"):
            journal.mark_fenced(str(run.get("run_id")), stopped=stopped_processes(run))
    if every and host is not None:
        for record in moved_runs(journal, host):
            if str(record.get("run_id")) not in listed:
                journal.mark_fenced(str(record.get("run_id")), stopped=[])


def unknown_run(result: dict[str, Any], run_id: str, host_spec: str) -> None:
    """Raise when ``--run`` named a run the box has no record of and nothing of it was found:
    "stopped run nosuch" would tell a user with a typo that the run they meant is stopped."""
    for run in result.get("runs") or []:
        if run.get("run_id") != run_id or run.get("known", True):
            continue
        if run.get("processes") or run.get("marked"):
            return  # no record, but processes carrying its marker were found (and stopped)
        raise ConfigError(
            f"no run {run_id} on {host_spec}: the box has no record of it and no process "
            "carries its marker; nothing was stopped. See the run ids with "
            f"`outrig status --host {host_spec}`.")


def _gpu_table(reporter: Reporter, title: str, audit: dict[str, Any],
               after: dict[str, Any] | None = None) -> None:
    cols = ["GPU", "used MiB" if after is None else "used before → after MiB", "total MiB",
            "holders"]
    after_used = {g["index"]: g.get("memory_used_mib") for g in (after or {}).get("gpus") or []}
    holders = (after if after is not None else audit).get("holders") or []
    rows = []
    for gpu in audit.get("gpus") or []:
        index = gpu["index"]
        used = str(gpu.get("memory_used_mib"))
        if after is not None:
            used += f" → {after_used.get(index)}"
        on_gpu = [h for h in holders if h.get("gpu_index") == index]
        names = ", ".join(_holder(h) for h in on_gpu) or "-"
        rows.append([str(index), used, str(gpu.get("memory_total_mib")), names])
    reporter.table(title, cols, rows, fold=True)


def _holder(h: dict[str, Any]) -> str:
    owner = h.get("owner")
    whose = f"{owner['process']}@{owner['run_id']}" if owner else "FOREIGN"
    title = visible(str(h.get("comm") or "?"))
    return f"pid {h['pid']} {title} ({h.get('user') or '?'}, {h.get('used_mib')} MiB, {whose})"


def _foreign(audit: dict[str, Any]) -> list[dict[str, Any]]:
    return [h for h in audit.get("holders") or [] if not h.get("owner")]


def print_report(reporter: Reporter, result: dict[str, Any]) -> None:
    runs = result.get("runs") or []
    for run in runs:
        reporter.table(
            f"stopped run {run.get('run_id')}",
            ["process", "how it ended", "seconds", "stragglers killed"],
            [[str(proc.get("process")),
              had_ended(proc) or HOW.get(str(proc.get("how")), str(proc.get("how"))),
              f"{float(proc.get('seconds') or 0):.1f}", str(proc.get("stragglers") or 0)]
             for proc in run.get("processes") or []])
    reporter.lines([f"force-foreign pid {forced.get('pid')} "
                    f"({visible(str(forced.get('cmdline')))}):"
                    f" {HOW.get(str(forced.get('how')), forced.get('how'))}"
                    for forced in result.get("forced") or []])
    before = result.get("gpus_before") or {}
    after = result.get("gpus_after") or {}
    if before.get("gpus") and reporter.gpu_table:
        _gpu_table(reporter, "GPUs", before, after)
    elif before.get("gpus"):
        reporter.lines(gpu_summary_lines(audit_gpus(after or before), reporter.width))
    elif before.get("error"):
        reporter.warn(f"GPU audit unavailable: {before['error']}")
    foreign = _foreign(after or before)
    if foreign:
        reporter.warn("processes outrig did not start hold GPUs (left alone):")
        reporter.lines([f"  pid {h['pid']} user {h.get('user')} GPU {h.get('gpu_index')} "
                        f"{h.get('used_mib')} MiB: "
                        f"{visible(str(h.get('cmdline') or h.get('comm')))}" for h in foreign])
        pids = " ".join(str(h["pid"]) for h in foreign)
        reporter.lines([f"  to kill them anyway: outrig cleanup --host HOST --force-foreign "
                        f"{pids}"])
    verdict = result.get("gpu") or {}
    count = sum(len(r.get("processes") or []) for r in runs)
    freed = sum((verdict.get("freed_mib") or {}).values())
    if (after or before).get("unreadable"):  # no audit was made: nothing to claim
        reporter.warn(
            f"cleanup done in {float(result.get('seconds') or 0):.1f}s: {len(runs)} run(s), "
            f"{count} process(es) stopped; the GPUs could not be audited "
            f"({(after or before).get('error')}): whether a process holds one is unknown. "
            "Look at the driver (nvidia-smi on the box).")
    elif verdict.get("released", True):
        reporter.success(
            f"cleanup done in {float(result.get('seconds') or 0):.1f}s: {len(runs)} run(s), "
            f"{count} process(es); nothing of ours holds a GPU"
            + (f"; {freed} MiB freed in {verdict.get('seconds')}s" if freed else ""))


def print_dry_run(reporter: Reporter, result: dict[str, Any]) -> None:
    lines = ["dry run: nothing was signalled"]
    for run in result.get("runs") or []:
        lines.append(f"run {run.get('run_id')}:")
        for proc in run.get("processes") or []:
            members = proc.get("members") or []
            lines.append(f"  {proc.get('process')}: leader pid {proc.get('pid')} "
                         f"({proc.get('leader')}), {len(members)} other process(es) in its "
                         f"group/session/marker {members if members else ''}")
        if run.get("marked"):
            lines.append(f"  carrying the run marker: {run.get('marked')}")
    for info in result.get("force_foreign") or []:
        lines.append(f"would force-kill pid {info.get('pid')}: user {info.get('user')}, "
                     f"{info.get('cmdline') or info.get('comm')}")
    reporter.lines(lines)
    before = result.get("gpus_before") or {}
    if before.get("gpus"):
        _gpu_table(reporter, "GPUs now", before)


def stop_all_runs(project: Project, box: str, journal: Journal) -> None:
    """Every run of ours on ``box`` stopped, quietly (``release --force`` of a rented box:
    :data:`outrig.providers.renting.StopRuns`)."""
    quiet = Reporter(quiet=True, out=io.StringIO(), err=io.StringIO())
    cleanup(project, box, quiet, all_runs=True, journal=journal)
