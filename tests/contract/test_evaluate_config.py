"""Contract: the speculative config ``outrig evaluate`` renders for a GPU dflash playbook is one
vLLM's own ``SpeculativeConfig`` accepts.

outrig's unit tests only prove it renders what *we* think vLLM takes. Here the config of
``playbooks/dflash-qwen36.yaml`` (method ``dflash``, ``num_speculative_tokens`` from its block
size, the checkpoint as ``model``) is built into vLLM's pydantic ``SpeculativeConfig`` (which
refuses unknown keys and wrong types, and reads the drafter's config.json), with the
checkpoint path replaced by a real speculators 0.9 DFlash drafter of the same block size made
here, for a tiny verifier: the keys and values are the playbook's, the files are real.

Two ways, one check:
- through a subprocess of ``$OUTRIG_VLLM_PYTHON`` (vLLM's CPU build 0.32; CI sets it, with
  ``$OUTRIG_REHEARSAL_PYTHON`` for the drafter); skipped with a hint when either is unset;
- in this interpreter, when it imports vLLM (the opt-in contract venv with vLLM 0.33 of
  tests/contract/test_real_parsers.py); skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from outrig.evaluation.spec import settings_for, speculative_config
from outrig.playbook import load_job
from outrig.recipes import eval_defaults

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "playbooks" / "dflash-qwen36.yaml"
BUILD = """
import json, sys
from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig
target = ModelConfig(model=sys.argv[1], max_model_len=512)
config = SpeculativeConfig(**json.loads(sys.argv[2]), target_model_config=target,
                           target_parallel_config=ParallelConfig())
print(json.dumps({"method": config.method, "model": config.model,
                  "num_speculative_tokens": config.num_speculative_tokens}))
"""


def _defaults(job: Any) -> Any:
    """What the playbook's recipe gives the evaluation (the op asks the same way)."""
    return eval_defaults(job.spec.recipe, job.spec.recipe_section())


def rendered() -> dict[str, Any]:
    """The config the playbook's evaluation serves its checkpoint 3 with."""
    job = load_job(PLAYBOOK)
    params = {"workdir": "/workspace/dflash", "run_dir": "/workspace/dflash/runs/r1"}
    settings, problems = settings_for(job.spec.evaluate, _defaults(job), params, "p")
    assert settings is not None, problems
    config = speculative_config(settings, "/workspace/dflash/checkpoints/3")
    assert config is not None and config["method"] == "dflash"
    return config


def _python(var: str, module: str) -> str:
    """``$var``, else this interpreter when it imports ``module`` (the contract venv)."""
    value = os.environ.get(var)
    if value:
        return value
    if importlib.util.find_spec(module) is not None:
        return sys.executable
    pytest.skip(f"{var} is not set (and {module} is not importable here): the contract needs "
                "the real tool (docs/evaluate.md, 'Tests')")


@pytest.fixture(scope="module")
def real_drafter(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tiny verifier and a random DFlash drafter of the playbook's block size."""
    vllm_python = _python("OUTRIG_VLLM_PYTHON", "vllm")
    spec_python = _python("OUTRIG_REHEARSAL_PYTHON", "speculators")
    out = tmp_path_factory.mktemp("contract")
    made = subprocess.run([vllm_python, str(REPO / "tests/rehearsal/make_verifier.py"),
                           str(out), "--preset", "vllm-cpu", "--conversations", "2"],
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-2000:]
    block = load_job(PLAYBOOK).spec.dflash.block_size  # type: ignore[attr-defined]
    drafted = subprocess.run([spec_python, str(REPO / "tests/realvllm/make_dflash_drafter.py"),
                              str(out / "model"), str(out / "save"), "--block-size",
                              str(block)], capture_output=True, text=True, timeout=600)
    assert drafted.returncode == 0, drafted.stderr[-2000:]
    return {"verifier": str(out / "model"), "drafter": str(out / "save" / "0"),
            "python": vllm_python}


def test_vllm_032_accepts_the_rendered_config(real_drafter: dict[str, str]) -> None:
    config = {**rendered(), "model": real_drafter["drafter"]}
    done = subprocess.run([real_drafter["python"], "-c", BUILD, real_drafter["verifier"],
                           json.dumps(config)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    built = json.loads(done.stdout.strip().splitlines()[-1])
    assert built == {"method": "dflash", "model": real_drafter["drafter"],
                     "num_speculative_tokens": 15}


def test_vllm_refuses_a_key_it_does_not_know(real_drafter: dict[str, str]) -> None:
    """The check above can fail: vLLM's SpeculativeConfig refuses what it does not know."""
    config = {**rendered(), "model": real_drafter["drafter"], "block_size": 16}
    done = subprocess.run([real_drafter["python"], "-c", BUILD, real_drafter["verifier"],
                           json.dumps(config)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert done.returncode != 0 and "block_size" in done.stderr


def test_vllm_in_this_interpreter_accepts_the_rendered_config(
        real_drafter: dict[str, str]) -> None:
    pytest.importorskip("vllm", reason="vLLM is not importable here; run tests/contract from "
                        "the contract venv (vllm==0.33.*), see docs/dflash.md")
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    config = {**rendered(), "model": real_drafter["drafter"]}
    target = ModelConfig(model=real_drafter["verifier"], max_model_len=512)
    built = SpeculativeConfig(**config, target_model_config=target,
                              target_parallel_config=ParallelConfig())
    assert (built.method, built.num_speculative_tokens) == ("dflash", 15)
