"""``migrate`` installs NEW's environments while it stages data and the checkpoint.

OLD is dead (nothing listens on its port), NEW is the sandbox box. The playbook has an
environment whose package comes from an index served here on 127.0.0.1, and a data folder
staged from the workstation. The index holds its answer until staging has ended (a gate
opened by the recorded ``migrate_step`` event, never by a clock), so the move can only finish
when provision and staging really run at once; a sequential move would install first and be
left waiting, or stage first and never show provision starting before staging ended.
"""

from __future__ import annotations

import http.server
import io
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.errors import OutrigError, RemoteError
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import deploy
from outrig.ops.migrate import migrate
from outrig.sandbox.box import SandboxBox
from outrig.session import Project
from tests.support.network import free_port, serve
from tests.support.processes import marked
from tests.support.provisioning import make_wheel
from tests.support.runs import host_a

pytestmark = pytest.mark.integration
GATE_LIMIT_S = 120.0  # only a broken (sequential) move ever waits this long


class Recorder(io.StringIO):
    """``--json`` output, read line by line as it is written; opens ``gate`` when the stage
    step is done."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate
        self.events: list[dict[str, Any]] = []
        self.partial = ""

    def write(self, text: str) -> int:
        self.partial += text
        while "\n" in self.partial:
            line, self.partial = self.partial.split("\n", 1)
            event = json.loads(line)
            self.events.append(event)
            if event.get("event") == "migrate_step" and event.get("step") == "stage" \
                    and event.get("state") == "done":
                self.gate.set()
        return len(text)

    def steps(self) -> list[str]:
        """``provision:started``, ``stage:done``... in the order they happened."""
        return [f"{e['step']}:{e['state']}" for e in self.events
                if e.get("event") == "migrate_step"]


@pytest.fixture
def gate() -> threading.Event:
    return threading.Event()


@pytest.fixture
def gated_index(tmp_path: Path, gate: threading.Event) -> Iterator[str]:
    """A PEP 503 index with outrigdemo 1.0 whose project page waits for ``gate``."""
    root = tmp_path / "index"
    page = root / "simple" / "outrigdemo"
    page.mkdir(parents=True)
    wheel = make_wheel(root / "files", "outrigdemo", "1.0")
    (page / "index.html").write_text(f'<a href="/files/{wheel.name}">{wheel.name}</a>')

    class Gated(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/simple/outrigdemo"):
                gate.wait(GATE_LIMIT_S)
            super().do_GET()

        def log_message(self, *args: Any) -> None:
            pass

    with serve(root, Gated) as port:
        try:
            yield f"http://127.0.0.1:{port}/simple"
        finally:
            gate.set()  # before the server stops: a held request must not keep it waiting


def write_project(root: Path, index: str, venv: Path, data: Path,
                  package: str = "outrigdemo==1.0") -> Project:
    (root / "playbooks").mkdir(parents=True)
    data.mkdir(parents=True, exist_ok=True)
    (data / "train.jsonl").write_text('{"q": 1}\n' * 100)
    book = {
        "name": "ovl",
        "stage": {"data": {"path": "${workdir}/data", "source": str(data), "kind": "data"},
                  "ckpt": {"path": "${workdir}/ckpt", "kind": "checkpoints"}},
        "environments": {"demo": {"path": str(venv), "python": sys.executable,
                                  "packages": [package], "index_url": index,
                                  "installer": "pip", "pip_args": ["--timeout", "150"]}},
        "processes": {"job": {"command": [sys.executable, "-c",
                                          "import time; time.sleep(600)"]}}}
    (root / "playbooks" / "ovl.yaml").write_text(yaml.safe_dump(book, sort_keys=False))
    return Project(root)


def dead_host(new: Path, tmp_path: Path) -> Path:
    gone = tmp_path / "hosts" / "gone.yaml"
    gone.write_text(yaml.safe_dump({**yaml.safe_load(new.read_text()),
                                    "port": free_port()}))
    return gone


def test_provision_runs_while_data_stages_and_deploy_waits_for_both(
        host_b: Path, tmp_path: Path, gate: threading.Event,
        gated_index: str) -> None:
    venv = tmp_path / "venvs" / "demo"
    project = write_project(tmp_path / "proj", gated_index, venv, tmp_path / "data")
    journal = Journal(tmp_path / "state")
    recorder = Recorder(gate)
    reporter = Reporter(json_mode=True, out=recorder)
    workdir = Path(yaml.safe_load(host_b.read_text())["workdir"])
    try:
        report = migrate(project, str(dead_host(host_b, tmp_path)), str(host_b), reporter,
                         journal=journal, playbook="ovl", probe_attempts=1, probe_pause=0.0)
    finally:
        cleanup(project, str(host_b), Reporter(quiet=True), all_runs=True, journal=journal)
    steps = recorder.steps()
    assert steps.index("provision:started") < steps.index("stage:done"), steps
    assert steps.index("stage:started") < steps.index("provision:done"), steps
    deploy = steps.index("deploy:started")
    assert deploy > steps.index("provision:done") and deploy > steps.index("checkpoint:done")
    assert (workdir / "data" / "train.jsonl").is_file()
    assert (venv / "bin" / "python").exists()
    assert report["provision"]["environments"][0]["versions"] == {"outrigdemo": "1.0"}
    assert set(report["timings"]) == {"probe", "provision", "stage", "checkpoint", "deploy",
                                      "total"}
    assert all(isinstance(v, float) for v in report["timings"].values())
    # Each branch's lines say which branch they come from.
    assert {e.get("branch") for e in recorder.events if e.get("event") == "environment"} == {
        "provision"}
    assert {e.get("branch") for e in recorder.events if e.get("step") == "stage"} == {"stage"}
    [final] = [e for e in recorder.events if "timings" in e and "run_id" in e]
    assert final["timings"] == report["timings"]


def test_a_failed_provision_stops_the_move_before_deploy(
        host_b: Path, tmp_path: Path, gate: threading.Event,
        gated_index: str) -> None:
    venv = tmp_path / "venvs" / "demo"
    project = write_project(tmp_path / "proj", gated_index, venv, tmp_path / "data",
                            package="nosuchpkg==1.0")
    journal = Journal(tmp_path / "state")
    recorder = Recorder(gate)
    gate.set()  # nothing to hold back here
    workdir = Path(yaml.safe_load(host_b.read_text())["workdir"])
    with pytest.raises(RemoteError) as info:
        migrate(project, str(dead_host(host_b, tmp_path)), str(host_b),
                Reporter(json_mode=True, out=recorder), journal=journal, playbook="ovl",
                probe_attempts=1, probe_pause=0.0)
    assert info.value.kind == "pip" and "nosuchpkg==1.0" in str(info.value)
    steps = recorder.steps()
    assert "provision:failed" in steps
    assert "stage:done" in steps, "the running stage step ended; it was not cut"
    assert not [s for s in steps if s.startswith("deploy:")]
    assert not (workdir / "runs").exists() or not list((workdir / "runs").iterdir())
    assert not [r for r in journal.runs() if r.get("playbook") == "ovl"]


def test_a_failed_stage_is_reported_and_provision_ends_its_step(
        host_b: Path, tmp_path: Path, gate: threading.Event,
        gated_index: str) -> None:
    venv = tmp_path / "venvs" / "demo"
    data = tmp_path / "data"
    project = write_project(tmp_path / "proj", gated_index, venv, data)
    (data / "train.jsonl").unlink()
    data.rmdir()  # the workstation folder to stage is gone
    journal = Journal(tmp_path / "state")
    recorder = Recorder(gate)
    gate.set()
    with pytest.raises(OutrigError) as info:
        migrate(project, str(dead_host(host_b, tmp_path)), str(host_b),
                Reporter(json_mode=True, out=recorder), journal=journal, playbook="ovl",
                probe_attempts=1, probe_pause=0.0)
    assert str(data) in str(info.value)
    steps = recorder.steps()
    assert "stage:failed" in steps and "provision:done" in steps
    assert not [s for s in steps if s.startswith(("deploy:", "checkpoint:"))]
    assert (venv / "bin" / "python").exists(), "provision's running step was let finish"


def test_a_live_old_run_is_stopped_only_after_provision_succeeded(
        box_a: SandboxBox, host_b: Path, tmp_path: Path, gate: threading.Event,
        gated_index: str) -> None:
    """OLD is alive: its job trains on while NEW installs; a failed provision leaves it
    running, and a good one is followed by the stop and the checkpoint, in that order."""
    gate.set()
    journal = Journal(tmp_path / "state")
    old = host_a(box_a, tmp_path)
    quiet = Reporter(quiet=True)
    bad = write_project(tmp_path / "bad", gated_index, tmp_path / "venvs" / "bad",
                        tmp_path / "data", package="nosuchpkg==1.0")
    first = deploy(bad, str(old), "ovl", quiet, journal=journal)
    try:
        recorder = Recorder(gate)
        with pytest.raises(RemoteError) as info:
            migrate(bad, str(old), str(host_b), Reporter(json_mode=True, out=recorder),
                    journal=journal, playbook="ovl", probe_attempts=1, probe_pause=0.0)
        assert info.value.kind == "pip"
        assert marked(first.plan.run_id), "OLD's run goes on: NEW could not be made ready"
        assert not [s for s in recorder.steps() if s.startswith(("checkpoint:", "deploy:"))]

        good = write_project(tmp_path / "good", gated_index, tmp_path / "venvs" / "good",
                             tmp_path / "data")
        recorder = Recorder(gate)
        report = migrate(good, str(old), str(host_b), Reporter(json_mode=True, out=recorder),
                         journal=journal, playbook="ovl", probe_attempts=1, probe_pause=0.0)
        steps = recorder.steps()
        assert steps.index("provision:done") < steps.index("checkpoint:started")
        assert report["old_alive"] is True and not marked(first.plan.run_id)
    finally:
        cleanup(bad, str(host_b), quiet, all_runs=True, journal=journal)
        cleanup(bad, str(old), quiet, all_runs=True, journal=journal)
