"""Cleanup never reports success while a process of ours lives (remote/agent/, run locally).

A child that clears the OUTRIG_* markers and calls setsid is in no group, session or marker of
its run. It is still ours when it is in the run's cgroup, when its parent chain leads to the
run, or when it was seen as ours before (pid + start time); a holder of the run's GPU that
none of these proves is reported and cleanup is not "done". With /proc hidden from the agent,
nothing is started and cleanup says it could prove nothing.

GPUs are the sandbox's fake nvidia-smi (outrig/sandbox/nvidia_smi.py): a process "holds" a
GPU while its holder file names its live pid and start time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from outrig.sandbox import nvidia_smi
from tests.support.agent import AGENT, ESCAPE, PY, R1, Box, stat_fields, wait_until
from tests.support.network import free_port
from tests.support.processes import alive, marked

HIDE_PROC = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             'mount -t tmpfs tmpfs /proc && exec "$@"', "sh"]


@pytest.fixture
def gpu_env(tmp_path: Path) -> dict[str, str]:
    """Request env putting the sandbox's fake nvidia-smi (2 GPUs) on the agent's PATH."""
    gpu_dir = tmp_path / "fakegpu"
    nvidia_smi.write_inventory(gpu_dir, nvidia_smi.make_inventory(2, 81559, "NVIDIA H100"))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(f"#!{sys.executable}\n{Path(nvidia_smi.__file__).read_text()}")
    smi.chmod(0o755)
    return {"PATH": f"{bindir}:$PATH", nvidia_smi.STATE_ENV: str(gpu_dir)}


def deploy_escaper(box: Box, env: dict[str, str], late: bool = False) -> dict[str, Any]:
    """Deploy ESCAPE on GPU 1; return the result, with the escaped child tracked. ``late``:
    the child escapes only after the deploy returned (no contact has seen it)."""
    if late:
        env = {**env, "ESCAPE_LATE": "1"}
    _, result = box.deploy([{"name": "job", "argv": [PY, "-c", ESCAPE], "gpus": [1],
                             "ready": {"log": "^up$", "timeout": 30}, "stop_grace": 1}],
                           env=env)
    assert result["ok"] is True, result
    if late:
        (box.workdir / "escape.now").touch()
        assert wait_until(lambda: (box.workdir / "parent.pid").exists(), timeout=20)
    box.track(child_pid(box))
    box.track(int((box.workdir / "parent.pid").read_text()))
    st = stat_fields(child_pid(box))
    assert st is not None and st[2] == child_pid(box)  # really in a session of its own
    return result


def child_pid(box: Box) -> int:
    return int((box.workdir / "child.pid").read_text())


def orphan_the_child(box: Box) -> None:
    """Let the parent exit, and wait until the child has lost it (reparented)."""
    parent = int((box.workdir / "parent.pid").read_text())
    (box.workdir / "parent.exit").touch()
    assert wait_until(lambda: not alive(parent), timeout=20)
    assert alive(child_pid(box))


def no_cgroups(env: dict[str, str]) -> dict[str, str]:
    return {**env, "OUTRIG_CGROUPS": "0"}


def test_setsid_child_without_markers_is_stopped_through_its_parent(
        box: Box, gpu_env: dict[str, str]) -> None:
    env = no_cgroups(gpu_env)
    deploy_escaper(box, env)
    _, result = box.agent({"op": "cleanup", "playbook": "smoke", "env": env})
    assert result["ok"] is True, result
    assert wait_until(lambda: not alive(child_pid(box)))
    assert result["gpu"]["released"] is True, result["gpu"]


def seen_child_is_stopped_once_orphaned(box: Box, env: dict[str, str]) -> None:
    """The escaped child is in the run's record of processes seen as ours; once its parent
    has exited, that record alone proves it ours, and cleanup stops it and frees its GPU."""
    seen = json.loads((box.workdir / "runs" / R1 / "descendants.json").read_text())
    assert child_pid(box) in [p["pid"] for p in seen["processes"]]
    orphan_the_child(box)
    _, result = box.agent({"op": "cleanup", "playbook": "smoke", "env": env})
    assert result["ok"] is True, result
    assert wait_until(lambda: not alive(child_pid(box)))
    assert result["gpu"]["released"] is True, result["gpu"]


def test_setsid_child_seen_by_status_is_stopped_after_its_parent_exited(
        box: Box, gpu_env: dict[str, str]) -> None:
    env = no_cgroups(gpu_env)
    deploy_escaper(box, env)
    _, status = box.agent({"op": "status", "playbook": "smoke", "env": env})
    assert status["ok"] is True, status
    seen_child_is_stopped_once_orphaned(box, env)


def test_setsid_child_seen_by_the_deploys_wait_is_stopped_after_its_parent_exited(
        box: Box, gpu_env: dict[str, str]) -> None:
    # No status call in between: the deploy's own wait recorded the child (its parent was
    # proven ours), and that record is the only proof left once the parent is gone.
    env = no_cgroups(gpu_env)
    deploy_escaper(box, env)
    seen_child_is_stopped_once_orphaned(box, env)


def test_unprovable_holder_of_the_runs_gpu_is_reported_not_called_done(
        box: Box, gpu_env: dict[str, str]) -> None:
    env = no_cgroups(gpu_env)
    deploy_escaper(box, env, late=True)
    orphan_the_child(box)  # escaped after the deploy, never seen: nothing proves it ours
    _, result = box.agent({"op": "cleanup", "playbook": "smoke", "env": env})
    assert result["ok"] is True, result
    verdict = result["gpu"]
    assert verdict["released"] is False
    assert [h["pid"] for h in verdict["unproven"]] == [child_pid(box)]
    # the fix names the installed command (`inv` in a checkout takes the same tasks)
    assert f"outrig cleanup --host HOST --force-foreign {child_pid(box)}" in verdict["message"]
    assert alive(child_pid(box))  # not proven ours: not killed


def test_setsid_child_in_the_runs_cgroup_is_stopped(box: Box, gpu_env: dict[str, str]) -> None:
    result = deploy_escaper(box, gpu_env)
    run = box.run_json()
    cgroup = run["processes"][0]["cgroup"]
    if cgroup is None:
        pytest.skip("this machine does not let the agent create a cgroup v2 folder")
    assert child_pid(box) in [int(x) for x in Path(cgroup, "cgroup.procs").read_text().split()]
    orphan_the_child(box)
    _, result = box.agent({"op": "cleanup", "playbook": "smoke", "env": gpu_env})
    assert result["ok"] is True, result
    assert wait_until(lambda: not alive(child_pid(box)))
    assert result["gpu"]["released"] is True, result["gpu"]
    assert not Path(cgroup).exists()


def hide_proc_prefix() -> list[str]:
    """The argv prefix that runs the agent with an empty /proc, or skip naming why."""
    if not shutil.which("unshare"):
        pytest.skip("unshare(1) is not installed: cannot hide /proc from the agent")
    probe = subprocess.run([*HIDE_PROC, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount over /proc in a private mount namespace here: "
                    f"{probe.stderr.strip()}")
    return list(HIDE_PROC)


def test_deploy_with_proc_hidden_starts_nothing(box: Box) -> None:
    prefix = hide_proc_prefix()
    marker = box.tmp / "started"
    req = {"op": "deploy", "playbook": "smoke", "run_id": R1, "lock_timeout": 2,
           "processes": [{"name": "svc", "argv": ["sh", "-c", f"touch {marker}; sleep 60"],
                          "ready": None}]}
    _, result = box.agent(req, prefix=prefix)
    assert result["ok"] is False and result["error"]["kind"] == "proc", result
    assert "cannot prove which processes are its own" in result["error"]["message"]
    assert not (box.workdir / "runs" / R1).exists()
    assert not marker.exists()


def test_cleanup_with_proc_hidden_says_it_proved_nothing(box: Box) -> None:
    prefix = hide_proc_prefix()
    _, result = box.deploy([{"name": "svc", "argv": ["sleep", "60"], "ready": None}])
    assert result["ok"] is True, result
    pid = result["processes"][0]["pid"]
    events, result = box.agent({"op": "cleanup", "playbook": "smoke"}, prefix=prefix)
    assert result["ok"] is False and result["error"]["kind"] == "proc", result
    assert "cleanup stopped nothing" in result["error"]["message"]
    assert alive(pid)
    # nor does it tell the workstation's journal that the run is gone
    assert [ev for ev in events if ev["event"] == "runs"] == []
    _, status = box.agent({"op": "status", "playbook": "smoke"}, prefix=prefix)
    assert status["ok"] is False and status["error"]["kind"] == "proc", status


# The agent, with the /proc entries of its own children made unreadable: what a box that hides
# other processes' /proc entries (but not the agent's own) shows it right after a launch.
CHILD_STAT_HIDDEN = f"""
import os, sys
sys.path.insert(0, {str(AGENT.parent)!r})  # remote/: the agent package imports as `agent`
os.environ["OUTRIG_REQUEST"] = sys.argv[-1]  # the harness's argv path puts the request last
import agent.__main__, agent.procs
real = agent.procs.read_stat
def read_stat(pid):
    st = real(pid)
    return None if st is not None and st.ppid == os.getpid() else st
for name, module in list(sys.modules.items()):
    if name.startswith("agent.") and hasattr(module, "read_stat"):
        module.read_stat = read_stat
agent.__main__.main()
"""


def test_launch_whose_proc_entry_is_unreadable_is_killed_not_left_running(box: Box) -> None:
    req = {"op": "deploy", "playbook": "smoke", "run_id": R1, "lock_timeout": 2,
           "processes": [{"name": "svc", "argv": ["sleep", "60"], "ready": None}]}
    _, result = box.agent(req, prefix=[PY, "-c", CHILD_STAT_HIDDEN, "--"])
    assert result["ok"] is False and result["error"]["kind"] == "proc", result
    assert "was killed at once" in result["error"]["message"]
    assert marked(R1) == []  # neither the wrapper nor its command lives on


def test_cgroup_of_a_process_that_ended_by_itself_is_removed(box: Box) -> None:
    _, result = box.deploy([{"name": "once", "argv": [PY, "-c", "print('done')"],
                             "ready": {"exit": True, "timeout": 30}}])
    assert result["ok"] is True, result
    cgroup = result["processes"][0]["cgroup"]
    if cgroup is None:
        pytest.skip("this machine does not let the agent create a cgroup v2 folder")
    assert wait_until(lambda: not Path(cgroup).exists())


# ------------------------------------------------- vLLM's DP supervisor: ranks in their own groups
FAKE_VLLM = Path(__file__).resolve().parents[1] / "standins" / "fake_vllm.py"


def session_members(sid: int) -> dict[int, tuple[int, str]]:
    """{pid: (pgid, comm)} of the live processes in session ``sid``, but its leader."""
    out: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != sid:
            st = stat_fields(int(entry))
            if st is not None and st[2] == sid and st[0] not in ("Z", "X"):
                with contextlib.suppress(OSError):
                    out[int(entry)] = (st[1], Path(f"/proc/{entry}/comm").read_text().strip())
    return out


def test_dp_supervisors_setpgrp_api_servers_are_found_and_stopped(
        box: Box, gpu_env: dict[str, str]) -> None:
    # vLLM --data-parallel-multi-port-external-lb: the launched process supervises one API
    # server per local DP rank, each of which calls os.setpgrp() and renames itself (no marker
    # left). The supervisor dies by SIGKILL; the ranks and their engines live on, outside the
    # leader's group, holding GPUs 0 and 1. No cgroup here: what proves them the run's is
    # the session they never left (and the record of the deploy's looks).
    env = no_cgroups(gpu_env)
    port, sup = free_port(), free_port()
    _, result = box.deploy([{"name": "server", "gpus": [0, 1], "stop_grace": 3,
                             "argv": [PY, str(FAKE_VLLM), "serve", "m",
                                      "--data-parallel-multi-port-external-lb",
                                      "--data-parallel-size", "2",
                                      "--data-parallel-size-local", "2", "--port", str(port),
                                      "--data-parallel-supervisor-port", str(sup),
                                      "--fake-mib", "4096"],
                             "ready": {"http": f"http://127.0.0.1:{sup}/health",
                                       "timeout": 90}}], env=env)
    assert result["ok"] is True, result
    leader = box.run_json()["processes"][0]["pid"]
    members = session_members(leader)
    for pid in members:
        box.track(pid)
    servers = [p for p, (_, comm) in members.items() if comm.startswith("VLLM::APIServer")]
    engines = [p for p, (_, comm) in members.items() if comm.startswith("VLLM::EngineCor")]
    assert len(servers) == 2 and len(engines) == 2, members
    assert all(members[p][0] == p for p in servers)  # each leads a group of its own
    assert not set(servers + engines) & set(marked(R1))  # renamed: the marker is gone
    _, status = box.agent({"op": "status", "playbook": "smoke", "env": env})
    proofs = {n["pid"]: n["proof"] for n in status["runs"][0]["processes"][0]["tree"]}
    assert all(proofs.get(p) == "session" for p in servers + engines), proofs
    supervisor = next(p for p, (pgid, _) in members.items()
                      if pgid == leader and stat_fields(p) is not None)
    os.kill(supervisor, 9)
    assert wait_until(lambda: not alive(leader), timeout=30)  # the wrapper ends with it
    assert all(alive(p) for p in servers + engines)  # a group kill would not reach them
    _, status = box.agent({"op": "status", "playbook": "smoke", "env": env})
    proofs = {n["pid"]: n["proof"] for n in status["runs"][0]["processes"][0]["tree"]}
    # still the session: its members started while the leader lived (its exit file says until
    # when), and were recorded as the run's by the deploy's looks
    assert all(proofs.get(p) == "session" for p in servers + engines), proofs
    _, result = box.agent({"op": "cleanup", "playbook": "smoke", "env": env})
    assert result["ok"] is True, result
    assert wait_until(lambda: not any(alive(p) for p in servers + engines), timeout=20)
    assert result["gpu"]["released"] is True, result["gpu"]
    assert result["runs"][0]["processes"][0]["stragglers"] >= 4
