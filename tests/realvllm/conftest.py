"""Fixtures of the real-vLLM tier: the tiny verifiers the real vLLM serves, a host on the
sandbox box (a real sshd on 127.0.0.1) for the whole module, and playbooks whose server is
``python -m vllm.entrypoints.openai.api_server``.

The interpreter is ``vllm_python`` (tests/conftest.py, shared with the rehearsal): unset
``OUTRIG_VLLM_PYTHON`` skips with a hint; set to an interpreter that cannot import vLLM (or
setproctitle, which names its processes) fails: a CI that sets it must run these."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from outrig.sandbox.box import SandboxBox
from outrig.sandbox.nvidia_smi import load_inventory, write_inventory
from tests.realvllm.serving import PROJECT, make_verifier
from tests.support.runs import stop_every_run, stop_recorded_runs


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
