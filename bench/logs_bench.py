#!/usr/bin/env python3
"""tail-logs benchmark at a slow link: time to the first line, and streaming throughput vs
``ssh host cat file`` over the same link.

Starts the sandbox box (a real OpenSSH sshd on 127.0.0.1, throwaway keys) and a latency proxy
in front of it (one-way delay = RTT / 2), makes a run with logs on the box, then measures
through the proxy:

- ``first line``: from the call to ``outrig.ops.logs.tail_logs(lines=1, follow=False)`` (fresh
  connection: TCP, key exchange, auth) until the first log line is written to the screen;
  ``connect`` is the SSH connection set-up inside that, and the rest is shown in RTTs (target:
  first line ≤ connect + 2 RTT). Also the same through the ``inv`` CLI, Python start included.
- ``throughput``: a whole log streamed from byte 0 with ``--no-follow`` (into the mirror, with
  fsync, and printed to /dev/null) vs ``ssh -o ... host cat file > /dev/null`` with the OpenSSH
  client over the same proxy, for realistic (compressible) log text and for incompressible text;
  and a log growing as fast as a writer can append, followed live (bytes/s while it grows).

Usage:  python bench/logs_bench.py [--rtt-ms 240] [--mib 64] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from outrig.console import Reporter  # noqa: E402
from outrig.journal import Journal  # noqa: E402
from outrig.ops.logs import LogTailer, tail_logs  # noqa: E402
from outrig.sandbox.box import start_sandbox  # noqa: E402
from outrig.sandbox.proxy import LatencyProxy  # noqa: E402
from outrig.session import HostSession, Project  # noqa: E402

RUN_ID = "bench-20260101-000000-0000"
PROJECT = Project(REPO)


def make_run(workdir: Path, names: list[str]) -> Path:
    logs = workdir / "runs" / RUN_ID / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (workdir / "runs" / RUN_ID / "run.json").write_text(json.dumps({
        "v": 1, "run_id": RUN_ID, "playbook": "bench", "status": "running",
        "processes": [{"name": n, "log": str(logs / f"{n}.log")} for n in names]}))
    (workdir / ".outrig" / "current").mkdir(parents=True, exist_ok=True)
    (workdir / ".outrig" / "current" / "bench").write_text(RUN_ID + "\n")
    return logs


def realistic_lines(nbytes: int, seed: int = 1) -> bytes:
    """Trainer-like metric lines with varying numbers (compresses like a real log)."""
    rng = random.Random(seed)
    out, size, step = [], 0, 0
    while size < nbytes:
        step += 1
        line = (f"[11/30/26 03:{step // 60 % 60:02d}:{step % 60:02d}] INFO     "
                f"train/loss={rng.uniform(0.5, 6):.3f}, train/full_acc={rng.random():.3f}, "
                f"train/eal={rng.uniform(1, 8):.3f}, profile/step_ms={rng.uniform(150, 300):.3f},"
                f" profile/tokens_per_s={rng.uniform(2e4, 5e4):.2e}, epoch=0, "
                f"global_step={step}\n").encode()
        out.append(line)
        size += len(line)
    return b"".join(out)[:nbytes]


def random_lines(nbytes: int) -> bytes:
    """Incompressible printable lines (base64 of random bytes), the worst case for outrig."""
    raw = base64.b64encode(os.urandom(nbytes * 3 // 4 + 100))
    lines = [raw[i:i + 99] + b"\n" for i in range(0, len(raw), 99)]
    return b"".join(lines)[:nbytes]


class Bench:
    def __init__(self, rtt_ms: float) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="outrig-logs-bench-"))
        os.environ["XDG_STATE_HOME"] = str(self.root / "state")
        self.box = start_sandbox(self.root / "box")
        self.proxy = LatencyProxy("127.0.0.1", self.box.port, one_way_delay=rtt_ms / 2000.0)
        self.proxy.start()
        self.workdir = self.root / "workdir"
        self.workdir.mkdir()
        self.host = self.box.write_host_file(self.root / "bench.yaml", workdir=self.workdir,
                                             port=self.proxy.port)
        self.logs = make_run(self.workdir, ["trainer", "fast", "noise"])

    def journal(self) -> Journal:
        """A fresh state dir each time: no cursor, no cached RTT (a cold start)."""
        return Journal(Path(tempfile.mkdtemp(dir=self.root, prefix="state-")))

    # -- first line

    def first_line(self) -> dict[str, float]:
        journal = self.journal()
        reporter = Reporter(out=io.StringIO(), err=io.StringIO())
        started = time.monotonic()
        session = HostSession(PROJECT, str(self.host), reporter, journal)
        tailer = LogTailer(session, lines=1, follow=False, processes=["trainer"])
        transport: Any = session.transport
        real_connect = transport.connect
        spent: list[float] = []

        def timed_connect() -> None:  # the whole connect: config, TCP, kex, auth
            t0 = time.monotonic()
            real_connect()
            spent.append(time.monotonic() - t0)

        transport.connect = timed_connect
        try:
            result = tailer.run()
        finally:
            connect = spent[0] if spent else 0.0
            rtt = session.transport.rtt or 0.0
            session.close()
        assert result.first_line_at is not None
        total = result.first_line_at + (tailer.started - started)
        return {"first_line": total, "connect": connect, "rtt": rtt}

    def agent_start(self) -> float:
        """Seconds from spawning the agent (python3 + the compressed source on stdin) to its
        first event, on this machine: the box's share of the first line."""
        from outrig.agent.client import agent_command, agent_payload

        request = {"v": 1, "op": "follow", "workdir": str(self.workdir), "env": {},
                   "run_id": RUN_ID, "processes": ["trainer"], "lines": 1, "follow": False}
        started = time.monotonic()
        proc = subprocess.Popen(agent_command("python3"), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(agent_payload() + json.dumps(request).encode() + b"\n")
        proc.stdin.flush()
        proc.stdout.readline()
        elapsed = time.monotonic() - started
        proc.communicate(timeout=30)
        return elapsed

    def first_line_cli(self) -> float:
        env = {**os.environ, "XDG_STATE_HOME": str(self.root / "cli-state")}
        shutil.rmtree(self.root / "cli-state", ignore_errors=True)
        inv = shutil.which("inv", path=str(Path(sys.executable).parent)) or "inv"
        started = time.monotonic()
        proc = subprocess.Popen(
            [inv, "tail-logs", "--host", str(self.host), "--process", "trainer", "--lines", "1",
             "--no-follow"], cwd=REPO, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL)
        assert proc.stdout is not None
        proc.stdout.readline()
        elapsed = time.monotonic() - started
        proc.wait(60)
        return elapsed

    # -- throughput

    def ssh_cat(self, path: Path) -> float:
        argv = ["ssh", "-i", str(self.box.identity_file), "-p", str(self.proxy.port),
                "-o", f"UserKnownHostsFile={self.root / 'ssh_known_hosts'}",
                "-o", "StrictHostKeyChecking=accept-new", "-o", "BatchMode=yes",
                "-o", "ControlMaster=no", "-o", "LogLevel=ERROR",
                f"{self.box.user}@127.0.0.1", "cat", str(path)]
        started = time.monotonic()
        subprocess.run(argv, stdout=subprocess.DEVNULL, check=True, timeout=600)
        return time.monotonic() - started

    def outrig_once(self, process: str) -> tuple[float, int]:
        devnull = open(os.devnull, "w")  # noqa: SIM115
        try:
            started = time.monotonic()
            result = tail_logs(PROJECT, str(self.host), Reporter(out=devnull,
                                                                 err=io.StringIO()),
                               processes=[process], follow=False, journal=self.journal())
            return time.monotonic() - started, result.bytes
        finally:
            devnull.close()

    def growing(self, seconds: float) -> dict[str, float]:
        """A writer appends 64 KiB blocks as fast as it can; tail-logs follows it live."""
        path = self.logs / "fast.log"
        path.write_bytes(b"")
        journal = self.journal()
        stop = threading.Event()
        reporter = Reporter(out=open(os.devnull, "w"), err=io.StringIO())  # noqa: SIM115
        session = HostSession(PROJECT, str(self.host), reporter, journal)
        tailer = LogTailer(session, follow=True, processes=["fast"], stop=stop)
        thread = threading.Thread(target=tailer.run, daemon=True)
        thread.start()
        while tailer.result.run_id is None:
            time.sleep(0.05)
        block = realistic_lines(64 * 1024, seed=7)
        written = 0
        started = time.monotonic()
        with open(path, "ab", buffering=0) as f:
            while time.monotonic() - started < seconds:
                f.write(block)
                written += len(block)
                time.sleep(0.0005)
        wrote_for = time.monotonic() - started
        while tailer.result.bytes < written and time.monotonic() - started < seconds + 120:
            time.sleep(0.01)
        caught_up = time.monotonic() - started
        stop.set()
        thread.join(30)
        session.close()
        return {"written_mib": written / 2**20, "write_rate": written / wrote_for / 1e6,
                "follow_rate": tailer.result.bytes / caught_up / 1e6,
                "lag_s": caught_up - wrote_for}

    def close(self) -> None:
        self.proxy.close()
        self.box.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rtt-ms", type=float, default=240.0)
    parser.add_argument("--mib", type=int, default=64, help="size of the streamed logs")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--grow-seconds", type=float, default=8.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    bench = Bench(args.rtt_ms)
    report: dict[str, Any] = {"rtt_ms": args.rtt_ms, "mib": args.mib}
    try:
        (bench.logs / "trainer.log").write_bytes(realistic_lines(1 << 20))
        bench.first_line()  # warm-up: imports, host key recording
        runs = [bench.first_line() for _ in range(args.repeat)]
        report["first_line"] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        report["agent_start"] = statistics.median(bench.agent_start() for _ in range(3))
        report["first_line_cli"] = statistics.median(
            bench.first_line_cli() for _ in range(args.repeat))

        size = args.mib << 20
        cases = {"realistic log text": realistic_lines(size), "incompressible text":
                 random_lines(size)}
        report["throughput"] = {}
        for label, data in cases.items():
            (bench.logs / "noise.log").write_bytes(data)
            bench.ssh_cat(bench.logs / "noise.log")  # warm-up
            cat = statistics.median(bench.ssh_cat(bench.logs / "noise.log")
                                    for _ in range(args.repeat))
            ours = [bench.outrig_once("noise") for _ in range(args.repeat)]
            assert all(n == len(data) for _, n in ours), "outrig streamed a different size"
            outrig = statistics.median(t for t, _ in ours)
            report["throughput"][label] = {"ssh_cat_mb_s": len(data) / cat / 1e6,
                                           "outrig_mb_s": len(data) / outrig / 1e6,
                                           "ratio": cat / outrig}
        report["growing"] = bench.growing(args.grow_seconds)
    finally:
        bench.close()

    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    fl = report["first_line"]
    rtt = fl["rtt"]
    extra = (fl["first_line"] - fl["connect"]) / rtt if rtt else float("nan")
    print(f"tail-logs at {args.rtt_ms:.0f} ms RTT (sandbox sshd + latency proxy), "
          f"median of {args.repeat}")
    print()
    print("| measure | value | target |")
    print("|---|---|---|")
    print(f"| first line on screen (library, cold connection) | {fl['first_line']:.2f} s | "
          f"≤ connect + 2 RTT = {fl['connect'] + 2 * rtt:.2f} s |")
    print(f"| of which SSH connect (TCP, kex, auth) | {fl['connect']:.2f} s | |")
    after = fl["first_line"] - fl["connect"]
    start = report["agent_start"]
    print(f"| after connect | {after:.2f} s = {extra:.1f} RTT | ≤ 2 RTT |")
    print(f"| ... of which: 2 RTT on the wire (channel open; request → first chunk) | "
          f"{2 * rtt:.2f} s | |")
    print(f"| ... of which: agent start on the box (python3, decompress, compile, first "
          f"event; measured locally) | {start:.2f} s | |")
    print(f"| ... of which: the rest (sshd exec, client) | {after - 2 * rtt - start:.2f} s | |")
    print(f"| first line via `inv tail-logs` (Python + Invoke start-up included) | "
          f"{report['first_line_cli']:.2f} s | |")
    for label, row in report["throughput"].items():
        print(f"| {args.mib} MiB {label}: outrig vs `ssh cat` | {row['outrig_mb_s']:.1f} vs "
              f"{row['ssh_cat_mb_s']:.1f} MB/s = {row['ratio'] * 100:.0f}% | ≥ 80% |")
    grow = report["growing"]
    print(f"| growing log ({grow['written_mib']:.0f} MiB written at {grow['write_rate']:.1f} "
          f"MB/s), followed live | {grow['follow_rate']:.1f} MB/s, caught up "
          f"{grow['lag_s']:.2f} s after the writer stopped | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
