"""/proc: the box's boot id, the one /proc/PID/stat parser, process scans and markers."""

from __future__ import annotations

import os
from typing import Iterator, NamedTuple, Optional, Set, Tuple

from .constants import MARKER_KEY, PROCESS_KEY
from .events import AgentError


def boot_id() -> str:
    """This boot's id: pids and start ticks only mean something on the same boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


class ProcStat(NamedTuple):
    """The fields of /proc/PID/stat that ownership decisions need."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    start_ticks: int
    state: str

    def live(self) -> bool:
        """Zombies still have a stat file but are not running (PID 1 may never reap them)."""
        return self.state not in ("Z", "X", "x")


def read_stat(pid: int) -> Optional[ProcStat]:
    """Parse /proc/PID/stat. comm may hold spaces and ')', so split after the last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        rest = data[data.rindex(b")") + 2 :].split()
        return ProcStat(
            pid=pid,
            ppid=int(rest[1]),
            pgid=int(rest[2]),
            sid=int(rest[3]),
            start_ticks=int(rest[19]),  # field 22 overall; rest starts at field 3
            state=rest[0].decode("ascii", errors="replace"),
        )
    except (ValueError, IndexError):
        return None


def now_ticks() -> Optional[int]:
    """Clock ticks since boot now (the unit of a process's start time), from /proc/uptime; None
    when it is unreadable. Read it *before* looking at a process: a process seen alive after
    this reading was alive at this tick."""
    try:
        with open("/proc/uptime", encoding="ascii") as f:
            seconds = float(f.read().split()[0])
        return int(seconds * os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def pid_live(pid: int) -> bool:
    """The pid exists and is not a zombie."""
    st = read_stat(pid)
    return st is not None and st.live()


def scan_procs() -> Iterator[ProcStat]:
    """Every process visible in /proc (vanished ones are skipped)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit():
            st = read_stat(int(name))
            if st is not None:
                yield st


def read_markers(pid: int) -> Tuple[Optional[str], Optional[str]]:
    """(OUTRIG_RUN, OUTRIG_PROCESS) from /proc/PID/environ; unreadable → (None, None)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None, None
    run: Optional[str] = None
    proc: Optional[str] = None
    run_prefix = (MARKER_KEY + "=").encode()
    proc_prefix = (PROCESS_KEY + "=").encode()
    for entry in data.split(b"\0"):
        if entry.startswith(run_prefix):
            run = entry[len(run_prefix) :].decode("utf-8", errors="replace")
        elif entry.startswith(proc_prefix):
            proc = entry[len(proc_prefix) :].decode("utf-8", errors="replace")
    return run, proc


def own_lineage() -> Set[int]:
    """The agent and all its ancestors: never signalled, whatever their environment says."""
    out = {0, 1, os.getpid()}
    pid = os.getppid()
    while pid > 1 and pid not in out:
        out.add(pid)
        st = read_stat(pid)
        if st is None:
            break
        pid = st.ppid
    return out


def proc_problem() -> Optional[str]:
    """Why /proc cannot prove ownership here (hidden or not mounted), or None when it can.

    Every ownership rule reads /proc (stat for pid, group, session and start time; environ for
    the markers). If the agent cannot read its own entries it cannot read its children's
    either, and must neither start what it could not stop nor call anything stopped."""
    pid = os.getpid()
    if read_stat(pid) is None:
        return f"/proc/{pid}/stat (the agent's own) is unreadable: /proc is hidden or not mounted"
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            f.read(1)
    except OSError as exc:
        return f"/proc/{pid}/environ (the agent's own) is unreadable ({exc.strerror})"
    return None


def require_proc(doing: str) -> None:
    """Raise a ``proc`` error (saying what was not done) when /proc cannot prove ownership."""
    problem = proc_problem()
    if problem is not None:
        raise AgentError(
            "proc", f"{problem}, so outrig cannot prove which processes are its own and "
            f"{doing}. Run the agent where /proc is mounted and shows this user's processes "
            "(hidepid= must not hide them from it), then run the command again")
