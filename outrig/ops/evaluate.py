"""``outrig evaluate``: serve a drafter with speculative decoding on the box, measure it, stop.

Everything that can be refused is refused before a server starts: the settings
(:func:`outrig.evaluation.settings_for`), a local prompts file (read and checked here), the
checkpoint (the agent's ``checkpoints`` op and its completeness rule), the prompts on the box
(the ``bench`` op with ``check_only``), and the GPUs (a running run that holds one is named).
Then the server is an ordinary recorded run, deployed through :func:`deploy_on` under
``<playbook>.evaluate`` (so it never stops the training run) and stopped by its run id through
:func:`cleanup_on`, on success, on failure and on Ctrl-C alike. The ``bench`` op sends the
prompts from the box and returns the counters around them; the numbers are vLLM's own.
"""

from __future__ import annotations

import dataclasses
import os
import secrets as _secrets
import sys
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from outrig.agent_code import parse_prompt_lines
from outrig.checkpoints import assess, newest_complete, order_text
from outrig.console import Reporter
from outrig.errors import ConfigError, OutrigError, PlanError, RemoteError
from outrig.evaluation import (
    MAX_INLINE_PROMPT_BYTES,
    EvalSettings,
    acceptance,
    bench_fields,
    compare_rows,
    measured,
    rate,
    report_lines,
    server_playbook,
    settings_for,
    speculative_config,
    speedup,
)
from outrig.inventory import resolve_host
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup_on
from outrig.ops.deploy import deploy_on
from outrig.ops.placement import held_runs
from outrig.ops.runs import new_run_id
from outrig.plan import builtin_params
from outrig.playbook import Job, find_playbook, load_job, playbook_spec
from outrig.redaction import ordered, redact_tree
from outrig.session import HostSession, Project, host_session
from outrig.yamlfile import YamlDoc

_CHECK_KINDS = ("bad_request", "not_found")


class EvaluationFailed(OutrigError):
    """The server answered with errors, or counted nothing: the numbers would mislead."""


def evaluate(project: Project, host_spec: str, playbook: str, reporter: Reporter, *,
             run_id: str | None = None, checkpoint: str | None = None,
             requests: int | None = None, baseline: bool | None = None,
             journal: Journal | None = None) -> dict[str, Any]:
    """Load the playbook, open the session, :func:`evaluate_on`."""
    job = load_job(find_playbook(playbook, project.playbooks_dir))
    with host_session(project, host_spec, reporter, journal) as session:
        return evaluate_on(session, job, run_id=run_id, checkpoint=checkpoint,
                           requests=requests, baseline=baseline)


def evaluate_on(session: HostSession, job: Job, *, run_id: str | None = None,
                checkpoint: str | None = None, requests: int | None = None,
                baseline: bool | None = None) -> dict[str, Any]:
    """One evaluation (and its baseline) on an open session; returns the document it
    recorded in the journal and printed."""
    reporter = session.reporter
    run = training_run(session, job, run_id)
    settings = resolve(session, job, run, requests=requests, baseline=baseline)
    inline = local_prompts(session.project, job, settings)
    ckpt = find_checkpoint(session, settings, checkpoint)
    check_prompts(session, settings, inline)
    check_gpus(session, settings, job.name)
    speculative = speculative_config(settings, ckpt.get("path") if ckpt else None)
    # the servers' plans, progress and stop reports go to stderr: stdout holds the result
    quiet = Reporter(json_mode=False, out=sys.stderr, gpu_table=reporter.gpu_table)
    spec_side = serve_and_send(session, job, settings, speculative, inline, quiet,
                               "with speculative decoding")
    base_side = (serve_and_send(session, job, settings, None, inline, quiet,
                                "baseline, without speculation")
                 if settings.baseline else None)
    doc = document(session, job, run, settings, speculative, ckpt, spec_side, base_side)
    return publish(session, job, doc)


def publish(session: HostSession, job: Job, doc: dict[str, Any]) -> dict[str, Any]:
    """Record the evaluation in the journal and print it (``--json``: the document; else the
    report). What the box and the server said may hold a value of the playbook's
    ``secrets:`` (a path, a server's message): the journal, the JSON and the report get it
    redacted with this shell's values, as tail-logs' mirror does. Returns what was
    recorded."""
    reporter = session.reporter
    doc = redact_tree(doc, ordered(os.environ.get(k, "") for k in job.spec.secrets))
    session.journal.record_evaluation(doc["eval_id"], doc)
    if reporter.json_mode:
        reporter.emit_json(doc)
    else:
        reporter.lines(report_lines(doc))
        reporter.success(f"evaluation {doc['eval_id']} recorded; compare: outrig evaluate "
                         f"--host {session.host_spec} --playbook {job.name} --compare")
    return doc


def training_run(session: HostSession, job: Job, run_id: str | None) -> dict[str, Any] | None:
    """The run whose checkpoints are evaluated: ``--run``, else the playbook's newest run on
    this host in the journal (None when there is none)."""
    if run_id is not None:
        record = session.journal.run(run_id)
        if record is None:
            raise ConfigError(f"--run {run_id}: the journal has no such run; see the run ids "
                              f"with `outrig status --host {session.host_spec}`")
        return record
    runs = session.journal.runs(host=session.host.name, playbook=job.name)
    return runs[0] if runs else None


def resolve(session: HostSession, job: Job, run: dict[str, Any] | None, *,
            requests: int | None, baseline: bool | None) -> EvalSettings:
    """The settings with the flags applied; every problem refused at once (exit 2)."""
    params: dict[str, object] = dict(job.spec.params)
    if run is not None:
        params.update(builtin_params(session.host, job, str(run.get("run_id"))))
    else:
        params.update({k: v for k, v in builtin_params(session.host, job, "none").items()
                       if k not in ("run_id", "run_dir", "job_id")})
    dflash = getattr(job.spec, "dflash", None) if job.spec.recipe == "dflash" else None
    settings, problems = settings_for(job.spec.evaluate, dflash, params, str(job.doc.path))
    if requests is not None and requests < 1:
        problems.append(f"--requests {requests}: give at least 1")
    if problems or settings is None:
        raise PlanError(problems, context=f"evaluate {job.name} on {session.host.name}")
    changes: dict[str, Any] = {}
    if requests is not None:
        changes["requests"] = requests
    if baseline is not None:
        changes["baseline"] = baseline
    return dataclasses.replace(settings, **changes)


def local_prompts(project: Project, job: Job, settings: EvalSettings
                  ) -> list[dict[str, Any]] | None:
    """A workstation prompts file, read and checked (the first ``requests`` prompts)."""
    if settings.prompts.kind != "local":
        return None
    path = Path(settings.prompts.paths[0]).expanduser()
    if not path.is_absolute():
        path = project.root / path
    where = job.doc.where(("evaluate", "prompts"))
    if not path.is_file():
        raise ConfigError(f"{where}: prompts file {path} does not exist; fix the path "
                          "(relative paths start at the project root), or write box:PATH "
                          "for a file on the box")
    if path.stat().st_size > MAX_INLINE_PROMPT_BYTES:
        raise ConfigError(f"{where}: {path} is {path.stat().st_size >> 20} MiB, more than "
                          f"the {MAX_INLINE_PROMPT_BYTES >> 20} MiB sent with a request; put "
                          "it on the box (outrig stage, or files:) and write prompts: box:PATH")
    items, problems = parse_prompt_lines(path.read_text(encoding="utf-8", errors="replace"),
                                         str(path))
    if problems or not items:
        shown = "; ".join(problems[:3]) or "no prompt in it"
        raise ConfigError(f"{where}: {path} is not JSONL of prompts: {shown}. Each line "
                          "must be {\"prompt\": \"...\"} or {\"messages\": [{\"role\": ..., "
                          "\"content\": ...}]}")
    return items[: settings.requests]


def find_checkpoint(session: HostSession, settings: EvalSettings,
                    path: str | None) -> dict[str, Any] | None:
    """The checkpoint evaluated: ``--checkpoint`` (refused when torn), else the newest
    complete one under the save path; None for a method without one (ngram)."""
    speculative = settings.speculative or {}
    if path is not None and not (settings.needs_checkpoint or "model" in speculative):
        raise ConfigError(f"--checkpoint {path}: method {speculative.get('method')} drafts "
                          "without a checkpoint; leave --checkpoint out, or give "
                          "evaluate.speculative a method that loads one (dflash, eagle3)")
    if path is None and not settings.needs_checkpoint:
        model = (settings.speculative or {}).get("model")
        return {"path": str(model)} if model else None
    if path is not None:
        parent, _, name = path.rstrip("/").rpartition("/")
        if not name.isdigit():
            return exported_checkpoint(session, path)
        listing = session.call("checkpoints", stream=False, save_path=parent or "/",
                               scheduler=settings.scheduler)
        found = [c for c in assess(listing) if c.path.rstrip("/") == path.rstrip("/")]
        if not found:
            raise ConfigError(f"--checkpoint {path}: no such checkpoint folder on "
                              f"{session.host.name}; list them with `outrig status`")
        chosen = found[0]
        if not chosen.complete:
            raise ConfigError(f"--checkpoint {path} is torn ({chosen.why}): vLLM would load "
                              "half a save. Give a complete one, or leave --checkpoint out "
                              "for the newest complete one")
    else:
        listing = session.call("checkpoints", stream=False, save_path=settings.save_path or "",
                               scheduler=settings.scheduler)
        newest = newest_complete(listing)
        if newest is None:
            torn = "; ".join(f"{c.path}: {c.why}" for c in assess(listing)) or "none yet"
            raise ConfigError(f"no complete checkpoint under {settings.save_path} on "
                              f"{session.host.name} ({torn}); train first (or wait for the "
                              "first save), or give --checkpoint PATH")
        chosen = newest
    return {"path": chosen.path, "epoch": chosen.epoch, "local_step": chosen.local_step,
            "global_step": chosen.global_step, "order_text": order_text(chosen.order)}


def exported_checkpoint(session: HostSession, path: str) -> dict[str, Any]:
    """A drafter folder that is not a numbered save (an export): it must exist on the box."""
    result = session.call("model_facts", stream=False, models=[path], pythons=[])
    report: dict[str, Any] = next(iter(result.get("models") or []), {})
    if not report.get("exists"):
        raise ConfigError(f"--checkpoint {path}: not found on {session.host.name}; give a "
                          "drafter folder that exists there (config.json and weights)")
    return {"path": path}


def check_prompts(session: HostSession, settings: EvalSettings,
                  inline: list[dict[str, Any]] | None) -> None:
    """Prompts on the box (a file, or training conversations) read there before anything
    starts: missing or malformed is bad input (exit 2), named with its fix."""
    if inline is not None:
        return
    try:
        result = session.call("bench", stream=False,
                              **bench_fields(settings, None, check_only=True))
    except RemoteError as exc:
        if exc.kind in _CHECK_KINDS:
            raise ConfigError(f"evaluate.prompts: {exc}") from None
        raise
    session.reporter.info(f"• {result.get('prompts')} prompt(s) on the box "
                          f"({', '.join(result.get('kinds') or [])})")


def check_gpus(session: HostSession, settings: EvalSettings, playbook: str) -> None:
    """Refuse GPUs a running run of the box holds (an earlier evaluation's server excepted:
    deploying the next one replaces it), naming the run and the fix."""
    if not settings.gpus:
        return
    status = session.call("status", stream=False, log_lines=0, gpu_holders=True)
    own = server_playbook(playbook, settings, None)["name"]
    clashes = []
    for run in held_runs(status):
        taken = sorted(set(run["gpus"]) & set(settings.gpus))
        if run.get("status") == "running" and taken and run.get("playbook") != own:
            clashes.append(f"run {run['run_id']} holds GPU(s) {taken}")
    if clashes:
        raise ConfigError(
            f"evaluate.server.gpus {settings.gpus}: {'; '.join(clashes)} on "
            f"{session.host.name}. Stop it first (outrig cleanup --host {session.host_spec} "
            "--run RUN) or give evaluate.server.gpus other GPUs. Nothing was started.")


def server_job(job: Job, settings: EvalSettings, speculative: dict[str, Any] | None) -> Job:
    """The server as a one-process playbook of its own (the training playbook's secrets
    passed on, e.g. a hub token for a gated verifier)."""
    raw = server_playbook(job.name, settings, speculative)
    raw["secrets"] = list(job.spec.secrets)
    spec = playbook_spec().model_validate(raw)
    return Job(name=raw["name"], spec=spec, doc=YamlDoc(path=job.doc.path, data=raw),
               test_mode=False)


def serve_and_send(session: HostSession, job: Job, settings: EvalSettings,
                   speculative: dict[str, Any] | None, inline: list[dict[str, Any]] | None,
                   reporter: Reporter, label: str) -> dict[str, Any]:
    """Start the server (a recorded run), send the prompts, stop exactly that run."""
    server = server_job(job, settings, speculative)
    run_id = new_run_id(server.name)
    outer = session.reporter
    session.reporter = reporter
    try:
        reporter.info(f"• starting vLLM {label} (run {run_id})")
        started = deploy_on(session, server, run_id=run_id)
        bench = session.call("bench", handler=lambda e: progress(reporter, e),
                             **bench_fields(settings, inline))
    finally:
        try:
            cleanup_on(session, run_id=run_id, timeout=60.0, missing_ok=True)
        finally:
            session.reporter = outer
    if bench.get("failed"):
        raise EvaluationFailed(
            f"{bench['failed']} of {bench.get('sent')} request(s) failed on the server "
            f"{label} (run {run_id}, stopped): {(bench.get('errors') or ['?'])[0]}. See its "
            f"log: outrig tail-logs --host {session.host_spec} --run {run_id} --no-follow")
    return {"run_id": run_id, "start_seconds": round(started.seconds, 3), "bench": bench}


def progress(reporter: Reporter, event: dict[str, Any]) -> None:
    """The bench's progress as one live line; other events as the reporter shows them."""
    if event.get("event") == "bench_progress":
        reporter.live(f"requests: {event.get('done')}/{event.get('total')} answered, "
                      f"{event.get('tokens')} tokens, {event.get('elapsed')}s")
    else:
        reporter.event(event)


def document(session: HostSession, job: Job, run: dict[str, Any] | None,
             settings: EvalSettings, speculative: dict[str, Any] | None,
             ckpt: dict[str, Any] | None, spec_side: dict[str, Any],
             base_side: dict[str, Any] | None) -> dict[str, Any]:
    """The evaluation's one document (``--json``, the journal)."""
    bench = spec_side["bench"]
    counts = measured(str(bench.get("metrics_before") or ""),
                      str(bench.get("metrics_after") or ""))
    numbers = acceptance(counts)
    tps = rate(int(bench.get("completion_tokens") or 0), float(bench.get("seconds") or 0))
    base_tps = None
    if base_side is not None:
        base = base_side["bench"]
        base_tps = rate(int(base.get("completion_tokens") or 0), float(base.get("seconds") or 0))
    at = time.time()
    doc: dict[str, Any] = {
        "eval_id": f"{job.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(at))}-"
                   f"{_secrets.token_hex(2)}",
        "playbook": job.name, "host": session.host.name,
        "run_id": run.get("run_id") if run else None, "checkpoint": ckpt,
        "model": settings.model, "method": (speculative or {}).get("method"),
        "num_speculative_tokens": (speculative or {}).get("num_speculative_tokens"),
        "speculative_config": speculative, **numbers,
        "requests": bench.get("sent"), "completion_tokens": bench.get("completion_tokens"),
        "seconds": bench.get("seconds"), "tokens_per_s": tps,
        "baseline_tokens_per_s": base_tps, "speedup": speedup(tps, base_tps),
        "max_tokens": settings.max_tokens, "concurrency": settings.concurrency,
        "temperature": settings.temperature,
        "server_start_seconds": spec_side["start_seconds"],
        "baseline_start_seconds": base_side["start_seconds"] if base_side else None,
        "server_runs": [s["run_id"] for s in (spec_side, base_side) if s],
        "counters_seen": counts.seen, "at": at}
    if not counts.drafts:
        session.reporter.warn(
            "the server counted no drafts: speculative decoding was not in effect (no "
            "vllm:spec_decode counters moved). Check the speculative config and the server log"
            " (a runner setting can silence a drafter, vllm#49559)")
    return doc


def compare(project: Project, host_spec: str, playbook: str, reporter: Reporter, *,
            journal: Journal | None = None) -> list[dict[str, Any]]:
    """``evaluate --compare``: the recorded evaluations of the playbook (nothing is sent)."""
    name = load_job(find_playbook(playbook, project.playbooks_dir)).name
    host = resolve_host(host_spec, hosts_dir=project.hosts_dir)
    records = (journal or Journal()).evaluations(playbook=name, host=host.name)
    if reporter.json_mode:
        reporter.emit_json({"playbook": name, "evaluations": records})
        return records
    if not records:
        reporter.info(f"no evaluation of {name} on {host.name} recorded yet; run outrig "
                      f"evaluate --host {host_spec} --playbook {playbook}")
        return records
    table = Table(title=f"evaluations of {name} on {host.name}", title_justify="left")
    for col in ("checkpoint", "accept len", "per position", "tokens/s", "speedup", "when"):
        table.add_column(col, overflow="fold")
    for row in compare_rows(records):
        table.add_row(*row)
    reporter.stdout_console.print(table)
    return records
