"""Escape sequences printed by a process never reach the user's terminal raw.

A process's output can hold a window-title OSC, a clear-screen CSI, an OSC 52 clipboard write
and a one-byte C1 CSI. Where outrig shows process output to a person (a deploy error's log
excerpt, ``tail-logs``, ``status``) every control character but tab and newline is shown as a
visible ``\\x1b``-style escape; ``--json`` keeps the exact text. Through the real sshd.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from invoke.exceptions import Exit

import tasks
from outrig.console import Reporter
from outrig.errors import OutrigError, RemoteError
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import deploy
from outrig.ops.logs import tail_logs
from outrig.ops.status import print_status, status
from outrig.ops.watch import watch
from outrig.ops.watch_record import WatchOptions
from outrig.session import Project
from outrig.text.layout import visible

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)

HOSTILE = "title\x1b]0;pwned\x07 clear\x1b[2J clip\x1b]52;c;ZWNobyBoaQ==\x07 c1\x9b31m end"
CONTROLS = [chr(c) for c in [*range(0, 9), *range(11, 32), *range(0x7f, 0xa0)]]


def raw_controls(text: str) -> list[str]:
    """The control characters (but tab and newline) present in ``text``."""
    return sorted({repr(ch) for ch in text if ch in CONTROLS})


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "state")


@pytest.fixture
def teardown_runs(box_host: Path) -> Iterator[None]:
    yield
    cleanup(PROJECT, str(box_host), Reporter(quiet=True), all_runs=True,
            journal=Journal(box_host.parent / "teardown-state"))


def hostile_playbook(tmp_path: Path) -> Path:
    script = f"import sys, time; print({HOSTILE!r}, flush=True); time.sleep(0.3); sys.exit(3)"
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump({"name": "hostile", "processes": {
        "evil": {"command": [sys.executable, "-c", script],
                 "ready": {"log": "never printed", "timeout": 30}}}}))
    return path


def test_visible_shows_every_control_but_tab_and_newline() -> None:
    shown = visible(HOSTILE + "\ttab\nnext\r\x00\x7f")
    assert raw_controls(shown) == []
    assert "\\x1b]0;pwned\\x07" in shown and "\\x1b]52;c;" in shown and "\\x9b31m" in shown
    assert "\ttab\nnext\\x0d\\x00\\x7f" in shown


def test_deploy_error_status_and_tail_logs_show_escapes_visibly(
        box_host: Path, tmp_path: Path, journal: Journal, teardown_runs: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    playbook = hostile_playbook(tmp_path)

    def failing_deploy() -> None:
        deploy(PROJECT, str(box_host), str(playbook), Reporter(quiet=True), journal=journal)

    with pytest.raises(Exit):
        tasks.friendly(failing_deploy)()
    err = capsys.readouterr().err
    assert "exited" in err and "\\x1b]0;pwned\\x07" in err, err
    assert raw_controls(err) == []
    with pytest.raises(RemoteError) as info:  # the error itself keeps the exact text
        failing_deploy()
    assert HOSTILE in str(info.value)

    human = io.StringIO()
    result = status(PROJECT, str(box_host), Reporter(quiet=True), playbook="hostile",
                    journal=journal)
    print_status(Reporter(out=human, err=io.StringIO()), result)
    assert "\\x1b[2J" in human.getvalue(), human.getvalue()
    assert raw_controls(human.getvalue()) == []
    machine = io.StringIO()
    status(PROJECT, str(box_host), Reporter(json_mode=True, out=machine), playbook="hostile",
           journal=journal)
    tails = [p.get("log_tail") for doc in map(json.loads, machine.getvalue().splitlines())
             for run in doc.get("runs") or [] for p in run.get("processes") or []]
    assert any(HOSTILE in (tail or []) for tail in tails), machine.getvalue()

    human = io.StringIO()
    tail_logs(PROJECT, str(box_host), Reporter(out=human, err=io.StringIO()),
              playbook="hostile", follow=False, journal=journal)
    assert "\\x1b]52;c;ZWNobyBoaQ==\\x07" in human.getvalue(), human.getvalue()
    assert raw_controls(human.getvalue()) == []
    machine = io.StringIO()
    fresh = Journal(tmp_path / "state2")  # a journal's mirror resumes after lines shown
    tail_logs(PROJECT, str(box_host), Reporter(json_mode=True, out=machine, err=io.StringIO()),
              playbook="hostile", follow=False, journal=fresh)
    lines = [json.loads(ln) for ln in machine.getvalue().splitlines()]
    assert HOSTILE in [ln.get("line") for ln in lines], lines


FORGED = "worker\nerror: forged by the box\r\x1b[2K"


def test_box_side_text_with_a_newline_cannot_start_a_line_in_watchs_error(
        box_host: Path, tmp_path: Path, journal: Journal, teardown_runs: None) -> None:
    """A process name rewritten in the box's run.json (anything on the box can write it)
    reaches watch's error message with its newline and carriage return shown as escapes
    (ESC, like every other control, is escaped where the message is printed): the message
    keeps its one line, no forged ``error:`` line."""
    playbook = tmp_path / "plain.yaml"
    playbook.write_text(yaml.safe_dump({"name": "plain", "processes": {"worker": {
        "command": [sys.executable, "-c", "import time; time.sleep(600)"]}}}))
    deployed = deploy(PROJECT, str(box_host), str(playbook), Reporter(quiet=True),
                      journal=journal)
    record = box_host.parent.parent / "workdir" / "runs" / deployed.plan.run_id / "run.json"
    run = json.loads(record.read_text())
    run["processes"][0]["name"] = FORGED
    record.write_text(json.dumps(run))
    wrapper = int(run["processes"][0]["pid"])
    child = Path(f"/proc/{wrapper}/task/{wrapper}/children").read_text().split()[0]
    os.kill(int(child), signal.SIGKILL)  # the job crashes on a box that answers
    with pytest.raises(OutrigError) as caught:
        watch(PROJECT, str(box_host), "plain", Reporter(quiet=True), journal=journal,
              options=WatchOptions(threshold=4.0, period=0.5))
    text = str(caught.value)
    assert "\n" not in text and "\r" not in text, repr(text)
    assert "worker\\nerror: forged by the box\\r\x1b[2K" in text
    assert "\n" not in visible(text) and "\\x1b[2K" in visible(text)
