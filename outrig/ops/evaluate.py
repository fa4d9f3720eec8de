"""``outrig evaluate``: serve a drafter with speculative decoding on the box, measure it, stop.

Everything that can be refused is refused before a server starts: the settings
(:func:`outrig.evaluation.spec.settings_for`), a local prompts file (read and checked here), the
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
import sys
from pathlib import Path
from typing import Any

from outrig.agent_code import parse_prompt_lines, prompts_digest
from outrig.checkpoints import assess, newest_complete, order_text
from outrig.console import Reporter
from outrig.errors import ConfigError, PlanError, RemoteError
from outrig.evaluation.card import card_markdown
from outrig.evaluation.datasets import box_file, parse_dataset
from outrig.evaluation.report import full_report
from outrig.evaluation.spec import (
    MAX_INLINE_PROMPT_BYTES,
    EvalSettings,
    Prompts,
    bench_fields,
    compare_rows,
    server_playbook,
    settings_for,
    speculative_config,
)
from outrig.inventory import Host, HostBook
from outrig.journal import Journal
from outrig.ops.evaluate_document import document
from outrig.ops.evaluate_serving import (
    CheckpointRewritten,
    EvaluationFailed,
    baselines,
    box_facts,
    per_request_level,
    serve_and_send,
)
from outrig.ops.placement import held_runs
from outrig.plan import builtin_params
from outrig.playbook import Job, find_playbook, load_job
from outrig.recipes import drafter_methods, eval_defaults
from outrig.redaction import ordered, redact_tree
from outrig.session import HostSession, Project, host_session

_CHECK_KINDS = ("bad_request", "not_found")
SMOKE_FILE = Path(__file__).resolve().parent.parent / "evaluation" / "prompts" / "smoke.jsonl"
__all__ = ["CheckpointRewritten", "EvaluationFailed", "compare", "evaluate", "evaluate_on"]


@dataclasses.dataclass(frozen=True)
class Options:
    """The command's flags beyond the playbook: each None or empty leaves the playbook's."""

    run_id: str | None = None
    checkpoint: str | None = None
    requests: int | None = None
    baseline: bool | None = None
    fresh: bool = False  # --baseline fresh: measure the baseline again
    ks: tuple[int, ...] = ()  # --sweep-k 3,7,15: one speculative server per value
    card: Path | None = None  # --card FILE.md
    command: tuple[str, ...] = ()  # the command line, for the card's "reproduce"
    dataset: str | None = None  # --dataset spec_bench|speed_bench[:CATEGORY]
    dataset_path: str | None = None  # --dataset-path PATH (on the box)
    gpus: tuple[int, ...] | None = None  # evaluate.during_training.gpus: the server's GPUs


def evaluate(project: Project, host_spec: str, playbook: str | Job, reporter: Reporter,
             options: Options | None = None, *, journal: Journal | None = None,
             book: HostBook | None = None) -> dict[str, Any]:
    """Load the playbook (or take the one built from flags), open the session,
    :func:`evaluate_on`."""
    job = playbook if isinstance(playbook, Job) else load_job(
        find_playbook(playbook, project.playbooks_dir))
    with host_session(project, host_spec, reporter, journal, book=book) as session:
        return evaluate_on(session, job, options or Options())


def evaluate_on(session: HostSession, job: Job, options: Options) -> dict[str, Any]:
    """One evaluation (each k of a sweep, and the baseline unless cached) on an open session;
    returns the document it recorded in the journal and printed."""
    run = training_run(session, job, options.run_id)
    settings = resolve(session, job, run, requests=options.requests, baseline=options.baseline)
    settings = with_dataset(settings, options.dataset, options.dataset_path)
    if options.gpus is not None:
        settings = dataclasses.replace(settings, gpus=list(options.gpus))
    inline = local_prompts(session.project, job, settings)
    ckpt = find_checkpoint(session, settings, options.checkpoint)
    digest = check_prompts(session, settings, inline)
    check_gpus(session, settings, job.name)
    facts = box_facts(session, settings, ckpt.get("path") if ckpt else None)
    per_request, note = per_request_level(settings, facts)
    # the servers' plans, progress and stop reports go to stderr: stdout holds the result
    quiet = Reporter(json_mode=False, out=sys.stderr, gpu_table=session.reporter.gpu_table,
                     quiet=session.reporter.quiet, err=session.reporter.err)
    sides = []
    for k in options.ks or (None,):
        speculative = speculative_config(settings, ckpt.get("path") if ckpt else None)
        if k is not None and speculative is not None:
            speculative["num_speculative_tokens"] = k
        sides.append(serve_and_send(session, job, settings, speculative, inline, quiet,
                                    "with speculative decoding" + (f", k {k}" if k else ""),
                                    per_request))
    base, base_side = baselines(session, job, settings, inline, quiet, facts, digest,
                                options.fresh)
    unchanged(session, settings, ckpt)
    doc = document(session, job, run, settings, ckpt, sides, base, base_side,
                   facts={**facts, "prompts_sha256": digest, "per_request_note": note},
                   command=list(options.command))
    doc = publish(session, job, doc)
    if options.card is not None:
        write_card(options.card, doc, session.reporter)
    return doc


def write_card(path: Path, doc: dict[str, Any], reporter: Reporter) -> None:
    """Write the model-card section (a local file; its folder must exist)."""
    try:
        path.write_text(card_markdown(doc), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--card {path}: cannot write it ({exc.strerror or exc}); give a "
                          "path in a folder that exists") from None
    reporter.info(f"• model-card section written to {path}")


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
        reporter.lines(full_report(doc))
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
    defaults = eval_defaults(job.spec.recipe, job.spec.recipe_section())
    settings, problems = settings_for(job.spec.evaluate, defaults, params, str(job.doc.path))
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


def with_dataset(settings: EvalSettings, name: str | None, path: str | None
                 ) -> EvalSettings:
    """``--dataset`` / ``--dataset-path`` over the playbook's ``evaluate.dataset`` (refused,
    exit 2, when they do not make one of vLLM's sets)."""
    if name is None and path is None:
        return settings
    base = settings.dataset
    text = name or (base.text if base is not None else None)
    if text is None:
        raise ConfigError("--dataset-path goes with --dataset spec_bench|speed_bench (or the "
                          "playbook's evaluate.dataset)")
    dataset, problems = parse_dataset(
        text, path or (base.path if base is not None else None),
        base.subset if base is not None and base.name == "speed_bench" else None,
        ("--dataset", "--dataset-path", "evaluate.dataset_subset"))
    if problems or dataset is None:
        raise PlanError(problems, context="evaluate --dataset")
    return dataclasses.replace(settings, dataset=dataset,
                               prompts=Prompts("dataset", (box_file(dataset),)))


def local_prompts(project: Project, job: Job, settings: EvalSettings
                  ) -> list[dict[str, Any]] | None:
    """A workstation prompts file (or the smoke set shipped with outrig), read and checked
    (the first ``requests`` prompts)."""
    if settings.prompts.kind not in ("local", "smoke"):
        return None
    if settings.prompts.kind == "smoke":
        items, _ = parse_prompt_lines(SMOKE_FILE.read_text(encoding="utf-8"), str(SMOKE_FILE))
        return items[: settings.requests]
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
    loading = (*drafter_methods(), "eagle3")  # vLLM's methods whose drafter is a checkpoint
    if path is not None and not (settings.needs_checkpoint or "model" in speculative):
        raise ConfigError(f"--checkpoint {path}: method {speculative.get('method')} drafts "
                          "without a checkpoint; leave --checkpoint out, or give "
                          f"evaluate.speculative a method that loads one ({', '.join(loading)})")
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


def unchanged(session: HostSession, settings: EvalSettings,
              ckpt: dict[str, Any] | None) -> None:
    """A numbered checkpoint still holds the state it held when it was chosen: speculators
    rewrites ``<save>/<epoch>/`` in place at each mid-epoch save, and vLLM reads the folder
    while it starts, so a save in between leaves unknown which state was measured. States
    only advance, so the same state after the measurement as before it proves the one
    loaded. Raises :class:`CheckpointRewritten` (nothing is recorded) when it moved on."""
    if not ckpt or not isinstance(ckpt.get("epoch"), int):
        return
    path = str(ckpt["path"]).rstrip("/")
    listing = session.call("checkpoints", stream=False, save_path=path.rpartition("/")[0] or "/",
                           scheduler=settings.scheduler)
    now = next((c for c in assess(listing) if c.path.rstrip("/") == path), None)
    before = (ckpt["epoch"], ckpt.get("local_step"), ckpt.get("global_step"))
    if now is not None and now.complete and (now.epoch, now.local_step,
                                             now.global_step) == before:
        return
    later = "gone" if now is None else (order_text(now.order) + (
        f", global step {now.global_step}" if now.global_step is not None else "")
        if now.complete else f"being written ({now.why})")
    raise CheckpointRewritten(
        f"checkpoint {path} was rewritten by the trainer while it was evaluated: it held "
        f"{ckpt.get('order_text')} (global step {ckpt.get('global_step')}) when the server "
        f"started, and now {later}; which of them vLLM loaded is unknown, so nothing was "
        "recorded. Evaluate it again, or evaluate end-of-epoch checkpoints, which are never "
        "rewritten (evaluate.during_training.every: epoch)")


def exported_checkpoint(session: HostSession, path: str) -> dict[str, Any]:
    """A drafter folder that is not a numbered save (an export): it must exist on the box."""
    result = session.call("model_facts", stream=False, models=[path], pythons=[])
    report: dict[str, Any] = next(iter(result.get("models") or []), {})
    if not report.get("exists"):
        raise ConfigError(f"--checkpoint {path}: not found on {session.host.name}; give a "
                          "drafter folder that exists there (config.json and weights)")
    return {"path": path}


def check_prompts(session: HostSession, settings: EvalSettings,
                  inline: list[dict[str, Any]] | None) -> str:
    """Prompts on the box (a file, or training conversations) read there before anything
    starts: missing or malformed is bad input (exit 2), named with its fix. Returns the
    prompt set's sha256 (as sent)."""
    if inline is not None:
        return prompts_digest(inline)
    try:
        result = session.call("bench", stream=False,
                              **bench_fields(settings, None, check_only=True))
    except RemoteError as exc:
        if exc.kind in _CHECK_KINDS:
            key = "evaluate.dataset" if settings.dataset is not None else "evaluate.prompts"
            raise ConfigError(f"{key}: {exc}") from None
        raise
    loaded = result.get("dataset")
    if isinstance(loaded, dict) and settings.dataset is not None:
        counts = ", ".join(f"{k} {v}" for k, v in (loaded.get("categories") or {}).items())
        session.reporter.info(f"• {settings.dataset.text}: {loaded.get('prompts')} prompt(s) "
                              f"read by vLLM {loaded.get('version')}'s {loaded.get('cls')} "
                              f"({counts}); sending the first {result.get('prompts')}")
    else:
        session.reporter.info(f"• {result.get('prompts')} prompt(s) on the box "
                              f"({', '.join(result.get('kinds') or [])})")
    return str(result.get("prompts_sha256") or "")


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


def compare(project: Project, host: Host, host_spec: str, playbook: str, reporter: Reporter,
            *, journal: Journal | None = None) -> list[dict[str, Any]]:
    """``evaluate --compare``: the recorded evaluations of the playbook on ``host`` (nothing
    is sent); ``host_spec``, the host as typed, goes into the command it suggests."""
    name = load_job(find_playbook(playbook, project.playbooks_dir)).name
    records = (journal or Journal()).evaluations(playbook=name, host=host.name)
    if reporter.json_mode:
        reporter.emit_json({"playbook": name, "evaluations": records})
        return records
    if not records:
        reporter.info(f"no evaluation of {name} on {host.name} recorded yet; run outrig "
                      f"evaluate --host {host_spec} --playbook {playbook}")
        return records
    reporter.table(f"evaluations of {name} on {host.name}",
                   ["checkpoint", "accept len", "per position", "tokens/s", "speedup", "when"],
                   compare_rows(records), fold=True)
    return records
