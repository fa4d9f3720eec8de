"""``migrate`` on two sandbox boxes: A (its own sshd, 4 × 48 GB) and B (8 × 96 GB).

A runs the job with the vLLM and trainer stand-ins; the trainer writes checkpoints. Then
either A "dies" (its sshd stops and its processes are killed) and migrate must find it
unreachable, use the workstation's mirror, re-plan for B and resume; or A is alive and migrate
copies the checkpoint box to box and cleans A up."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from outrig.connectors.ssh.transport import SSHTransport
from outrig.console import Reporter
from outrig.inventory import resolve_host
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import DeployResult, deploy
from outrig.ops.migrate import migrate
from outrig.ops.stage import sync_checkpoints
from outrig.sandbox.box import SandboxBox
from outrig.sandbox.proxy import Fault, LatencyProxy
from outrig.session import Project
from tests.support.network import free_port
from tests.support.processes import marked
from tests.support.runs import host_a, kill_run, resumed_log, wait_checkpoints, write_playbooks

pytestmark = pytest.mark.integration


def start_on_a(box_a: SandboxBox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               checkpoints: int) -> tuple[Project, Journal, Path, DeployResult]:
    """The job running on A (4 GPUs) until the trainer wrote ``checkpoints`` checkpoints."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    project = write_playbooks(tmp_path / "proj", free_port())
    journal = Journal()
    a = host_a(box_a, tmp_path)
    first = deploy(project, str(a), "mig-4gpu", Reporter(quiet=True), journal=journal)
    wait_checkpoints(box_a.workdir / "ckpt", checkpoints)
    return project, journal, a, first


def count_connections(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """SSH connections made from now on, per host name (each successful connect counts)."""
    made: Counter[str] = Counter()
    real = SSHTransport.connect

    def counted(transport: SSHTransport) -> None:
        before = transport.connection
        real(transport)
        if transport.connection is not before:
            made[transport.host.name] += 1

    monkeypatch.setattr(SSHTransport, "connect", counted)
    return made


def host_name(project: Project, host: Path) -> str:
    return resolve_host(str(host), hosts_dir=project.hosts_dir).name


def test_dead_node_migrates_from_the_mirror_and_resumes_on_bigger_hardware(
        box_a: SandboxBox, host_b: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    project, journal, a, first = start_on_a(box_a, tmp_path, monkeypatch, 2)
    quiet = Reporter(quiet=True)
    synced = sync_checkpoints(project, str(a), quiet, journal=journal)
    assert synced["pulled"], "the mirror holds A's complete checkpoints"
    newest = max(p["epoch"] for p in synced["pulled"])

    # A later deploy of another playbook was cut before it reached A: it never ran, so it is
    # not the run to move, though it is the newest in the journal.
    journal.record_run("cut-deploy", {"run_id": "cut-deploy", "host": a.stem,
                                      "playbook": "not-this-one", "status": "deploying",
                                      "created": time.time()})
    box_a.stop()  # the node dies: no sshd, no processes
    kill_run(box_a.workdir, first.plan.run_id)
    b_workdir = Path(yaml.safe_load(host_b.read_text())["workdir"])
    connections = count_connections(monkeypatch)
    try:
        report = migrate(project, str(a), str(host_b), quiet, journal=journal,
                         probe_attempts=2, probe_pause=0.2)
        assert connections[host_name(project, host_b)] == 1, "one session on the new box"
        assert report["old_run"]["run_id"] == first.plan.run_id
        assert "cut-deploy (deploying, never ran)" in report["old_run"]["why"]
        assert report["old_alive"] is False
        assert len(report["probes"]) == 3 and "tcp" in report["probes"][-1]
        assert report["playbook"] == "mig-8gpu", "re-planned for B's 8 GPUs"
        assert report["checkpoint"]["route"] == "mirror"
        assert report["checkpoint"]["epoch"] == newest
        assert f"Resuming training on epoch {newest + 1}" in \
            resumed_log(b_workdir, report["run_id"])
        record = journal.run(report["run_id"])
        assert record is not None and record["migrated_from"]["alive"] is False
        assert record["migrated_from"]["run_id"] == first.plan.run_id
    finally:
        cleanup(project, str(host_b), quiet, all_runs=True, journal=journal)


def test_live_node_copies_the_checkpoint_directly_and_is_cleaned_up(
        box_a: SandboxBox, host_b: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    project, journal, a, first = start_on_a(box_a, tmp_path, monkeypatch, 1)
    quiet = Reporter(quiet=True)
    b_workdir = Path(yaml.safe_load(host_b.read_text())["workdir"])
    connections = count_connections(monkeypatch)
    try:
        report = migrate(project, str(a), str(host_b), quiet, journal=journal,
                         playbook="mig-4gpu")
        assert connections == {host_name(project, host_b): 1, host_name(project, a): 1}, \
            "one session per box: probe, copy and stop share OLD's; every step NEW's"
        assert report["old_alive"] is True
        assert report["playbook"] == "mig-4gpu", "--playbook is taken as given"
        assert report["checkpoint"]["route"] == "peer"
        assert marked(first.plan.run_id) == [], "A's run was stopped"
        epoch = report["checkpoint"]["epoch"]
        assert (b_workdir / "ckpt" / str(epoch) / "training_state.json").is_file()
        assert f"Resuming training on epoch {epoch + 1}" in \
            resumed_log(b_workdir, report["run_id"])
    finally:
        cleanup(project, str(host_b), quiet, all_runs=True, journal=journal)
        kill_run(box_a.workdir, first.plan.run_id)


def test_a_cut_on_the_new_box_costs_one_reconnect_not_a_connection_per_step(
        host_b: Path, tmp_path: Path, make_proxy: Callable[..., LatencyProxy],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """OLD never answers (nothing listens on its port); NEW's first answer is cut. migrate
    goes on over NEW's one session: its first connection plus the one reconnect after the cut,
    whatever the number of steps (check, stage, deploy)."""
    project = write_playbooks(tmp_path, free_port())
    journal = Journal(tmp_path / "state")
    config = yaml.safe_load(host_b.read_text())
    proxy = make_proxy(config["port"], one_way_delay=0.005)
    proxy.inject(Fault(phase="stream", connection=1))
    new = tmp_path / "hosts" / "b-cut.yaml"
    new.write_text(yaml.safe_dump({**config, "port": proxy.port}))
    gone = tmp_path / "hosts" / "gone.yaml"
    gone.write_text(yaml.safe_dump({**config, "port": free_port()}))
    quiet = Reporter(quiet=True)
    connections = count_connections(monkeypatch)
    try:
        report = migrate(project, str(gone), str(new), quiet, journal=journal,
                         playbook="mig-4gpu", probe_attempts=1, probe_pause=0.0)
        assert report["old_alive"] is False and report["checkpoint"] is None
        assert proxy.fired == [(1, "stream", "cut")]
        assert connections[host_name(project, new)] == 2, "one connection + one reconnect"
        record = journal.run(report["run_id"])
        assert record is not None and record["status"] == "running"
    finally:
        cleanup(project, str(new), quiet, all_runs=True, journal=journal)
