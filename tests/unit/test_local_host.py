"""``--host local``: the agent runs on this machine without SSH, workdir ``~/outrig``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import deploy
from outrig.session import Project

REPO = Path(__file__).resolve().parents[2]


def test_deploy_and_cleanup_on_local_host_use_home_workdir(tmp_path: Path) -> None:
    home = Path(os.environ["HOME"])  # isolated per test by conftest
    playbook = tmp_path / "local.yaml"
    playbook.write_text(yaml.safe_dump({"name": "local", "processes": {"a": {
        "command": [sys.executable, "-c", "import time; print('up', flush=True); "
                    "time.sleep(600)"],
        "ready": {"log": "^up$", "timeout": 20}, "stop": {"grace": 2}}}}))
    journal = Journal(tmp_path / "state")
    result = deploy(Project(REPO), "local", str(playbook), Reporter(quiet=True), journal=journal)
    run_dir = home / "outrig" / "runs" / result.plan.run_id
    assert (run_dir / "run.json").is_file()
    pid = result.processes[0]["pid"]
    os.kill(pid, 0)
    report = cleanup(Project(REPO), "local", Reporter(quiet=True), playbook="local",
                     journal=journal)
    assert report["runs"][0]["processes"][0]["how"] == "term"
    assert not Path(f"/proc/{pid}").exists() or \
        Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_home_workdir_is_expanded_in_commands(tmp_path: Path) -> None:
    """``${run_dir}`` of a ``~/outrig`` workdir must reach the process as a real path: there is
    no shell on the way to expand ``~``."""
    home = Path(os.environ["HOME"])
    playbook = tmp_path / "tilde.yaml"
    playbook.write_text(yaml.safe_dump({"name": "tilde", "processes": {"a": {
        "command": [sys.executable, "-c",
                    "import pathlib, sys; p = pathlib.Path(sys.argv[1]); "
                    "p.mkdir(parents=True); (p / 'ok').write_text('yes')", "${run_dir}/made"],
        "ready": {"exit": True, "timeout": 20}}}}))
    result = deploy(Project(REPO), "local", str(playbook), Reporter(quiet=True),
                    journal=Journal(tmp_path / "state"))
    made = home / "outrig" / "runs" / result.plan.run_id / "made" / "ok"
    assert made.read_text() == "yes"
    assert not (Path("/") / "~").exists()


OLD_PYTHON = Path("/root/.pyenv/versions/3.7.16/bin/python")


@pytest.mark.skipif(not OLD_PYTHON.exists(), reason="no Python 3.7 interpreter on this machine")
def test_too_old_python_on_the_box_is_named_with_the_fix(tmp_path: Path) -> None:
    from dataclasses import replace

    from outrig.agent.client import AgentCall
    from outrig.connectors.local import LocalTransport
    from outrig.errors import RemoteError
    from outrig.inventory import resolve_host

    host = replace(resolve_host("local", hosts_dir=REPO / "hosts"), python=str(OLD_PYTHON))
    with pytest.raises(RemoteError) as info:
        AgentCall(LocalTransport(host)).run({"op": "check", "workdir": str(tmp_path), "env": {}})
    assert info.value.kind == "old_python"
    assert "needs Python >= 3.8, this is 3.7.16" in str(info.value)
    assert "Set python: in the host file" in str(info.value)


def test_a_host_file_with_hostname_local_is_a_box_on_this_machine_with_its_workdir(
        tmp_path: Path) -> None:
    """Two such files are two boxes on one machine (what the real-trainer rehearsal migrates
    between); the deploy lands in the file's workdir, not in ~/outrig."""
    hosts = tmp_path / "hosts"
    hosts.mkdir()
    (hosts / "box-a.yaml").write_text(yaml.safe_dump(
        {"hostname": "local", "workdir": str(tmp_path / "a")}))
    (tmp_path / "playbooks").mkdir()
    playbook = tmp_path / "playbooks" / "one.yaml"
    playbook.write_text(yaml.safe_dump({"name": "one", "processes": {"a": {
        "command": [sys.executable, "-c", "print('up', flush=True)"],
        "ready": {"exit": True, "timeout": 20}}}}))
    project = Project(tmp_path)
    result = deploy(project, "box-a", "one", Reporter(quiet=True),
                    journal=Journal(tmp_path / "state"))
    assert (tmp_path / "a" / "runs" / result.plan.run_id / "run.json").is_file()
