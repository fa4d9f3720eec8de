"""``inv status``: one agent call; progress is parsed here (outrig/progress.py)."""

from __future__ import annotations

import os
from typing import Any

from outrig.console import Reporter, visible
from outrig.errors import ConfigError
from outrig.journal import Journal
from outrig.ops.base import HostSession, Project, host_session, playbook_name


def _selector(run_id: str | None, playbook: str | None, all_runs: bool = False) -> dict[str, Any]:
    if sum(bool(x) for x in (run_id, playbook, all_runs)) > 1:
        raise ConfigError("give at most one of --run, --playbook and --all")
    return {"run_id": run_id, "playbook": playbook}


PROGRESS_BYTES = 16384  # log tail shipped per process for the progress parser
PROGRESS_MARKERS = ["Training epoch "]  # last line holding these is found further back


def status(project: Project, host_spec: str, reporter: Reporter, *, run_id: str | None = None,
           playbook: str | None = None, log_lines: int = 5,
           journal: Journal | None = None) -> dict[str, Any]:
    """``inv status``: one agent exec; progress is parsed here (outrig/progress.py)."""
    playbook = playbook_name(project, playbook)
    with host_session(project, host_spec, reporter, journal) as session:
        return status_on(session, run_id=run_id, playbook=playbook, log_lines=log_lines)


def status_on(session: HostSession, *, run_id: str | None = None, playbook: str | None = None,
              log_lines: int = 5) -> dict[str, Any]:
    """Status of the runs on the session's box, shown (tables, or JSON) and returned."""
    selector = _selector(run_id, playbook)
    result = session.call("status", stream=False, log_lines=log_lines,
                          progress_bytes=PROGRESS_BYTES, markers=PROGRESS_MARKERS,
                          gpu_holders=True, **selector)
    enrich_status(result)
    if session.reporter.json_mode:
        session.reporter.emit_json(result)
    else:
        print_status(session.reporter, result)
    return result


def enrich_status(result: dict[str, Any]) -> dict[str, Any]:
    """Turn the agent's raw status into the documented document (docs/logs-and-status.md):
    parse each process's progress from its shipped log text (then drop the raw text), and map
    every GPU to the processes holding it."""
    from outrig.progress import parse_progress

    holders = [h for h in result.pop("gpu_holders", None) or [] if isinstance(h, dict)]
    for run in result.get("runs") or []:
        redact_run(run)
        for proc in run.get("processes") or []:
            text = proc.pop("tail_text", None)
            markers = proc.pop("markers", None) or {}
            checkpoint = proc.get("checkpoint") or {}
            progress = None
            if isinstance(text, str) and text:
                progress = parse_progress(
                    text, argv=[str(a) for a in proc.get("argv") or []],
                    epoch_line=markers.get("Training epoch "),
                    training_state=checkpoint.get("training_state"))
            proc["progress"] = progress.to_json() if progress is not None else None
            proc["gpus_held"] = sorted({
                h["gpu_index"] for h in holders
                if h.get("gpu_index") is not None and (h.get("owner") or {}).get("run_id")
                == run.get("run_id") and (h.get("owner") or {}).get("process") == proc.get("name")
            })
    facts = result.get("facts") or {}
    gpus = []
    for gpu in facts.get("gpus") or []:
        held = []
        for h in holders:
            if h.get("gpu_index") != gpu.get("index"):
                continue
            owner = h.get("owner") or {}
            held.append({"pid": h.get("pid"), "used_mib": h.get("used_mib"),
                         "run_id": owner.get("run_id"), "process": owner.get("process"),
                         "ours": bool(owner), "comm": h.get("comm"), "user": h.get("user")})
        gpus.append({**gpu, "holders": held})
    result["gpus"] = gpus
    result["gpu_error"] = facts.get("gpu_error") or result.pop("gpu_audit_error", None)
    return result


def redact_run(run: dict[str, Any]) -> None:
    """Replace the values of the run's secrets (``secret_keys``, read from this shell's
    environment) in every log text the box shipped. The box redacts with the values of live
    processes; once they are gone only this shell still knows them. Same function as the box."""
    from outrig.transfer import agent_module

    keys = [str(k) for k in run.get("secret_keys") or []]
    values = sorted({os.environ[k] for k in keys if os.environ.get(k)}, key=len, reverse=True)
    if not values:
        return
    redact = agent_module().redact
    error = run.get("error")
    if isinstance(error, dict):
        error["message"] = redact(str(error.get("message") or ""), values)
        error["excerpt"] = [redact(str(line), values) for line in error.get("excerpt") or []]
    for proc in run.get("processes") or []:
        proc["log_tail"] = [redact(str(line), values) for line in proc.get("log_tail") or []]
        if isinstance(proc.get("tail_text"), str):
            proc["tail_text"] = redact(proc["tail_text"], values)
        markers = proc.get("markers")
        if isinstance(markers, dict):
            proc["markers"] = {k: redact(v, values) if isinstance(v, str) else v
                               for k, v in markers.items()}


def _age(seconds: float | None) -> str:
    from outrig.progress import format_duration

    return "-" if seconds is None else format_duration(seconds)


def print_status(reporter: Reporter, result: dict[str, Any]) -> None:
    """Tables for humans: processes (state, readiness, GPUs, progress), checkpoints, GPUs."""
    from rich.markup import escape
    from rich.table import Table

    from outrig.progress import Progress, summary

    out = reporter.stdout_console
    runs = result.get("runs") or []
    if not runs:
        reporter.info("no outrig runs on this box")
    for run in runs:
        table = Table(title=escape(f"run {run.get('run_id')} ({run.get('playbook')}): "
                                   f"{run.get('status')}"), title_justify="left")
        for col in ("process", "state", "pid", "uptime", "ready", "GPUs", "detail"):
            table.add_column(col, overflow="fold")
        notes: list[str] = []
        for proc in run.get("processes") or []:
            name = str(proc.get("name"))
            state = str(proc.get("state"))
            if state == "exited":
                state += f" ({proc.get('exit_code')})"
            elif state == "killed" and proc.get("signal"):
                state += f" (signal {proc.get('signal')})"
            ready = proc.get("ready")
            detail = ""
            raw_progress = proc.get("progress")
            if isinstance(raw_progress, dict):
                detail = summary(Progress.from_json(raw_progress))
            server = proc.get("server") or {}
            if server.get("health") is not None or server.get("health_error"):
                health = server.get("health") or f"down ({server.get('health_error')})"
                models = ", ".join(server.get("models") or []) or "?"
                detail = f"/health {health}, serving {models}"
            elif not detail and proc.get("log_tail"):
                detail = str(proc["log_tail"][-1])[-100:]
            checkpoint = proc.get("checkpoint")
            if isinstance(checkpoint, dict):
                if checkpoint.get("path"):
                    notes.append(f"{name}: newest complete checkpoint {checkpoint['path']} "
                                 f"({checkpoint.get('count')} in {checkpoint.get('save_path')})")
                else:
                    notes.append(f"{name}: no complete checkpoint yet in "
                                 f"{checkpoint.get('save_path')}")
            failed = (proc.get("state") == "exited" and proc.get("exit_code") not in (0, None)) \
                or proc.get("state") == "killed"
            if failed and proc.get("log_tail"):
                notes.append(f"{name} {state}; last log lines:")
                notes.extend(f"    | {line}" for line in proc["log_tail"])
            held = ",".join(str(i) for i in proc.get("gpus_held") or []) or "-"
            table.add_row(name, state, str(proc.get("pid") or "-"), _age(proc.get("uptime")),
                          "-" if ready is None else ("yes" if ready else "no"), held,
                          escape(visible(detail)))
        out.print(table)
        for note in notes:
            out.print(escape(visible(note)), highlight=False)
    gpus = result.get("gpus") or []
    if gpus:
        table = Table(title="GPUs", title_justify="left")
        for col in ("gpu", "name", "memory", "util", "held by"):
            table.add_column(col, overflow="fold")
        for gpu in gpus:
            who = []
            for h in gpu.get("holders") or []:
                mem = f" {h['used_mib']} MiB" if h.get("used_mib") is not None else ""
                if h.get("ours"):
                    who.append(f"{h.get('process')} (pid {h.get('pid')}{mem})")
                else:
                    who.append(f"NOT OURS: pid {h.get('pid')} {h.get('comm') or ''}{mem}")
            util = gpu.get("utilization_pct")
            table.add_row(str(gpu.get("index")), str(gpu.get("name")),
                          f"{gpu.get('memory_used_mib')}/{gpu.get('memory_total_mib')} MiB",
                          "-" if util is None else f"{util}%",
                          escape(visible("; ".join(who) or "free")))
        out.print(table)
    elif result.get("gpu_error"):
        reporter.info(f"GPUs: {result['gpu_error']}")
