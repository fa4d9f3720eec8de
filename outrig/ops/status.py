"""``inv status``: one agent call; progress is parsed here (outrig/progress.py)."""

from __future__ import annotations

import os
import time
from typing import Any

from outrig.console import Reporter
from outrig.errors import ConfigError, ConnectError
from outrig.evaluation.served import served_trend
from outrig.hang import store as hang_store
from outrig.hang.judge import defaults
from outrig.hosts import gpu_health
from outrig.inventory import HostBook
from outrig.journal import Journal, utc_text
from outrig.metrics.store import loss_trends, remember_samples
from outrig.providers.ledger import annotate_costs, rental_lines, rental_summary
from outrig.redeploy.record import run_host
from outrig.run_history import last_known_document, last_known_lines, seen_from_status
from outrig.session import HostSession, Project, host_session
from outrig.text.layout import fmt


def _selector(run_id: str | None, playbook: str | None, all_runs: bool = False) -> dict[str, Any]:
    if sum(bool(x) for x in (run_id, playbook, all_runs)) > 1:
        raise ConfigError("give at most one of --run, --playbook and --all")
    return {"run_id": run_id, "playbook": playbook}


PROGRESS_BYTES = 16384  # log tail shipped per process for the progress parser
PROGRESS_MARKERS = ["Training epoch "]  # last line holding these is found further back


def status(project: Project, host_spec: str, reporter: Reporter, *, run_id: str | None = None,
           playbook: str | None = None, log_lines: int = 5,
           journal: Journal | None = None, book: HostBook | None = None) -> dict[str, Any]:
    """``inv status``: one agent exec; progress is parsed here (outrig/progress.py). With
    ``run_id``, a box whose host file is gone is reached at the address the run's record
    holds (:func:`outrig.redeploy.record.run_host`)."""
    journal = journal or Journal()
    book = book or HostBook(project.hosts_dir)
    host = run_host(book, journal, host_spec, run_id)[0] if run_id else None
    with host_session(project, host_spec, reporter, journal, host=host,
                      book=book) as session:
        try:
            return status_on(session, run_id=run_id, playbook=playbook, log_lines=log_lines)
        except ConnectError as exc:
            record = session.journal.run(run_id) if run_id is not None else None
            if record is None:
                raise
            show_last_known(reporter, record, exc)
            raise


def show_last_known(reporter: Reporter, record: dict[str, Any], exc: ConnectError) -> None:
    """``status --run R`` of a run whose box does not answer: the journal's last known state
    of it (state as last seen and when, progress, checkpoint), marked as the journal's; the
    error then ends the command with exit 1, as any unreachable box does."""
    error = str(exc).split(". ")[0]
    if reporter.json_mode:
        reporter.emit_json(last_known_document(record, error))
    else:
        reporter.lines(last_known_lines(record, error, reporter.width))


def status_on(session: HostSession, *, run_id: str | None = None, playbook: str | None = None,
              log_lines: int = 5) -> dict[str, Any]:
    """Status of the runs on the session's box, shown (tables, or JSON) and returned."""
    selector = _selector(run_id, playbook)
    result = session.call("status", stream=False, log_lines=log_lines,
                          progress_bytes=PROGRESS_BYTES, markers=PROGRESS_MARKERS,
                          gpu_holders=True, hang=hang_request(session, playbook), **selector)
    read_answer(session.journal, result)
    mark_hangs(result, session)
    remember_progress(session.journal, result)
    mark_moved_runs(result, session)
    mark_redeployed(result, session.journal)
    mark_evaluations(result, session)
    mark_gpu_health(result, session)
    rental = rental_summary(session.journal, session.host.name, time.time())
    if rental is not None:  # a box rented through outrig: what it costs (outrig.providers)
        result["rental"] = rental
        annotate_costs(session.journal, [{**r, "host": session.host.name}
                                         for r in result.get("runs") or []], time.time())
    if session.reporter.json_mode:
        session.reporter.emit_json(result)
    else:
        print_status(session.reporter, result)
        session.reporter.lines(evaluation_lines(result))
        warn_gpu_health(session.reporter, result)
        session.reporter.lines(rental_lines(rental))
    return result


def hang_request(session: HostSession, playbook: str | None) -> dict[str, Any] | None:
    """What the agent samples for the hang judge: as the named playbook's ``hang:`` section
    asks (the metric names, the canary), else as the defaults do."""
    settings = playbook_hang(session)(playbook) if playbook else None
    return hang_store.request_for(settings or defaults())


def playbook_hang(session: HostSession) -> hang_store.PlaybookSettings:
    """The ``hang:`` settings of a playbook of the session's project, by name. The playbook
    module (and pydantic with it) is imported only when a playbook is read: a warm status
    of a run whose hang state is saved never pays for it."""
    def read(name: str) -> dict[str, Any] | None:
        from outrig.playbook import hang_settings
        return hang_settings(session.project.playbooks_dir, name)
    return read


def mark_hangs(result: dict[str, Any], session: HostSession) -> None:
    """Each running process's hang verdict (``hung``: the signal and its evidence, with the
    confirmations counted so far), judged with the confirmations the journal kept for the
    run (a watch's, or earlier status calls'); docs/watch.md#hangs."""
    for run in result.get("runs") or []:
        if not isinstance(run, dict) or not isinstance(run.get("run_id"), str):
            continue
        settings = hang_store.settings_for(session.journal, run["run_id"],
                                           playbook_hang(session))
        verdicts = hang_store.judge_answer(session.journal, run, result.get("facts") or {},
                                           settings)
        by_name = {v.process: v for v in verdicts}
        for proc in run.get("processes") or []:
            verdict = by_name.get(str(proc.get("name")))
            if verdict is not None and verdict.evidence:
                proc["hung"] = verdict.to_json()
            proc.pop("hang", None)  # the raw sample: the verdict says what it meant


def mark_gpu_health(result: dict[str, Any], session: HostSession) -> None:
    """Each GPU's health (``gpus[].health``: verdict, a short form, findings), judged from the
    facts against the journal's last look at the box; a GPU that turned ``bad`` since then
    is a ``gpu_unhealthy`` event in ``gpu_events``, with the runs whose processes hold it."""
    verdicts, before = gpu_health.look(session.journal, session.host.name,
                                       result.get("facts") or {})
    by_index = {v.get("index"): v for v in verdicts}
    for gpu in result.get("gpus") or []:
        verdict = by_index.get(gpu.get("index"))
        if verdict is not None:
            gpu["health"] = {"verdict": verdict["verdict"], "short": gpu_health.short(verdict),
                             "findings": verdict["findings"]}
    events = []
    for verdict in gpu_health.newly_bad(verdicts, before):
        held: dict[str, Any] = next((g for g in result.get("gpus") or []
                                     if g.get("index") == verdict.get("index")), {})
        runs = sorted({str(h.get("run_id")) for h in held.get("holders") or []
                       if h.get("run_id")})
        events.append({"event": "gpu_unhealthy", "host": session.host.name,
                       **gpu_health.event_fields(verdict), "runs": runs})
    result["gpu_events"] = events


def warn_gpu_health(reporter: Reporter, result: dict[str, Any]) -> None:
    """A warning per ``bad`` GPU; one that turned bad since the last look says so first."""
    new = {e.get("gpu"): e for e in result.get("gpu_events") or []}
    for gpu in result.get("gpus") or []:
        health = gpu.get("health") or {}
        if health.get("verdict") != gpu_health.BAD:
            continue
        event = new.get(gpu.get("index"))
        runs = (event or {}).get("runs") or sorted(
            {str(h.get("run_id")) for h in gpu.get("holders") or [] if h.get("run_id")})
        held = f" (held by run {', '.join(runs)})" if runs else ""
        reporter.warn(("gpu_unhealthy: " if event else "")
                      + gpu_health.summary({"index": gpu.get("index"), **health}) + held)


def remember_progress(journal: Journal, result: dict[str, Any]) -> None:
    """Keep in the journal what an enriched status answer says of each run's progress and
    newest complete checkpoint (``last_seen``), for ``outrig runs`` and for a later
    ``status`` of a box that is gone."""
    now = time.time()
    for run in result.get("runs") or []:
        if isinstance(run, dict) and isinstance(run.get("run_id"), str):
            journal.record_seen(run["run_id"], seen_from_status(run, now))


EVALUATION_KEYS = ("eval_id", "checkpoint", "method", "acceptance_length", "per_position",
                   "tokens_per_s", "baseline_tokens_per_s", "speedup", "at")


def mark_evaluations(result: dict[str, Any], session: HostSession) -> None:
    """Each run's newest ``outrig evaluate`` of its checkpoints (from the journal), as
    ``evaluation``: what the drafter is worth on vLLM, beside the trainer's own metrics;
    and ``served``, the acceptance length per evaluated checkpoint step."""
    for run in result.get("runs") or []:
        found = session.journal.evaluations(run_id=str(run.get("run_id")))
        if found:
            run["evaluation"] = {k: found[0].get(k) for k in EVALUATION_KEYS}
            run["served"] = [list(row) for row in served_trend(found)]


def evaluation_lines(result: dict[str, Any]) -> list[str]:
    """``run R: checkpoint C evaluated on vLLM ...: acceptance length 3.10 ...``."""
    lines = []
    for run in result.get("runs") or []:
        ev = run.get("evaluation")
        if not ev:
            continue
        ckpt = (ev.get("checkpoint") or {}).get("path") or ev.get("method")
        lines.append(f"run {run.get('run_id')}: {ckpt} evaluated on vLLM "
                     f"{utc_text(ev.get('at'))}: acceptance length "
                     f"{fmt(ev.get('acceptance_length'))}, per position "
                     f"{' '.join(fmt(p) for p in ev.get('per_position') or []) or '-'}, "
                     f"speedup {fmt(ev.get('speedup'))}× (outrig evaluate --compare)")
        served = run.get("served") or []
        if len(served) > 1:
            lines.append(f"run {run.get('run_id')}: served acceptance length by checkpoint "
                         "step: " + ", ".join(f"{s} {fmt(v)}" for s, v in served[-8:]))
    return lines


def read_answer(journal: Journal, result: dict[str, Any]) -> None:
    """A raw ``status`` answer as ``status`` and ``watch`` show it: its metric records and
    GPU samples kept in the journal first (:func:`enrich_status` drops the log text they
    come from), then enriched, then each process's loss sparkline from the kept series."""
    remember_samples(journal, result)
    enrich_status(result)
    loss_trends(journal, result)


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


def mark_moved_runs(result: dict[str, Any], session: HostSession) -> None:
    """Show runs a migrate moved away from this box as ``moved`` (or ``fenced`` once their
    processes were confirmed stopped), not as the job's live run: ``status`` becomes that,
    ``box_status`` keeps what the box said (``running`` when the old trainer still trains),
    and ``moved_to``/``fenced`` are the journal's marks (see :mod:`outrig.moves`)."""
    moved = {str(r.get("run_id")): r for r in session.journal.moved_runs(session.host.name)}
    for run in result.get("runs") or []:
        record = moved.get(str(run.get("run_id")))
        if record is None:
            continue
        run["box_status"] = run.get("status")
        run["status"] = "fenced" if record.get("fenced") else "moved"
        run["moved_to"] = record.get("moved_to")
        run["fenced"] = record.get("fenced")


def mark_redeployed(result: dict[str, Any], journal: Journal) -> None:
    """A run that a move (``migrate``, watch's move) or a restart (``watch --restarts``)
    deployed again from an earlier run's record (:mod:`outrig.redeploy`): ``redeployed``
    says from which run and host, with which params, and every difference from that run as
    it was deployed (none: the same job)."""
    for run in result.get("runs") or []:
        record = journal.run(str(run.get("run_id"))) or {}
        origin = record.get("migrated_from") or record.get("restarted_from")
        if not isinstance(origin, dict):
            continue
        run["redeployed"] = {"how": "moved" if record.get("migrated_from") else "restarted",
                             "run_id": origin.get("run_id"), "host": origin.get("host"),
                             "params": record.get("param_overrides") or {},
                             "differences": list(origin.get("differences") or [])}


def redact_run(run: dict[str, Any]) -> None:
    """Replace the values of the run's secrets (``secret_keys``, read from this shell's
    environment) in every log text the box shipped. The box redacts with the values of live
    processes; once they are gone only this shell still knows them. Same function as the box."""
    from outrig.agent_code import redact

    keys = [str(k) for k in run.get("secret_keys") or []]
    values = sorted({os.environ[k] for k in keys if os.environ.get(k)}, key=len, reverse=True)
    if not values:
        return
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


def print_status(reporter: Reporter, result: dict[str, Any]) -> None:
    """For humans, laid out for the terminal's width (outrig/text/layout.py)."""
    reporter.status(result)
