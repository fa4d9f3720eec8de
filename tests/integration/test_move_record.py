"""A move carries the job: the run is deployed on the new box as it was deployed on the old
one (its playbook as deployed, its ``--param`` values, ``--test``), and a move needs only the
journal and the spare (the old box's host file may be gone).

On the sandbox: A (its own sshd, 4 GPUs) or a ``sandbox-up`` box behind the 240 ms latency
proxy, and B (the session's sshd, 8 GPUs). The trainer is the speculators stand-in; the
param under test reaches it as an environment variable, read back from the new run's plan
and from the box's own record of what it launched."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import deploy
from outrig.ops.migrate import migrate
from outrig.ops.stage import sync_checkpoints
from outrig.sandbox.box import SandboxBox
from outrig.session import Project
from tests.support.cli import outrig
from tests.support.network import free_port
from tests.support.runs import (
    box_workdir,
    host_a,
    kill_run,
    resumed_log,
    trainer_tag,
    wait_checkpoints,
    with_tag,
    write_playbooks,
)

pytestmark = pytest.mark.integration


def box_tag(workdir: Path, run_id: str) -> str:
    """The trainer's ``TRAIN_TAG`` as the box recorded the launch (its run manifest)."""
    manifest = json.loads((workdir / "runs" / run_id / "run.json").read_text())
    plan = manifest.get("manifest") or manifest.get("plan") or {}
    found = [p for p in plan.get("processes") or [] if p.get("name") == "trainer"]
    assert found, f"the box's record of {run_id} lists no trainer: {sorted(manifest)}"
    return str(found[0]["env"]["TRAIN_TAG"])


def test_a_param_survives_migrate_and_the_changed_file_is_named(
        box_a: SandboxBox, host_b: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`deploy --param tag=carried`, A dies, the playbook file is edited since: the run
    moved to B (the family member for 8 GPUs) has tag=carried, the journal keeps it, and the
    report names the edited file."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    project = write_playbooks(tmp_path / "proj", free_port())
    with_tag(project)
    journal = Journal()
    quiet = Reporter(quiet=True)
    a = host_a(box_a, tmp_path)
    first = deploy(project, str(a), "mig-4gpu", quiet, journal=journal,
                   params={"tag": "carried"})
    assert trainer_tag(journal, first.plan.run_id) == "carried"
    wait_checkpoints(box_a.workdir / "ckpt", 1)
    assert sync_checkpoints(project, str(a), quiet, journal=journal)["pulled"]
    book = project.playbooks_dir / "mig-4gpu.yaml"
    book.write_text(book.read_text().replace("from-the-file", "edited-since"))
    box_a.stop()
    kill_run(box_a.workdir, first.plan.run_id)
    try:
        report = migrate(project, str(a), str(host_b), quiet, journal=journal,
                         probe_attempts=1, probe_pause=0.0)
        new_run = report["run_id"]
        assert report["playbook"] == "mig-8gpu"
        assert trainer_tag(journal, new_run) == "carried"
        assert box_tag(box_workdir(host_b), new_run) == "carried"
        record = journal.run(new_run)
        assert record is not None and record["param_overrides"] == {"tag": "carried"}
        assert report["params"] == {"tag": "carried"}
        assert "Resuming training on epoch" in resumed_log(box_workdir(host_b), new_run)
    finally:
        cleanup(project, str(host_b), quiet, all_runs=True, journal=journal)


def test_a_param_given_again_wins_and_the_run_keeps_its_playbook_as_deployed(
        box_a: SandboxBox, host_b: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A family of one (no other member to choose): the run's playbook as deployed, not
    today's edited file, and a --param given on migrate's command line wins, said so."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    project = write_playbooks(tmp_path / "proj", free_port())
    with_tag(project)
    (project.playbooks_dir / "mig-8gpu.yaml").unlink()
    journal = Journal()
    quiet = Reporter(quiet=True)
    a = host_a(box_a, tmp_path)
    first = deploy(project, str(a), "mig-4gpu", quiet, journal=journal,
                   params={"tag": "carried"})
    book = project.playbooks_dir / "mig-4gpu.yaml"
    data = yaml.safe_load(book.read_text())
    data["processes"]["trainer"]["env"]["EDITED"] = "yes"  # today's file differs
    book.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        report = migrate(project, str(a), str(host_b), quiet, journal=journal,
                         run_id=first.plan.run_id, params={"tag": "given-again"})
        new_run = report["run_id"]
        assert trainer_tag(journal, new_run) == "given-again"
        record = journal.run(new_run)
        assert record is not None
        (trainer,) = [p for p in record["plan"]["processes"] if p["name"] == "trainer"]
        assert "EDITED" not in trainer["env"], "the playbook as deployed, not today's file"
        said = " ".join(report["differences"])
        assert "changed since run" in said and "--param tag=given-again" in said, said
        assert record["migrated_from"]["differences"] == report["differences"]
    finally:
        cleanup(project, str(host_b), quiet, all_runs=True, journal=journal)
        kill_run(box_a.workdir, first.plan.run_id)


@pytest.fixture
def up_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A project whose box is `outrig sandbox-up --delay 120` (a 240 ms RTT); stopped (and
    its host file deleted) by `outrig sandbox-down` in the test, and again at teardown."""
    from outrig.ops.sandbox import sandbox_down

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    root = tmp_path / "proj"
    project = write_playbooks(root, free_port())
    with_tag(project)
    (root / "hosts").mkdir()
    monkeypatch.chdir(root)
    yield root
    sandbox_down(Project(root), "sandbox", Reporter(quiet=True))


def test_a_move_needs_only_the_journal_after_sandbox_down_deleted_the_host_file(
        up_project: Path, host_b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The box is stopped with `outrig sandbox-down`, which deletes its host file: `outrig
    migrate --run RUN --to b` finds the box in the journal, probes it at the recorded
    address, finds it dead, resumes from the mirror with the run's --param; `tail-logs
    --run RUN --no-follow` shows the mirror, and `status --run RUN` the last known state,
    both without --host."""
    b = up_project / "hosts" / "b.yaml"
    b.write_text(host_b.read_text())
    code, out, err = outrig(["sandbox-up", "--delay", "120", "--json"], capsys)
    assert code == 0, err
    code, out, err = outrig(["deploy", "--host", "sandbox", "--playbook", "mig-4gpu",
                             "--param", "tag=carried", "--json"], capsys)
    assert code == 0, err
    run_id = json.loads(out.splitlines()[-1])["run_id"]
    workdir = Path(yaml.safe_load((up_project / "hosts" / "sandbox.yaml").read_text())
                   ["workdir"])
    wait_checkpoints(workdir / "ckpt", 1)
    code, out, err = outrig(["sync-checkpoints", "--host", "sandbox"], capsys)
    assert code == 0, err
    code, out, err = outrig(["tail-logs", "--host", "sandbox", "--run", run_id,
                             "--no-follow", "--lines", "3"], capsys)
    assert code == 0, err
    code, out, err = outrig(["sandbox-down"], capsys)
    assert code == 0, err
    assert not (up_project / "hosts" / "sandbox.yaml").exists(), "the host file is gone"

    code, out, err = outrig(["migrate", "--run", run_id, "--to", "b", "--json"], capsys)
    assert code == 0, err
    report = json.loads(out.splitlines()[-1])
    assert report["old_alive"] is False and report["checkpoint"]["route"] == "mirror"
    assert "sandbox has no host file any more" in " ".join(err.split())
    journal = Journal()
    assert trainer_tag(journal, report["run_id"]) == "carried"
    assert "Resuming training on epoch" in resumed_log(box_workdir(host_b), report["run_id"])

    code, out, err = outrig(["tail-logs", "--run", run_id, "--no-follow"], capsys)
    assert code == 0, err
    said = " ".join(err.split())
    assert "local mirror" in said and "may still be running" not in said, said
    assert "trainer" in out and "global_step=" in out, out[-2000:]
    code, out, err = outrig(["cleanup", "--host", "b", "--all"], capsys)
    assert code == 0, err


def test_the_moved_run_warning_ends_once_any_cleanup_stopped_the_run(
        box_project: Path, box_host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run moved away while its box did not answer (a migrate marked it moved, nothing
    fenced it): every command to the box warns that it may still be running there, until
    a cleanup stops it, `cleanup --all` included."""
    book = box_project / "playbooks" / "sleeper.yaml"
    book.write_text(yaml.safe_dump({"name": "sleeper", "processes": {"sleeper": {
        "command": [sys.executable, "-c", "import time; print('up', flush=True); "
                    "time.sleep(600)"], "gpus": []}}}))
    code, out, err = outrig(["deploy", "--host", str(box_host), "--playbook", "sleeper",
                             "--json", "--project", str(box_project)], capsys)
    assert code == 0, err
    run_id = json.loads(out.splitlines()[-1])["run_id"]
    Journal().mark_moved(run_id, host=box_host.stem, to_host="spare", to_run_id="moved-1")
    host = ["--host", str(box_host), "--project", str(box_project)]
    code, out, err = outrig(["status", *host], capsys)
    assert code == 0, err
    assert "may still be running here" in " ".join(err.split())
    code, out, err = outrig(["cleanup", *host, "--all"], capsys)
    assert code == 0, err
    assert "may still be running here" not in " ".join(err.split()), "cleanup stops it"
    record = Journal().run(run_id)
    assert record is not None and record.get("fenced"), record
    code, out, err = outrig(["status", *host], capsys)
    assert code == 0, err
    assert "may still be running" not in " ".join(err.split())
