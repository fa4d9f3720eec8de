"""The sandbox box dies or hangs like a rented one (``sandbox-down --crash``, ``sandbox-hang``).

A rented box that dies takes everything with it at once: its sshd, every process it ran, no
clean shutdown, and nothing tells the workstation (its host file stays where it was). A box
whose job hangs keeps answering while the job's processes do nothing. Both are made here from
records only, never by looking processes up by name:

* :func:`crash` SIGKILLs, all at once, the sandbox's server and sshd (the pids and groups
  ``sandbox-up`` recorded, each checked by its start time), the sshd's sessions, and every
  process of every outrig run on the box (the groups its run records name, while their
  leader is still the recorded process, and the processes the box recorded as each run's
  with pid and start time). The host file and the box's folder stay; the state says
  ``crashed``. ``sandbox-down`` removes them, ``sandbox-up`` starts a fresh box.
* :func:`hang` sends SIGSTOP (``resume``: SIGCONT) to the same processes of the box's runs:
  the box answers, the job does nothing, as a job stuck in a collective or a wedged engine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

from outrig.errors import ConfigError
from outrig.journal import atomic_write_json
from outrig.sandbox.box import children_of
from outrig.sandbox.service import (
    STATE_FILE,
    is_recorded_process,
    is_up,
    read_state,
    run_processes,
    sandbox_root,
)


def _up_state(name: str, what: str) -> dict[str, Any]:
    state = read_state(name)
    if state is None or not is_up(state):
        named = "" if name == "sandbox" else f" --name {name}"
        raise ConfigError(f"sandbox {name} is not up, so there is nothing to {what}; start "
                          f"it with `outrig sandbox-up{named}` and deploy a run on it first")
    return state


def _signal(target: int, group: bool, signum: int) -> bool:
    try:
        (os.killpg if group else os.kill)(target, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def crash(name: str) -> dict[str, Any]:
    """Kill sandbox ``name`` like a power cut (module docstring); what was killed."""
    state = _up_state(name, "crash")
    root = sandbox_root(name)
    killed: list[int] = []
    live = [e for e in (state.get("server") or {}, state.get("sshd") or {})
            if is_recorded_process(e)]
    sessions = [pid for e in live for pid in children_of(int(e["pid"]))]
    for entry in live:  # all at once: no process here gets to clean up after another
        _signal(int(entry["pgid"]), True, signal.SIGKILL)
        killed.append(int(entry["pid"]))
    for pid in sessions:  # sshd's connections, in sessions of their own
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    runs = kill_runs(root / "box" / "workdir")
    atomic_write_json(root / STATE_FILE, {**state, "crashed": time.time()})
    return {"name": name, "host_file": state.get("host_file"), "killed": killed,
            "runs": runs, "port": state.get("port")}


def kill_runs(workdir: Path) -> list[str]:
    """SIGKILL every live process of every run recorded under ``workdir`` at once (what a
    dead box does to them); the run ids that had one."""
    runs: set[str] = set()
    for run_id, target, group in list(run_processes(workdir)):
        if _signal(target, group, signal.SIGKILL):
            runs.add(run_id)
    return sorted(runs)


def hang(name: str, *, resume: bool = False) -> dict[str, Any]:
    """SIGSTOP (``resume``: SIGCONT) every process of the box's runs; the run ids touched."""
    state = _up_state(name, "resume" if resume else "hang")
    signum = signal.SIGCONT if resume else signal.SIGSTOP
    runs: set[str] = set()
    for run_id, target, group in list(run_processes(sandbox_root(name) / "box" / "workdir")):
        if _signal(target, group, signum):
            runs.add(run_id)
    return {"name": name, "host_file": state.get("host_file"), "runs": sorted(runs),
            "resumed": resume}
