#!/usr/bin/env python3
"""Cleanup benchmark: one agent exec stops a 3-process run over a slow link.

Starts the sandbox box (a real OpenSSH sshd on 127.0.0.1) behind a latency proxy (one-way
delay = RTT / 2), deploys a run of three processes that exit promptly on SIGTERM, connects,
then times the cleanup call alone (the connection is already up: the issue's budget is
"3 RTT plus the processes' own exit time" after connect). The processes' own exit time is what
the agent measured for each stop (they are stopped one after the other, in reverse order).

Usage:  python bench/cleanup_bench.py [--rtt-ms 240] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SLEEPER = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n" \
          "time.sleep(3600)\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtt-ms", type=float, default=240.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from outrig.console import Reporter
    from outrig.journal import Journal
    from outrig.ops.deploy import deploy
    from outrig.sandbox.box import start_sandbox
    from outrig.sandbox.proxy import LatencyProxy
    from outrig.session import HostSession, Project

    root = Path(tempfile.mkdtemp(prefix="outrig-bench-cleanup-"))
    os.environ["XDG_STATE_HOME"] = str(root / "state")
    box = start_sandbox(root / "box")
    proxy = LatencyProxy(box.host, box.port, one_way_delay=args.rtt_ms / 2000.0).start()
    project = Project(REPO)
    journal = Journal(root / "state" / "outrig")
    quiet = Reporter(quiet=True)
    rows: list[dict[str, Any]] = []
    try:
        host = str(box.write_host_file(root / "bench.yaml", port=proxy.port))
        playbook = root / "three.yaml"
        processes = {
            name: {"command": [sys.executable, "-c", SLEEPER], "stop": {"grace": 10}}
            for name in ("a", "b", "c")
        }
        import yaml

        playbook.write_text(yaml.safe_dump({"name": "three", "processes": processes}))
        for _ in range(args.repeat):
            deploy(project, host, str(playbook), quiet, wait=True, journal=journal)
            session = HostSession(project, host, quiet, journal)
            try:
                session.transport.connect()
                started = time.monotonic()
                result = session.call("cleanup", stream=False, playbook="three",
                                      gpu_timeout=30)
                seconds = time.monotonic() - started
                rtt = session.transport.rtt or args.rtt_ms / 1000.0
            finally:
                session.close()
            stops = result["runs"][0]["processes"]
            exit_time = sum(float(p["seconds"]) for p in stops)
            rows.append({"seconds": seconds, "rtt": rtt, "exit_time": exit_time,
                         "overhead_rtt": (seconds - exit_time) / rtt,
                         "how": [p["how"] for p in stops]})
    finally:
        proxy.close()
        box.stop()
        shutil.rmtree(root, ignore_errors=True)

    median = statistics.median(r["seconds"] for r in rows)
    exit_median = statistics.median(r["exit_time"] for r in rows)
    rtt = statistics.median(r["rtt"] for r in rows)
    overhead = (median - exit_median) / rtt
    summary = {"rtt_ms": round(rtt * 1000, 1), "cleanup_s": round(median, 3),
               "processes_exit_s": round(exit_median, 3), "overhead_rtt": round(overhead, 2),
               "budget_rtt": 3, "runs": rows}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"cleanup of a 3-process run over a {rtt * 1000:.0f} ms RTT link "
              f"(median of {len(rows)}, connection already open)")
        print(f"  cleanup call             {median:6.3f} s  = {median / rtt:5.2f} RTT")
        print(f"  processes' own exit time {exit_median:6.3f} s")
        print(f"  outrig overhead          {median - exit_median:6.3f} s  = {overhead:5.2f} RTT "
              f"(budget 3 RTT)")
        print(f"  how they ended: {rows[-1]['how']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
