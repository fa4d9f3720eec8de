#!/usr/bin/env python3
"""Stage benchmark: pushing shards to a box over a slow link, outrig vs rsync, and the re-run.

Starts the sandbox box (a real OpenSSH sshd on 127.0.0.1) behind a latency proxy (one-way
delay = RTT / 2) and a folder of random shards on the workstation, then times, through the
proxy:
- ``outrig stage``: the folder as a playbook ``stage:`` item (parallel streams, part files,
  sha256 verification, stage mark);
- ``rsync -a`` over ``ssh`` (one stream, the usual way);
- the re-run of each on the already-staged box (outrig: one agent exec; rsync: its file list).

Usage:  python bench/stage_bench.py [--rtt-ms 240] [--mb 1024] [--shards 8] [--streams 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
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
    parser.add_argument("--mb", type=int, default=1024, help="total size of the shards")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if shutil.which("rsync") is None:
        print("rsync is not installed (apt-get install -y rsync)", file=sys.stderr)
        return 2

    import yaml

    from outrig.console import Reporter
    from outrig.journal import Journal
    from outrig.ops.stage import stage
    from outrig.sandbox.box import start_sandbox
    from outrig.sandbox.proxy import LatencyProxy
    from outrig.session import Project

    root = Path(tempfile.mkdtemp(prefix="outrig-bench-stage-"))
    os.environ["XDG_STATE_HOME"] = str(root / "state")
    box = start_sandbox(root / "box")
    proxy = LatencyProxy(box.host, box.port, one_way_delay=args.rtt_ms / 2000.0).start()
    rtt = args.rtt_ms / 1000.0
    rows: dict[str, Any] = {}
    try:
        shards = root / "shards"
        shards.mkdir()
        each = args.mb * (1 << 20) // args.shards
        for index in range(args.shards):
            with open(shards / f"data-{index:05d}.arrow", "wb") as handle:
                left = each
                while left:
                    block = os.urandom(min(left, 8 << 20))
                    handle.write(block)
                    left -= len(block)
        total = each * args.shards
        host = str(box.write_host_file(root / "bench.yaml", port=proxy.port))
        book = root / "bench-stage.yaml"
        book.write_text(yaml.safe_dump({"name": "bench", "processes": {"a": {"command": "true"}},
                                        "stage": {"data": {"path": str(root / "on-box"),
                                                           "source": str(shards)}}}))
        project = Project(REPO)
        journal = Journal(root / "state" / "outrig")
        quiet = Reporter(quiet=True)

        def timed_stage() -> float:
            started = time.monotonic()
            stage(project, host, str(book), quiet, journal=journal, streams=args.streams)
            return time.monotonic() - started

        rows["outrig stage (push)"] = timed_stage()
        rows["outrig stage re-run (staged)"] = timed_stage()

        ssh = (f"ssh -p {proxy.port} -i {box.identity_file} -o BatchMode=yes "
               f"-o UserKnownHostsFile={root / 'rsync_known'} -o StrictHostKeyChecking=accept-new "
               "-o ControlMaster=no -F /dev/null")
        target = f"{box.user}@127.0.0.1:{root / 'rsync-box'}/"

        def timed_rsync() -> float:
            started = time.monotonic()
            subprocess.run(["rsync", "-a", "-e", ssh, f"{shards}/", target], check=True)
            return time.monotonic() - started

        rows["rsync -a over ssh"] = timed_rsync()
        rows["rsync re-run (nothing changed)"] = timed_rsync()
    finally:
        proxy.close()
        box.stop()
        shutil.rmtree(root, ignore_errors=True)

    if args.json:
        print(json.dumps({"rtt_ms": args.rtt_ms, "bytes": total, "seconds": rows}, indent=2))
        return 0
    print(f"{args.mb} MiB in {args.shards} shards, {args.rtt_ms:.0f} ms RTT, "
          f"{args.streams} outrig streams")
    print("| method | seconds | MB/s | RTT multiples |")
    print("|---|---:|---:|---:|")
    for name, seconds in rows.items():
        rate = total / seconds / 1e6 if "re-run" not in name else 0.0
        print(f"| {name} | {seconds:.2f} | {rate:.1f} | {seconds / rtt:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
