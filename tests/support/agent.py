"""The agent test harness: runs the box agent locally exactly as the SSH and ``local``
transports run it (the bootstrap command with the bundle, see remote/agent/bundle.py; requests
with secrets on stdin, others in the command line), in a tmp workdir, and helpers that read
/proc. Shared by the agent's unit tests (tests/unit/test_agent_*.py), the fixture replays
(tests/unit/test_real_gpu_fixtures.py) and bench/real_gpu_check.py.

Every test works in its own tmp workdir with small real processes and asserts real outcomes
(pids gone in /proc, files, exit codes). Processes are cleaned up by recorded pid (and start
ticks) in the fixture's teardown, even when a test fails; never by name or pattern.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from outrig._box.agent.procs import read_stat
from outrig.agent.client import AGENT_DIR, agent_command, agent_payload, argv_command

# Run ids unique to this test session: the agent's marker sweep is box-wide, so two test
# sessions on one machine must never share a run id (real run ids carry a timestamp and
# random bits for the same reason).
R1 = f"r1-{uuid.uuid4().hex[:8]}"
R2 = f"r2-{uuid.uuid4().hex[:8]}"

ROOT = Path(__file__).resolve().parents[1]
AGENT = AGENT_DIR  # the package remote/agent/ (imported as outrig._box.agent)
# The agent must run on Python >= 3.8: point this at an old interpreter to check that.
PY = os.environ.get("OUTRIG_TEST_AGENT_PYTHON", sys.executable)

Event = dict[str, Any]


def stat_fields(pid: int) -> tuple[str, int, int, int] | None:
    """(state, pgid, sid, start_ticks) from /proc/PID/stat (the agent's own parser), or None
    when the pid is gone."""
    st = read_stat(pid)
    return None if st is None else (st.state, st.pgid, st.sid, st.start_ticks)


def wait_until(cond: Any, timeout: float = 5.0) -> bool:
    """Poll ``cond()`` until true or timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


def agent_command_for(request: dict[str, Any], python: str = PY) -> tuple[list[str], bytes]:
    """(argv, stdin bytes) that run the agent on ``request`` the way AgentCall does over SSH:
    everything in the command line, or (requests with secrets, or too long) the bootstrap
    with the bundle and the request line on stdin."""
    encoded = json.dumps(request).encode()
    workdir = str(request.get("workdir") or "")
    argv = None if request.get("secrets") else argv_command(python, encoded, workdir)
    if argv is not None:
        return argv, b""
    return agent_command(python, workdir), agent_payload() + encoded + b"\n"


def run_agent(request: dict[str, Any], *, python: str = PY, timeout: float = 60.0
              ) -> list[Event]:
    """Run the agent once on ``request`` (which must be complete: v, workdir, env) and return
    every event it printed, the result last; a non-zero exit fails with its stderr."""
    argv, stdin = agent_command_for(request, python)
    done = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


class Box:
    """One tmp workdir plus the pids started in it, cleaned up by pid at teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.workdir = tmp_path / "wd"
        self.pids: dict[int, int] = {}  # pid -> start ticks when recorded

    def track(self, pid: int) -> None:
        """Remember a pid (with its start ticks, so teardown never kills a reused pid)."""
        st = stat_fields(pid)
        if st is not None:
            self.pids.setdefault(pid, st[3])

    def track_events(self, events: list[Event]) -> None:
        """Track every pid the agent reports as launched."""
        for ev in events:
            if ev["event"] == "launched":
                self.track(ev["pid"])

    def agent(self, req: dict[str, Any], timeout: float = 40.0,
              prefix: list[str] | None = None) -> tuple[list[Event], Event]:
        """Run the agent with one request line; return (events before result, result).

        ``prefix`` is an argv the agent's command is appended to (e.g. one hiding /proc)."""
        req.setdefault("v", 1)
        req.setdefault("workdir", str(self.workdir))
        req.setdefault("env", {})
        argv, stdin = agent_command_for(req)
        proc = subprocess.run(
            [*(prefix or []), *argv],
            input=stdin,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr.decode()
        lines = [json.loads(x) for x in proc.stdout.decode().splitlines()]
        assert lines, proc.stderr.decode()
        for ev in lines:
            assert "event" in ev and isinstance(ev["t"], float)
        result = lines[-1]
        assert result["event"] == "result", lines
        events = lines[:-1]
        self.track_events(events)
        return events, result

    def deploy(self, processes: list[dict[str, Any]], **extra: Any) -> tuple[list[Event], Event]:
        """A deploy request with test-friendly defaults."""
        req: dict[str, Any] = {
            "op": "deploy",
            "playbook": "smoke",
            "run_id": R1,
            "processes": processes,
            "lock_timeout": 2,
            "progress_interval": 0.2,
        }
        req.update(extra)
        return self.agent(req)

    def run_json(self, run_id: str = R1) -> dict[str, Any]:
        """The run's manifest."""
        data: dict[str, Any] = json.loads((self.workdir / "runs" / run_id / "run.json").read_text())
        return data

    def log(self, name: str, run_id: str = R1) -> str:
        """A process log's text."""
        return (self.workdir / "runs" / run_id / "logs" / f"{name}.log").read_text()

    def teardown(self) -> None:
        """Stop everything: the agent's own cleanup, then SIGKILL any recorded pid still ours."""
        if (self.workdir / ".outrig").is_dir():
            with contextlib.suppress(Exception):  # teardown must go on to the pid kills
                self.agent({"op": "cleanup", "all": True, "stop_grace": 0.2}, timeout=30)
        for pid, ticks in self.pids.items():
            st = stat_fields(pid)
            if st is not None and st[3] == ticks and st[0] not in ("Z", "X"):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def sleeper(name: str, **extra: Any) -> dict[str, Any]:
    """A process that just runs for a minute (ready when launched)."""
    proc: dict[str, Any] = {
        "name": name,
        "argv": [PY, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        "ready": None,
        "stop_grace": 1,
    }
    proc.update(extra)
    return proc


def error_of(result: Event, kind: str) -> dict[str, Any]:
    """Assert the result failed with this kind; return the error."""
    assert result["ok"] is False, result
    err: dict[str, Any] = result["error"]
    assert err["kind"] == kind, err
    return err


def names(events: list[Event], kind: str) -> list[str]:
    """``process`` of every event of one kind, in order."""
    return [ev["process"] for ev in events if ev["event"] == kind]


# The run's process: starts a child that drops every OUTRIG_* variable and leaves the session
# (setsid), and that child holds GPU 1. The parent exits when parent.exit appears (or on
# SIGTERM), leaving the child reparented to init.
ESCAPE = r"""
import json, os, subprocess, sys, time
gpu_dir = os.environ["OUTRIG_FAKE_GPU_DIR"]
child = r'''
import json, os, sys, time
ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
holders = os.path.join(sys.argv[1], "holders")
os.makedirs(holders, exist_ok=True)
rec = {"pid": os.getpid(), "gpu": 1, "mib": 4096, "start_ticks": ticks}
with open(os.path.join(holders, ".tmp%d" % os.getpid()), "w") as f:
    f.write(json.dumps(rec))
os.replace(os.path.join(holders, ".tmp%d" % os.getpid()),
           os.path.join(holders, "%d.json" % os.getpid()))
open("child.pid", "w").write(str(os.getpid()))
time.sleep(120)
'''
env = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIG_")}
if os.environ.get("ESCAPE_LATE") == "1":  # escape only once the deploy is over
    print("up", flush=True)
    while not os.path.exists("escape.now"):
        time.sleep(0.05)
kid = subprocess.Popen([sys.executable, "-c", child, gpu_dir], env=env, start_new_session=True)
while not os.path.exists("child.pid"):
    time.sleep(0.02)
open("parent.pid", "w").write(str(os.getpid()))
if os.environ.get("ESCAPE_LATE") != "1":
    print("up", flush=True)
while not os.path.exists("parent.exit"):
    time.sleep(0.05)
"""
