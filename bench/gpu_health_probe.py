#!/usr/bin/env python3
"""The GPU health probe on the machine it runs on: its wall time and what it reads.

Runs the agent's own probe code (``remote/agent/gpus.py``: one ``nvidia-smi --query-gpu``
holding the inventory and the health fields, ``dmesg``'s Xid lines read beside it) and the
judge (``remote/agent/gpu_judge.py``) straight from this checkout: python3 and the checkout
are all it needs, no install (the agent is stdlib only).

What it times, each ``--runs`` times (median, min, max), so the probe's cost reads as a
ratio to what it replaces or avoids, measured in the same run:

* ``probe``: :func:`gather_facts` as the agent runs it for ``check``, ``status`` and
  ``deploy`` (nvidia-smi with the health fields, dmesg beside it);
* ``inventory_only``: the inventory query alone, what the agent asked before the health
  fields were folded in (the extra cost of the health fields is the difference);
* ``dmesg``: the kernel log read alone;
* ``nvidia_smi_q``: ``nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER,TEMPERATURE,POWER,
  CLOCK,PERFORMANCE``, the full report a probe could have parsed instead.

It prints one JSON document: the timings and ratios, the raw query output (with its header,
to see the names the driver answers under), the raw facts and each GPU's verdict.

Usage: python3 bench/gpu_health_probe.py [--runs 7] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from remote.agent import gpu_judge, gpus  # noqa: E402  (the checkout, not an install)

Q_SECTIONS = "ECC,PAGE_RETIREMENT,ROW_REMAPPER,TEMPERATURE,POWER,CLOCK,PERFORMANCE"


def timed(body: Callable[[], Any], runs: int) -> tuple[dict[str, float], Any]:
    """``body`` run ``runs`` times: (median/min/max seconds, the last answer)."""
    seconds: list[float] = []
    answer: Any = None
    for _ in range(runs):
        start = time.perf_counter()
        answer = body()
        seconds.append(time.perf_counter() - start)
    return ({"median": round(statistics.median(seconds), 4), "min": round(min(seconds), 4),
             "max": round(max(seconds), 4), "runs": runs}, answer)


def smi(args: list[str]) -> str:
    """nvidia-smi's output (stdout and stderr, with its exit status when not 0)."""
    exe = shutil.which("nvidia-smi") or "nvidia-smi"
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60,
                          check=False)
    text = proc.stdout + proc.stderr
    return text if proc.returncode == 0 else f"{text}\n(exit {proc.returncode})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs of each (default 7)")
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    args = parser.parse_args()
    if shutil.which("nvidia-smi") is None:
        print("nvidia-smi is not on the PATH: run this on a machine with NVIDIA GPUs",
              file=sys.stderr)
        return 2
    runs = max(1, args.runs)
    gpus.gather_facts()  # warm: the first nvidia-smi of a process loads the driver's state
    probe, facts = timed(gpus.gather_facts, runs)
    inventory, _ = timed(lambda: gpus.run_nvidia_smi(
        [f"--query-gpu={gpus.GPU_QUERY}", "--format=csv,noheader,nounits"]), runs)
    dmesg, _ = timed(gpus.read_xid_lines, runs)
    full_q, _ = timed(lambda: smi(["-q", "-d", Q_SECTIONS]), runs)
    verdicts = gpu_judge.judge_facts(facts)
    doc = {
        "host": os.uname().nodename,
        "driver": next((g.get("driver") for g in facts.get("gpus") or []), None),
        "gpus": len(facts.get("gpus") or []),
        "seconds": {"probe": probe, "inventory_only": inventory, "dmesg": dmesg,
                    "nvidia_smi_q": full_q},
        "ratios": {
            "probe_to_inventory_only": round(probe["median"] / inventory["median"], 2)
            if inventory["median"] else None,
            "probe_to_nvidia_smi_q": round(probe["median"] / full_q["median"], 2)
            if full_q["median"] else None,
        },
        "raw_query": smi([f"--query-gpu={gpus.GPU_QUERY},{gpus.HEALTH_QUERY}",
                          "--format=csv"]),
        "facts": facts,
        "judged": [{"index": v["index"], "verdict": v["verdict"],
                    "summary": gpu_judge.summary(v), "findings": v["findings"]}
                   for v in verdicts],
    }
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
