#!/usr/bin/env python3
"""CLI start-up benchmark: how long the installed ``outrig`` command takes to answer
``--version``, ``--list`` and ``--help``, next to what any Python command costs.

Times, in one run and round-robin (so that the machine's load falls on every row alike), the
wall time of each command as a subprocess, and prints the medians with their ratios to two
alternatives measured in the same run: ``python -c pass`` (the interpreter's own start, the
floor) and ``python -c "import invoke"`` (what every start cost while the program was Invoke's
from the first line). ``outrig --help deploy`` is parsed by the Invoke program, for
comparison. The module count of each row is the number of imports ``python -X importtime``
reports for it (the interpreter's own included), from one more run.

Bytecode: every command runs with a private bytecode cache (``PYTHONPYCACHEPREFIX``, a
temporary folder, so the source trees are left alone) and ``PYTHONDONTWRITEBYTECODE`` unset,
and each is run once before timing, so that no row pays for compiling a module, as on a
machine where outrig is installed. The machine's load average is printed before and after:
the figures are only comparable within one run.

Usage:  python bench/cli_start.py [--repeat 21] [--outrig PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 0.15  # seconds: outrig --version and outrig --list (issue 23)


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Wall time of one subprocess; a failing one stops the bench with its stderr."""
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env=env)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{argv} failed ({done.returncode}):\n{done.stderr}")
    return seconds


def modules(argv: list[str], env: dict[str, str]) -> int:
    """The imports ``-X importtime`` reports for ``argv`` (a Python command line)."""
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, env=env)
    return sum(1 for line in done.stderr.splitlines() if line.startswith("import time:")
               and not line.rstrip().endswith("| package"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--outrig", default=str(Path(sys.executable).with_name("outrig")),
                        help="the outrig console script to time (default: beside this "
                             "interpreter)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args()
    script = Path(args.outrig)
    python = str(script.with_name("python")) if script.with_name("python").exists() \
        else sys.executable
    rows = {
        "python -c pass": [python, "-c", "pass"],
        'python -c "import invoke"': [python, "-c", "import invoke"],
        "outrig --version": [python, str(script), "--version"],
        "outrig --list": [python, str(script), "--list"],
        "outrig --help": [python, str(script), "--help"],
        "outrig --help deploy (parsed by Invoke)": [python, str(script), "--help", "deploy"],
    }
    with tempfile.TemporaryDirectory(prefix="outrig-cli-start-") as cache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPYCACHEPREFIX=cache, COLUMNS="80")
        before = os.getloadavg()
        for argv in rows.values():  # fill the bytecode cache
            timed(argv, env)
        samples: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.repeat):
            for name, argv in rows.items():
                samples[name].append(timed(argv, env))
        counts = {name: modules(argv, env) for name, argv in rows.items()}
        after = os.getloadavg()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    floor, invoke = medians["python -c pass"], medians['python -c "import invoke"']
    print(f"median of {args.repeat}, {os.cpu_count()} CPUs; load average (1, 5, 15 min) "
          f"before {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, after {after[0]:.2f} "
          f"{after[1]:.2f} {after[2]:.2f}; {sys.version.split()[0]}")
    width = max(len(name) for name in rows)
    print(f"{'command':<{width}} {'seconds':>8} {'x pass':>7} {'x invoke':>9} {'modules':>8}")
    for name in rows:
        print(f"{name:<{width}} {medians[name]:>8.3f} {medians[name] / floor:>7.2f} "
              f"{medians[name] / invoke:>9.2f} {counts[name]:>8}")
    for name in ("outrig --version", "outrig --list"):
        met = "met" if medians[name] <= TARGET else "NOT met"
        print(f"{name}: {medians[name]:.3f} s (target <= {TARGET} s): {met}")
    if args.json:
        print(json.dumps({"repeat": args.repeat, "load": [before, after],
                          "rows": [{"command": name, "seconds": medians[name],
                                    "samples": samples[name], "modules": counts[name]}
                                   for name in rows]}))


if __name__ == "__main__":
    main()
