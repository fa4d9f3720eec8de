"""``outrig status --follow``, the live view, through the installed command against the
sandbox box behind a latency proxy that counts the connections made through it: frames come
one after another on one connection (the warm path: one login for the whole view, not one
per refresh), plain lines with no cursor movement when stdout is a pipe, redrawn in place
on a terminal (a pty), and Ctrl-C leaves with exit 130. Counts of frames and connections,
never timings."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.ops.deploy import deploy
from outrig.session import Project
from tests.support.hosts import write_host_file
from tests.support.runs import write_playbook

pytestmark = pytest.mark.integration
OUTRIG = str(Path(sys.executable).parent / "outrig")
HEADER = "status of far at "


@pytest.fixture
def far(box_host: Path, sandbox: Any, make_proxy: Any, tmp_path: Path,
        teardown_runs: None, keeping: None) -> tuple[Path, Any]:
    """A project whose host ``far`` reaches the sandbox through a counting proxy, with a
    run of a two-process playbook (a trainer printing metric lines) on the box."""
    project = tmp_path / "proj"
    (project / "hosts").mkdir(parents=True)
    host = yaml.safe_load(box_host.read_text())
    proxy = make_proxy(sandbox.port, one_way_delay=0.0)
    host["port"] = proxy.port
    write_host_file(project, "far", **host)
    trainer = ("import time\nstep = 0\nwhile True:\n    step += 1\n"
               "    print(f'train/loss={1 / step:.4f}, global_step={step}', flush=True)\n"
               "    time.sleep(0.2)\n")
    playbook = write_playbook(tmp_path, {"processes": {
        "trainer": {"command": [sys.executable, "-c", trainer],
                    "ready": {"log": "global_step=1$", "timeout": 60}}}}, "live")
    deploy(Project(project), str(box_host), str(playbook), Reporter(quiet=True),
           journal=Journal())
    return project, proxy


def read_until(fd: int, done: Any, limit: float = 120) -> str:
    """Read ``fd`` until ``done(text)`` holds (or the limit, a guard, passes)."""
    text = ""
    deadline = time.monotonic() + limit
    while not done(text) and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # a pty reads EIO once its other end is closed
                break
            if not chunk:
                break
            text += chunk.decode("utf-8", "replace")
    return text


def test_follow_in_a_pipe_is_plain_frames_on_one_connection(far: tuple[Path, Any]) -> None:
    project, proxy = far
    before = proxy.accepted
    follow = subprocess.Popen([OUTRIG, "status", "--host", "far", "--follow", "--every",
                               "0.2", "--lines", "0"], cwd=project, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "80"})
    try:
        assert follow.stdout is not None
        text = read_until(follow.stdout.fileno(), lambda t: t.count(HEADER) >= 4)
        follow.send_signal(signal.SIGINT)
        _, err = follow.communicate(timeout=60)
    finally:
        if follow.poll() is None:
            follow.kill()
    assert follow.returncode == 130, err
    assert "status --follow stopped (Ctrl-C)" in err.decode()
    assert text.count(HEADER) >= 4, text
    assert "\x1b" not in text  # no cursor movement, no colour: a log of snapshots
    frames = text.split(HEADER)[1:]
    assert all("trainer  running" in frame for frame in frames[:4]), frames[0]
    steps = [int(frame.split("step ", 1)[1].split(",", 1)[0].split("/")[0])
             for frame in frames[:4] if "step " in frame]
    assert len(steps) >= 3 and steps == sorted(steps) and steps[-1] > steps[0], steps
    assert max(len(line) for line in text.splitlines()) <= 80
    # one connection for every refresh: the warm link, never a login per frame
    assert proxy.accepted - before == 1


def test_follow_on_a_terminal_redraws_in_place(far: tuple[Path, Any]) -> None:
    project, proxy = far
    before = proxy.accepted
    main, child = pty.openpty()
    follow = subprocess.Popen([OUTRIG, "status", "--host", "far", "--follow", "--every",
                               "0.2", "--lines", "0"], cwd=project, stdin=subprocess.DEVNULL,
                              stdout=child, stderr=child,
                              env={**os.environ, "COLUMNS": "80", "TERM": "xterm"})
    os.close(child)
    try:
        text = read_until(main, lambda t: t.count(HEADER) >= 3)
        follow.send_signal(signal.SIGINT)
        follow.wait(timeout=60)
        text += read_until(main, lambda t: "stopped (Ctrl-C)" in t, limit=10)
    finally:
        if follow.poll() is None:
            follow.kill()
        os.close(main)
    assert follow.returncode == 130
    frames = text.split(HEADER)
    assert len(frames) >= 4, text
    # every frame after the first starts by moving up over the last one and clearing it
    for before_frame in frames[1:-1]:
        assert before_frame.endswith("\x1b[J") and "\x1b[" in before_frame[-12:], \
            repr(before_frame[-20:])
    assert "stopped (Ctrl-C)" in text
    assert proxy.accepted - before == 1
