"""``cleanup`` under faults, through the real sshd: a full workdir disk, and a child that left
its run (cleared the OUTRIG_* markers, called setsid, lost its parent) while holding a GPU."""

from __future__ import annotations

import io
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.ops.cleanup import CleanupIncomplete, cleanup
from outrig.ops.deploy import deploy
from outrig.sandbox.fulldisk import is_full
from outrig.session import Project
from tests.support.agent import ESCAPE
from tests.support.processes import alive
from tests.support.runs import stop_every_run, write_playbook

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)

# Ready once it said so; when told (after the deploy is recorded), writes until the disk is
# full and waits, as a runaway job writing checkpoints does. It never prints again, so the full
# disk does not end it.
FILLER = r"""
import errno, os, sys, time
print("ready", flush=True)
while not os.path.exists("go"):
    time.sleep(0.05)
with open("filler.bin", "wb", buffering=0) as f:
    while True:
        try:
            f.write(b"\0" * 4096)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            break
time.sleep(120)
"""


def wait_for(predicate: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def host_with(box_host: Path, tmp_path: Path, **changes: Any) -> Path:
    config = yaml.safe_load(box_host.read_text())
    env = {**config.get("env", {}), **changes.pop("env", {})}
    config.update(changes, env=env)
    path = tmp_path / "hosts" / "changed.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def stop_all() -> Iterator[list[Path]]:
    """Host files whose runs are cleaned up at teardown (by outrig's own records)."""
    hosts: list[Path] = []
    yield hosts
    for host in hosts:
        stop_every_run(PROJECT, str(host), host.parent / "teardown-state")


def test_cleanup_stops_the_job_that_filled_the_workdir_disk(
        box_host: Path, tmp_path: Path, small_fs: Path, stop_all: list[Path]) -> None:
    workdir = small_fs / "wd"
    host = host_with(box_host, tmp_path, workdir=str(workdir))
    stop_all.append(host)
    playbook = write_playbook(tmp_path, {"processes": {"hog": {
        "command": [sys.executable, "-c", FILLER], "ready": {"log": "^ready$", "timeout": 60},
        "stop": {"grace": 2}}}})
    journal = Journal(tmp_path / "state")
    deploy(PROJECT, str(host), str(playbook), Reporter(quiet=True), journal=journal)
    run = json.loads(next((workdir / "runs").glob("*/run.json")).read_text())
    pid = run["processes"][0]["pid"]
    (workdir / "go").touch()
    assert wait_for(lambda: is_full(workdir))
    assert alive(pid)
    out = io.StringIO()
    report = cleanup(PROJECT, str(host), Reporter(json_mode=True, out=out), playbook="job",
                     journal=journal)
    assert wait_for(lambda: not alive(pid))
    assert [p["how"] for p in report["runs"][0]["processes"]] == ["term"]
    assert any("run.json" in note for note in report["not_recorded"]), report["not_recorded"]
    warnings = [json.loads(ln) for ln in out.getvalue().splitlines()]
    assert any(ev.get("event") == "warning" and "could not record" in ev.get("msg", "")
               for ev in warnings)


def escaper_playbook(tmp_path: Path, *, late: bool = False) -> Path:
    """The escaper: a child that leaves the session and clears its markers. ``late``: it
    escapes only once the test touches ``escape.now``, after the deploy, so the deploy's own
    wait (which records what is in the run's session) never saw it."""
    env = {"ESCAPE_LATE": "1"} if late else {}
    return write_playbook(tmp_path, {"processes": {"job": {
        "command": [sys.executable, "-c", ESCAPE], "gpus": [1], "env": env,
        "ready": {"log": "^up$", "timeout": 60}, "stop": {"grace": 1}}}})


def orphan(workdir: Path) -> int:
    """Let the escaper's parent exit; return the (now reparented) child's pid."""
    parent = int((workdir / "parent.pid").read_text())
    child = int((workdir / "child.pid").read_text())
    (workdir / "parent.exit").touch()
    assert wait_for(lambda: not alive(parent))
    assert alive(child)
    return child


def test_setsid_child_in_the_runs_cgroup_is_stopped_through_ssh(
        box_host: Path, tmp_path: Path, stop_all: list[Path]) -> None:
    stop_all.append(box_host)
    workdir = Path(yaml.safe_load(box_host.read_text())["workdir"])
    journal = Journal(tmp_path / "state")
    deploy(PROJECT, str(box_host), str(escaper_playbook(tmp_path)), Reporter(quiet=True),
           journal=journal)
    run = json.loads(next((workdir / "runs").glob("*/run.json")).read_text())
    if run["processes"][0]["cgroup"] is None:
        pytest.skip("the sandbox box does not let the agent create a cgroup v2 folder")
    child = orphan(workdir)
    report = cleanup(PROJECT, str(box_host), Reporter(quiet=True), playbook="job",
                     journal=journal)
    assert wait_for(lambda: not alive(child))
    assert report["gpu"]["released"] is True


def test_unprovable_gpu_holder_makes_cleanup_fail_naming_it(
        box_host: Path, tmp_path: Path, stop_all: list[Path]) -> None:
    host = host_with(box_host, tmp_path, env={"OUTRIG_CGROUPS": "0"})
    stop_all.append(host)
    workdir = Path(yaml.safe_load(host.read_text())["workdir"])
    journal = Journal(tmp_path / "state")
    deploy(PROJECT, str(host), str(escaper_playbook(tmp_path, late=True)),
           Reporter(quiet=True), journal=journal)
    (workdir / "escape.now").touch()
    assert wait_for(lambda: (workdir / "parent.pid").exists())
    child = orphan(workdir)
    with pytest.raises(CleanupIncomplete) as info:
        cleanup(PROJECT, str(host), Reporter(quiet=True), playbook="job", journal=journal)
    assert info.value.exit_code == 1
    assert f"outrig cleanup --host {host} --force-foreign {child}" in str(info.value)
    assert alive(child)  # not proven ours: left alone, and said so
    cleanup(PROJECT, str(host), Reporter(quiet=True), force_foreign=[child], journal=journal)
    assert wait_for(lambda: not alive(child))
