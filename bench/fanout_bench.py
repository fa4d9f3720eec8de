#!/usr/bin/env python3
"""Fan-out benchmark: ``status`` on N sandbox boxes at once over a slow link.

Starts N sandbox boxes (each its own OpenSSH sshd on 127.0.0.1, keys, workdir and fake
GPUs), each behind its own latency proxy (one-way delay = RTT / 2), writes a host file per
box, and times ``status`` across 1, 5 and N of them (cold connections: no warm keeper).
Then 3 of the N go bad, one refusing (its sshd stopped), one blackholed (connects get no
answer), one stalled (connects are accepted, nothing is forwarded), and ``status`` runs on
all N again: it prints when the healthy boxes' results were in, when the command ended (the
bad ones' deadline) and each bad box's reason.

``--deadline S`` gives the bad round a per-host deadline (``outrig status --deadline S``)
instead of the RTT-derived default.

Usage:  python bench/fanout_bench.py [--rtt-ms 240] [--boxes 20] [--repeat 3]
                                     [--deadline S] [--json]
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtt-ms", type=float, default=240.0)
    parser.add_argument("--boxes", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="outrig-bench-fanout-"))
    os.environ["XDG_STATE_HOME"] = str(root / "state")
    os.environ["OUTRIG_KEEP_SECONDS"] = "0"  # every round connects afresh

    from outrig.fanout import run_fanout
    from outrig.ops.base import Project
    from outrig.ops.status import status_on
    from outrig.sandbox.box import SandboxBox, start_sandbox
    from outrig.sandbox.proxy import LatencyProxy

    boxes: list[SandboxBox] = []
    proxies: list[LatencyProxy] = []
    try:
        for i in range(args.boxes):
            box = start_sandbox(root / f"box{i}", name=f"b{i}")
            boxes.append(box)
            proxy = LatencyProxy(box.host, box.port,
                                 one_way_delay=args.rtt_ms / 2000.0).start()
            proxies.append(proxy)
            box.write_host_file(root / "project" / "hosts" / f"b{i}.yaml", port=proxy.port)
        project = Project(root / "project")
        names = [f"b{i}" for i in range(args.boxes)]

        def core(session: Any) -> dict[str, Any]:
            return status_on(session, log_lines=0)

        def timed(hosts: list[str], deadline: float | None = None) -> tuple[float, list[Any]]:
            start = time.monotonic()
            outcomes = run_fanout(project, hosts, core, deadline=deadline)
            return time.monotonic() - start, outcomes

        timed(names)  # first contact: host keys recorded, RTTs in the journal
        rows: dict[str, Any] = {}
        for count in sorted({1, min(5, args.boxes), args.boxes}):
            runs = [timed(names[:count]) for _ in range(args.repeat)]
            assert all(o.ok for _, outcomes in runs for o in outcomes), runs
            rows[f"N={count}"] = round(statistics.median(t for t, _ in runs), 2)

        bad = {names[-3]: "refusing", names[-2]: "blackholed", names[-1]: "stalled"}
        boxes[-3].stop()
        proxies[-2].blackhole_all(drop_new=True)
        proxies[-1].stall_all(3600)
        total, outcomes = timed(names, args.deadline)
        healthy = [o for o in outcomes if o.host not in bad]
        rows["dead"] = {
            "healthy_ok": sum(o.ok for o in healthy), "healthy": len(healthy),
            "healthy_in_s": round(max(o.seconds for o in healthy), 2),
            "total_s": round(total, 2),
            "bad": {f"{o.host} ({bad[o.host]})": f"{o.state}: {o.error}"
                    for o in outcomes if o.host in bad}}
        report = {"rtt_ms": args.rtt_ms, "boxes": args.boxes, "repeat": args.repeat,
                  "status_seconds_median": {k: v for k, v in rows.items() if k != "dead"},
                  f"with_3_bad_of_{args.boxes}": rows["dead"]}
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            for key, value in report["status_seconds_median"].items():
                print(f"status on {key:6} boxes at {args.rtt_ms:.0f} ms RTT: {value:.2f} s")
            dead = rows["dead"]
            print(f"with 3 bad of {args.boxes}: {dead['healthy_ok']}/{dead['healthy']} "
                  f"healthy boxes answered, the last after {dead['healthy_in_s']:.2f} s; the "
                  f"command ended after {dead['total_s']:.2f} s")
            for host, why in dead["bad"].items():
                print(f"  {host}: {why}")
        return 0
    finally:
        for proxy in proxies:
            proxy.close()
        for box in boxes:
            box.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
