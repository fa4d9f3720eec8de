#!/usr/bin/env python3
"""Warm-connection benchmark: what a second command costs, cold vs warm, over a slow link.

Starts the sandbox box (a real OpenSSH sshd on 127.0.0.1) behind a latency proxy (one-way
delay = RTT / 2) and times, through the proxy, in RTT multiples:

- ``status`` in process (``outrig.ops.status.status``, no Python start-up): cold (a
  direct connection, ``OUTRIG_KEEP_SECONDS=0``), the first command with keeping on (it starts
  the keeper, which connects), and a second command through the keeper;
- the same through the ``outrig`` CLI as a subprocess, with the CLI's own start-up measured
  apart (``outrig status`` with an unknown host: the same imports, exit 2, no network);
- ``status`` on ``hostname: local``: the agent's own time, with no link at all;
- OpenSSH ``ssh box true``: plain, and through a ControlMaster (``ControlPersist``), first
  and second command.

The proxy counts TCP connections: the warm commands must open none. Everything is stopped at
the end (keepers by ``connections --close``, the ControlMaster by ``ssh -O exit``).

Usage:  python bench/warm_rtt.py [--rtt-ms 240] [--repeat 3] [--json]
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

REPO = Path(__file__).resolve().parent.parent
OUTRIG = [sys.executable, "-c",
          "import sys; from outrig.cli import program; program.run(['outrig', *sys.argv[1:]])"]


def timed(argv: list[str], env: dict[str, str] | None = None, expect: int = 0) -> float:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env=env, cwd=REPO)
    seconds = time.monotonic() - started
    if done.returncode != expect:
        raise SystemExit(f"{argv[:4]} failed ({done.returncode}):\n{done.stderr}")
    return seconds


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtt-ms", type=float, default=240.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rtt = args.rtt_ms / 1000.0

    root = Path(tempfile.mkdtemp(prefix="outrig-warm-"))
    os.environ["XDG_STATE_HOME"] = str(root / "state")
    os.environ["OUTRIG_RUNTIME_DIR"] = str(root / "run")

    from outrig.connectors.kept import close_keepers, wait_gone
    from outrig.console import Reporter
    from outrig.journal import Journal
    from outrig.ops.base import Project
    from outrig.ops.status import status
    from outrig.sandbox.box import start_sandbox
    from outrig.sandbox.proxy import LatencyProxy

    project = Project(REPO)
    journal = Journal(root / "state" / "outrig")
    box = start_sandbox(root / "box", name="bench")
    proxy = LatencyProxy(box.host, box.port, one_way_delay=rtt / 2).start()
    host_file = box.write_host_file(root / "bench.yaml", port=proxy.port)
    ssh_opts = ["-F", "/dev/null", "-p", str(proxy.port), "-i", str(box.identity_file),
                "-o", f"UserKnownHostsFile={box.known_hosts}",
                "-o", "StrictHostKeyChecking=accept-new", "-o", "BatchMode=yes",
                "-o", "LogLevel=ERROR"]
    target = f"{box.user}@{box.host}"
    control = ["-o", "ControlMaster=auto", "-o", f"ControlPath={root}/cm-%C",
               "-o", "ControlPersist=600"]

    local_file = root / "local.yaml"
    local_file.write_text(f"hostname: local\nworkdir: {box.workdir}\n")

    def in_process(keep: str, host: Path = host_file) -> tuple[float, int]:
        os.environ["OUTRIG_KEEP_SECONDS"] = keep
        before = proxy.accepted
        started = time.monotonic()
        status(project, str(host), Reporter(quiet=True), journal=journal)
        return time.monotonic() - started, proxy.accepted - before

    def close_all() -> None:
        for entry in close_keepers():
            wait_gone(int(entry["pid"]), 10.0)

    rows: dict[str, list[float]] = {}
    connections: dict[str, int] = {}

    def add(name: str, seconds: float, opened: int | None = None) -> None:
        rows.setdefault(name, []).append(seconds)
        if opened is not None:
            connections[name] = connections.get(name, 0) + opened

    try:
        in_process("0")  # warm-up: host key recorded, agent unpacked, RTT in the journal
        for _ in range(args.repeat):
            add("status, direct (--no-keep), in process", *in_process("0"))
            close_all()
            add("status, first with keeping (starts the keeper), in process",
                *in_process("600"))
            add("status, second through the keeper, in process", *in_process("600"))
            add("status on hostname: local (the agent's own time, no link), in process",
                *in_process("0", local_file))
            close_all()
            env = {**os.environ, "OUTRIG_KEEP_SECONDS": "600"}
            status_cmd = [*OUTRIG, "status", "--host", str(host_file), "--json"]
            add("outrig status --no-keep (CLI)", timed([*status_cmd, "--no-keep"], env))
            add("outrig status, first (CLI, starts the keeper)", timed(status_cmd, env))
            before = proxy.accepted
            add("outrig status, second (CLI, through the keeper)", timed(status_cmd, env),
                proxy.accepted - before)
            close_all()
            add("CLI start-up (outrig status --host no-such-host: exits 2, no network)",
                timed([*OUTRIG, "status", "--host", "no-such-host"], env, expect=2))
            add("ssh box true (OpenSSH, no ControlMaster)",
                timed(["ssh", *ssh_opts, target, "true"]))
            add("ssh box true, first (ControlMaster starts)",
                timed(["ssh", *ssh_opts, *control, target, "true"]))
            add("ssh box true, second (through ControlMaster)",
                timed(["ssh", *ssh_opts, *control, target, "true"]))
            subprocess.run(["ssh", *ssh_opts, *control, "-O", "exit", target],
                           capture_output=True, stdin=subprocess.DEVNULL)
    finally:
        close_all()
        proxy.close()
        box.stop()
        shutil.rmtree(root, ignore_errors=True)

    print(f"RTT {args.rtt_ms:.0f} ms, median of {args.repeat}")
    print(f"{'what':<64} {'seconds':>8} {'RTT':>6}")
    for name, values in rows.items():
        print(f"{name:<64} {median(values):>8.3f} {median(values) / rtt:>6.1f}")
    for name, count in connections.items():
        print(f"TCP connections opened by '{name}': {count} in {args.repeat} runs")
    if args.json:
        print(json.dumps({"rtt_ms": args.rtt_ms, "rows": rows, "connections": connections},
                         indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
