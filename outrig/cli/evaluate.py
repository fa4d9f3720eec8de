"""The ``evaluate`` task: what a trained drafter is worth on the real vLLM (docs/evaluate.md).

A module of its own: one task over one op (outrig/ops/evaluate.py), with the most flags of
any; :mod:`outrig.cli` lists it with the others.
"""

from __future__ import annotations

from typing import Any

from outrig.cli.flags import HOST_HELP, NO_KEEP_HELP, PROJECT_HELP, friendly, make_reporter, number
from outrig.errors import ConfigError
from outrig.settings import playbook_for, settings_for
from outrig.taskspec import task


@task(
    auto_shortflags=False,
    help={"host": HOST_HELP, "playbook": "the playbook whose evaluate: key (or dflash: "
          "section) says what to serve and send",
          "run": "the training run whose checkpoints are evaluated (default: the "
                 "playbook's newest run on this host)",
          "checkpoint": "a checkpoint folder on the box (default: the run's newest complete "
                        "one); a torn one is refused",
          "requests": "how many prompts to send (default: evaluate.requests, 32)",
          "baseline": "also serve the verifier without speculation and report the speedup "
                      "(default: evaluate.baseline, true)",
          "no_baseline": "skip the baseline server (no speedup is reported)",
          "compare": "print the recorded evaluations of the playbook's runs; nothing is sent",
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
          "json": "one JSON document: acceptance_length, per_position, drafts, draft_tokens, "
                  "accepted_tokens, tokens_per_s, baseline_tokens_per_s, speedup, checkpoint "
                  "(progress goes to stderr)"},
)
@friendly
def evaluate(c: Any, host: str | None = None, playbook: str | None = None,
             run: str | None = None, checkpoint: str | None = None,
             requests: str | None = None, baseline: bool = False,
             no_baseline: bool = False,
             compare: bool = False, project: str | None = None, no_keep: bool = False,
             json: bool = False) -> None:
    """Measure a drafter the way vLLM uses it: acceptance length, per position, speedup.

    Starts vLLM on the box with speculative decoding (the verifier, the checkpoint as the
    drafter) as a recorded run, waits until it serves, sends the prompts from the box, reads
    vLLM's spec_decode counters before and after, and stops exactly that server. With a
    baseline (the default) the same prompts go to the verifier alone, for the speedup. The
    result is recorded with the checkpoint; `outrig status` shows the newest one beside the
    trainer's metrics and --compare lists them all. Bad input (no checkpoint, a torn one,
    GPUs a running run holds, a missing or malformed prompts file) is refused before
    anything starts.

    Examples:
        outrig evaluate --host uk-node --playbook dflash-qwen36
        outrig evaluate --host uk-node --playbook dflash-qwen36 --checkpoint /w/ckpt/2
        outrig evaluate --host uk-node --playbook dflash-qwen36 --compare
    """
    from outrig.cli.targets import one_host  # at run time only, as in outrig.cli.runs
    from outrig.ops.evaluate import compare as run_compare
    from outrig.ops.evaluate import evaluate as run_evaluate

    settings = settings_for(c, project, no_keep=no_keep)
    reporter = make_reporter(json)
    host_spec = one_host(settings, reporter, host).spec
    name = playbook_for(settings, playbook, host_spec, reporter, what="evaluate")
    if compare:
        run_compare(settings.project, host_spec, name, reporter)
        return
    if baseline and no_baseline:
        raise ConfigError("give --baseline or --no-baseline, not both")
    count = None if requests is None else int(number(requests, "requests", 32))
    run_evaluate(settings.project, host_spec, name, reporter, run_id=run,
                 checkpoint=checkpoint, requests=count,
                 baseline=True if baseline else (False if no_baseline else None))
