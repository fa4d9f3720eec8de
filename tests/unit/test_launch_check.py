"""The pre-launch rules (outrig/evaluation/launch_check.py) on constructed probe reports:
which refusal is raised, with which key and fix, and how a server's argv is read."""

from __future__ import annotations

import json

from outrig.evaluation.launch_check import launch_problems, server_python, speculative_model


def env(version: str = "0.34.0", removed: bool | None = True,
        drafters: list[dict[str, object]] | None = None) -> dict[str, object]:
    return {"versions": {"vllm": version}, "vllm_runner_v1_removed": removed,
            "vllm_speculators_types": ["dflash", "eagle3", "peagle"],
            "drafters": drafters or []}


def test_a_refused_drafter_names_the_key_the_reason_and_the_fix() -> None:
    peagle = {"path": "/c/3", "type": "peagle", "refused": "ValueError: P-EAGLE ..."}
    mtp = {"path": "/c/4", "type": "mtp", "refused": "Expected one of: ..."}
    ok = {"path": "/c/5", "type": "dflash", "refused": None}
    problems = launch_problems(env(drafters=[peagle, mtp, ok]), {}, env_key="e",
                               drafter_key="the checkpoint")
    assert len(problems) == 2
    assert problems[0].startswith("the checkpoint: /c/3 is a speculators 'peagle' checkpoint "
                                  "that vLLM 0.34.0 on the box refuses to load: ValueError")
    assert "vLLM 0.33 or older" in problems[0]
    assert "train an algorithm this vLLM loads (dflash, eagle3, peagle)" in problems[1]


def test_the_v1_runner_is_refused_only_where_vllm_removed_it() -> None:
    for value, removed, count in (("0", True, 1), ("false", True, 1), ("1", True, 0),
                                  ("0", False, 0), ("0", None, 0)):
        problems = launch_problems(env(removed=removed), {"VLLM_USE_V2_MODEL_RUNNER": value},
                                   env_key="evaluate.server.env", drafter_key="d")
        assert len(problems) == count, (value, removed, problems)
    assert launch_problems(env(), {}, env_key="e", drafter_key="d") == []
    (only,) = launch_problems(env(), {"VLLM_USE_V2_MODEL_RUNNER": "0"},
                              env_key="evaluate.server.env", drafter_key="d")
    assert "remove VLLM_USE_V2_MODEL_RUNNER from evaluate.server.env" in only


def test_the_argv_tells_the_drafter_and_the_interpreter() -> None:
    config = json.dumps({"method": "eagle3", "model": "/d/1"})
    assert speculative_model(["python", "-m", "vllm", "--speculative-config", config]) == (
        True, "/d/1")
    assert speculative_model([f"--speculative-config={config}"]) == (True, "/d/1")
    assert speculative_model(["x", "--speculative-config", '{"method": "ngram"}']) == (
        True, None)
    assert speculative_model(["x", "--speculative-config", "not json"]) == (True, None)
    assert speculative_model(["x", "--model", "m"]) == (False, None)
    assert server_python(["/v/bin/python3.11", "-m", "vllm"]) == "/v/bin/python3.11"
    assert server_python(["/v/bin/vllm", "serve", "m"]) == "/v/bin/python"
    assert server_python(["vllm", "serve", "m"]) is None
    assert server_python([]) is None
