#!/usr/bin/env python3
"""Deploy benchmark: outrig's one-exec deploy vs the hand-made scp/ssh routine, over a slow link.

Starts the sandbox box (a real OpenSSH sshd on 127.0.0.1 with throwaway keys) and a latency
proxy in front of it (one-way delay = RTT / 2), then times, through the proxy:

- ``outrig (library)``: ``outrig.ops.deploy.deploy(..., wait=False)`` of playbooks/smoke.yaml,
  called in this process, from the call until "all launched and recorded" (it returns);
- ``outrig (inv CLI)``: ``inv deploy --no-wait`` as a subprocess: what a user waits for,
  Python and Invoke start-up included;
- ``hand-made``: what people type today with the real OpenSSH clients, one connection each:
  scp the script, ssh chmod, ssh cleanup (kill of the pids recorded last time, standing in for
  ``pkill -f``), ssh nohup the server, ssh nohup the trainer;
- ``floor``: ``ssh box true`` (TCP + key exchange + auth + one exec), the least any SSH tool pays.

Every repeat redeploys (outrig stops the previous run of the playbook in the same call; the
hand-made routine kills the pids it recorded). One untimed warm-up precedes each method.
At the end everything is stopped: ``cleanup --all`` for outrig's runs, the hand-made pids from
their pid files, then the proxy and the sshd.

Usage:  python bench/deploy_rtt.py [--rtt-ms 240] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def timed(func: Callable[[], Any]) -> tuple[float, Any]:
    started = time.monotonic()
    value = func()
    return time.monotonic() - started, value


class HandMade:
    """The scp/ssh routine, with the OpenSSH clients, one connection per step."""

    def __init__(self, box: Any, port: int, remote_dir: Path, python: str) -> None:
        self.remote_dir = remote_dir
        self.python = python
        self.server_port = free_port()
        self.target = f"{box.user}@{box.host}"
        self.opts = [
            "-F", "/dev/null",  # hermetic: no ~/.ssh/config or /etc/ssh/ssh_config extras
            "-i", str(box.identity_file),
            "-o", f"UserKnownHostsFile={box.known_hosts}",
            "-o", "StrictHostKeyChecking=accept-new",
            "-o", "ControlMaster=no",
            "-o", "BatchMode=yes",
            "-o", "LogLevel=ERROR",
        ]
        self.port = port

    def ssh(self, command: str) -> None:
        subprocess.run(["ssh", "-p", str(self.port), *self.opts, self.target, command],
                       check=True, stdin=subprocess.DEVNULL, capture_output=True)

    def scp(self, local: Path, remote: str) -> None:
        subprocess.run(["scp", "-q", "-P", str(self.port), *self.opts, str(local),
                        f"{self.target}:{remote}"],
                       check=True, stdin=subprocess.DEVNULL, capture_output=True)

    def deploy(self) -> dict[str, float]:
        d = self.remote_dir
        steps: dict[str, float] = {}
        steps["scp train.py"], _ = timed(
            lambda: self.scp(REPO / "remote/examples/train_tiny.py", f"{d}/train.py"))
        steps["ssh chmod"], _ = timed(lambda: self.ssh(f"chmod +x {d}/train.py"))
        # Stands in for `ssh box 'pkill -9 -f "http.server|train.py"'`: one exec, same cost,
        # but it only signals the pids this benchmark recorded.
        steps["ssh cleanup"], _ = timed(lambda: self.ssh(
            f"kill $(cat {d}/server.pid {d}/trainer.pid 2>/dev/null) 2>/dev/null; true"))
        # `cd d && nohup X > log &` would background the whole AND-list in a subshell that keeps
        # the channel's stdout open, and ssh would hang until X exits: hence `cd d || exit; `.
        steps["ssh launch server"], _ = timed(lambda: self.ssh(
            f"cd {d} || exit 1; nohup {self.python} -m http.server {self.server_port}"
            " --bind 127.0.0.1 > server.log 2>&1 < /dev/null & echo $! > server.pid"))
        steps["ssh launch trainer"], _ = timed(lambda: self.ssh(
            f"cd {d} || exit 1; nohup {self.python} -u train.py --steps 400"
            f" --save-path {d}/checkpoints > run.log 2>&1 < /dev/null & echo $! > trainer.pid"))
        return steps

    def floor(self) -> None:
        self.ssh("true")

    def stop(self) -> list[int]:
        """Kill the hand-made processes by the pid files written above (never by name)."""
        killed = []
        for name in ("server.pid", "trainer.pid"):
            try:
                pid = int((self.remote_dir / name).read_text().strip())
            except (OSError, ValueError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
                killed.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        for pid in killed:
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return killed


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtt-ms", type=float, default=240.0, help="round-trip time to inject")
    parser.add_argument("--repeat", type=int, default=3, help="timed repeats per method")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument("--no-cli", action="store_true", help="skip the `inv deploy` subprocess")
    args = parser.parse_args()
    rtt = args.rtt_ms / 1000.0

    root = Path(tempfile.mkdtemp(prefix="outrig-bench-"))
    # The journal must not touch the user's real state: point XDG_STATE_HOME at the temp dir
    # before outrig is imported (the CLI subprocess inherits it).
    os.environ["XDG_STATE_HOME"] = str(root / "state")

    from outrig.console import Reporter
    from outrig.journal import Journal
    from outrig.ops.cleanup import cleanup
    from outrig.ops.deploy import deploy
    from outrig.sandbox.box import start_sandbox
    from outrig.sandbox.proxy import LatencyProxy
    from outrig.session import Project

    project = Project(REPO)
    journal = Journal(root / "state" / "outrig")
    box = start_sandbox(root / "box", name="bench")
    proxy = LatencyProxy(box.host, box.port, one_way_delay=rtt / 2).start()
    host_file = box.write_host_file(root / "bench.yaml", port=proxy.port)
    hand_dir = box.workdir / "hand"
    hand_dir.mkdir(parents=True, exist_ok=True)  # the user's workdir exists already
    hand = HandMade(box, proxy.port, hand_dir, sys.executable)

    results: dict[str, Any] = {"rtt_ms": args.rtt_ms, "repeat": args.repeat}
    try:
        # ---- outrig, in process ----
        lib_times: list[float] = []
        connects: list[float] = []
        measured_rtts: list[float] = []
        agent_calls: list[float] = []
        for i in range(args.repeat + 1):
            seconds, outcome = timed(lambda: deploy(project, str(host_file), "smoke",
                                                    Reporter(quiet=True), wait=False,
                                                    journal=journal))
            if i == 0:
                continue  # warm-up: host key recorded, .pyc compiled, page cache warm
            lib_times.append(seconds)
            if outcome.connect_seconds is not None:
                connects.append(outcome.connect_seconds)
                agent_calls.append(outcome.seconds - outcome.connect_seconds)
            if outcome.rtt is not None:
                measured_rtts.append(outcome.rtt)
        results["outrig_library"] = lib_times
        results["outrig_connect"] = connects
        results["outrig_agent_call"] = agent_calls
        results["outrig_channel_rtt"] = measured_rtts

        # ---- outrig, the CLI a user types ----
        cli_times: list[float] = []
        if not args.no_cli:
            inv = str(Path(sys.executable).parent / "inv")
            argv = [inv, "deploy", "--host", str(host_file), "--playbook", "smoke", "--no-wait"]
            for i in range(args.repeat + 1):
                seconds, proc = timed(lambda: subprocess.run(
                    argv, cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL))
                if proc.returncode != 0:
                    raise SystemExit(f"inv deploy failed ({proc.returncode}):\n{proc.stderr}")
                if i:
                    cli_times.append(seconds)
            # Start-up alone: the same CLI doing no network work.
            startup: list[float] = []
            for _ in range(args.repeat):
                seconds, _proc = timed(lambda: subprocess.run(
                    [inv, "plan", "--host", str(host_file), "--playbook", "smoke"],
                    cwd=REPO, capture_output=True, stdin=subprocess.DEVNULL))
                startup.append(seconds)
            results["inv_plan_no_network"] = startup
        results["outrig_cli"] = cli_times

        cleanup(project, str(host_file), Reporter(quiet=True), all_runs=True, journal=journal)

        # ---- the hand-made routine ----
        hand_times: list[float] = []
        hand_steps: list[dict[str, float]] = []
        for i in range(args.repeat + 1):
            seconds, steps = timed(hand.deploy)
            if i:
                hand_times.append(seconds)
                hand_steps.append(steps)
        results["hand_made"] = hand_times
        results["hand_made_steps"] = {k: median([s[k] for s in hand_steps])
                                      for k in hand_steps[0]} if hand_steps else {}

        # ---- the floor ----
        floor_times = []
        for i in range(args.repeat + 1):
            seconds, _ = timed(hand.floor)
            if i:
                floor_times.append(seconds)
        results["floor_ssh_true"] = floor_times
    finally:
        try:
            cleanup(project, str(host_file), Reporter(quiet=True), all_runs=True,
                    journal=journal)
        except Exception as exc:
            print(f"warning: outrig cleanup --all failed: {exc}", file=sys.stderr)
        hand.stop()
        proxy.close()
        box.stop()
        shutil.rmtree(root, ignore_errors=True)

    print_table(results, rtt)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


def print_table(results: dict[str, Any], rtt: float) -> None:
    rows: list[tuple[str, float]] = [
        ("outrig deploy --no-wait (library call)", median(results["outrig_library"])),
    ]
    if results.get("outrig_cli"):
        rows.append(("outrig `inv deploy --no-wait` (CLI, incl. start-up)",
                     median(results["outrig_cli"])))
        rows.append(("  of which: `inv plan` start-up, no network",
                     median(results["inv_plan_no_network"])))
    rows.append(("  outrig: SSH connect (TCP, kex, auth)", median(results["outrig_connect"])))
    rows.append(("  outrig: agent call (channel, exec, push, launch)",
                 median(results["outrig_agent_call"])))
    rows.append(("hand-made: scp + 4 × ssh (5 connections)", median(results["hand_made"])))
    for step, seconds in results["hand_made_steps"].items():
        rows.append((f"  {step}", seconds))
    rows.append(("floor: ssh box true", median(results["floor_ssh_true"])))
    width = max(len(r[0]) for r in rows)
    print(f"\nRTT {rtt * 1000:.0f} ms (latency proxy), median of {results['repeat']} "
          f"(after 1 warm-up); channel-open RTT measured by outrig: "
          f"{median(results['outrig_channel_rtt']) * 1000:.0f} ms\n")
    print(f"| {'method':<{width}} | seconds (median) | RTT multiples |")
    print(f"|{'-' * (width + 2)}|------------------|---------------|")
    for name, seconds in rows:
        print(f"| {name:<{width}} | {seconds:16.2f} | {seconds / rtt:13.1f} |")


if __name__ == "__main__":
    sys.exit(main())
