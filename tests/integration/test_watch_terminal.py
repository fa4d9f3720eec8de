"""``outrig watch`` on an 80-column terminal (a pseudo-terminal, the real sshd sandbox): Ctrl-C
while its heartbeat spinner is drawn erases the frame and shows the cursor again before the
message, and draws nothing after it (issue 41: the frame was left over the message)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.cli import deployed
from tests.support.terminal import on_a_terminal

pytestmark = pytest.mark.integration
OUTRIG = Path(sys.executable).parent / "outrig"
SPINNER = "⠋".encode()  # rich's first frame of its dots spinner
BEAT_WAIT_S = 300  # the first heartbeat comes 30 s in (BEAT_EVERY); a bound only


@pytest.fixture
def project(box_project: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The sandbox as ``--host sandbox``, a playbook that runs until stopped."""
    monkeypatch.chdir(box_project)
    monkeypatch.delenv("OUTRIG_PROJECT", raising=False)
    (box_project / "playbooks" / "loop.yaml").write_text(yaml.safe_dump({
        "name": "loop", "processes": {"loop": {
            "command": ["python3", "-u", "-c",
                        "import time\nwhile True: print('beat', flush=True); time.sleep(1)"],
            "ready": {"log": "beat", "timeout": 60}}}}))
    return box_project


def test_ctrl_c_in_watch_erases_the_spinner_before_the_message(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_id = deployed("loop", capsys)["run_id"]
    sent: list[int] = []

    def ctrl_c_at_the_spinner(pid: int, output: bytes) -> None:
        if not sent and SPINNER in output:
            os.kill(pid, signal.SIGINT)  # what Ctrl-C sends
            sent.append(pid)

    code, output = on_a_terminal(
        [str(OUTRIG), "watch", "--host", "sandbox", "--playbook", "loop"], cwd=project,
        env={"COLUMNS": "80"}, timeout=BEAT_WAIT_S, react=ctrl_c_at_the_spinner)
    assert sent, output
    assert code == 130, output
    said = output.index(b"interrupted: anything already launched keeps running")
    before, after = output[:said], output[said:]
    assert f"{run_id}: running".encode() in before, output  # the heartbeat was drawn
    assert b"\x1b[?25h" in before, output  # the spinner stopped: the cursor shown again
    assert b"\x1b[2K" in before[before.rindex(b"\x1b[?25h"):], output  # its line erased
    assert SPINNER not in after and run_id.encode() not in after, output  # nothing redrawn
    assert b"\x1b[?25l" not in after, output
    text = after.decode().replace("\r", "")
    assert all(len(line) <= 80 for line in text.splitlines()), text
