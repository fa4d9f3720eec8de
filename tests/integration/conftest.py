"""Fixtures shared by the integration tests that move a job between two boxes (migrate,
the migrate overlap, fencing, watch): A with its own sshd and 4 × 48 GB, and B on the
session's shared sshd with 8 × 96 GB."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from outrig.sandbox.box import SandboxBox, start_sandbox
from outrig.sandbox.nvidia_smi import make_inventory, write_inventory


@pytest.fixture
def box_a(tmp_path: Path) -> Iterator[SandboxBox]:
    box = start_sandbox(tmp_path / "box-a", name="a", gpus=4, gpu_memory_mib=49152)
    try:
        yield box
    finally:
        stop_recorded_runs(box.workdir)
        box.stop()


def stop_recorded_runs(workdir: Path) -> None:
    """Every run the box recorded under ``workdir``, stopped by its recorded process groups,
    by the processes it recorded as seen, and then by its marker (a test that restarts or
    moves a run, or kills a launcher, may leave a later run's server or an orphaned rank
    behind). A group is signalled only while
    its leader still carries that run's ``OUTRIG_RUN`` marker, so a process group id reused
    by anything else is left alone; each run id is unique to the test that made it."""
    for record in (workdir / "runs").glob("*/run.json"):
        try:
            run = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        marker = f"OUTRIG_RUN={run.get('run_id')}".encode()
        for proc in run.get("processes") or []:
            pgid = proc.get("pgid")
            if not isinstance(pgid, int) or pgid <= 1:
                continue
            try:
                environ = Path(f"/proc/{pgid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue  # gone already
            if marker in environ:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
        # what the box recorded as the run's (pid + start ticks): vLLM's renamed children carry
        # no marker (setproctitle clears their environ) and outlive a killed leader
        seen = record.parent / "descendants.json"
        try:
            items = json.loads(seen.read_text()).get("processes") or []
        except (OSError, ValueError, AttributeError):
            items = []
        for item in items:
            pid, ticks = item.get("pid"), item.get("start_ticks")
            try:
                stat = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if isinstance(pid, int) and pid > 1 and int(stat[19]) == ticks:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        # ranks a launcher started in sessions of their own (as torchrun does) outlive a
        # killed launcher's group: they still carry the run's marker
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if marker in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    os.kill(int(entry), signal.SIGKILL)
            except OSError:
                continue


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
