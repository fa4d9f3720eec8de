"""Checked before launch, on the sandbox box (a real sshd): what the box's vLLM would refuse of
a speculative server is refused by ``outrig evaluate`` and ``outrig deploy`` before any
server starts (exit 2, the reason, no run created).

The box's vLLM here is the stand-in tree of vLLM 0.34 (tests/standins/vllm_tree.py: the
files the probe reads, traced to the 0.34.0 wheel): it refuses a P-EAGLE drafter and
``VLLM_USE_V2_MODEL_RUNNER=0``. The same probe on the real vLLM 0.32 CPU build is
tests/contract/test_launch_check.py."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.test_evaluate import outrig, refused, workdir, write
from tests.standins.vllm_tree import make_vllm_034

PEAGLE = {"speculators_model_type": "peagle", "mask_token_id": 5,
          "speculators_config": {"algorithm": "peagle"},
          "transformer_layer_config": {"model_type": "qwen3"}}
EAGLE3 = {"speculators_model_type": "eagle3", "speculators_config": {"algorithm": "eagle3"},
          "transformer_layer_config": {"model_type": "qwen3"}}


def drafter(tmp_path: Path, name: str, config: dict[str, object]) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def evaluate_playbook(python: str, model: Path, env: dict[str, str] | None = None
                      ) -> dict[str, object]:
    return {"evaluate": {"model": "/models/m", "prompts": "smoke", "requests": 2,
                         "speculative": {"method": "eagle3", "model": str(model),
                                         "num_speculative_tokens": 3},
                         "server": {"python": python, "gpus": [], "env": env or {}}}}


def test_evaluate_refuses_a_peagle_drafter_on_vllm_034(box_project: Path, box_host: Path,
                                                        tmp_path: Path) -> None:
    python = make_vllm_034(tmp_path / "v034")
    write(box_project, "pe", evaluate_playbook(python, drafter(tmp_path, "pe", PEAGLE)))
    done = outrig(box_project, "evaluate", "--host", box_host.stem, "--playbook", "pe")
    refused(done, box_host, "the checkpoint: ", "is a speculators 'peagle' checkpoint that "
            "vLLM 0.34.0 on the box "
            "refuses to load: ValueError: P-EAGLE (parallel drafting EAGLE-3) is not "
            "supported.", "vLLM 0.33 or older")


def test_evaluate_refuses_the_v1_runner_on_vllm_034(box_project: Path, box_host: Path,
                                                     tmp_path: Path) -> None:
    python = make_vllm_034(tmp_path / "v034")
    write(box_project, "v1", evaluate_playbook(python, drafter(tmp_path, "e3", EAGLE3),
                                               {"VLLM_USE_V2_MODEL_RUNNER": "0"}))
    done = outrig(box_project, "evaluate", "--host", box_host.stem, "--playbook", "v1")
    # a playbook without a recipe: the refusal names its own key only (no recipe's env)
    refused(done, box_host, "- evaluate.server.env: VLLM_USE_V2_MODEL_RUNNER=0: "
            "vLLM 0.34.0 on the box has removed "
            "Model Runner V1", "remove VLLM_USE_V2_MODEL_RUNNER from evaluate.server.env")
    assert "peagle" not in done.stderr  # the eagle3 drafter itself loads


def test_deploy_refuses_a_server_vllm_would_refuse(box_project: Path, box_host: Path,
                                                   tmp_path: Path) -> None:
    """A generic playbook's vLLM server with a P-EAGLE drafter and the V1 runner: both
    reasons, exit 2, nothing launched; the same server with an eagle3 drafter and no runner
    setting passes the check (its deploy is then only planned, --dry-run sends nothing, so
    the check is run on the plan of a deploy that starts a harmless process instead)."""
    python = make_vllm_034(tmp_path / "v034")
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m",
            "--speculative-config",
            json.dumps({"method": "eagle3", "model": str(drafter(tmp_path, "pe", PEAGLE))})]
    write(box_project, "srv", {"processes": {"server": {
        "command": argv, "env": {"VLLM_USE_V2_MODEL_RUNNER": "0"}}}})
    done = outrig(box_project, "deploy", "--host", box_host.stem, "--playbook", "srv")
    assert done.returncode == 2, done.stderr
    said = " ".join(done.stderr.split())
    assert "processes.server: --speculative-config's model:" in said, said
    assert "P-EAGLE (parallel drafting EAGLE-3) is not supported" in said, said
    assert "remove VLLM_USE_V2_MODEL_RUNNER from processes.server.env" in said, said
    runs = workdir(box_host) / "runs"
    assert not runs.is_dir() or not list(runs.iterdir())

    # a process that passes the check is deployed: here one whose "vLLM" only sleeps and
    # whose drafter vLLM 0.34 loads (the argv names --speculative-config as vLLM's would)
    sleeper = [python, "-c", "import time; time.sleep(60)", "--speculative-config",
               json.dumps({"method": "eagle3", "model": str(drafter(tmp_path, "e3", EAGLE3))})]
    write(box_project, "ok", {"processes": {"server": {"command": sleeper}}})
    done = outrig(box_project, "deploy", "--host", box_host.stem, "--playbook", "ok",
                  "--no-wait")
    assert done.returncode == 0, done.stderr
    outrig(box_project, "cleanup", "--host", box_host.stem, "--playbook", "ok")
