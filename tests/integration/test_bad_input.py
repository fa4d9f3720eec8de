"""Bad input is named early, and nothing is started or killed on it (through the real sshd)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from outrig.console import Reporter
from outrig.errors import RemoteError
from outrig.journal import Journal
from outrig.ops.deploy import deploy
from outrig.session import Project

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)


@pytest.mark.parametrize("python", ["/bin/false", "/bin/true"])
def test_interpreter_that_cannot_run_the_agent_is_named(box_host: Path, tmp_path: Path,
                                                        python: str) -> None:
    config = yaml.safe_load(box_host.read_text())
    config["python"] = python
    host = tmp_path / "badpy.yaml"
    host.write_text(yaml.safe_dump(config))
    playbook = tmp_path / "job.yaml"
    playbook.write_text(yaml.safe_dump({"name": "job", "processes": {
        "a": {"command": [sys.executable, "-c", "import time; time.sleep(60)"]}}}))
    with pytest.raises(RemoteError) as info:
        deploy(PROJECT, str(host), str(playbook), Reporter(quiet=True),
               journal=Journal(tmp_path / "state"))
    text = str(info.value)
    assert info.value.kind == "bad_python", text
    assert f"the interpreter {python!r} could not run the agent" in text
    assert "out of memory" not in text
    assert not (Path(config["workdir"]) / "runs").exists()
