"""``inv status``, ``inv tail-logs --no-follow`` and ``inv cleanup``: one agent call each."""

from __future__ import annotations

import time
from typing import Any

from outrig.console import Reporter
from outrig.errors import ConfigError
from outrig.journal import Journal
from outrig.ops.base import Project, host_session


def _selector(run_id: str | None, playbook: str | None, all_runs: bool = False) -> dict[str, Any]:
    if sum(bool(x) for x in (run_id, playbook, all_runs)) > 1:
        raise ConfigError("give at most one of --run, --playbook and --all")
    return {"run_id": run_id, "playbook": playbook}


def status(project: Project, host_spec: str, reporter: Reporter, *, run_id: str | None = None,
           playbook: str | None = None, log_lines: int = 5,
           journal: Journal | None = None) -> dict[str, Any]:
    with host_session(project, host_spec, reporter, journal) as session:
        result = session.call("status", stream=False, log_lines=log_lines,
                              **_selector(run_id, playbook))
    if reporter.json_mode:
        reporter.emit_json(result)
    else:
        print_status(reporter, result)
    return result


def print_status(reporter: Reporter, result: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    runs = result.get("runs") or []
    if not runs:
        reporter.info("no outrig runs on this box")
    for run in runs:
        table = Table(title=escape(f"run {run.get('run_id')} ({run.get('playbook')}): "
                                   f"{run.get('status')}"), title_justify="left")
        for col in ("process", "state", "pid", "uptime", "ready", "last line"):
            table.add_column(col, overflow="fold")
        for proc in run.get("processes") or []:
            state = str(proc.get("state"))
            if state == "exited":
                state += f" ({proc.get('exit_code')})"
            elif state == "killed" and proc.get("signal"):
                state += f" (signal {proc.get('signal')})"
            uptime = proc.get("uptime")
            ready = proc.get("ready")
            tail = proc.get("log_tail") or []
            table.add_row(str(proc.get("name")), state, str(proc.get("pid") or "-"),
                          f"{float(uptime):.0f}s" if uptime is not None else "-",
                          "-" if ready is None else ("yes" if ready else "no"),
                          escape(str(tail[-1])[-100:]) if tail else "")
        reporter.stdout_console.print(table)
    gpus = (result.get("facts") or {}).get("gpus") or []
    if gpus:
        used = ", ".join(f"{g.get('index')}: {g.get('memory_used_mib')}/"
                         f"{g.get('memory_total_mib')} MiB" for g in gpus)
        reporter.stdout_console.print(f"GPUs {escape(used)}")


def logs(project: Project, host_spec: str, reporter: Reporter, *, run_id: str | None = None,
         playbook: str | None = None, processes: list[str] | None = None, lines: int = 50,
         journal: Journal | None = None) -> dict[str, Any]:
    with host_session(project, host_spec, reporter, journal) as session:
        result = session.call("logs", stream=False, processes=processes or None, lines=lines,
                              **_selector(run_id, playbook))
    logs_by_process: dict[str, list[str]] = result.get("logs") or {}
    width = max((len(name) for name in logs_by_process), default=0)
    for name, text_lines in logs_by_process.items():
        for line in text_lines:
            if reporter.json_mode:
                reporter.emit_json({"process": name, "line": line})
            else:
                reporter.stdout_console.out(f"{name:<{width}} | {line}", highlight=False)
    return result


def cleanup(project: Project, host_spec: str, reporter: Reporter, *, run_id: str | None = None,
            playbook: str | None = None, all_runs: bool = False,
            journal: Journal | None = None) -> dict[str, Any]:
    if not (run_id or playbook or all_runs):
        raise ConfigError("say what to clean up: --run ID, --playbook NAME or --all")
    journal = journal or Journal()
    started = time.monotonic()
    with host_session(project, host_spec, reporter, journal) as session:
        result = session.call("cleanup", all=all_runs, lock_timeout=10,
                              **_selector(run_id, playbook, all_runs))
    for run in result.get("runs") or []:
        if journal.run(str(run.get("run_id"))) is not None:
            journal.record_run(str(run.get("run_id")), {"status": "stopped"})
    seconds = time.monotonic() - started
    if reporter.json_mode:
        reporter.emit_json(result)
    else:
        count = sum(len(r.get("processes") or []) for r in result.get("runs") or [])
        reporter.success(f"cleanup done in {seconds:.1f}s: {len(result.get('runs') or [])} "
                         f"run(s), {count} process(es) handled")
    return result


def check(project: Project, host_spec: str, reporter: Reporter,
          journal: Journal | None = None) -> dict[str, Any]:
    """Preflight: reach, python, GPUs, workdir, disk. Raises when the box is not usable."""
    with host_session(project, host_spec, reporter, journal) as session:
        result = session.call("check")
        rtt = session.transport.rtt
    if reporter.json_mode:
        reporter.emit_json({**result, "rtt": rtt})
    else:
        free = result.get("disk_free_bytes")
        reporter.success(
            f"{session.host.describe()} reachable (RTT {rtt * 1000:.0f} ms), python "
            f"{result.get('python')}, workdir {session.host.workdir} "
            f"{'writable' if result.get('workdir_writable') else 'NOT writable'}"
            + (f", {int(free) / 1e9:.1f} GB free" if isinstance(free, int) else "")
            if rtt is not None else f"{session.host.describe()} reachable")
    return result
