"""A run's leader exits and a stranger takes its pid: the pieces of that story, for the agent's
ownership tests (tests/unit/test_agent_pid_reuse.py).

The stranger does what any process may do with a pid it was given: it calls ``setsid()``, so a
new session and process group get the dead leader's id, forks ``sleep 600`` and exits. The
sleeper's group and session are then the recorded leader's pid, it started after the leader,
it carries no marker and sits in no cgroup of the run: nothing about it is the run's, and a
cleanup must leave it alone.

Two ways to give the stranger the leader's pid:
- :func:`point_record_at` rewrites the run's record to name the stranger's pid (the leader's
  start time stays): what the agent reads is then exactly what a real reuse leaves, on any
  machine;
- run as a module (``python -m tests.support.pid_reuse WORKDIR``) as PID 1 of a fresh pid
  namespace (``unshare --pid --fork --mount-proc``, root), it makes the reuse real: the kernel
  hands the stranger the leader's very pid, through ``/proc/sys/kernel/ns_last_pid``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from tests.support.agent import PY, Box, Event, stat_fields, wait_until
from tests.support.processes import alive

# The run's process: up at once, exits when job.exit appears in the workdir (its cwd).
JOB = ("import os, time\nprint('up', flush=True)\n"
       "while not os.path.exists('job.exit'):\n    time.sleep(0.05)\n")
# The stranger: a session (and group) of its own, a sleeper in it, then it exits.
STRANGER = ("import os, subprocess, sys\nos.setsid()\n"
            "sleeper = subprocess.Popen(['sleep', '600'])\n"
            "open(sys.argv[1], 'w').write(str(sleeper.pid))\n")
WAYS = ("run", "all", "redeploy")


def deploy_job(box: Box, run_id: str) -> dict[str, Any]:
    """Deploy the one-process run ``run_id`` of playbook ``smoke``; return its record."""
    job = {"name": "job", "argv": [PY, "-c", JOB], "ready": {"log": "^up$", "timeout": 30},
           "stop_grace": 1}
    _, result = box.deploy([job], run_id=run_id)
    assert result["ok"] is True, result
    record: dict[str, Any] = box.run_json(run_id)["processes"][0]
    return record


def end_job(box: Box, record: dict[str, Any]) -> None:
    """Let the job exit; wait until its leader (the wrapper) is gone too."""
    flag = box.workdir / "job.exit"
    flag.touch()
    assert wait_until(lambda: not alive(record["pid"]), timeout=30), "the leader did not end"
    flag.unlink()


def start_stranger(box: Box) -> tuple[int, int]:
    """Run the stranger to its end; return (its pid, its sleeper's pid), the sleeper tracked
    for the teardown."""
    out = box.tmp / f"sleeper-{uuid.uuid4().hex[:6]}.pid"
    stranger = subprocess.Popen([sys.executable, "-c", STRANGER, str(out)])
    assert stranger.wait(timeout=30) == 0
    sleeper = int(out.read_text())
    box.track(sleeper)
    st = stat_fields(sleeper)
    assert st is not None and st[1] == st[2] == stranger.pid  # its group and session
    return stranger.pid, sleeper


def point_record_at(box: Box, run_id: str, pid: int) -> None:
    """Make the run's record name ``pid`` as its leader's, keeping the leader's start time:
    what the agent finds after the kernel gave the dead leader's pid to someone else."""
    path = box.workdir / "runs" / run_id / "run.json"
    run = json.loads(path.read_text())
    run["processes"][0].update(pid=pid, pgid=pid, sid=pid)
    path.write_text(json.dumps(run))


def stop_by(box: Box, way: str, run_id: str) -> list[Event]:
    """Stop the run as ``cleanup --run``, ``cleanup --all`` or a re-deploy of its playbook;
    return the ``stopped`` events of its process ``job``."""
    if way == "redeploy":
        events, result = box.deploy([{"name": "job", "argv": [PY, "-c", JOB],
                                      "ready": {"log": "^up$", "timeout": 30},
                                      "stop_grace": 1}], run_id=f"{run_id}-again")
    else:
        req = {"op": "cleanup", "run_id": run_id} if way == "run" else {"op": "cleanup",
                                                                         "all": True}
        events, result = box.agent(req)
    assert result["ok"] is True, result
    return [e for e in events
            if e["event"] == "stopped" and e["run_id"] == run_id and e["process"] == "job"]


def tree_pids(box: Box, run_id: str) -> list[int]:
    """The pids ``status`` lists as the run's (under its process's tree)."""
    _, status = box.agent({"op": "status", "run_id": run_id})
    assert status["ok"] is True, status
    return [n["pid"] for r in status["runs"] for p in r["processes"] for n in p.get("tree", [])]


def real_reuse(box: Box, way: str) -> dict[str, Any]:
    """In a fresh pid namespace: the leader ends, the kernel gives the stranger its pid, the
    run is stopped ``way``. Returns what was seen."""
    run_id = f"reuse-{way}-{uuid.uuid4().hex[:6]}"
    record = deploy_job(box, run_id)
    end_job(box, record)
    # gone for good, not only a zombie: PID 1 (main) must have reaped it for the pid to be free
    assert wait_until(lambda: not os.path.exists(f"/proc/{record['pid']}"), timeout=30)
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(record["pid"] - 1))  # the next fork in this namespace gets the leader's pid
    stranger, sleeper = start_stranger(box)
    listed = tree_pids(box, run_id)
    stopped = stop_by(box, way, run_id)
    return {"leader": record["pid"], "stranger": stranger, "sleeper": sleeper,
            "listed": sleeper in listed, "stragglers": [e["stragglers"] for e in stopped],
            "alive": alive(sleeper)}


def main(workdir: str) -> int:
    """PID 1 of the namespace: run the scenario in a child and reap every orphan meanwhile
    (the ended leader must really be gone for its pid to be handed out again)."""
    child = os.fork()
    if child == 0:
        box = Box(Path(workdir))
        code = 0
        try:
            print(json.dumps({way: real_reuse(box, way) for way in WAYS}), flush=True)
        except BaseException as exc:  # the test reads the reason from stderr
            print(f"pid reuse scenario failed: {exc!r}", file=sys.stderr, flush=True)
            code = 1
        finally:
            box.teardown()
        os._exit(code)
    while True:
        pid, status = os.wait()
        if pid == child:
            return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
