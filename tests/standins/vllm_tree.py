"""A stand-in for the files of an installed vLLM 0.34 that outrig's pre-launch probe reads
(remote/agent/model_facts.py ``SPECULATORS_PROBE``), for the tiers that have no vLLM 0.34:
vLLM 0.34 has no CPU build, and its wheel needs torch 2.14.

Each file holds only what the probe reads, each traced to the 0.34.0 wheel:
- ``vllm/transformers_utils/configs/speculators/algos.py``: ``SUPPORTED_SPECULATORS_TYPES``
  filled by ``register_speculator`` (algos.py:4-12), the five types it registers (15, 53,
  58, 97, 120), the P-EAGLE updater raising ``ValueError("P-EAGLE (parallel drafting
  EAGLE-3) is not supported.")`` (53-55) and DFlash's reading ``aux_hidden_state_layer_ids``
  and ``mask_token_id`` (a KeyError when missing, as there);
- ``vllm/platforms/interface.py``: ``validate_environ``'s message for
  ``VLLM_USE_V2_MODEL_RUNNER`` other than 1 (interface.py:1481-1486);
- ``vllm/engine/arg_utils.py``: the ``--per-request-spec-decode-metrics`` flag (0.34 has it);
- ``vllm-0.34.0.dist-info/METADATA``: the version ``importlib.metadata`` reads.

:func:`make_vllm` makes any such tree: the dataset loader's refusals use one of an older
vLLM without ``vllm/benchmarks/datasets`` and one whose datasets.py has the class (the
loader finds it in the source text, vLLM 0.32-0.34 datasets.py ``class SpecBench(``) in an
interpreter without pandas (vLLM's ``bench`` extra).

The interpreter is a shell script running this machine's Python with the tree first on its
path, so the probe's subprocess sees "vLLM 0.34.0". (The real vLLM 0.32 CPU build runs the
same probe in tests/contract/test_launch_check.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

ALGOS = '''
SUPPORTED_SPECULATORS_TYPES = {}


def register_speculator(name):
    def decorator(fn):
        SUPPORTED_SPECULATORS_TYPES[name] = fn
        return fn

    return decorator


@register_speculator("eagle3")
def update_eagle3(config_dict, pre_trained_config):
    pre_trained_config["draft_vocab_size"] = config_dict.get("draft_vocab_size")


@register_speculator("peagle")
def update_peagle(config_dict, pre_trained_config):
    raise ValueError("P-EAGLE (parallel drafting EAGLE-3) is not supported.")


@register_speculator("dflash")
def update_dflash(config_dict, pre_trained_config):
    aux_layer_ids = config_dict["aux_hidden_state_layer_ids"]
    pre_trained_config["dflash_config"] = {"mask_token_id": config_dict["mask_token_id"],
                                           "target_layer_ids": [i - 1 for i in aux_layer_ids]}


@register_speculator("dflash2")
def update_dflash2(config_dict, pre_trained_config):
    update_dflash(config_dict, pre_trained_config)


@register_speculator("dspark")
def update_dspark(config_dict, pre_trained_config):
    update_dflash(config_dict, pre_trained_config)
'''

INTERFACE = '''
class Platform:
    @classmethod
    def validate_environ(cls, hard_fail):
        for env, value in os.environ.items():
            if env == "VLLM_USE_V2_MODEL_RUNNER":
                if value != "1":
                    raise ValueError(
                        f"VLLM_USE_V2_MODEL_RUNNER={value} is no longer supported: "
                        "Model Runner V1 has been removed. Unset this variable."
                    )
'''


def make_vllm(root: Path, version: str, files: dict[str, str]) -> str:
    """A vLLM ``version`` of just these files (paths under ``vllm/``); returns the
    interpreter (a script running this machine's Python with the tree first on its path)."""
    for rel, text in files.items():
        target = root / "site" / "vllm" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    (root / "site" / "vllm" / "__init__.py").write_text("")
    meta = root / "site" / f"vllm-{version}.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    python = root / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{root / "site"}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return str(python)


def make_vllm_034(root: Path) -> str:
    """vLLM 0.34's files the pre-launch probe reads; returns the interpreter that sees them."""
    return make_vllm(root, "0.34.0", {
        "transformers_utils/configs/speculators/algos.py": ALGOS,
        "platforms/interface.py": INTERFACE,
        "engine/arg_utils.py": '"--per-request-spec-decode-metrics"\n'})
