"""Stopping: the :class:`Stopper` that ends a run's processes by the ownership rules
(group, session, cgroup, marker, recorded descendants) and records how each ended."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from .cgroups import cgroup_kill, cgroup_pids, record_cgroup, remove_cgroup, run_cgroups
from .constants import (
    CGROUP_SWEEP_NAME,
    CHILDREN_FIRST_LAUNCHER_S,
    DEFAULT_STOP_GRACE,
    DESCENDANTS_FILE,
    KILL_WAIT_S,
    POLL_S,
    STOP_HEARTBEAT_S,
    SWEEP_NAME,
    JSONDict,
)
from .events import Emitter
from .layout import Layout, clear_pointers, read_json, write_json_atomic
from .probes import read_exit_file
from .procs import (
    ProcStat,
    boot_id,
    now_ticks,
    own_lineage,
    pid_live,
    read_markers,
    read_stat,
    scan_procs,
)
from .validation import _is_num


class Stopper:
    """Stops runs exactly as the protocol says, signalling only what is proven ours.

    ``popens`` are children of this agent (launched in this call): they are polled while
    waiting so they do not linger as zombies.
    """

    def __init__(self, out: Emitter, popens: Optional[Dict[int, subprocess.Popen[bytes]]] = None,
                 layout: Optional[Layout] = None):
        self.out = out
        self.popens = popens if popens is not None else {}
        self.layout = layout  # where descendants seen are recorded (None: kept in memory)
        # run id -> {(pid, start ticks): process name}: every process proven ours so far,
        # so one that later leaves its parent, group and session is still known.
        self.seen: Dict[str, Dict[Tuple[int, int], str]] = {}
        self.protected = own_lineage()
        self.boot = boot_id()
        self.marker_cache: Dict[Tuple[int, int], Tuple[Optional[str], Optional[str]]] = {}
        # (leader pid, start ticks) -> the latest clock tick at which it was seen alive
        self.alive_at: Dict[Tuple[int, int], int] = {}
        # What a stop could not write (a full disk must never keep it from killing).
        self.unrecorded: List[str] = []
        own_pgid = os.getpgid(0)
        self.protected_groups = {own_pgid}
        for pid in self.protected:
            st = read_stat(pid)
            if st is not None:
                self.protected_groups.add(st.pgid)

    # -- small helpers

    def reap(self) -> None:
        """Collect exited children of this agent (never blocks)."""
        for popen in self.popens.values():
            popen.poll()

    def markers(self, st: ProcStat) -> Tuple[Optional[str], Optional[str]]:
        """Markers of a process, cached per (pid, start ticks): environ is read once."""
        key = (st.pid, st.start_ticks)
        if key not in self.marker_cache:
            self.marker_cache[key] = read_markers(st.pid)
        return self.marker_cache[key]

    def kill(self, pid: int, sig: int) -> None:
        """Signal one proven-ours pid; vanished pids and permission errors are ignored."""
        if pid in self.protected or pid <= 1:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)

    def killpg(self, pgid: int, sig: int) -> None:
        """Signal a proven-ours group, unless the agent or an ancestor is in it."""
        if pgid <= 1 or pgid in self.protected_groups:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def leader_state(self, rec: JSONDict) -> str:
        """``alive`` (ticks match), ``reused`` (pid is someone else's) or ``gone``."""
        if rec.get("boot_id") and rec.get("boot_id") != self.boot:
            return "gone"
        now = now_ticks()  # read before the look: alive at the look means alive at this tick
        st = read_stat(rec["pid"])
        if st is None:
            return "gone"
        if st.start_ticks != rec["start_ticks"]:
            return "reused"
        if not st.live():
            return "gone"
        if now is not None:
            key = (st.pid, st.start_ticks)
            self.alive_at[key] = max(self.alive_at.get(key, now), now)
        return "alive"

    def alive_until(self, rec: JSONDict) -> int:
        """The latest clock tick (since boot) at which the record's leader is known to have been
        alive: its start, a look of this stopper, or the ``alive_ticks`` its wrapper wrote into
        its exit file as it ended (the wrapper reads the clock while it still lives)."""
        pid: int = rec["pid"]
        start: int = rec["start_ticks"]
        best = max(start, self.alive_at.get((pid, start), 0))
        path = rec.get("exit_file")
        data: Any = None
        if isinstance(path, str):
            with contextlib.suppress(OSError, ValueError):
                data = read_json(path)
        if isinstance(data, dict) and data.get("pid") == pid:
            ticks = data.get("alive_ticks")
            if isinstance(ticks, int) and not isinstance(ticks, bool):
                best = max(best, ticks)
        return best

    def session_is_the_leaders(self, run_id: str, rec: JSONDict, leader: str,
                               procs: Dict[int, ProcStat]) -> bool:
        """Whether a process group or session whose id is the leader's pid is still the one the
        leader made, so that its members are ours.

        While the leader lives, yes: Linux never hands out a pid that is some live group's or
        session's id, so nobody else can make one with it. Once the leader is gone its pid is
        free as soon as its group and session are empty, and a stranger that gets the pid and
        calls setsid() makes a new session (and group) with the same id. The id then still
        means the leader's only when a live member provably joined while the leader lived:
        one in the session (the session id cannot be joined, only inherited at fork) that
        started after the leader and before the last tick the leader was known alive
        (:meth:`alive_until`), or one recorded as the run's before (``seen``). That member has
        kept the pid in use since the leader lived, so the pid was never free to be reused.
        So does the leader's own zombie, where nothing reaps it (a container whose PID 1 does
        not reap)."""
        if leader == "alive":
            return True
        if leader != "gone":
            return False
        pid = rec["pid"]
        ticks = rec["start_ticks"]
        st = read_stat(pid)
        if st is not None and st.start_ticks == ticks:
            return True  # the leader's zombie (nobody reaped it) still holds the pid
        until = self.alive_until(rec)
        seen = self.seen_of(run_id)
        return any(
            st.sid == pid and st.pid != pid and st.start_ticks >= ticks
            and (st.start_ticks < until or (st.pid, st.start_ticks) in seen)
            for st in procs.values())

    def members(self, run_id: str, rec: JSONDict, leader: str) -> Set[int]:
        """Live processes of this record other than its leader, by the ownership rules (see
        :meth:`member_proofs`, which also says which rule found each)."""
        return set(self.member_proofs(run_id, rec, leader))

    def live_procs(self) -> Dict[int, ProcStat]:
        """One scan of /proc: every live process but the agent and its ancestors."""
        return {st.pid: st for st in scan_procs() if st.pid not in self.protected and st.live()}

    def member_proofs(self, run_id: str, rec: JSONDict, leader: str,
                      procs: Optional[Dict[int, ProcStat]] = None) -> Dict[int, str]:
        """{pid: the rule that proves it ours} for the record's live processes but its leader.

        Ours: in the leader's ``group`` or ``session`` (started after it, while that group or
        session is provably still the leader's: :meth:`session_is_the_leaders`), carrying its
        ``marker``, in its ``cgroup``, ``seen`` as ours before with the same pid and start
        time, or a ``child`` of a process already proven ours (a setsid child that cleared its
        environment). What is found is recorded, so it stays ours after its parent is gone.

        The marker is the weakest: vLLM renames its engine and workers with setproctitle,
        which overwrites the memory /proc/PID/environ shows, so they carry none once renamed
        (docs/cleanup.md). Every contact records what the other rules find, so a process seen
        once in the run's session stays provably ours after it leaves it."""
        pid = rec["pid"]
        ticks = rec["start_ticks"]
        same_boot = not rec.get("boot_id") or rec.get("boot_id") == self.boot
        if procs is None:
            procs = self.live_procs()
        out: Dict[int, str] = {}
        leaders = same_boot and self.session_is_the_leaders(run_id, rec, leader, procs)
        for st in procs.values():
            if st.pid == pid:
                continue
            if leaders and st.start_ticks >= ticks and (st.pgid == pid or st.sid == pid):
                out[st.pid] = "group" if st.pgid == pid else "session"
                continue
            run, name = self.markers(st)
            if run == run_id and name == rec["name"]:
                out[st.pid] = "marker"
        cgroup = record_cgroup(run_id, rec) if same_boot else None
        if cgroup is not None:
            for p in cgroup_pids(cgroup):
                if p in procs and p != pid:
                    out.setdefault(p, "cgroup")
        for (p, t), name in self.seen_of(run_id).items():
            if name == rec["name"] and p in procs and procs[p].start_ticks == t and p != pid:
                out.setdefault(p, "seen")
        roots = set(out) | ({pid} if leader == "alive" else set())
        for p in self.descendants(roots, procs) - {pid}:
            out.setdefault(p, "child")
        self.remember(run_id, rec["name"], {procs[p] for p in out if p in procs})
        return out

    def census(self, run_id: str, records: List[JSONDict]) -> int:
        """Record every live process of the run's records (pid + start time, this boot) as
        seen; returns how many there are. Called at every contact with a run, from the
        deploy's first look on: a process recorded here is ours later whatever it does to its
        session, group or environment."""
        count = 0
        procs = self.live_procs()  # one scan for every record
        for rec in records:
            if not valid_record(rec):
                continue
            state = self.leader_state(rec)
            if state != "reused":
                count += len(self.member_proofs(run_id, rec, state, procs))
        return count

    @staticmethod
    def descendants(roots: Set[int], procs: Dict[int, ProcStat]) -> Set[int]:
        """Every live process whose parent chain reaches one of ``roots`` (proven ours)."""
        children: Dict[int, List[int]] = {}
        for st in procs.values():
            children.setdefault(st.ppid, []).append(st.pid)
        found: Set[int] = set()
        todo = list(roots)
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in found and child not in roots:
                    found.add(child)
                    todo.append(child)
        return found

    def seen_path(self, run_id: str) -> Optional[str]:
        """runs/<id>/descendants.json, when this stopper knows the workdir."""
        if self.layout is None:
            return None
        return os.path.join(self.layout.run_dir(run_id), DESCENDANTS_FILE)

    def seen_of(self, run_id: str) -> Dict[Tuple[int, int], str]:
        """The processes of a run seen as ours before (this boot), loaded once per run."""
        if run_id not in self.seen:
            table: Dict[Tuple[int, int], str] = {}
            path = self.seen_path(run_id)
            data: Any = None
            if path is not None:
                with contextlib.suppress(OSError, ValueError):
                    data = read_json(path)
            if isinstance(data, dict) and data.get("boot_id") == self.boot:
                for item in data.get("processes") or []:
                    if (isinstance(item, dict) and isinstance(item.get("pid"), int)
                            and isinstance(item.get("start_ticks"), int)
                            and isinstance(item.get("process"), str)):
                        table[(item["pid"], item["start_ticks"])] = item["process"]
            self.seen[run_id] = table
        return self.seen[run_id]

    def remember(self, run_id: str, name: str, found: Set[ProcStat]) -> None:
        """Record processes proven ours by pid and start time (best effort on disk)."""
        table = self.seen_of(run_id)
        new = {(st.pid, st.start_ticks) for st in found} - set(table)
        if not new:
            return
        for key in new:
            table[key] = name
        path = self.seen_path(run_id)
        if path is None or not os.path.isdir(os.path.dirname(path)):
            return
        items = [{"pid": p, "start_ticks": t, "process": n} for (p, t), n in sorted(table.items())]
        try:
            write_json_atomic(path, {"boot_id": self.boot, "processes": items})
        except OSError as exc:
            self.unrecorded.append(f"the processes seen of run {run_id} in {path} "
                                   f"({exc.strerror or exc})")

    def marked(self, run_id: str) -> Set[int]:
        """Every live process carrying OUTRIG_RUN=run_id (not the agent or its ancestors)."""
        out: Set[int] = set()
        for st in scan_procs():
            if st.pid in self.protected or not st.live():
                continue
            if self.markers(st)[0] == run_id:
                out.add(st.pid)
        return out

    def leftovers(self, run_id: str) -> Set[int]:
        """What the sweep stops: the marked processes, and every process seen as the run's
        before (same pid and start time, this boot) that is still alive, whichever record it
        was seen under: a renamed vLLM child carries no marker any more."""
        out = self.marked(run_id)
        table = self.seen_of(run_id)
        if table:
            for st in scan_procs():
                if (st.pid not in self.protected and st.live()
                        and (st.pid, st.start_ticks) in table):
                    out.add(st.pid)
        return out

    # -- the procedure

    def stop_record(self, run_id: str, rec: JSONDict) -> JSONDict:
        """Stop one recorded process: TERM the leader, wait grace, KILL group/session/marked."""
        t0 = time.monotonic()
        pid: int = rec["pid"]
        grace_raw = rec.get("stop_grace")
        grace = DEFAULT_STOP_GRACE
        if isinstance(grace_raw, (int, float)) and grace_raw >= 0:
            grace = float(grace_raw)
        leader = self.leader_state(rec)
        how = "gone"
        stragglers: Set[int] = set()
        if leader == "reused":
            return self._stopped(run_id, rec["name"], "reused", t0, 0)
        killed_leader = False
        # Known before the leader is signalled: a child that left its session is reparented
        # when its parent exits, and is then found only because it was seen here.
        self.members(run_id, rec, leader)
        if leader == "alive" and rec.get("stop_children_first"):
            self.stop_children_first(run_id, rec, grace, t0)
        if leader == "alive":
            self.kill(pid, signal.SIGTERM)
            # A stopped process (SIGSTOP: a hung run, a debugger) acts on TERM only once it
            # runs again: its group goes on, so it saves and exits within its grace instead
            # of waiting the grace out to be killed (systemd sends SIGCONT after TERM too).
            self.killpg(pid, signal.SIGCONT)
            self.wait_grace(run_id, rec, grace, t0)
            if self.leader_state(rec) == "alive":
                how = "kill"
                killed_leader = True
                rest = self.members(run_id, rec, "alive")  # counted before killpg hides them
                stragglers |= rest
                self.kill_cgroup(run_id, rec)
                self.killpg(pid, signal.SIGKILL)
                self.kill(pid, signal.SIGKILL)
                for other in rest:
                    self.kill(other, signal.SIGKILL)
            else:
                how = "term"
        deadline = time.monotonic() + KILL_WAIT_S
        while True:
            self.reap()
            state = self.leader_state(rec)
            rest = self.members(run_id, rec, state)
            if not rest and state != "alive":
                break
            if time.monotonic() >= deadline:
                left = sorted(rest | ({pid} if state == "alive" else set()))
                self.out.warning(
                    f"{rec['name']} (run {run_id}): pids {left} still alive {KILL_WAIT_S:g} s"
                    " after SIGKILL (stuck in the kernel?)"
                )
                break
            how = "kill"
            self.kill_cgroup(run_id, rec)
            if state == "alive":
                killed_leader = True
                self.killpg(pid, signal.SIGKILL)
                self.kill(pid, signal.SIGKILL)
            for other in rest:
                self.kill(other, signal.SIGKILL)
            stragglers |= rest
            time.sleep(POLL_S)
        if killed_leader:
            self._note_killed(rec)
        cgroup = record_cgroup(run_id, rec)
        if cgroup is not None and not cgroup_pids(cgroup):
            remove_cgroup(cgroup)
        ended = exit_of(rec) if how == "gone" else {}
        return self._stopped(run_id, rec["name"], how, t0, len(stragglers), **ended)

    def wait_grace(self, run_id: str, rec: JSONDict, grace: float, t0: float) -> None:
        """Wait (up to the grace) for a TERMed leader to exit by itself, saying so meanwhile."""
        # Children-first left the launcher with nothing to wait for; it still gets at least
        # the launcher part of the grace to exit by itself.
        deadline = max(t0 + grace, time.monotonic() + CHILDREN_FIRST_LAUNCHER_S)
        next_beat = t0 + STOP_HEARTBEAT_S
        while self.leader_state(rec) == "alive" and time.monotonic() < deadline:
            self.reap()
            if time.monotonic() >= next_beat:
                # A trainer may take minutes to save its interrupt checkpoint; keep the
                # workstation informed (and its dead-link detector quiet) meanwhile.
                next_beat += STOP_HEARTBEAT_S
                self.out.emit(
                    "stopping", process=rec["name"], run_id=run_id,
                    elapsed=round(time.monotonic() - t0, 1), grace=grace,
                )
            time.sleep(POLL_S)
        self.reap()

    def kill_cgroup(self, run_id: str, rec: JSONDict) -> None:
        """SIGKILL the record's whole cgroup at once, unless the agent itself is in it."""
        cgroup = record_cgroup(run_id, rec)
        if cgroup is not None and not (cgroup_pids(cgroup) & self.protected):
            cgroup_kill(cgroup)

    def launched_children(self, rec: JSONDict) -> List[int]:
        """The children of the wrapper's child: with torchrun as the command, its ranks.

        Found by parent pid and proven ours by the run marker or by having been seen as the
        run's (each rank runs in a session of its own, so group and session do not reach it)."""
        pid = rec["pid"]
        procs = [st for st in scan_procs() if st.live() and st.pid not in self.protected]
        commands = {st.pid for st in procs if st.ppid == pid}
        run_id = rec.get("_run_id")
        seen = self.seen_of(run_id) if isinstance(run_id, str) else {}
        out: List[int] = []
        for st in procs:
            if st.ppid in commands and (self.markers(st)[0] == run_id
                                        or (st.pid, st.start_ticks) in seen):
                out.append(st.pid)
        return sorted(out)

    def stop_children_first(self, run_id: str, rec: JSONDict, grace: float,
                            t0: float) -> None:
        """SIGTERM the launcher's children themselves (not their groups) and wait for them.

        torchrun, given SIGTERM, signals each rank's whole process group (the DataLoader
        workers die first and the rank's interrupt save fails on them) and SIGKILLs the ranks
        30 s later unless --shutdown-timeout (torch 2.13 has it, 2.11 does not) says otherwise.
        Signalling the ranks directly lets speculators' handler save ``interrupted/`` with its
        workers alive; torchrun then sees its workers exit and ends by itself."""
        rec = dict(rec, _run_id=run_id)
        children = self.launched_children(rec)
        if not children:
            return
        self.out.step(f"{rec['name']}: SIGTERM to {len(children)} launched worker(s) "
                      f"{children} first (they save before exiting)")
        for child in children:
            self.kill(child, signal.SIGTERM)
            self.kill(child, signal.SIGCONT)  # a stopped rank acts on TERM once it runs
        deadline = t0 + grace
        next_beat = time.monotonic() + STOP_HEARTBEAT_S
        while time.monotonic() < deadline:
            self.reap()
            left = [c for c in children if pid_live(c)]
            if not left:
                # torchrun notices its workers' exit on its own poll; a SIGTERM before that
                # makes it raise SignalException and exit 1 after a clean save. Give it its
                # moment to exit 0 by itself.
                until = time.monotonic() + CHILDREN_FIRST_LAUNCHER_S
                while time.monotonic() < until and self.leader_state(rec) == "alive":
                    self.reap()
                    time.sleep(POLL_S)
                return
            if time.monotonic() >= next_beat:
                next_beat += STOP_HEARTBEAT_S
                self.out.emit("stopping", process=rec["name"], run_id=run_id,
                              elapsed=round(time.monotonic() - t0, 1), grace=grace,
                              waiting_for=left)
            time.sleep(POLL_S)

    def _note_killed(self, rec: JSONDict) -> None:
        """The wrapper was SIGKILLed so it wrote no exit file: write one saying so."""
        path = rec.get("exit_file")
        if isinstance(path, str) and not os.path.exists(path):
            try:
                write_json_atomic(
                    path, {"code": None, "signal": 9, "ended": time.time(), "by": "outrig"}
                )
            except OSError as exc:
                self.unrecorded.append(f"the exit file {path} ({exc.strerror or exc})")

    def _stopped(self, run_id: str, name: str, how: str, t0: float, stragglers: int,
                 **ended: Optional[int]) -> JSONDict:
        """Emit ``stopped`` and return the per-process cleanup record; ``ended``: how a
        process that was no longer running had ended (``exit_code`` or ``exit_signal``)."""
        seconds = round(time.monotonic() - t0, 2)
        self.out.emit(
            "stopped", process=name, run_id=run_id, how=how, seconds=seconds,
            stragglers=stragglers, **ended
        )
        return {"process": name, "how": how, "seconds": seconds, "stragglers": stragglers,
                **ended}

    def sweep(self, run_id: str, grace: float) -> Optional[JSONDict]:
        """Stop whatever still carries the run's marker or was seen as the run's (TERM, grace,
        KILL); None if nothing."""
        found = self.leftovers(run_id)
        if not found:
            return None
        t0 = time.monotonic()
        for pid in found:
            self.kill(pid, signal.SIGTERM)
            self.kill(pid, signal.SIGCONT)  # a stopped one acts on TERM once it runs again
        deadline = t0 + grace
        how = "term"
        seen = set(found)
        while time.monotonic() < deadline:
            self.reap()
            if not self.leftovers(run_id):
                break
            time.sleep(POLL_S)
        deadline = time.monotonic() + KILL_WAIT_S
        while True:
            self.reap()
            left = self.leftovers(run_id)
            if not left:
                break
            if time.monotonic() >= deadline:
                self.out.warning(f"run {run_id}: pids {sorted(left)} survived SIGKILL")
                break
            how = "kill"
            seen |= left
            for pid in left:
                self.kill(pid, signal.SIGKILL)
            time.sleep(POLL_S)
        return self._stopped(run_id, SWEEP_NAME, how, t0, len(seen))

    def stop_run(
        self, run_id: str, records: Optional[List[JSONDict]], sweep_grace: float
    ) -> List[JSONDict]:
        """Stop a run's records in reverse start order, then sweep its marker and cgroups."""
        results: List[JSONDict] = []
        for rec in reversed(records or []):
            results.append(self.stop_record(run_id, rec))
        swept = self.sweep(run_id, sweep_grace)
        if swept is not None:
            results.append(swept)
        swept = self.sweep_cgroups(run_id)
        if swept is not None:
            results.append(swept)
        return results

    def sweep_cgroups(self, run_id: str) -> Optional[JSONDict]:
        """Kill what is left in the run's cgroups (a record was reused or unreadable) and
        remove them; None when they were all empty."""
        t0 = time.monotonic()
        killed: Set[int] = set()
        for path in run_cgroups(run_id):
            pids = cgroup_pids(path) - self.protected
            if pids and not (cgroup_pids(path) & self.protected):
                killed |= pids
                if not cgroup_kill(path):
                    for pid in pids:
                        self.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + KILL_WAIT_S
                while cgroup_pids(path) and time.monotonic() < deadline:
                    self.reap()
                    time.sleep(POLL_S)
                if cgroup_pids(path):
                    self.out.warning(f"run {run_id}: pids {sorted(cgroup_pids(path))} in "
                                     f"{path} survived SIGKILL")
            remove_cgroup(path)
        if not killed:
            return None
        return self._stopped(run_id, CGROUP_SWEEP_NAME, "kill", t0, len(killed))


def exit_of(rec: JSONDict) -> Dict[str, Optional[int]]:
    """How a process that was gone before cleanup ended, from its wrapper's exit file:
    ``{"exit_code": N}`` or ``{"exit_signal": S}``; empty when nothing was recorded (the box
    rebooted, the wrapper was killed). Without it cleanup could only say "was not running" of
    a trainer that finished with exit 0."""
    path = rec.get("exit_file")
    status = read_exit_file(path) if isinstance(path, str) else None
    if status is None:
        return {}
    code, sig = status
    return {"exit_signal": sig} if sig is not None else {"exit_code": code}


def valid_record(rec: Any) -> bool:
    """A process record we can act on (pid, ticks, name of the right types)."""
    return (
        isinstance(rec, dict)
        and isinstance(rec.get("name"), str)
        and isinstance(rec.get("pid"), int)
        and not isinstance(rec.get("pid"), bool)
        and rec["pid"] > 1
        and isinstance(rec.get("start_ticks"), int)
        and not isinstance(rec.get("start_ticks"), bool)
    )


def load_run(layout: Layout, run_id: str, out: Emitter) -> Optional[JSONDict]:
    """run.json of a run, or None with a warning when it is missing or corrupt."""
    path = layout.run_json(run_id)
    try:
        run = read_json(path)
    except FileNotFoundError:
        out.warning(f"run {run_id}: {path} is missing; sweeping for its marker only")
        return None
    except (OSError, ValueError) as exc:
        out.warning(f"run {run_id}: {path} is unreadable ({exc}); sweeping for its marker only")
        return None
    if not isinstance(run, dict) or not isinstance(run.get("processes"), list):
        out.warning(f"run {run_id}: {path} is corrupt; sweeping for its marker only")
        return None
    return run


def stop_run_by_id(
    layout: Layout, run_id: str, stopper: Stopper, out: Emitter, sweep_grace: Optional[float],
    by: str = "cleanup",
) -> JSONDict:
    """Stop one run (by its run.json, or by marker only), mark it stopped, clear pointers.

    ``by`` (``cleanup``, or ``redeploy`` when a deploy replaces the run) is recorded as
    ``stopped_by`` in each record whose process was still running when it was signalled, so
    that ``status`` says who stopped it instead of ``killed (signal 15)``: the wrapper's exit
    file only knows the signal, not that it was ours."""
    run = load_run(layout, run_id, out)
    records: List[JSONDict] = []
    if run is not None:
        for rec in run["processes"]:
            if valid_record(rec):
                records.append(rec)
            else:
                out.warning(f"run {run_id}: skipping a malformed process record")
    running = [rec for rec in records if stopper.leader_state(rec) == "alive"]
    grace = sweep_grace
    if grace is None:
        graces = [float(r["stop_grace"]) for r in records if _is_num(r.get("stop_grace"))]
        grace = max(graces) if graces else DEFAULT_STOP_GRACE
    results = stopper.stop_run(run_id, records, grace)
    for rec in records:
        scratch = rec.get("scratch")
        for folder in scratch if isinstance(scratch, list) else []:
            if isinstance(folder, str):
                clear_scratch(layout, folder, out)
    if run is not None:
        run["status"] = "stopped"
        run["stopped_at"] = round(time.time(), 3)
        for rec in running:
            rec["stopped_by"] = by
        try:
            write_json_atomic(layout.run_json(run_id), run)
        except OSError as exc:
            out.warning(f"run {run_id}: cannot update run.json: {exc}")
            stopper.unrecorded.append(
                f"run {run_id} stopped in {layout.run_json(run_id)} ({exc.strerror or exc})")
    clear_pointers(layout, run_id)
    # known: the box had a record of it (else only its marker was swept; an unknown id is
    # reported as such instead of as "stopped")
    return {"run_id": run_id, "processes": results, "known": run is not None}


def clear_scratch(layout: Layout, folder: str, out: Emitter) -> None:
    """Delete the files (not the folder) of a process's scratch folder once it is stopped.

    vLLM's hidden-state connector writes ``<path>/<request>.safetensors`` (+ ``.lock``) that
    the trainer deletes after reading; a crash leaves them (about 0.5 GB each). Only folders
    inside the workdir are touched, resolved through symlinks, so a playbook value can never
    make this delete anything else."""
    real = os.path.realpath(folder)
    root = os.path.realpath(layout.workdir)
    if not real.startswith(root + os.sep):
        out.warning(f"scratch folder {folder} is outside the workdir {layout.workdir}; "
                    "left as it is")
        return
    removed = 0
    freed = 0
    for dirpath, _dirs, names in os.walk(real):
        for name in names:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                size = os.lstat(path).st_size
                os.unlink(path)
                removed += 1
                freed += size
    if removed:
        out.step(f"cleared {removed} file(s), {freed / 1e9:.2f} GB, from {folder}")
