#!/usr/bin/env python3
"""Dead-link benchmark: how long `status`, `check` and `deploy` take to report a link that is
already dead, through the warm connection (the keeper) and with keeping off (``--no-keep``).

Starts the sandbox box (a real OpenSSH sshd on 127.0.0.1) behind the latency proxy. Per round
and per command: one command that works (it records the RTT in the journal and, with keeping
on, leaves a keeper holding the link), then the proxy blackholes everything (live connections
go silent, new connects get no answer) and the same command is run through the ``outrig``
CLI; its wall time to exit is the "seconds to report". The proxy is restored and the keepers
closed (by their recorded pid) before the next round. The host file sets no
``connect_timeout``: the limits are the RTT-scaled ones of ``outrig/timing.py``, as a user gets.

The ratio column is keeper on over keeper off: the issue's rule is that it stays ≤ 1.

Usage:  python bench/dead_link.py [--rtt-ms 10] [--repeat 1] [--commands status,check,deploy]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
OUTRIG = [sys.executable, "-c",
          "import sys; from outrig.cli import program; program.run(['outrig', *sys.argv[1:]])"]


def run(argv: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """Seconds, exit status and stderr of one CLI command."""
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env=env, cwd=REPO, timeout=600)
    return time.monotonic() - started, done.returncode, done.stderr


def what_fired(stderr: str) -> str:
    """The limits the error names: the keeper's keepalive, then the connect attempts, or
    the mid-call limit (what the warm path waited out before the probe)."""
    said = " ".join(stderr.split())
    parts = []
    if "no answer to a keepalive within" in said:
        parts.append("keepalive " + said.split("no answer to a keepalive within ")[1]
                     .split(" ")[0] + " s")
    tried = re.findall(r"Tried (\d+) time", said)
    limit = re.findall(r"connect timeout of ([\d.]+) s", said)
    if tried and limit:
        parts.append(f"{tried[-1]} × connect {limit[-1]} s")
    if "lost contact with the agent" in said:
        parts.append("mid-call limit " + said.split("(limit ")[1].split(")")[0])
    if "keeps running" in said:
        parts.append('says "keeps running"')
    return ", ".join(parts) or said[-160:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtt-ms", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--commands", default="status,check,deploy")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="outrig-dead-"))
    os.environ["XDG_STATE_HOME"] = str(root / "state")
    os.environ["OUTRIG_RUNTIME_DIR"] = str(root / "run")

    from outrig.connectors.keeper.client import close_keepers, wait_gone
    from outrig.sandbox.box import start_sandbox
    from outrig.sandbox.proxy import LatencyProxy

    box = start_sandbox(root / "box", name="bench")
    proxy = LatencyProxy(box.host, box.port, one_way_delay=args.rtt_ms / 2000).start()
    host_file = box.write_host_file(root / "bench.yaml", port=proxy.port)
    book = root / "deadlink.yaml"
    book.write_text(yaml.safe_dump({"name": "deadlink", "processes": {"svc": {
        "command": [sys.executable, "-u", "-c", "import time\nprint('up', flush=True)\n"
                    "time.sleep(600)"], "ready": {"log": "up", "timeout": 30}}}}))
    argv = {"status": ["status", "--host", str(host_file)],
            "check": ["check", "--host", str(host_file)],
            "deploy": ["deploy", "--host", str(host_file), "--playbook", str(book)]}
    results: dict[str, dict[str, list[float]]] = {}
    lines: dict[str, str] = {}  # what fired, per command and mode (the last round's)
    try:
        for _ in range(args.repeat):
            for command in args.commands.split(","):
                for mode, extra, keep in (("keeper on", [], "600"),
                                          ("keeper off", ["--no-keep"], "0")):
                    env = {**os.environ, "OUTRIG_KEEP_SECONDS": keep}
                    warm = [*OUTRIG, *argv[command if command != "deploy" else "status"],
                            *extra]
                    seconds, code, said = run(warm, env)
                    if code != 0:
                        raise SystemExit(f"the working {command} failed ({code}): {said}")
                    proxy.blackhole_all(drop_new=True)
                    try:
                        seconds, code, said = run([*OUTRIG, *argv[command], *extra], env)
                    finally:
                        proxy.restore()
                        for entry in close_keepers():
                            wait_gone(int(entry["pid"]), 10.0)
                    results.setdefault(command, {}).setdefault(mode, []).append(seconds)
                    lines[f"{command}, {mode}"] = f"exit {code}: {what_fired(said)}"
    finally:
        proxy.close()
        box.stop()
    table = {c: {m: statistics.median(v) for m, v in modes.items()}
             for c, modes in results.items()}
    if args.json:
        print(json.dumps({"rtt_ms": args.rtt_ms, "seconds": table, "last_lines": lines}))
        return 0
    print(f"RTT {args.rtt_ms:g} ms, median of {args.repeat}")
    print(f"{'command':<8} {'keeper on':>10} {'keeper off':>11} {'ratio':>6}")
    for command, modes in table.items():
        on, off = modes["keeper on"], modes["keeper off"]
        print(f"{command:<8} {on:>10.1f} {off:>11.1f} {on / off:>6.2f}")
    for name, line in lines.items():
        print(f"  {name}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
