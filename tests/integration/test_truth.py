"""Through the sandbox's real sshd: deploy tells the truth about processes that never started
or finished at once, a secret a failing process prints appears nowhere it should not, and the
journal follows the box's run records so that sync-checkpoints and migrate pick a run that
really ran."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.errors import ConfigError, RemoteError
from outrig.journal import Journal
from outrig.ops.check import check
from outrig.ops.deploy import deploy
from outrig.ops.runs import pick_host_run
from outrig.ops.stage import sync_checkpoints
from outrig.ops.status import status
from outrig.session import Project
from tests.support.processes import alive, wait_gone
from tests.support.runs import stop_every_run
from tests.support.trees import checkpoint

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SECRET = "hf_NOWHEREsecret9876543210"
LEAK = "import os, sys; print('HF_TOKEN=' + os.environ['HF_TOKEN'], flush=True); "


@pytest.fixture
def project(tmp_path: Path) -> Project:
    root = tmp_path / "project"
    (root / "playbooks").mkdir(parents=True)
    return Project(root)


def book(project: Project, name: str, processes: dict[str, Any], **extra: Any) -> str:
    path = project.playbooks_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "processes": processes, **extra},
                                   sort_keys=False))
    return name


def workdir(host_file: Path) -> Path:
    return Path(yaml.safe_load(host_file.read_text())["workdir"])


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "state")


@pytest.fixture
def teardown_runs(box_host: Path, project: Project) -> Iterator[None]:
    yield
    stop_every_run(project, str(box_host), box_host.parent / "teardown-state")


def sleeper() -> dict[str, Any]:
    return {"command": [sys.executable, "-c", "import time; time.sleep(600)"],
            "stop": {"grace": 1}}


# ------------------------------------------------------------------- item: process truth


def test_missing_binary_without_ready_fails_the_deploy_with_127(
        box_host: Path, project: Project, journal: Journal, teardown_runs: None) -> None:
    name = book(project, "ghost", {"ghost": {"command": ["/nonexistent/trainer", "--go"]}})
    with pytest.raises(RemoteError) as info:
        deploy(project, str(box_host), name, Reporter(quiet=True), journal=journal)
    assert info.value.kind == "exited" and info.value.process_exit_code == 127
    assert "never ran" in str(info.value) and "cannot execute" in str(info.value)
    (run,) = journal.runs(host=box_host.stem)
    assert run["status"] == "failed"


def test_trainer_with_nothing_left_to_do_is_reported_finished(
        box_host: Path, project: Project, journal: Journal, teardown_runs: None) -> None:
    done = "print('Training complete: all 3 epochs were already done', flush=True)"
    name = book(project, "resume", {"trainer": {
        "command": [sys.executable, "-c", done],
        "ready": {"log": r"Training epoch \d+", "timeout": 60}}})
    said = io.StringIO()
    result = deploy(project, str(box_host), name, Reporter(err=said), journal=journal)
    assert result.status == "finished"
    assert result.processes[0]["outcome"] == "finished"
    text = said.getvalue()
    assert "trainer finished: exited 0" in text and "Training complete" in text
    assert "resume finished on" in text and "nothing is running" in text
    assert journal.run(result.plan.run_id)["status"] == "finished"  # type: ignore[index]
    shown = status(project, str(box_host), Reporter(quiet=True), playbook=name,
                   journal=journal)
    assert shown["runs"][0]["status"] == "finished"


# ------------------------------------------------------------------------- item: secrets


def proc_cmdlines() -> list[bytes]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                out.append(Path(f"/proc/{entry}/cmdline").read_bytes())
            except OSError:
                continue
    return out


class CmdlineWatch:
    """Scans every process's command line while a command runs; records any holding the
    secret (the agent and every process it starts run on this machine)."""

    def __init__(self) -> None:
        self.hits: list[bytes] = []
        self.scans = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        while not self.stop.is_set():
            self.hits += [c for c in proc_cmdlines() if SECRET.encode() in c]
            self.scans += 1

    def __enter__(self) -> CmdlineWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


@pytest.mark.parametrize("ready", [{"log": "^serving$", "timeout": 60}, None])
def test_secret_printed_by_a_failing_process_appears_nowhere(
        box_host: Path, project: Project, tmp_path: Path, teardown_runs: None,
        ready: Any) -> None:
    name = book(project, "leaky", {
        "keeper": {**sleeper(), "command": [sys.executable, "-c",
                                            LEAK + "import time; time.sleep(600)"]},
        "leaky": {"command": [sys.executable, "-c", LEAK + "sys.exit(1)"], "ready": ready,
                  "after": "keeper"}},
        secrets=["HF_TOKEN"])
    state = tmp_path / "inv-state"
    env = {**os.environ, "XDG_STATE_HOME": str(state), "HF_TOKEN": SECRET}
    inv = [sys.executable, "-m", "invoke", "--search-root", str(REPO)]
    shown: list[str] = []
    with CmdlineWatch() as watch:
        for extra in ([], ["--json"]):
            done = subprocess.run(
                [*inv, "deploy", "--host", str(box_host), "--playbook",
                 str(project.playbooks_dir / f"{name}.yaml"), *extra],
                capture_output=True, text=True, env=env, timeout=180)
            assert done.returncode == 1, done.stderr
            assert "HF_TOKEN=***" in done.stderr, "the excerpt is shown, redacted"
            shown += [done.stdout, done.stderr]
        status_done = subprocess.run(
            [*inv, "status", "--host", str(box_host), "--playbook", name, "--json"],
            capture_output=True, text=True, env=env, timeout=120)
        shown += [status_done.stdout, status_done.stderr]
        for extra, fresh in (([], state), (["--json"], tmp_path / "inv-state-2")):
            # each from a fresh local mirror: a second tail would only show what is new
            tail_done = subprocess.run(
                [*inv, "tail-logs", "--host", str(box_host), "--playbook", name,
                 "--no-follow", *extra], capture_output=True, text=True,
                env={**env, "XDG_STATE_HOME": str(fresh)}, timeout=120)
            assert tail_done.returncode == 0, tail_done.stderr
            assert "HF_TOKEN=***" in tail_done.stdout, "the line is shown, redacted"
            shown += [tail_done.stdout, tail_done.stderr]
    assert watch.scans > 0 and watch.hits == []
    assert all(SECRET not in text for text in shown)
    runs = sorted((workdir(box_host) / "runs").iterdir())
    assert len(runs) == 2
    for run in runs:
        assert SECRET not in (run / "run.json").read_text()
        # the second deploy stops (and so marks) the first, failed, run of the playbook
        assert json.loads((run / "run.json").read_text())["status"] in ("failed", "stopped")
        assert SECRET in (run / "logs" / "leaky.log").read_text(), "its own log keeps it"
    for root in (state, tmp_path / "inv-state-2"):
        mirrors = root / "outrig" / "logs"  # tail-logs' copy of the process's log, redacted
        assert any("HF_TOKEN=***" in p.read_text(errors="replace")
                   for p in mirrors.rglob("*.log")), "the mirror has the line, redacted"
        files = [path for path in root.rglob("*") if path.is_file()]
        assert files and all(SECRET not in path.read_text(errors="replace")
                             for path in files), "nothing on the workstation keeps it"


def test_status_of_a_running_process_redacts_its_secret_even_without_it_in_the_shell(
        box_host: Path, project: Project, journal: Journal, teardown_runs: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    name = book(project, "talker", {"talker": {
        **sleeper(), "command": [sys.executable, "-c", LEAK + "import time; time.sleep(600)"]}},
        secrets=["HF_TOKEN"])
    monkeypatch.setenv("HF_TOKEN", SECRET)
    deploy(project, str(box_host), name, Reporter(quiet=True), journal=journal)
    monkeypatch.delenv("HF_TOKEN")  # only the box's live process knows the value now
    shown = status(project, str(box_host), Reporter(quiet=True), playbook=name,
                   journal=journal)
    assert SECRET not in json.dumps(shown)
    assert shown["runs"][0]["processes"][0]["log_tail"] == ["HF_TOKEN=***"]


# ------------------------------------------------------------------------- item: journal


def test_journal_follows_the_box_on_every_contact(
        box_host: Path, project: Project, journal: Journal, teardown_runs: None) -> None:
    name = book(project, "svc", {"svc": sleeper()})
    host = box_host.stem
    first = deploy(project, str(box_host), name, Reporter(quiet=True), journal=journal)
    second = deploy(project, str(box_host), name, Reporter(quiet=True), journal=journal)
    assert journal.run(first.plan.run_id)["status"] == "stopped"  # type: ignore[index]
    # A cut deploy leaves `unknown`; one cut before it reached the box leaves `deploying`.
    journal.record_run(second.plan.run_id, {"status": "unknown"})
    journal.record_run("svc-never-sent", {"run_id": "svc-never-sent", "host": host,
                                          "playbook": name, "status": "deploying",
                                          "created": 1.0})
    check(project, str(box_host), Reporter(quiet=True), journal=journal)
    assert journal.run(second.plan.run_id)["status"] == "running"  # type: ignore[index]
    assert journal.run("svc-never-sent")["status"] == "not_on_box"  # type: ignore[index]
    # The process dies behind outrig's back: the next contact says so.
    record = json.loads((workdir(box_host) / "runs" / second.plan.run_id / "run.json")
                        .read_text())["processes"][0]
    child = next(int(p) for p in Path(f"/proc/{record['pid']}/task/{record['pid']}/children")
                 .read_text().split())
    os.kill(child, signal.SIGKILL)
    assert wait_gone([record["pid"]]) == [] and not alive(child)
    status(project, str(box_host), Reporter(quiet=True), playbook=name, journal=journal)
    assert journal.run(second.plan.run_id)["status"] == "exited"  # type: ignore[index]


def test_sync_checkpoints_takes_the_newest_run_that_really_ran(
        box_host: Path, project: Project, journal: Journal, tmp_path: Path,
        teardown_runs: None) -> None:
    good_save, bad_save = tmp_path / "good-ckpt", tmp_path / "bad-ckpt"
    checkpoint(good_save, 0)
    checkpoint(bad_save, 0)
    checkpoint(bad_save, 1)
    good = book(project, "trainjob", {"trainer": sleeper()},
                stage={"ckpt": {"path": str(good_save), "kind": "checkpoints"}})
    bad = book(project, "badjob", {"trainer": {"command": [sys.executable, "-c",
                                                           "raise SystemExit(1)"]}},
               stage={"ckpt": {"path": str(bad_save), "kind": "checkpoints"}})
    ran = deploy(project, str(box_host), good, Reporter(quiet=True), journal=journal)
    with pytest.raises(RemoteError):
        deploy(project, str(box_host), bad, Reporter(quiet=True), journal=journal)
    said = io.StringIO()
    report = sync_checkpoints(project, str(box_host), Reporter(err=said), journal=journal)
    assert report["playbook"] == "trainjob"
    assert [p["epoch"] for p in report["pulled"]] == [0]
    assert ran.plan.run_id in said.getvalue() and "never ran" in said.getvalue()


def test_two_playbooks_running_at_once_is_ambiguous_and_names_the_flag(
        journal: Journal) -> None:
    for run_id, playbook, created in (("a-1", "alpha", 1.0), ("b-1", "beta", 2.0),
                                      ("b-2", "beta", 3.0)):
        journal.record_run(run_id, {"run_id": run_id, "host": "h", "playbook": playbook,
                                    "created": created, "status": "running", "ran": True})
    journal.record_run("b-2", {"status": "failed", "ran": False})
    with pytest.raises(ConfigError) as info:
        pick_host_run(journal, "h")
    assert "a-1" in str(info.value) and "b-1" in str(info.value)
    assert "--run RUN_ID" in str(info.value) and "--playbook" in str(info.value)
    chosen, why = pick_host_run(journal, "h", run_id="a-1")
    assert chosen["run_id"] == "a-1" and "--run" in why
    chosen, why = pick_host_run(journal, "h", playbook="beta")
    assert chosen["run_id"] == "b-1" and "b-2 (failed, never ran)" in why
