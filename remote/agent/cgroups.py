"""Cgroups: one cgroup v2 folder per launched process where the box allows it, so cleanup finds
(and ``cgroup.kill`` kills) every descendant whatever it does to its session or environment."""

from __future__ import annotations

import contextlib
import os
from typing import List, Optional, Set

from .constants import CGROUP_SWITCH, NAME_RE, JSONDict

#
# Where the box allows it (cgroup v2, a writable cgroup folder for this user), each process
# is started in a cgroup of its own, ``outrig+<run>+<process>``, next to the agent's: every
# descendant is in it whatever it does to its session, group or environment, so cleanup finds
# (and cgroup.kill kills) them all. Elsewhere the record says ``cgroup: null`` and the other
# rules (group, session, marker, descendants seen) apply.


def cgroup_base() -> Optional[str]:
    """The agent's own cgroup v2 folder if this user may create cgroups in it, else None."""
    if os.environ.get(CGROUP_SWITCH, "1").strip() == "0":
        return None
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            own = next((ln.strip()[3:] for ln in f if ln.startswith("0::")), None)
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            mounts = [ln.split() for ln in f]
    except OSError:
        return None
    if own is None:
        return None
    for fields in mounts:
        if "-" not in fields:
            continue
        tail = fields[fields.index("-") + 1:]
        if not tail or tail[0] != "cgroup2":
            continue
        root, point = fields[3], fields[4]
        if root != "/" and not own.startswith(root):
            continue
        rel = own[len(root):] if root != "/" else own
        base = os.path.join(point, rel.lstrip("/"))
        if os.path.isdir(base) and os.access(base, os.W_OK):
            return base
    return None


def cgroup_name(run_id: str, name: str) -> str:
    """The folder name of a process's cgroup (checked again before it is ever used).

    ``+`` is in no run id or process name, so the run's prefix is unambiguous."""
    return f"outrig+{run_id}+{name}"


def run_cgroups(run_id: str) -> List[str]:
    """Every cgroup of a run next to the agent's (found without run.json: a corrupt one)."""
    base = cgroup_base()
    try:
        names = os.listdir(base) if base is not None else []
    except OSError:
        return []
    prefix = cgroup_name(run_id, "")
    return [os.path.join(base or "", n) for n in sorted(names)
            if n.startswith(prefix) and NAME_RE.match(n[len(prefix):])]


def make_cgroup(run_id: str, name: str) -> Optional[str]:
    """Create the process's cgroup; None where the box does not allow it."""
    base = cgroup_base()
    if base is None:
        return None
    path = os.path.join(base, cgroup_name(run_id, name))
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except OSError:
        return None
    return path


def record_cgroup(run_id: str, rec: JSONDict) -> Optional[str]:
    """The cgroup a record names, only if it is the one outrig would have made for it."""
    path = rec.get("cgroup")
    if not isinstance(path, str) or os.path.basename(path) != cgroup_name(run_id, rec["name"]):
        return None
    return path if os.path.isdir(path) else None


def cgroup_pids(path: str) -> Set[int]:
    """The pids in a cgroup now (empty when it is gone or unreadable)."""
    try:
        with open(os.path.join(path, "cgroup.procs"), encoding="ascii") as f:
            return {int(x) for x in f.read().split() if x.isdigit()}
    except OSError:
        return set()


def cgroup_kill(path: str) -> bool:
    """SIGKILL everything in the cgroup at once (cgroup.kill, Linux 5.14+); False if absent."""
    try:
        with open(os.path.join(path, "cgroup.kill"), "w", encoding="ascii") as f:
            f.write("1")
    except OSError:
        return False
    return True


def remove_cgroup(path: str) -> None:
    """Remove an emptied cgroup (best effort: it may still hold a process stuck in D)."""
    with contextlib.suppress(OSError):
        os.rmdir(path)
