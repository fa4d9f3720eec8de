"""Fixtures shared by the integration tests: ``teardown_runs`` (whatever a test launched on
the sandbox, stopped by outrig's own cleanup), ``keeping`` (warm connections on for one test,
its keepers closed after it), and for the tests that move a job between two
boxes (migrate, the migrate overlap, fencing, watch) A with its own sshd and 4 × 48 GB, and B
on the session's shared sshd with 8 × 96 GB."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from outrig.connectors.keeper.client import close_keepers, wait_gone
from outrig.sandbox.box import SandboxBox, start_sandbox
from outrig.sandbox.nvidia_smi import make_inventory, write_inventory
from outrig.session import Project
from tests.support.runs import stop_every_run, stop_recorded_runs

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def keeping(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Keeping on for this test (the suite has it off); every keeper it started is closed
    at teardown."""
    monkeypatch.setenv("OUTRIG_KEEP_SECONDS", "600")
    yield
    for entry in close_keepers():
        wait_gone(int(entry["pid"]), 10.0)


@pytest.fixture
def box_a(tmp_path: Path) -> Iterator[SandboxBox]:
    box = start_sandbox(tmp_path / "box-a", name="a", gpus=4, gpu_memory_mib=49152)
    try:
        yield box
    finally:
        stop_recorded_runs(box.workdir)
        box.stop()


@pytest.fixture
def host_b(sandbox: SandboxBox, tmp_path: Path) -> Path:
    """B on the shared sshd, with its own workdir and an 8 × 96 GB inventory."""
    if not sandbox.is_running():
        sandbox.start()
    gpu_dir = tmp_path / "gpu-b"
    write_inventory(gpu_dir, make_inventory(8, 98304, "NVIDIA H100 NVL", seed="b"))
    (tmp_path / "workdir-b").mkdir()
    return sandbox.write_host_file(tmp_path / "hosts" / "b.yaml", workdir=tmp_path / "workdir-b",
                                   gpu_dir=gpu_dir, known_hosts=tmp_path / "known_hosts_b")


@pytest.fixture
def teardown_runs(box_host: Path) -> Iterator[None]:
    """Whatever a test launched on the sandbox is stopped by outrig's own cleanup (by record)."""
    yield
    stop_every_run(Project(REPO), str(box_host), box_host.parent / "teardown-state")
