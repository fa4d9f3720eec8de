"""What a ``recipe: dflash`` playbook gives ``outrig evaluate`` (docs/evaluate.md): vLLM
serves ``dflash.model`` with the run's newest checkpoint as its drafter (method ``dflash``, one
token fewer than the block), prompts from the last conversations of ``dflash.prepare.data``,
and the training server's interpreter, GPUs, length, environment and chat template.
"""

from __future__ import annotations

from dataclasses import replace

from outrig.recipes.base import EvalDefaults
from outrig.recipes.dflash import RECIPE as PLANNED
from outrig.recipes.dflash_section import DFlashSpec

DRAFTER_METHOD = "dflash"  # vLLM's speculative method for a DFlash drafter


def eval_defaults(section: DFlashSpec) -> EvalDefaults:
    """The evaluation's defaults from the playbook's validated ``dflash:`` section."""
    return EvalDefaults(
        key="dflash", model=section.model,
        speculative={"method": DRAFTER_METHOD,
                     "num_speculative_tokens": max(1, section.block_size - 1)},
        save_path=section.save_path, prompt_data=tuple(section.prepare.data),
        prompt_data_key="dflash.prepare.data", python=section.server.python,
        gpus=tuple(section.server.gpus), max_model_len=section.server.max_model_len,
        env=dict(section.env), server_args=tuple(str(a) for a in section.server.extra_args),
        scheduler=_scheduler(list(section.trainer.extra_args)), seq_length=section.seq_length)


def _scheduler(args: list[str]) -> bool:
    """False when the trainer runs with ``--scheduler-type none`` (no scheduler file)."""
    for i, arg in enumerate(args):
        if arg == "--scheduler-type" and i + 1 < len(args):
            return str(args[i + 1]) != "none"
        if arg.startswith("--scheduler-type="):
            return str(arg).split("=", 1)[1] != "none"
    return True


RECIPE = replace(PLANNED, eval_defaults=eval_defaults, drafter_method=DRAFTER_METHOD)
"""The dflash recipe as the registry lists it: :mod:`outrig.recipes.dflash`'s (expand, probes,
stage items) with what ``outrig evaluate`` takes from its section."""
