"""How many times one agent request runs nvidia-smi (each run costs 0.1-0.5 s on a real box,
and on a workstation driving many boxes at once every box pays it on every ``status``).

The fake nvidia-smi of the sandbox (outrig/sandbox/nvidia_smi.py) sits behind a wrapper that
appends its arguments to a log, so the test counts real invocations.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from outrig.sandbox import nvidia_smi
from tests.support.agent import Box


def counting_gpu_env(tmp_path: Path, *, broken: bool = False) -> tuple[dict[str, str], Path]:
    """Request env with the fake nvidia-smi (2 GPUs) on PATH behind a logging wrapper;
    ``broken``: it fails as nvidia-smi does without a driver."""
    gpu_dir = tmp_path / "fakegpu"
    nvidia_smi.write_inventory(gpu_dir, nvidia_smi.make_inventory(2, 81559, "NVIDIA H100"))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    real = tmp_path / "fake-nvidia-smi"
    real.write_text(f"#!{sys.executable}\n{Path(nvidia_smi.__file__).read_text()}")
    real.chmod(0o755)
    log = tmp_path / "calls.log"
    wrapper = bindir / "nvidia-smi"
    run = ("echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA "
           "driver.'; exit 9" if broken else f'exec {shlex.quote(str(real))} "$@"')
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {shlex.quote(str(log))}\n{run}\n')
    wrapper.chmod(0o755)
    return {"PATH": f"{bindir}:$PATH", nvidia_smi.STATE_ENV: str(gpu_dir)}, log


def test_status_with_gpu_holders_queries_the_gpus_once(box: Box, tmp_path: Path) -> None:
    env, log = counting_gpu_env(tmp_path)
    _, result = box.agent({"op": "status", "env": env, "log_lines": 0, "gpu_holders": True})
    assert result["ok"] is True, result
    calls = log.read_text().splitlines()
    assert sum("--query-gpu" in c for c in calls) == 1, calls
    assert sum("--query-compute-apps" in c for c in calls) == 1, calls
    facts = result["facts"]
    assert [g["index"] for g in facts["gpus"]] == [0, 1]
    assert facts["gpu_error"] is None
    assert result["gpu_holders"] == []


def test_status_facts_carry_the_gpu_error_when_nvidia_smi_fails(box: Box,
                                                                 tmp_path: Path) -> None:
    env, log = counting_gpu_env(tmp_path, broken=True)
    _, result = box.agent({"op": "status", "env": env, "log_lines": 0, "gpu_holders": True})
    assert result["ok"] is True, result
    facts = result["facts"]
    assert facts["gpus"] == [] and "could not communicate" in facts["gpu_error"], facts
    assert "could not communicate" in result["gpu_audit_error"]
    assert sum("--query-gpu" in c for c in log.read_text().splitlines()) == 1
