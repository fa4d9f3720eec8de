"""A stranger that got a dead leader's pid is not the run's (remote/agent/stopping.py).

A run's leader exits; a stranger is given its pid, calls setsid() (so a session and group with
the leader's id exist again), forks ``sleep 600`` and exits. The sleeper started after the
leader, in a group and session whose id is the recorded leader's pid: the old rule "group or
session = the leader's pid, started after it" took it for the run's, and ``cleanup --run``,
``cleanup --all`` and a re-deploy SIGKILLed it as a straggler. A group or session with that id
is the leader's only while the leader lives, or while a member that provably joined it then
still lives (docs/cleanup.md, rule 3). The run's own orphans are still found (last test).

The stand-in reuse (tests/support/pid_reuse.py) points the run's record at the stranger's pid;
the real one runs in a fresh pid namespace where the kernel hands the stranger the very pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import pid_reuse
from tests.support.agent import PY, R1, Box, stat_fields, wait_until
from tests.support.processes import alive, children

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("way", pid_reuse.WAYS)
def test_a_stranger_given_a_dead_leaders_pid_is_not_stopped(box: Box, way: str) -> None:
    record = pid_reuse.deploy_job(box, R1)
    pid_reuse.end_job(box, record)
    stranger, sleeper = pid_reuse.start_stranger(box)
    pid_reuse.point_record_at(box, R1, stranger)
    assert sleeper not in pid_reuse.tree_pids(box, R1)  # status does not call it the run's
    stopped = pid_reuse.stop_by(box, way, R1)
    assert [e["stragglers"] for e in stopped] == [0]
    assert alive(sleeper), f"cleanup ({way}) killed a process that was never the run's"
    seen = json.loads((box.workdir / "runs" / R1 / "descendants.json").read_text())
    assert sleeper not in [p["pid"] for p in seen["processes"]]  # nor recorded it as ours


def namespace_prefix() -> list[str]:
    """``unshare`` argv for a fresh pid namespace, or skip saying why there is none here."""
    if not shutil.which("unshare"):
        pytest.skip("unshare(1) is not installed: no fresh pid namespace here")
    if os.geteuid() != 0:
        pytest.skip("a fresh pid namespace with a settable ns_last_pid needs root")
    argv = ["unshare", "--pid", "--fork", "--mount-proc"]
    probe = subprocess.run([*argv, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a pid namespace here: {probe.stderr.strip()}")
    return argv


@pytest.mark.processes  # the box agent and its runs, in the namespace (no fixture says so)
def test_real_pid_reuse_in_a_fresh_pid_namespace(tmp_path: Path) -> None:
    argv = [*namespace_prefix(), sys.executable, "-m", "tests.support.pid_reuse",
            str(tmp_path)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240,
                          check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    for way in pid_reuse.WAYS:
        case = seen[way]
        assert case["stranger"] == case["leader"], case  # the kernel really reused the pid
        assert case["listed"] is False, case
        assert case["stragglers"] == [0], case
        assert case["alive"] is True, f"cleanup ({way}) killed the stranger's sleeper: {case}"


# The run's own orphans: the server exits (its wrapper with it) and leaves a child that made a
# group of its own in the run's session, renamed, without marker, never seen by a contact.
ORPHAN = r"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import os, time; os.setpgrp(); os.environ.clear(); open('orphan.pid', 'w')"
    ".write(str(os.getpid())); time.sleep(600)"], env={})
while not os.path.exists("orphan.pid"):
    time.sleep(0.05)
print("up", flush=True)
while not os.path.exists("server.exit"):
    time.sleep(0.05)
"""


def test_the_runs_own_orphan_in_its_session_is_still_stopped(box: Box) -> None:
    # the child appears only after the deploy's last look (late), so only the session proves
    # it the run's: it started while the leader lived (the wrapper's exit file says until when)
    env = {"OUTRIG_CGROUPS": "0"}
    _, result = box.deploy([{"name": "server", "argv": [PY, "-c", ORPHAN],
                             "ready": {"log": "^up$", "timeout": 30}, "stop_grace": 1}],
                           env=env)
    assert result["ok"] is True, result
    orphan = int((box.workdir / "orphan.pid").read_text())
    box.track(orphan)
    leader = box.run_json()["processes"][0]["pid"]
    seen = box.workdir / "runs" / R1 / "descendants.json"
    seen.unlink(missing_ok=True)  # as if no contact had recorded it
    (box.workdir / "server.exit").touch()
    assert wait_until(lambda: not alive(leader), timeout=30)
    exit_record = json.loads((box.workdir / "runs" / R1 / "exit" / "server.json").read_text())
    assert exit_record["pid"] == leader and exit_record["alive_ticks"] > 0
    _, result = box.agent({"op": "cleanup", "run_id": R1, "env": env})
    assert result["ok"] is True, result
    assert wait_until(lambda: not alive(orphan), timeout=20), "the run's orphan was left"
    stopped = result["runs"][0]["processes"][0]
    assert stopped["process"] == "server" and stopped["stragglers"] == 1


def test_a_gone_leaders_zombie_keeps_its_session_the_runs(box: Box) -> None:
    # Where nothing reaps the ended wrapper (a container whose PID 1 does not reap), its zombie
    # still holds the pid: no stranger can have it, so the session is still the leader's even
    # with no exit file (the wrapper was SIGKILLed) and no record of its members.
    pr_set_child_subreaper = 36
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0) == 0  # orphans come to this test
    pids: list[int] = []
    try:
        env = {"OUTRIG_CGROUPS": "0"}
        # the server drops the markers too: only its session leads to it and its child
        unmarked = ["env", "-u", "OUTRIG_RUN", "-u", "OUTRIG_PROCESS", PY, "-c", ORPHAN]
        _, result = box.deploy([{"name": "server", "argv": unmarked,
                                 "ready": {"log": "^up$", "timeout": 30}, "stop_grace": 1}],
                               env=env)
        assert result["ok"] is True, result
        leader = box.run_json()["processes"][0]["pid"]
        orphan = int((box.workdir / "orphan.pid").read_text())
        server = next(p for p in children(leader))
        pids += [leader, server, orphan]
        for pid in (server, orphan):
            box.track(pid)
        os.kill(leader, signal.SIGKILL)  # no exit file: nothing says until when it lived
        assert wait_until(lambda: not alive(leader), timeout=30)
        assert stat_fields(leader) is not None  # a zombie, unreaped
        (box.workdir / "runs" / R1 / "descendants.json").unlink(missing_ok=True)
        _, result = box.agent({"op": "cleanup", "run_id": R1, "env": env})
        assert result["ok"] is True, result
        assert wait_until(lambda: not alive(server) and not alive(orphan), timeout=20)
        assert result["runs"][0]["processes"][0]["stragglers"] == 2
    finally:
        libc.prctl(pr_set_child_subreaper, 0, 0, 0, 0)
        for pid in pids:  # reap what came to this test
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
