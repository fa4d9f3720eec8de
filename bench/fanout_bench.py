#!/usr/bin/env python3
"""Fan-out benchmark: ``status`` on N sandbox boxes at once over a slow link, and its CPU.

Starts N sandbox boxes (each its own OpenSSH sshd on 127.0.0.1, keys, workdir and fake
GPUs), each behind its own latency proxy (one-way delay = RTT / 2), writes a host file per
box, and times ``status`` (the op core of ``outrig status --host a,b,...``, through
:func:`outrig.fanout.run_fanout`) across 1, 5 and N of them:

- **cold**: every host connects afresh (keeping off, as ``--no-keep``);
- **keep, first**: keeping on and no keeper yet: each host starts its keeper (which makes
  the connection), as the first command of a session does;
- **warm**: keeping on, the keepers from the round before are there, each with its live
  agent ready (connectors/keeper/live.py): each host's call is one request on the live agent's
  channel (no channel open, no exec, no Python start on the box);
- **Fabric ThreadingGroup, cold**: the plain alternative on the same boxes in the same run:
  one ``ThreadingGroup.run`` of a lighter look than ``status`` (``ps`` of every process, ``df``
  and the load average), host keys checked against the same known_hosts (RejectPolicy).

After the kept rounds on all N boxes it reports the **memory of the kept hosts**: each
keeper's PSS, RSS and private bytes (``/proc/PID/smaps_rollup``: PSS shares the pages the
keepers share, forked from one launcher, fairly between them), and the same for each box's
live agent, in total and per host.

Every round also counts CPU seconds, so that a slow round can be told apart from a slow
link: the **client** (this process: outrig's threads, paramiko's transports; for kept
connections plus the keeper processes), the **boxes** (every sshd listener with all the
processes under it: per-connection sshd, the agent, the fake ``nvidia-smi``), and the
**link** stand-in (the latency proxies, which run in a process of their own so that their
threads do not compete with the client's for its interpreter lock; a real link costs the
workstation nothing). ``--no-delay`` runs the same rounds with the proxies' delay at 0:
the difference is what the link itself costs.

Then 3 of the N go bad, one refusing (its sshd and its proxy stopped: connects are refused),
one blackholed (connects get no answer), one stalled (connects are accepted, nothing is
forwarded), and ``status`` runs on all N again, cold: it prints when the healthy boxes'
results were in, when the command ended (the bad ones' deadline) and each bad box's reason.

``--max-parallel`` is outrig's bound on hosts in progress at once (``outrig status
--max-parallel``); the default here is N, so that every host starts at once: with outrig's
own default (16) the last hosts of 20 wait for a free slot. ``--deadline S`` gives the bad
round a per-host deadline instead of the RTT-derived default. ``--profile FILE`` writes a
cProfile of every thread of the cold N round (``python -m pstats FILE``).

Usage:  python bench/fanout_bench.py [--rtt-ms 240] [--boxes 20] [--repeat 3]
                                     [--max-parallel K] [--deadline S] [--no-delay]
                                     [--profile FILE] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TICK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------- the link, apart


def serve_proxies() -> int:
    """``--serve-proxies``: the latency proxies in their own process. One JSON command a
    line on stdin, one answer a line on stdout; EOF closes them all."""
    from outrig.sandbox.proxy import LatencyProxy

    proxies: list[LatencyProxy] = []
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            if "start" in cmd:
                proxies = [LatencyProxy(h, p, one_way_delay=cmd["delay"]).start()
                           for h, p in cmd["start"]]
                answer: Any = [p.port for p in proxies]
            elif "delay" in cmd:
                for proxy in proxies:
                    proxy.set_delay(cmd["delay"])
                answer = "ok"
            elif "close" in cmd:
                proxies[cmd["close"]].close()
                answer = "ok"
            elif "blackhole" in cmd:
                proxies[cmd["blackhole"]].blackhole_all(drop_new=True)
                answer = "ok"
            elif "stall" in cmd:
                proxies[cmd["stall"]].stall_all(3600)
                answer = "ok"
            else:
                answer = f"unknown command {cmd!r}"
            print(json.dumps(answer), flush=True)
    finally:
        for proxy in proxies:
            proxy.close()
    return 0


class Proxies:
    """The client side of :func:`serve_proxies`."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-proxies"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, bufsize=1)

    def ask(self, **cmd: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------------- CPU accounting


def _stat_times(pid: int) -> tuple[int, int, list[int]] | None:
    """(own ticks, reaped children's ticks, ppid) of ``pid``, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]), [
        int(fields[1])]


def tree_cpu(roots: list[int]) -> float:
    """CPU seconds of the processes ``roots`` and everything under them: a live process
    counts its own time and its reaped children's; a reaped one is in its parent's."""
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _stat_times(int(entry))
            if found is not None:
                own, reaped, (ppid,) = found
                parents[int(entry)] = ppid
                times[int(entry)] = own + reaped
    wanted = set(roots)
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in wanted and pid not in wanted:
                wanted.add(pid)
                changed = True
    return sum(times.get(pid, 0) for pid in wanted) / TICK


def self_cpu() -> float:
    """CPU seconds of this process (all its threads) and of its reaped children (the
    launchers of keepers: the keeper's imports happen there, before it forks away)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def keeper_pids() -> list[int]:
    from outrig.connectors.keeper.client import keepers

    return [int(k["pid"]) for k in keepers()]


FABRIC_LOOK = "ps -eo pid,ppid,pgid,lstart,args >/dev/null; df -P / >/dev/null; " \
              "cat /proc/loadavg"


def live_served() -> int:
    """Calls the keepers' live agents have served so far."""
    from outrig.connectors.keeper.client import keepers

    return sum(int((k.get("live") or {}).get("served") or 0) for k in keepers())


def live_ready(count: int, limit: float = 120.0) -> int:
    """Wait until ``count`` keepers each have a ready live agent; the calls served so far."""
    from outrig.connectors.keeper.client import keepers

    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = keepers()
        states = [(k.get("live") or {}).get("state") for k in found]
        if len(found) == count and states == ["ready"] * count:
            return live_served()
        if "failed" in states:
            raise SystemExit(f"a live agent failed: {[k.get('live') for k in found]}")
        time.sleep(0.1)
    raise SystemExit(f"the live agents were not all ready: {keepers()}")


def memory_of(pid: int) -> dict[str, int] | None:
    """PSS, RSS and private bytes of one process (``/proc/PID/smaps_rollup``)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    kib = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            kib[name.strip()] = int(parts[0])
    return {"pss": kib.get("Pss", 0) << 10, "rss": kib.get("Rss", 0) << 10,
            "private": (kib.get("Private_Clean", 0) + kib.get("Private_Dirty", 0)) << 10}


def kept_memory() -> dict[str, Any]:
    """Memory of every keeper and every box's live agent, total and per host."""
    from outrig.connectors.keeper.client import keepers

    found = keepers()
    pids = {"keeper": {e.get("pid") for e in found},  # one hosting process holds many
            "live_agent": {(e.get("live") or {}).get("pid") for e in found}}
    out: dict[str, Any] = {"hosts": len(found),
                           "keeper_processes": len(pids["keeper"])}
    for side, chosen in pids.items():
        rows = [m for m in (memory_of(int(p)) for p in chosen if isinstance(p, int)) if m]
        for key in ("pss", "rss", "private"):
            total = sum(r[key] for r in rows)
            out[f"{side}_{key}_total_mib"] = round(total / 2**20, 1)
            out[f"{side}_{key}_per_host_mib"] = round(total / 2**20 / max(1, len(found)), 1)
    return out


@dataclass
class Round:
    """One timed ``status`` across some hosts: wall clock and CPU by side."""

    seconds: float
    client_cpu: float
    box_cpu: float
    link_cpu: float
    outcomes: list[Any] = field(default_factory=list)

    def row(self, hosts: int) -> dict[str, float]:
        return {"seconds": round(self.seconds, 2), "client_cpu_s": round(self.client_cpu, 2),
                "client_cpu_per_host_ms": round(1000 * self.client_cpu / hosts),
                "box_cpu_s": round(self.box_cpu, 2),
                "box_cpu_per_host_ms": round(1000 * self.box_cpu / hosts),
                "link_cpu_s": round(self.link_cpu, 2)}


def median_round(runs: list[Round]) -> Round:
    """The run of median wall time (its CPU figures with it)."""
    ordered = sorted(runs, key=lambda r: r.seconds)
    return ordered[len(ordered) // 2]


# ---------------------------------------------------------------------- profiling


class ThreadProfiles:
    """cProfile in every thread started while active, paramiko's transport threads too
    (cProfile sees one thread only: each new thread gets its own profile at its first
    event, through :func:`threading.setprofile`)."""

    def __init__(self) -> None:
        import cProfile

        self.profiles: list[cProfile.Profile] = []

    def __enter__(self) -> ThreadProfiles:
        import cProfile

        profiles = self.profiles

        def first_event(*_: Any) -> None:
            profile = cProfile.Profile()
            profiles.append(profile)
            profile.enable()  # replaces this hook in this thread

        threading.setprofile(first_event)
        self._main = cProfile.Profile()
        self.profiles.append(self._main)
        self._main.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        self._main.disable()
        threading.setprofile(None)  # type: ignore[arg-type]

    def dump(self, path: str) -> None:
        import pstats

        time.sleep(1.0)  # threads of closed transports end
        stats = pstats.Stats(self.profiles[0])
        for profile in self.profiles[1:]:
            with contextlib.suppress(TypeError):  # a profile that saw no call
                stats.add(profile)
        stats.dump_stats(path)


# ---------------------------------------------------------------------- the bench


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtt-ms", type=float, default=240.0)
    parser.add_argument("--boxes", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-parallel", type=int, default=None)
    parser.add_argument("--deadline", type=float, default=None)
    parser.add_argument("--no-delay", action="store_true",
                        help="also run every round with the proxies' delay at 0")
    parser.add_argument("--skip-bad", action="store_true", help="skip the 3-bad round")
    parser.add_argument("--profile", default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve-proxies", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_proxies:
        return serve_proxies()

    root = Path(tempfile.mkdtemp(prefix="outrig-bench-fanout-"))
    os.environ["XDG_STATE_HOME"] = str(root / "state")
    os.environ["OUTRIG_RUNTIME_DIR"] = str(root / "run")
    os.environ.pop("OUTRIG_KEEP_SECONDS", None)

    from outrig.connectors.keeper.client import LAUNCHER, close_keepers, wait_gone
    from outrig.fanout import run_fanout
    from outrig.ops.status import status_on
    from outrig.sandbox.box import SandboxBox, start_sandbox
    from outrig.session import Project

    boxes: list[SandboxBox] = []
    proxies = Proxies()
    max_parallel = args.max_parallel or args.boxes
    try:
        for i in range(args.boxes):
            boxes.append(start_sandbox(root / f"box{i}", name=f"b{i}"))
        ports = proxies.ask(start=[[b.host, b.port] for b in boxes],
                            delay=args.rtt_ms / 2000.0)
        for i, (box, port) in enumerate(zip(boxes, ports, strict=True)):
            box.write_host_file(root / "project" / "hosts" / f"b{i}.yaml", port=port)
        cold = Project(root / "project", keep_seconds=0)
        kept = Project(root / "project", keep_seconds=600)
        names = [f"b{i}" for i in range(args.boxes)]

        def core(session: Any) -> dict[str, Any]:
            return status_on(session, log_lines=0)

        def stop_keepers() -> None:
            for entry in close_keepers():
                wait_gone(int(entry["pid"]), 10.0)

        def timed(project: Project, hosts: list[str], deadline: float | None = None,
                  profile: str | None = None) -> Round:
            """One round; CPU read before and after (sshd reaps its per-connection
            processes shortly after the connections close: settle first)."""
            roots = [b.pid for b in boxes if b.pid is not None]
            keepers_before = keeper_pids()
            time.sleep(0.3)
            box0, link0 = tree_cpu(roots), tree_cpu([proxies.proc.pid])
            keep0, self0 = tree_cpu(keepers_before), self_cpu()
            start = time.monotonic()
            with ThreadProfiles() if profile else contextlib.nullcontext() as prof:
                outcomes = run_fanout(project, hosts, core, deadline=deadline,
                                      max_parallel=max_parallel)
            seconds = time.monotonic() - start
            LAUNCHER.close()  # reaped: its CPU (one interpreter start) is this round's
            client = self_cpu() - self0
            if prof is not None and profile:
                prof.dump(profile)
            time.sleep(0.5)
            after = keeper_pids()
            # keepers started in this round count whole (their start-up is this round's)
            client += tree_cpu(keepers_before) - keep0 + tree_cpu(
                [p for p in after if p not in keepers_before])
            return Round(seconds, client, tree_cpu(roots) - box0,
                         tree_cpu([proxies.proc.pid]) - link0, outcomes)

        def series(delay_ms: float) -> dict[str, Any]:
            proxies.ask(delay=delay_ms / 2000.0)
            rows: dict[str, Any] = {}
            counts = sorted({1, min(5, args.boxes), min(10, args.boxes), args.boxes})
            for count in counts:
                runs = [timed(cold, names[:count],
                              profile=args.profile if count == args.boxes and i == 0
                              and delay_ms else None)
                        for i in range(args.repeat)]
                assert all(o.ok for r in runs for o in r.outcomes), runs
                rows[f"cold N={count}"] = median_round(runs).row(count)
            for count in counts:
                stop_keepers()
                first = timed(kept, names[:count])
                assert first.outcomes and all(o.ok for o in first.outcomes), first
                served = live_ready(count)
                runs = [timed(kept, names[:count]) for _ in range(args.repeat)]
                assert all(o.ok for r in runs for o in r.outcomes), runs
                calls = live_served() - served
                if calls != count * args.repeat:
                    raise SystemExit(f"warm N={count}: {calls} of {count * args.repeat} "
                                     "calls were served by the live agents")
                rows[f"keep, first N={count}"] = first.row(count)
                rows[f"warm N={count}"] = median_round(runs).row(count)
                if count == args.boxes and delay_ms:
                    memory.update(kept_memory())
            stop_keepers()
            for count in counts:
                runs = [fabric_round(boxes[:count]) for _ in range(args.repeat)]
                rows[f"Fabric group N={count}"] = median_round(runs).row(count)
            for name, row in rows.items():
                base = rows[name.split("N=")[0] + "N=1"]["seconds"]
                row["x_one_box"] = round(row["seconds"] / base, 2)
                row["x_cold_one_box"] = round(row["seconds"] / rows["cold N=1"]["seconds"], 2)
            return rows

        memory: dict[str, Any] = {}

        def fabric_round(chosen: list[SandboxBox]) -> Round:
            """Fabric's ThreadingGroup on ``chosen``, cold: connect, run the look, close."""
            import fabric
            import paramiko

            conns = []
            for box, port in zip(chosen, ports, strict=False):
                conn = fabric.Connection(box.host, user=box.user, port=port, connect_kwargs={
                    "key_filename": str(box.identity_file), "look_for_keys": False,
                    "allow_agent": False})
                conn.client.load_host_keys(str(box.known_hosts))
                conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
                conns.append(conn)
            group = fabric.ThreadingGroup.from_connections(conns)
            roots = [b.pid for b in boxes if b.pid is not None]
            time.sleep(0.3)
            box0, link0, self0 = tree_cpu(roots), tree_cpu([proxies.proc.pid]), self_cpu()
            start = time.monotonic()
            try:
                group.run(FABRIC_LOOK, hide=True)
            finally:
                group.close()
            seconds = time.monotonic() - start
            time.sleep(0.5)
            return Round(seconds, self_cpu() - self0, tree_cpu(roots) - box0,
                         tree_cpu([proxies.proc.pid]) - link0)

        timed(cold, names)  # first contact: host keys recorded, RTTs in the journal
        report: dict[str, Any] = {
            "rtt_ms": args.rtt_ms, "boxes": args.boxes, "repeat": args.repeat,
            "max_parallel": max_parallel, "cpus": os.cpu_count(),
            "load_before": os.getloadavg()[0], "rounds": series(args.rtt_ms)}
        report["memory"] = memory
        if args.no_delay:
            report["rounds_no_delay"] = series(0.0)
            proxies.ask(delay=args.rtt_ms / 2000.0)
        if not args.skip_bad:
            report[f"with_3_bad_of_{args.boxes}"] = bad_round(args, boxes, proxies, names,
                                                               cold, timed)
        report["load_after"] = os.getloadavg()[0]
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print_report(report)
        return 0
    finally:
        with contextlib.suppress(Exception):
            from outrig.connectors.keeper.client import close_keepers as closing

            closing()
        proxies.close()
        for box in boxes:
            box.stop()
        shutil.rmtree(root, ignore_errors=True)


def bad_round(args: argparse.Namespace, boxes: list[Any], proxies: Proxies,
              names: list[str], project: Any, timed: Any) -> dict[str, Any]:
    """3 of the boxes go bad (refusing, blackholed, stalled); status on all of them."""
    bad = {names[-3]: "refusing", names[-2]: "blackholed", names[-1]: "stalled"}
    boxes[-3].stop()
    proxies.ask(close=len(boxes) - 3)
    proxies.ask(blackhole=len(boxes) - 2)
    proxies.ask(stall=len(boxes) - 1)
    result = timed(project, names, args.deadline)
    healthy = [o for o in result.outcomes if o.host not in bad]
    return {"healthy_ok": sum(o.ok for o in healthy), "healthy": len(healthy),
            "healthy_in_s": round(max(o.seconds for o in healthy), 2),
            "total_s": round(result.seconds, 2),
            "bad": {f"{o.host} ({bad[o.host]})": f"{o.state}: {o.error}"
                    for o in result.outcomes if o.host in bad}}


def print_report(report: dict[str, Any]) -> None:
    print(f"{report['boxes']} boxes at {report['rtt_ms']:.0f} ms RTT, max-parallel "
          f"{report['max_parallel']}, {report['cpus']} CPUs, load {report['load_before']:.1f}"
          f" before, {report['load_after']:.1f} after; median of {report['repeat']}")
    print("x1: seconds over the same kind of round on 1 box; x1cold: over cold on 1 box; "
          "CPU in seconds (client: outrig's process and its keepers; box: sshd and all "
          "under it; link: the latency proxies)")
    for key in ("rounds", "rounds_no_delay"):
        if key not in report:
            continue
        print("with the link's delay" if key == "rounds" else "link delay 0")
        print(f"  {'round':18} {'s':>6} {'x1':>5} {'x1cold':>6} {'client CPU':>11} "
              f"{'/host':>7} {'box CPU':>8} {'/host':>7} {'link CPU':>9}")
        for name, row in report[key].items():
            print(f"  {name:18} {row['seconds']:6.2f} {row['x_one_box']:5.2f} "
                  f"{row['x_cold_one_box']:6.2f} "
                  f"{row['client_cpu_s']:9.2f} s {row['client_cpu_per_host_ms']:4d} ms "
                  f"{row['box_cpu_s']:6.2f} s {row['box_cpu_per_host_ms']:4d} ms "
                  f"{row['link_cpu_s']:7.2f} s")
    rounds = report["rounds"]
    ten = min(10, report["boxes"])
    if f"warm N={ten}" in rounds and f"Fabric group N={ten}" in rounds:
        warm = rounds[f"warm N={ten}"]["seconds"] / rounds["warm N=1"]["seconds"]
        cold = rounds[f"cold N={ten}"]["seconds"] / rounds[f"Fabric group N={ten}"]["seconds"]
        print(f"goals: status on {ten} boxes warm = {warm:.2f}x one box warm (target <= 1.5: "
              f"{'met' if warm <= 1.5 else 'NOT met'}); {ten} boxes cold = {cold:.2f}x Fabric "
              f"ThreadingGroup on the same boxes (target <= 1: "
              f"{'met' if cold <= 1 else 'NOT met'})")
    memory = report.get("memory")
    if memory:
        print(f"memory of {memory['hosts']} kept hosts, {memory['keeper_processes']} keeper "
              "process(es) (PSS, the fair share of pages shared between processes; RSS; "
              "private; each total over the hosts):")
        for side, words in (("keeper", "keepers (workstation)"),
                            ("live_agent", "live agents (boxes)")):
            print(f"  {words:24} PSS {memory[side + '_pss_total_mib']:6.1f} MiB = "
                  f"{memory[side + '_pss_per_host_mib']:5.1f} MiB/host; RSS "
                  f"{memory[side + '_rss_per_host_mib']:5.1f} MiB/host; private "
                  f"{memory[side + '_private_per_host_mib']:5.1f} MiB/host")
    dead = report.get(f"with_3_bad_of_{report['boxes']}")
    if dead:
        print(f"with 3 bad of {report['boxes']}: {dead['healthy_ok']}/{dead['healthy']} "
              f"healthy boxes answered, the last after {dead['healthy_in_s']:.2f} s; the "
              f"command ended after {dead['total_s']:.2f} s")
        for host, why in dead["bad"].items():
            print(f"  {host}: {why}")


if __name__ == "__main__":
    raise SystemExit(main())
