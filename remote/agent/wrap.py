"""outrig process wrapper (written by the outrig agent; do not edit).

Usage: python3 wrap.py EXIT_FILE -- ARGV...
Runs ARGV as a child in this process group, forwards SIGTERM, SIGINT and SIGHUP to it, waits,
then writes EXIT_FILE atomically as {"code": int|null, "signal": int|null, "ended": unix_time,
"pid": its own pid, "alive_ticks": clock ticks since boot, read while it still lived} and exits
with the child's code (128+N when the child died of signal N). ``alive_ticks`` bounds which
members of its session started while it lived (cleanup's session rule, docs/cleanup.md).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, Optional


def alive_ticks() -> Optional[int]:
    """Clock ticks since boot now, the unit of /proc/PID/stat's start time (None: unreadable)."""
    try:
        with open("/proc/uptime", encoding="ascii") as f:
            return int(float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def write_exit(path: str, code: Optional[int], sig: Optional[int]) -> None:
    data = json.dumps({"code": code, "signal": sig, "ended": time.time(), "pid": os.getpid(),
                       "alive_ticks": alive_ticks()}).encode()
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def leave_cgroup(procs_file: str) -> None:
    """Move back to the parent cgroup and remove this process's own one if nothing is left in
    it; a descendant still there keeps it (and is found there by cleanup)."""
    folder = os.path.dirname(procs_file)
    try:
        with open(os.path.join(os.path.dirname(folder), "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        os.rmdir(folder)
    except OSError:
        pass


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.stderr.write("usage: wrap.py EXIT_FILE -- ARGV...\n")
        return 2
    exit_file = sys.argv[1]
    argv = sys.argv[3:]
    state: Dict[str, Any] = {"child": None, "pending": []}

    def forward(signum: int, frame: Any) -> None:
        child = state["child"]
        if child is None:
            state["pending"].append(signum)
        elif child.returncode is None:
            try:
                os.kill(child.pid, signum)
            except OSError:
                pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    # Join the process's own cgroup before starting anything: every descendant is then found
    # there, whatever it does to its session or environment. Best effort (the agent checks).
    procs_file = os.environ.pop("OUTRIG_CGROUP_PROCS", None)
    if procs_file:
        try:
            with open(procs_file, "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            pass
    try:
        child = subprocess.Popen(argv)
    except (OSError, ValueError) as exc:
        sys.stdout.write(f"outrig: cannot execute {argv[0]!r}: {exc}\n")
        sys.stdout.flush()
        write_exit(exit_file, 127, None)
        if procs_file:
            leave_cgroup(procs_file)
        return 127
    state["child"] = child
    for signum in state["pending"]:
        forward(signum, None)
    rc = child.wait()
    if procs_file:
        leave_cgroup(procs_file)
    if rc < 0:
        write_exit(exit_file, None, -rc)
        return 128 - rc
    write_exit(exit_file, rc, None)
    return rc


if __name__ == "__main__":
    sys.exit(main())
