"""Runs on a box as the tests make and end them: playbooks written for a test, the
stand-ins they run, waiting on what a run writes, and stopping what a test left behind (by
outrig's own cleanup, by the box's records, or as a dead node would lose it)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup
from outrig.sandbox.box import SandboxBox
from outrig.session import Project

STANDINS = Path(__file__).resolve().parents[1] / "standins"


def standin_path(name: str) -> Path:
    """Path of tests/standins/<name>.py (name with or without ``.py``)."""
    path = STANDINS / (name if name.endswith(".py") else f"{name}.py")
    if not path.is_file():
        raise FileNotFoundError(f"no stand-in {path}")
    return path


def write_playbook(tmp_path: Path, body: dict[str, Any], name: str = "job") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, **body}, sort_keys=False))
    return path


def box_workdir(host_file: Path) -> Path:
    return Path(yaml.safe_load(host_file.read_text())["workdir"])


def write_playbooks(root: Path, port: int) -> Project:
    """Two members of family "mig": 4 GPUs (TP2 + 2 ranks) and 8 GPUs (TP2×DP2 + 4 ranks)."""
    (root / "playbooks").mkdir(parents=True)
    for name, server, parallel, trainer in (("mig-4gpu", [0, 1], [2, 1], [2, 3]),
                                            ("mig-8gpu", [0, 1, 2, 3], [2, 2], [4, 5, 6, 7])):
        book = {
            "name": name, "family": "mig",
            "params": {"port": port},
            "stage": {"ckpt": {"path": "${workdir}/ckpt", "kind": "checkpoints"}},
            "processes": {
                "server": {
                    "command": [sys.executable, str(STANDINS / "fake_vllm.py"), "serve", "m",
                                "--tensor-parallel-size", str(parallel[0]),
                                "--data-parallel-size", str(parallel[1]),
                                "--port", "${port}", "--fake-startup-delay", "0.2"],
                    "gpus": server, "parallel": {"tensor": parallel[0], "data": parallel[1]},
                    "ready": {"http": "http://127.0.0.1:${port}/health", "timeout": 60},
                    "stop": {"grace": 5}},
                "trainer": {
                    "after": "server",
                    "command": [sys.executable, str(STANDINS / "fake_trainer.py"),
                                "--verifier-name-or-path", "m",
                                "--vllm-endpoint", "http://127.0.0.1:${port}/v1",
                                "--save-path", "${workdir}/ckpt", "--epochs", "1000",
                                "--fake-steps-per-epoch", "2", "--fake-step-seconds", "0.1"],
                    "gpus": trainer,
                    "ready": {"log": "global_step=", "timeout": 60},
                    "stop": {"grace": 10}}}}
        (root / "playbooks" / f"{name}.yaml").write_text(yaml.safe_dump(book, sort_keys=False))
    return Project(root)


def with_tag(project: Project, default: str = "from-the-file") -> None:
    """Both members of family "mig" take a param ``tag``, which the trainer gets as
    ``TRAIN_TAG`` (a stand-in for lr, epochs, anything a DFlash run passes as a param)."""
    for book in project.playbooks_dir.glob("*.yaml"):
        data = yaml.safe_load(book.read_text())
        data["params"]["tag"] = default
        data["processes"]["trainer"]["env"] = {"TRAIN_TAG": "${tag}"}
        book.write_text(yaml.safe_dump(data, sort_keys=False))


def trainer_tag(journal: Journal, run_id: str) -> str:
    """The trainer's ``TRAIN_TAG`` as the run's plan sent it to the box."""
    record = journal.run(run_id)
    assert record is not None, f"no journal record of {run_id}"
    (trainer,) = [p for p in record["plan"]["processes"] if p["name"] == "trainer"]
    return str(trainer["env"]["TRAIN_TAG"])


def wait_checkpoints(save: Path, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [p for p in save.glob("*") if p.name.isdigit()
                and (p / "training_state.json").is_file()]
        if len(done) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"the trainer wrote fewer than {count} checkpoints in {save}")


def kill_run(workdir: Path, run_id: str) -> None:
    """The node dies: every process of the run goes (by recorded group, then by marker)."""
    run = json.loads((workdir / "runs" / run_id / "run.json").read_text())
    for proc in run["processes"]:
        try:
            os.killpg(proc["pgid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    needle = f"OUTRIG_RUN={run_id}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    os.kill(int(entry), signal.SIGKILL)
            except OSError:
                continue
    for proc in run["processes"]:  # a dead node's cgroups go with it (a reboot clears them)
        cgroup = proc.get("cgroup")
        if cgroup:
            deadline = time.monotonic() + 10
            while Path(cgroup, "cgroup.procs").exists() and time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    os.rmdir(cgroup)  # refused while a killed process is still in it
                time.sleep(0.05)


def trainer_log(workdir: Path, run_id: str) -> str:
    return (workdir / "runs" / run_id / "logs" / "trainer.log").read_text()


def resumed_log(workdir: Path, run_id: str, timeout: float = 30) -> str:
    """The trainer's log once it says it resumed (or whatever it holds at the deadline)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and "Resuming training" not in \
            trainer_log(workdir, run_id):
        time.sleep(0.2)
    return trainer_log(workdir, run_id)


def stop_every_run(project: Project, host: str, state: Path) -> None:
    """Teardown: outrig's own cleanup of every run on ``host`` (by its records, journal in
    ``state``). A failure is printed, not raised: the test's own failure matters more."""
    try:
        cleanup(project, host, Reporter(quiet=True), all_runs=True, journal=Journal(state))
    except Exception as exc:
        print(f"teardown cleanup failed: {exc}", file=sys.stderr)


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


def host_a(box: SandboxBox, tmp_path: Path) -> Path:
    return box.write_host_file(tmp_path / "hosts" / "a.yaml", workdir=box.workdir)
