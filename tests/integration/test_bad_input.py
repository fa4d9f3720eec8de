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


def test_a_damaged_journal_is_warned_about_not_a_traceback(
        box_host: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Invalid UTF-8 in a run record and in the host's record, and a folder where a run
    record should be: status, tail-logs and deploy --dry-run each work, warn naming the
    file once, and the damaged records are moved aside."""
    from outrig.ops.logs import tail_logs
    from outrig.ops.status import status
    from tests.support.logs import make_run

    make_run(box_host, ["trainer"])
    state = tmp_path / "state"
    runs, hosts = state / "runs", state / "hosts"
    runs.mkdir(parents=True)
    hosts.mkdir()
    (runs / "broken.json").write_bytes(b'{"run_id": "broken", "host": "\xff"}')
    (runs / "x.json").mkdir()
    (hosts / f"{box_host.stem}.json").write_bytes(b"\xc3\x28")
    playbook = tmp_path / "job.yaml"
    playbook.write_text(yaml.safe_dump({"name": "job", "processes": {
        "a": {"command": [sys.executable, "-c", "import time; time.sleep(60)"]}}}))
    capsys.readouterr()
    shown = status(PROJECT, str(box_host), Reporter(quiet=True), journal=Journal(state))
    assert [r["run_id"] for r in shown["runs"]] == ["job-20260101-000000-abcd"]
    warned = capsys.readouterr().err
    for name in ("runs/broken.json", "runs/x.json", f"hosts/{box_host.stem}.json"):
        assert warned.count(f"{state}/{name} (") == 1, warned
        assert list(state.glob(f"{name}.unreadable-*")), name
    (runs / "again.json").write_bytes(b"\x80")
    tail_logs(PROJECT, str(box_host), Reporter(quiet=True), follow=False,
              journal=Journal(state))
    assert f"{runs}/again.json (not UTF-8" in capsys.readouterr().err
    (hosts / f"{box_host.stem}.json").write_text("{not json")  # what the plan reads
    dry = deploy(PROJECT, str(box_host), str(playbook), Reporter(quiet=True), dry_run=True,
                 journal=Journal(state))
    assert dry.launched is False
    assert f"{hosts}/{box_host.stem}.json (not JSON" in capsys.readouterr().err
