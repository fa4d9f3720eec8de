"""Deploy's checks before it launches anything: requested GPUs exist, are healthy and are
free, readiness ports are not taken by foreign processes."""

from __future__ import annotations

import contextlib
import os
import urllib.parse
from typing import List, Optional, Set

from .constants import JSONDict
from .events import AgentError
from .gpu_judge import judge_facts, refusals, summary
from .gpus import Owners, describe_pid, holder_line
from .layout import Layout
from .probes import probe_port
from .procs import scan_procs
from .stopping import Stopper
from .validation import ProcSpec

LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1", "[::1]")


def ready_ports(spec: ProcSpec) -> List[int]:
    """Local ports a process will listen on, as its readiness check names them."""
    ports: List[int] = []
    ready = spec.ready
    if ready is None:
        return ports
    if ready.port is not None:
        ports.append(ready.port)
    if ready.http is not None:
        parts = urllib.parse.urlsplit(ready.http)
        if (parts.hostname or "") in LOCAL_HOSTS:
            ports.append(parts.port or (443 if parts.scheme == "https" else 80))
    return ports


def listening_pids(port: int) -> List[int]:
    """Pids with a socket listening on ``port`` (from /proc/net/tcp{,6} and /proc/*/fd)."""
    inodes: Set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    wanted = {f"socket:[{inode}]" for inode in inodes}
    pids: List[int] = []
    for st in scan_procs():
        fd_dir = f"/proc/{st.pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(os.path.join(fd_dir, fd)) in wanted:
                    pids.append(st.pid)
                    break
    return sorted(pids)


def check_ports_free(layout: Layout, procs: List[ProcSpec], previous: Optional[str],
                     stopper: Stopper, host_label: str) -> None:
    """``port_busy`` when a port a process will serve on is already taken by anything but the
    run being replaced: its readiness check would otherwise talk to the stale server."""
    owners: Optional[Owners] = None
    for spec in procs:
        for port in ready_ports(spec):
            if not probe_port(port):
                continue
            pids = listening_pids(port)
            if owners is None:
                owners = Owners(layout, stopper)
            others = [pid for pid in pids
                      if previous is None or (owners.owner(pid) or {}).get("run_id") != previous]
            if pids and not others:
                continue  # the run this deploy replaces holds it; it is stopped first
            who = "; ".join(
                f"pid {pid} ({info.get('user') or '?'}, "
                f"{str(info.get('cmdline') or info.get('comm') or '?')[:120]})"
                for pid, info in ((pid, describe_pid(pid)) for pid in others)
            ) or "a process this user cannot see"
            fix = (f"outrig cleanup --host {host_label} --force-foreign "
                   + " ".join(str(pid) for pid in others)) if others else "stop it"
            raise AgentError(
                "port_busy",
                f"port {port}, where {spec.name} is to answer, is already taken by {who}; its "
                "readiness check would talk to that process instead. Nothing was stopped or "
                f"started. Free the port ({fix}) or give {spec.name} another port.",
                spec.name,
            )


def check_gpus(procs: List[ProcSpec], gpus: List[JSONDict]) -> None:
    """Every GPU index a process names must exist (only when the box reports GPUs)."""
    if not gpus:
        return
    have = sorted(g["index"] for g in gpus)
    if have == list(range(have[0], have[-1] + 1)):
        span = f"{have[0]}-{have[-1]}" if len(have) > 1 else str(have[0])
    else:
        span = ",".join(str(i) for i in have)
    for p in procs:
        for idx in p.gpus:
            if idx not in have:
                raise AgentError(
                    "gpu",
                    f"process {p.name} wants GPU {idx} but the box has {len(have)} ({span});"
                    " nothing was stopped or started. Use GPUs that exist there (or a playbook"
                    " of the same family made for this box)",
                    p.name,
                )


def check_gpus_free(audit: JSONDict, needed: Set[int], previous: Optional[str],
                    host_label: str) -> None:
    """``gpu_busy`` when a GPU the deploy needs is held by anything but ``previous``."""
    blockers = [
        h for h in audit["holders"]
        if h.get("gpu_index") in needed
        and not (h.get("owner") and h["owner"]["run_id"] == previous)
    ]
    if not blockers:
        return
    foreign = sorted({h["pid"] for h in blockers if not h.get("owner")})
    other_runs = sorted({h["owner"]["run_id"] for h in blockers if h.get("owner")})
    fixes = []
    if other_runs:
        fixes += [f"outrig cleanup --host {host_label} --run {rid}" for rid in other_runs]
    if foreign:
        fixes.append(f"outrig cleanup --host {host_label} --force-foreign "
                     + " ".join(str(p) for p in foreign)
                     + "  (only if you are sure they may die)")
    raise AgentError(
        "gpu_busy",
        f"GPU(s) {', '.join(str(i) for i in sorted(needed))} needed by this deploy are held by "
        f"{len(blockers)} other process(es): " + "; ".join(holder_line(h) for h in blockers)
        + ". Nothing was stopped or started. To free them: " + " ; ".join(fixes)
        + ", or give this playbook other GPUs.",
    )


def check_gpus_readable(procs: List[ProcSpec], facts: JSONDict, allow: bool) -> None:
    """``gpu_unhealthy`` when a process is given GPUs and the box's nvidia-smi is there but
    cannot read them (``could not communicate with the NVIDIA driver``, exit 9, or a hang):
    a driver that fails is no better than a GPU that reports errors, and the processes would
    start on GPUs nobody could see. ``--allow-unhealthy-gpu`` places them anyway."""
    if allow or not facts.get("gpu_unreadable"):
        return
    users = [p.name for p in procs if p.gpus]
    if not users:
        return
    raise AgentError(
        "gpu_unhealthy",
        f"the box's GPUs cannot be read ({facts.get('gpu_error') or 'nvidia-smi failed'}), so "
        f"whether GPU(s) {', '.join(str(g) for g in sorted({g for p in procs for g in p.gpus}))}"
        f" (given to {', '.join(users)}) exist, are free and are healthy is unknown. Nothing "
        "was stopped or started. Look at the driver (nvidia-smi on the box; a reboot often "
        "brings it back; on a rented box: ask the provider for another box), or deploy with "
        "--allow-unhealthy-gpu to start the processes anyway.",
        users[0])


def check_gpus_healthy(procs: List[ProcSpec], facts: JSONDict, allow: bool) -> None:
    """``gpu_unhealthy`` when a GPU a process is given is ``bad`` (gpu_judge.py: uncorrectable
    ECC errors, a pending or failed row remap, a fatal Xid), unless the request allows it
    (``--allow-unhealthy-gpu``). Checked before the workdir lock, on the facts deploy has
    read anyway: nothing was stopped, written or started when it refuses."""
    if allow:
        return
    needed = sorted({g for p in procs for g in p.gpus})
    bad = refusals(judge_facts(facts), needed)
    if not bad:
        return
    users = {v["index"]: [p.name for p in procs if v["index"] in p.gpus] for v in bad}
    raise AgentError(
        "gpu_unhealthy",
        "; ".join(f"{summary(v)} (given to {', '.join(users[v['index']])})" for v in bad)
        + ". Nothing was stopped or started. Give the processes other GPUs, take another "
        "box, or deploy with --allow-unhealthy-gpu to use it anyway.",
        users[bad[0]["index"]][0] if users[bad[0]["index"]] else None,
    )
