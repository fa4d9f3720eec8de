#!/usr/bin/env python3
"""Cold-path benchmark: a cold ``outrig deploy --no-wait --no-keep`` with and without the
pipelined login, next to OpenSSH's ``ssh box true`` and plain Fabric scripts, over a slow link.

Starts the sandbox box (a real OpenSSH sshd on 127.0.0.1) behind the latency proxy (one-way
delay = RTT / 2) and, in rounds (one untimed warm-up first), runs as subprocesses:

- ``outrig deploy --no-wait --no-keep`` of playbooks/smoke.yaml (every repeat redeploys:
  outrig stops the previous run in the same call) as it connects by default (the login and
  the channel open pipelined), with the login alone pipelined (``OUTRIG_SSH_PIPELINE=login``,
  the default before) and with paramiko's own sequence (``OUTRIG_SSH_PIPELINE=0``);
- ``outrig deploy --dry-run`` of the same: the CLI's start-up (the same imports, the plan,
  no network), subtracted in "beyond start";
- ``ssh box true`` with the OpenSSH client (``-F /dev/null``, ``ControlMaster=no``), and its
  start-up ``ssh -G`` (reads its options, no network);
- a plain Fabric script (``fabric.Connection(...).run("true")``), and a plain Fabric deploy
  (one connection: ``put`` train.py, then ``run`` chmod, the kill of the pids recorded last
  time, nohup the server, nohup the trainer), with their start-up (``import fabric``).

For every connection the proxy counts the client's *turns* (runs of client bytes sent after
the proxy handed it new server bytes: the times it may have waited, banner included) and, for
paramiko clients, the turn in which the exec went out (outrig/sandbox/proxy.py: the 4th
flight after NEWKEYS with paramiko's sequence, the 3rd with the login alone pipelined, the 2nd
with the channel open behind the login too). Wall time: the
median and the fastest of the rounds; "beyond start" subtracts the same of the method's own
start-up. The turns do not depend on the machine's load; the seconds do. The
machine's load average is printed before and after. Everything is stopped at the end.

Usage:  python bench/cold_connect.py [--rtt-ms 240] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from deploy_rtt import HandMade  # noqa: E402  (the OpenSSH options and the pid-file cleanup)

FABRIC_SCRIPT = r'''
import sys
import fabric
host, port, user, key, known, mode, d, python, sport = sys.argv[1:]
c = fabric.Connection(host, user=user, port=int(port), connect_kwargs={
    "key_filename": [key], "look_for_keys": False, "allow_agent": False})
c.client.load_host_keys(known)
if mode == "true":
    c.run("true", hide=True)
else:
    c.put(sys.argv[0].rsplit("/", 1)[0] + "/train.py", f"{d}/train.py")
    c.run(f"chmod +x {d}/train.py", hide=True)
    c.run(f"kill $(cat {d}/server.pid {d}/trainer.pid 2>/dev/null) 2>/dev/null; true",
          hide=True)
    c.run(f"cd {d} || exit 1; nohup {python} -m http.server {sport} --bind 127.0.0.1"
          " > server.log 2>&1 < /dev/null & echo $! > server.pid", hide=True)
    c.run(f"cd {d} || exit 1; nohup {python} -u train.py --steps 400"
          f" --save-path {d}/checkpoints > run.log 2>&1 < /dev/null & echo $! > trainer.pid",
          hide=True)
c.close()
'''


DEFAULT = "outrig deploy, login and channel open pipelined (default)"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtt-ms", type=float, default=240.0, help="round-trip time to inject")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args()
    rtt = args.rtt_ms / 1000.0

    root = Path(tempfile.mkdtemp(prefix="outrig-cold-"))
    os.environ["XDG_STATE_HOME"] = str(root / "state")  # before outrig is imported
    from outrig.console import Reporter
    from outrig.journal import Journal
    from outrig.ops.cleanup import cleanup
    from outrig.sandbox.box import start_sandbox
    from outrig.sandbox.proxy import LatencyProxy
    from outrig.session import Project

    box = start_sandbox(root / "box", name="cold")
    proxy = LatencyProxy(box.host, box.port, one_way_delay=rtt / 2).start()
    host_file = box.write_host_file(root / "cold.yaml", port=proxy.port)
    hand_dir = box.workdir / "hand"
    hand_dir.mkdir(parents=True, exist_ok=True)
    hand = HandMade(box, proxy.port, hand_dir, sys.executable)
    script = root / "fabric_script.py"
    script.write_text(FABRIC_SCRIPT)
    shutil.copy(REPO / "remote/examples/train_tiny.py", root / "train.py")
    fabric_args = [sys.executable, str(script), box.host, str(proxy.port), box.user,
                   str(box.identity_file), str(box.known_hosts)]
    tail = [str(hand_dir), sys.executable, str(hand.server_port)]
    outrig = str(Path(sys.executable).parent / "outrig")
    deploy_argv = [outrig, "deploy", "--host", str(host_file), "--playbook", "smoke",
                   "--no-wait", "--no-keep"]
    off = {**os.environ, "OUTRIG_SSH_PIPELINE": "0"}
    login = {**os.environ, "OUTRIG_SSH_PIPELINE": "login"}
    default = {k: v for k, v in os.environ.items() if k != "OUTRIG_SSH_PIPELINE"}
    methods: dict[str, tuple[list[str], dict[str, str] | None, bool]] = {
        # name: (argv, environment, connects)
        DEFAULT: (deploy_argv, default, True),
        "outrig deploy, login alone pipelined": (deploy_argv, login, True),
        "outrig deploy, paramiko's sequence": (deploy_argv, off, True),
        "outrig start-up (deploy --dry-run)": (
            [outrig, "deploy", "--host", str(host_file), "--playbook", "smoke", "--dry-run"],
            None, False),
        "ssh box true": (["ssh", "-p", str(proxy.port), *hand.opts, hand.target, "true"],
                         None, True),
        "ssh start-up (ssh -G)": (["ssh", "-G", "-p", str(proxy.port), *hand.opts,
                                   hand.target], None, False),
        "Fabric run('true')": ([*fabric_args, "true", *tail], None, True),
        "Fabric deploy (put + 4 runs)": ([*fabric_args, "deploy", *tail], None, True),
        "Fabric start-up (import fabric)": ([sys.executable, "-c", "import fabric"], None,
                                            False),
    }
    times: dict[str, list[float]] = {name: [] for name in methods}
    turns: dict[str, list[int]] = {name: [] for name in methods}
    exec_turns: dict[str, list[int]] = {name: [] for name in methods}
    load_before = os.getloadavg()
    try:
        for round_number in range(args.repeat + 1):
            for name, (argv, env, connects) in methods.items():
                before = proxy.accepted
                started = time.monotonic()
                proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                                      stdin=subprocess.DEVNULL)
                seconds = time.monotonic() - started
                if proc.returncode != 0:
                    raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr}")
                if round_number == 0:
                    continue  # warm-up: host key recorded, .pyc compiled, page cache warm
                times[name].append(seconds)
                if connects:
                    time.sleep(0.05)  # the proxy's last reads of the closed connection
                    for number in range(before + 1, proxy.accepted + 1):
                        tracker = proxy.tracker(number)
                        turns[name].append(tracker.turns)
                        # the exec's flight is known for paramiko's layouts only (OpenSSH's
                        # client asks whether a key would do before it signs)
                        paramiko_client = name.startswith(("outrig", "Fabric run"))
                        flights = 4 if not tracker.pipelined_login else \
                            2 if name == DEFAULT else 3
                        if len(tracker.flight_turns) >= flights and paramiko_client:
                            exec_turns[name].append(tracker.flight_turns[flights - 1])
    finally:
        try:
            cleanup(Project(REPO), str(host_file), Reporter(quiet=True), all_runs=True,
                    journal=Journal(root / "state" / "outrig"))
        except Exception as exc:
            print(f"warning: outrig cleanup --all failed: {exc}", file=sys.stderr)
        hand.stop()
        proxy.close()
        box.stop()
        shutil.rmtree(root, ignore_errors=True)
    load_after = os.getloadavg()
    results = {"rtt_ms": args.rtt_ms, "repeat": args.repeat, "seconds": times,
               "turns": turns, "exec_turn": exec_turns,
               "load": [list(load_before), list(load_after)]}
    print_table(results, rtt)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


def print_table(results: dict[str, Any], rtt: float) -> None:
    """Median and fastest run of each method; "beyond start" subtracts the same statistic of
    the method's start-up (on a shared machine the fastest run is the least disturbed one)."""
    times = results["seconds"]
    names = {"outrig": "outrig start-up (deploy --dry-run)", "ssh": "ssh start-up (ssh -G)",
             "Fabric": "Fabric start-up (import fabric)"}
    startup = {kind: (median(times[name]), min(times[name])) for kind, name in names.items()}
    ours = times[DEFAULT]
    base = (median(ours) - startup["outrig"][0], min(ours) - startup["outrig"][1])
    load = results["load"]
    print(f"\nRTT {rtt * 1000:.0f} ms (latency proxy), {results['repeat']} rounds (after 1 "
          f"warm-up); load average {load[0][0]:.2f} before, {load[1][0]:.2f} after\n")
    print("| method | median s | fastest s | beyond start: median | RTT | fastest | RTT "
          "| × outrig default (median / fastest) | client turns | exec in turn |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, values in times.items():
        middle, fastest = median(values), min(values)
        if "start-up" in name:
            print(f"| {name} | {middle:.2f} | {fastest:.2f} | | | | | | | |")
            continue
        kind = "outrig" if name.startswith("outrig") else name.split()[0]
        beyond = (middle - startup[kind][0], fastest - startup[kind][1])
        turns = results["turns"][name]
        execs = results["exec_turn"][name]
        turn_text = f"{median(turns):.0f}" if turns else ""
        exec_text = f"{median(execs):.0f}" if execs else ""
        print(f"| {name} | {middle:.2f} | {fastest:.2f} | {beyond[0]:.2f} | "
              f"{beyond[0] / rtt:.1f} | {beyond[1]:.2f} | {beyond[1] / rtt:.1f} | "
              f"{beyond[0] / base[0]:.2f} / {beyond[1] / base[1]:.2f} | {turn_text} | "
              f"{exec_text} |")


if __name__ == "__main__":
    sys.exit(main())
