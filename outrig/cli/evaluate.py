"""The ``evaluate`` task: what a trained drafter is worth on the real vLLM (docs/evaluate.md).

A module of its own: one task over one op (outrig/ops/evaluate.py), with the most flags of
any; :mod:`outrig.cli` lists it with the others. Without --playbook, --model and
--speculative (and --prompts, default outrig's smoke set) make a one-off evaluate-only
playbook (:func:`flag_playbook`).
"""

from __future__ import annotations

import json as jsonlib
import re
import sys
from pathlib import Path
from typing import Any

from outrig.cli.flags import HOST_HELP, NO_KEEP_HELP, PROJECT_HELP, friendly, make_reporter, number
from outrig.cli.settings import playbook_for, settings_for
from outrig.cli.taskspec import TaskContext, task
from outrig.errors import ConfigError


def parse_ks(text: str) -> tuple[int, ...]:
    """``--sweep-k 3,7,15``: whole numbers ≥ 1, each once. (Not ``--k``: Invoke makes a
    one-letter parameter the short flag ``-k``.)"""
    try:
        ks = tuple(int(part) for part in text.split(","))
    except ValueError:
        ks = ()
    if not ks or any(k < 1 for k in ks) or len(set(ks)) != len(ks):
        raise ConfigError(f"--sweep-k {text}: give num_speculative_tokens values as whole "
                          "numbers ≥ 1, comma-separated and each once, e.g. --sweep-k 3,7,15")
    return ks


def flag_playbook(model: str, speculative: str | None, prompts: str | None,
                  python: str | None = None) -> dict[str, Any]:
    """The evaluate-only playbook (as loaded YAML) of ``--model M --speculative JSON
    [--prompts F] [--python P]``; bad JSON is refused naming the flag."""
    if not speculative:
        raise ConfigError("--model needs --speculative JSON (vLLM's --speculative-config), "
                          "e.g. --speculative '{\"method\": \"ngram\", "
                          "\"num_speculative_tokens\": 3, \"prompt_lookup_max\": 3}'")
    try:
        config = jsonlib.loads(speculative)
    except ValueError as exc:
        raise ConfigError(f"--speculative: not JSON ({exc}); give vLLM's speculative config "
                          "as one JSON object") from None
    if not isinstance(config, dict):
        raise ConfigError("--speculative: give one JSON object, e.g. {\"method\": \"ngram\", "
                          "\"num_speculative_tokens\": 3}")
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", model.rstrip("/").rsplit("/", 1)[-1]).strip("-")
    evaluate: dict[str, Any] = {"model": model, "speculative": config}
    if prompts:
        evaluate["prompts"] = prompts
    if python:
        evaluate["server"] = {"python": python}
    return {"name": f"evaluate-{slug or 'model'}"[:64], "evaluate": evaluate}


@task(
    auto_shortflags=False,
    help={"host": HOST_HELP, "playbook": "the playbook whose evaluate: key (or its recipe's "
          "section) says what to serve and send",
          "model": "without --playbook: the verifier to serve (with --speculative)",
          "speculative": "without --playbook: vLLM's --speculative-config as JSON",
          "prompts": "without --playbook: a JSONL prompts file here, box:PATH, or smoke "
                     "(outrig's own set, the default)",
          "python": "without --playbook: the vLLM venv's interpreter on the box (default "
                    "python3)",
          "run": "the training run whose checkpoints are evaluated (default: the "
                 "playbook's newest run on this host); a multi-node job's id means its "
                 "node 0's run, on node 0's box",
          "checkpoint": "a checkpoint folder on the box (default: the run's newest complete "
                        "one); a torn one is refused",
          "dataset": "vLLM's own prompt set instead: spec_bench or speed_bench, optionally "
                     ":CATEGORY (e.g. speed_bench:coding), read on the box by vLLM's own "
                     "dataset classes; each prompt keeps its category",
          "dataset_path": "where that set is on the box: Spec-Bench's question.jsonl, or "
                          "the SPEED-Bench folder prepared from the hub",
          "requests": "how many prompts to send (default: evaluate.requests, 32)",
          "baseline": "cached (the default): serve the verifier without speculation for "
                      "the speedup, or reuse the one measured before with the same verifier, "
                      "vLLM, GPU, prompts, concurrency and max_tokens; fresh: measure it "
                      "again (even with evaluate.baseline: false)",
          "no_baseline": "skip the baseline (no speedup is reported)",
          "sweep_k": "sweep num_speculative_tokens, e.g. 3,7,15: one server each; the fastest "
                     "is named",
          "card": "also write the result as a model-card section (Markdown) to this file",
          "compare": "print the recorded evaluations of the playbook's runs; nothing is sent",
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
          "json": "one JSON document: acceptance_length, per_position, per_request, levels "
                  "(per concurrency: tokens/s, TTFT, TPOT, ITL, baseline, speedup, "
                  "categories), provenance, flags, checkpoint (progress goes to stderr)"},
)
@friendly
def evaluate(c: TaskContext, host: str | None = None, playbook: str | None = None,
             model: str | None = None, speculative: str | None = None,
             prompts: str | None = None, python: str | None = None,
             run: str | None = None, checkpoint: str | None = None,
             dataset: str | None = None, dataset_path: str | None = None,
             requests: str | None = None, baseline: str | None = None,
             no_baseline: bool = False, sweep_k: str | None = None,
             card: str | None = None,
             compare: bool = False, project: str | None = None, no_keep: bool = False,
             json: bool = False) -> None:
    """Measure a drafter the way vLLM uses it: acceptance, latency and speedup, and why.

    Starts vLLM on the box with speculative decoding as a recorded run, waits until it
    serves, sends the prompts from the box at each concurrency level (streamed: TTFT, TPOT
    and ITL), reads vLLM's spec_decode counters before and after (and its per-request
    metrics where the box's vLLM has them), and stops exactly that server. The baseline (the
    verifier alone, for the speedup) is measured once per verifier, vLLM, GPU, prompts,
    concurrency and max_tokens and reused. The result names the likely cause and fix of a
    bad number, is recorded with the checkpoint (`outrig status` shows the newest, --compare
    lists them) and can be written as a model-card section. Bad input is refused before
    anything starts.

    Examples:
        outrig evaluate --host uk-node --playbook dflash-qwen36
        outrig evaluate --host uk-node --playbook dflash-qwen36 --checkpoint /w/ckpt/2
        outrig evaluate --host uk-node --playbook dflash-qwen36 --card card.md
        outrig evaluate --host uk-node --model /m/q --speculative '{"method": "ngram"}'
        outrig evaluate --host uk-node --playbook dflash-qwen36 --sweep-k 3,7,15
        outrig evaluate --host uk-node --playbook dflash-qwen36 --dataset speed_bench:coding
            --dataset-path /data/speed-bench
        outrig evaluate --host uk-node --playbook dflash-qwen36 --compare
    """
    from outrig.cli.targets import one_host  # at run time only, as in outrig.cli.run_tasks
    from outrig.ops.evaluate import Options
    from outrig.ops.evaluate import compare as run_compare
    from outrig.ops.evaluate import evaluate as run_evaluate
    from outrig.playbook import flag_job

    settings = settings_for(c, project, no_keep=no_keep)
    reporter = make_reporter(json)
    _check_flags(playbook, model, bool(speculative or prompts or python), baseline,
                 no_baseline)
    ks = parse_ks(sweep_k) if sweep_k is not None else ()
    count = None if requests is None else int(number(requests, "requests", 32))
    if run is not None:  # a multi-node job's id: its node 0's run, on node 0's box
        from outrig.journal import Journal
        from outrig.ops.runs import head_run_id

        journal = Journal()
        run = head_run_id(journal, run)
        recorded = (journal.run(run) or {}).get("host")
        host = host or (str(recorded) if recorded else None)
    one = one_host(settings, reporter, host)
    host_spec = one.spec
    options = Options(run_id=run, checkpoint=checkpoint, requests=count,
                      baseline=True if baseline else (False if no_baseline else None),
                      fresh=baseline == "fresh", ks=ks,
                      card=Path(card) if card else None,
                      command=("outrig", *sys.argv[1:]), dataset=dataset,
                      dataset_path=dataset_path)
    if model:
        if compare:
            raise ConfigError("--compare lists a playbook's evaluations: give --playbook")
        job = flag_job(flag_playbook(model, speculative, prompts, python),
                       settings.project.root)
        run_evaluate(settings.project, host_spec, job, reporter, options, book=one.book)
        return
    name = playbook_for(settings, playbook, host_spec, reporter, what="evaluate",
                        book=one.book)
    if compare:
        run_compare(settings.project, one.host, host_spec, name, reporter)
        return
    run_evaluate(settings.project, host_spec, name, reporter, options, book=one.book)


def _check_flags(playbook: str | None, model: str | None, model_flags: bool,
                 baseline: str | None, no_baseline: bool) -> None:
    """The flags that contradict each other, refused before anything is read or sent
    (``model_flags``: --speculative, --prompts or --python given)."""
    if baseline not in (None, "cached", "fresh"):
        raise ConfigError(f"--baseline {baseline}: give --baseline cached (reuse a matching "
                          "one), --baseline fresh (measure again) or --no-baseline")
    if baseline and no_baseline:
        raise ConfigError("give --baseline or --no-baseline, not both")
    if playbook and (model or model_flags):
        raise ConfigError("--model, --speculative, --prompts and --python make a playbook of "
                          "their own; leave them out with --playbook (its evaluate: key says "
                          "them)")
    if model_flags and not model:
        raise ConfigError("--speculative, --prompts and --python go with --model M (the "
                          "verifier)")

