"""``inv deploy`` and ``inv plan``: plan locally, then one agent call does the rest.

The plan is checked completely on the workstation first (nothing is sent when it has a
problem). Then a single exec pushes the files, stops the previous run of this playbook,
launches every process in its own session and waits for readiness, streaming progress.

A recipe that needs facts about its model which nobody declared (layer count, weight size),
or whose model is a local path that must exist on *this* box, costs one more exec first: the
agent's read-only ``model_facts`` op, on the same connection (~2 RTT, ~0.5 s at 240 ms). Its
answer is cached in the journal, and a missing model stops the deploy before anything is
stopped or started.
"""

from __future__ import annotations

import base64
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from outrig import recipes
from outrig.console import Reporter
from outrig.errors import Interrupted, OutrigError, PlanError, RemoteError
from outrig.evaluation.launch_check import (
    RUNNER_ENV,
    launch_problems,
    server_python,
    speculative_model,
)
from outrig.inventory import Host, HostBook
from outrig.journal import Journal
from outrig.ops.runs import new_run_id, secret_values
from outrig.plan import HostFacts, NodePlace, Plan, make_plan
from outrig.playbook import Job, find_playbook, load_job
from outrig.recipes import EnvFacts, ModelFacts
from outrig.redeploy.record import RECORD_KEY, move_record
from outrig.session import HostSession, Project, host_facts, host_session


@dataclass
class DeployResult:
    plan: Plan
    launched: bool
    processes: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    rtt: float | None = None
    connect_seconds: float | None = None
    status: str = "planned"  # running, finished (nothing left running) or launched (no wait)
    replaced: dict[str, Any] | None = None  # the playbook's run this deploy stopped (the box's)


def deployed_status(result: dict[str, Any], wait: bool) -> str:
    """The run's state after a successful deploy call, as the box recorded it."""
    if result.get("status") == "finished":
        return "finished"
    return "running" if wait else "launched"


LIVE = ("running", "launching", "finished")  # a replaced run in these was news to someone


def concurrent_replacement(replaced: dict[str, Any] | None, elapsed: float) -> bool:
    """Whether the run this deploy replaced was started while this deploy command ran: by
    another deploy of the playbook started at about the same moment, which got the box's
    workdir lock first and may have reported that run ready. Durations are compared, each
    on its own machine's clock (the box's ``age`` of the run when it answered; how long this
    command had run when the answer came), so clock skew cannot decide it."""
    if not replaced or replaced.get("status") not in LIVE:
        return False
    age = replaced.get("age")
    return isinstance(age, (int, float)) and age <= elapsed


def replaced_words(replaced: dict[str, Any] | None) -> str:
    """``; it replaced run X, started 2 s ago by another deploy ...`` for a concurrent
    replacement (:func:`concurrent_replacement`); else nothing."""
    if not replaced or not replaced.get("concurrent"):
        return ""
    return (f"; it replaced run {replaced.get('run_id')}, started "
            f"{float(replaced['age']):.0f} s ago by another deploy of this playbook that "
            "finished first (only this run runs now)")


class DeploySuperseded(OutrigError):
    """The deploy's run came up, but another deploy of the same playbook was waiting for the
    box and replaces it the moment this one lets go."""


def superseded(session: HostSession, plan: Plan, result: dict[str, Any]) -> None:
    """Raise :class:`DeploySuperseded` when the box saw other deploys of the playbook
    waiting for its lock as this one finished (``waiting`` in the result): two identical
    deploys started at once ran one after the other, and the first said ``✓ ready`` (exit
    0) for a run the second stopped two seconds later. Its run is marked replaced."""
    waiting = [str(w.get("run_id")) for w in result.get("waiting") or []
               if isinstance(w, dict) and w.get("run_id")]
    if not waiting:
        return
    session.journal.record_run(plan.run_id, {"replaced_by": waiting[-1]})
    session.reporter.emit_json({"event": "superseded", "run_id": plan.run_id,
                                "by": waiting})
    raise DeploySuperseded(
        f"{plan.playbook} came up on {plan.host} as run {plan.run_id}, but another deploy "
        f"of {plan.playbook} started meanwhile was waiting for the box and replaces that run "
        f"now: run {', '.join(waiting)}. Only {waiting[-1]} will run, and its deploy reports "
        f"it; outrig status --host {session.host_spec} shows it.")


def deployed_message(plan: Plan, status: str, processes: list[dict[str, Any]], seconds: float,
                     host_spec: str, replaced: dict[str, Any] | None = None,
                     hint: bool = True) -> str:
    """The closing line: what is running now, which processes finished their work before
    they were ready (a resumed trainer with nothing left to do exits 0 at once), and the run
    of a deploy started at the same moment that this one replaced. ``hint``: the commands to
    look at the run next (not where the host is gone a moment later: the demo's)."""
    finished = [str(p.get("name")) for p in processes if p.get("outcome") == "finished"]
    were = "it was" if len(finished) == 1 else "they were"
    done = (f"{', '.join(finished)} finished (exited 0 before {were} ready: nothing left "
            "to do?)") if finished else ""
    if status == "finished":
        head = f"{plan.playbook} finished on {plan.host} in {seconds:.1f}s: {done}; " \
               "nothing is running"
    elif status == "launched":
        head = f"{plan.playbook} launched on {plan.host} (not waiting for readiness)"
    else:
        head = f"{plan.playbook} ready on {plan.host} in {seconds:.1f}s"
        head += f"; {done}" if done else ""
    head += replaced_words(replaced)
    if not hint:
        return f"{head} — run {plan.run_id}."
    return (f"{head} — run {plan.run_id}. Next: outrig status --host {host_spec}, "
            f"outrig tail-logs --host {host_spec}")

def plan_job(job: Job, host: Host, journal: Journal, *, run_id: str | None = None,
             probed: dict[str, ModelFacts] | None = None,
             envs: dict[str, EnvFacts] | None = None, node: NodePlace | None = None) -> Plan:
    """Plan with what the journal knows (plus models and environments just probed);
    ``node``: the box's place in a multi-node job (see :mod:`outrig.ops.nodes`)."""
    facts = host_facts(host, journal)
    models = cached_models(journal, host)
    models.update(probed or {})
    facts = HostFacts(gpu_count=facts.gpu_count, gpu_memory_mib=facts.gpu_memory_mib,
                      source=facts.source, models=models, envs=dict(envs or {}))
    plan = make_plan(job, host, facts, run_id or new_run_id(job.name), node)
    if plan.problems:
        raise PlanError(plan.problems, context=f"{job.name} on {host.name}")
    return plan


def cached_models(journal: Journal, host: Host) -> dict[str, ModelFacts]:
    """Model facts from an earlier contact. Whether the path *exists* is not carried over:
    the box may have been replaced since, so only a fresh probe may say so."""
    out: dict[str, ModelFacts] = {}
    for model, data in journal.model_facts(host.name).items():
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(data.get("seen") or 0)))
        facts = ModelFacts.from_json(data, f"read on the box {when}, cached")
        out[model] = ModelFacts(model=model, num_hidden_layers=facts.num_hidden_layers,
                                weight_bytes=facts.weight_bytes, path=facts.path,
                                source=facts.source, vocab_size=facts.vocab_size,
                                hidden_size=facts.hidden_size)
    return out


def probe_models(session: HostSession, models: list[str], pythons: list[str] | None = None
                 ) -> tuple[dict[str, ModelFacts], dict[str, EnvFacts]]:
    """One ``model_facts`` exec: layer count, weight bytes and existence of each model, and
    the package versions (torch, speculators, ...) of each interpreter."""
    pythons = pythons or []
    session.reporter.info("• reading on the box: " + ", ".join(
        [*models, *(f"packages of {p}" for p in pythons)]))
    result = session.call("model_facts", models=models, pythons=pythons)
    reports = [r for r in result.get("models") or [] if isinstance(r, dict)]
    session.journal.remember_models(session.host.name, reports)
    envs = {str(r.get("python")): EnvFacts.from_json(r, "read on the box just now")
            for r in result.get("envs") or [] if isinstance(r, dict)}
    return ({str(r.get("model")): ModelFacts.from_json(r, "read on the box just now")
             for r in reports}, envs)


def deploy_request(plan: Plan, *, wait: bool, secrets: dict[str, str],
                   allow_unhealthy_gpu: bool = False) -> dict[str, Any]:
    """The agent request for a plan (files read and encoded here, at the last moment).
    ``allow_unhealthy_gpu``: place processes on GPUs the health judge calls ``bad`` (the box
    refuses them otherwise, before it touches anything: docs/troubleshooting.md)."""
    from pathlib import Path

    files = []
    for remote, local in plan.files:
        data = Path(local).read_bytes()
        files.append({"path": remote, "data_b64": base64.b64encode(data).decode("ascii"),
                      "mode": Path(local).stat().st_mode & 0o777})
    processes = []
    for name in plan.order:
        proc = plan.processes[name]
        ready = None
        if proc.ready is not None:
            ready = {"http": proc.ready.http, "log": proc.ready.log, "port": proc.ready.port,
                     "exit": proc.ready.exit, "timeout": proc.ready.timeout}
            if proc.ready.model is not None:
                ready["model"] = proc.ready.model
            if proc.ready.generate:
                ready["generate"] = True
        processes.append({"name": name, "argv": proc.argv, "env": proc.env, "cwd": proc.cwd,
                          "gpus": proc.gpus, "after": proc.after, "ready": ready,
                          "fatal": proc.fatal, "stop_grace": proc.stop_grace,
                          "stop_children_first": proc.stop_children_first,
                          "checkpoints": proc.checkpoints, "scratch": proc.scratch})
    manifest = plan.to_dict()
    request = {"playbook": plan.playbook, "run_id": plan.run_id, "secrets": secrets,
               "files": files, "processes": processes, "wait": wait, "lock_timeout": 10,
               "progress_interval": 1.0, "manifest": manifest}
    if allow_unhealthy_gpu:
        request["allow_unhealthy_gpu"] = True
    return request


def deploy(project: Project, host_spec: str, playbook: str, reporter: Reporter, *,
           test: bool = False, dry_run: bool = False, wait: bool = True,
           journal: Journal | None = None, params: dict[str, Any] | None = None,
           allow_unhealthy_gpu: bool = False, hint: bool = True,
           book: HostBook | None = None) -> DeployResult:
    """Plan, show the plan, and (unless ``dry_run``) deploy in one agent call.

    ``params`` (from ``--param``) override the playbook's params and are journalled with the
    run, so a later look at the run says what it was started with. ``hint``: see
    :func:`deployed_message`. ``book``: the command's hosts, resolved once."""
    with host_session(project, host_spec, reporter, journal, book=book) as session:
        job = load_job(find_playbook(playbook, project.playbooks_dir), test=test, params=params)
        return deploy_on(session, job, dry_run=dry_run, wait=wait, params=params,
                         allow_unhealthy_gpu=allow_unhealthy_gpu, hint=hint)


def deploy_on(session: HostSession, job: Job, *, dry_run: bool = False, wait: bool = True,
              params: dict[str, Any] | None = None, run_id: str | None = None,
              allow_unhealthy_gpu: bool = False, hint: bool = True) -> DeployResult:
    """:func:`deploy` of a loaded playbook on an open session. A dry run sends nothing; a
    deploy whose recipe needs facts about its models reads them first, on the same
    connection. ``run_id``: the run's id (default: a new one; a deploy on several hosts
    gives each host its own, so their journal records never collide).
    ``allow_unhealthy_gpu``: see :func:`deploy_request`."""
    reporter, journal = session.reporter, session.journal
    if not dry_run:  # an unedited example host: refused before a plan suggests a deploy began
        session.host.refuse_placeholder()
    begun = time.monotonic()
    plan = plan_on(session, job, probe=not dry_run, run_id=run_id)
    if not dry_run:
        check_speculative_servers(session, plan)
    reporter.plan(plan)
    if dry_run:
        reporter.emit_json({"event": "plan", "plan": plan.to_dict()})
        reporter.info("dry run: nothing was sent")
        return DeployResult(plan=plan, launched=False)
    secrets = secret_values(plan.secrets)
    request = deploy_request(plan, wait=wait, secrets=secrets,
                             allow_unhealthy_gpu=allow_unhealthy_gpu)
    started = time.monotonic()
    journal.record_run(plan.run_id, {"run_id": plan.run_id, "host": plan.host,
                                     "playbook": plan.playbook, "created": time.time(),
                                     "test_mode": plan.test_mode, "plan": plan.to_dict(),
                                     "param_overrides": dict(params or {}),
                                     RECORD_KEY: move_record(job, session.host, params),
                                     "status": "deploying"})
    result = _deploy_call(session, plan, request)
    seconds = time.monotonic() - started
    processes = list(result.get("processes") or [])
    status = deployed_status(result, wait)
    journal.record_run(plan.run_id, {"status": status, "processes": processes,
                                     "run_dir": result.get("run_dir"),
                                     "ran": status in ("running", "finished")})
    replaced = result.get("replaced") if isinstance(result.get("replaced"), dict) else None
    if replaced is not None:
        replaced = {**replaced, "concurrent": concurrent_replacement(
            replaced, time.monotonic() - begun)}
        if replaced["concurrent"]:
            reporter.warn(
                f"this deploy replaced run {replaced.get('run_id')} of {plan.playbook}, "
                f"started {float(replaced['age']):.0f} s ago by another deploy of the same "
                "playbook that got the box first (it may have reported that run ready); only "
                f"{plan.run_id} runs now")
    superseded(session, plan, result)
    outcome = DeployResult(plan=plan, launched=True, processes=processes, seconds=seconds,
                           rtt=session.transport.rtt,
                           connect_seconds=session.transport.connect_seconds, status=status,
                           replaced=replaced)
    reporter.emit_json({"event": "deployed", "run_id": plan.run_id, "ok": True,
                        "status": status, "seconds": round(seconds, 3),
                        "processes": processes, "replaced": replaced})
    reporter.success(deployed_message(plan, status, processes, seconds, session.host_spec,
                                      replaced, hint))
    return outcome


def plan_on(session: HostSession, job: Job, *, probe: bool = True, run_id: str | None = None,
            node: NodePlace | None = None) -> Plan:
    """The plan for ``job`` on the session's box. With ``probe``, models and interpreters the
    recipe needs facts about (and the journal does not know) are read on the box first."""
    probed: dict[str, ModelFacts] = {}
    envs: dict[str, EnvFacts] = {}
    if probe:
        section = getattr(job.spec, job.spec.recipe) if job.spec.recipe else None
        wanted = recipes.models_to_probe(job.spec.recipe, section,
                                         cached_models(session.journal, session.host))
        pythons = recipes.pythons_to_probe(job.spec.recipe, section)
        if wanted or pythons:
            probed, envs = probe_models(session, wanted, pythons)
    return plan_job(job, session.host, session.journal, probed=probed, envs=envs,
                    run_id=run_id, node=node)


def check_speculative_servers(session: HostSession, plan: Plan) -> None:
    """Each process that starts vLLM with ``--speculative-config``: what its vLLM would refuse
    (the drafter's speculators algorithm, a Model Runner V1 setting) is refused before
    anything is stopped or started (:mod:`outrig.evaluation.launch_check`). One more
    ``model_facts`` exec, only for such a process that names a drafter or sets
    ``VLLM_USE_V2_MODEL_RUNNER`` (whose interpreter the argv tells)."""
    problems: list[str] = []
    for name in plan.order:
        proc = plan.processes[name]
        speculative, drafter = speculative_model(proc.argv)
        python = server_python(proc.argv) if speculative else None
        if python is None or (drafter is None and RUNNER_ENV not in proc.env):
            continue
        result = session.call("model_facts", stream=False, models=[], pythons=[python],
                              drafters=[drafter] if drafter else [])
        env: dict[str, Any] = next(iter(result.get("envs") or []), {})
        problems += launch_problems(env, proc.env, env_key=f"processes.{name}.env",
                                    drafter_key=f"processes.{name}: --speculative-config's "
                                    "model")
    if problems:
        raise PlanError(problems, context=f"{plan.playbook} on {plan.host}")


def _deploy_call(session: HostSession, plan: Plan, request: dict[str, Any]) -> dict[str, Any]:
    """The one deploy exec. A first Ctrl-C asks the box to stop what it launched; every way
    it can fail is journalled with the run before it is raised."""
    journal, reporter = session.journal, session.reporter
    try:
        return session.call("deploy", on_interrupt=lambda: reporter.warn(
            "interrupted: the box is stopping what this deploy launched; Ctrl-C again "
            "stops waiting for it (what was launched may then keep running)"), **request)
    except RemoteError as exc:
        journal.record_run(plan.run_id, {"status": "failed", "error": str(exc)})
        if exc.kind == "cancelled":
            raise Interrupted(
                f"deploy interrupted: the box stopped what run {plan.run_id} had launched "
                f"({launched_names(session.last_events) or 'nothing yet'}); nothing of it "
                "keeps running and the workdir is unlocked.") from None
        raise
    except KeyboardInterrupt:
        journal.record_run(plan.run_id, {"status": "unknown", "error": "interrupted twice"})
        raise Interrupted(
            f"interrupted twice: stopped waiting for the box. Launched so far by run "
            f"{plan.run_id}: {launched_names(session.last_events) or 'nothing'}; the box "
            "goes on stopping them. To make sure they are stopped: outrig cleanup --host "
            f"{shlex.quote(session.host_spec)} --run {plan.run_id}") from None
    except BaseException as exc:
        journal.record_run(plan.run_id, {"status": "unknown", "error": repr(exc)})
        raise


def launched_names(events: list[dict[str, Any]]) -> str:
    """``server (pid 12), trainer (pid 34)``: the processes the agent said it launched."""
    return ", ".join(f"{e.get('process')} (pid {e.get('pid')})" for e in events
                     if e.get("event") == "launched")


def show_plan(host: Host, job: Job, reporter: Reporter) -> Plan:
    """``outrig plan`` of a loaded playbook on ``host``: print the full plan (with what the
    journal knows of the host); nothing is sent. Raises :class:`PlanError` listing every
    problem."""
    plan = plan_job(job, host, Journal())
    reporter.plan(plan, full=True)
    reporter.emit_json(plan.to_dict())
    return plan
