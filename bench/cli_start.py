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

With ``--warm`` it also starts the sandbox box (a real OpenSSH sshd on 127.0.0.1; the journal
and the keepers' sockets in the temporary folder) and times ``outrig status`` on it through a
live keeper (the first command, untimed, starts it) and with ``--no-keep`` (its own SSH
connection), in the same rounds: whole commands, the box's own answer included, so these
rows say what the imports weigh only through their module counts and the difference. The
keeper is stopped by its recorded pid at the end, and the box's sshd.

Bytecode: every command runs with a private bytecode cache (``PYTHONPYCACHEPREFIX``, a
temporary folder, so the source trees are left alone) and ``PYTHONDONTWRITEBYTECODE`` unset,
and each is run once before timing, so that no row pays for compiling a module, as on a
machine where outrig is installed. The machine's load average is printed before and after:
the figures are only comparable within one run.

Usage:  python bench/cli_start.py [--repeat 21] [--outrig PATH] [--warm] [--json]
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
from typing import Any

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


def start_box(root: Path, env: dict[str, str]) -> tuple[Any, Path]:
    """The sandbox box under ``root`` and its host file; the commands' journal and keeper
    sockets under ``root`` too (``env`` and this process, which stops the keeper)."""
    from outrig.sandbox.box import start_sandbox

    for name in ("state", "run"):
        (root / name).mkdir(mode=0o700)
    places = {"XDG_STATE_HOME": str(root / "state"), "XDG_RUNTIME_DIR": str(root / "run"),
              "OUTRIG_KEEP_SECONDS": "600"}
    env.update(places)
    os.environ.update(places)
    box = start_sandbox(root / "box")
    host = box.write_host_file(root / "project" / "hosts" / "box.yaml")
    return box, host


def stop_box(box: Any) -> None:
    """Stop the keeper (by its recorded pid) and the box's sshd."""
    from outrig.connectors.keeper.client import close_keepers, wait_gone

    for entry in close_keepers():
        wait_gone(int(entry["pid"]), 10.0)
    box.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--outrig", default=str(Path(sys.executable).with_name("outrig")),
                        help="the outrig console script to time (default: beside this "
                             "interpreter)")
    parser.add_argument("--warm", action="store_true",
                        help="also time outrig status on the sandbox box, through a live "
                             "keeper and with --no-keep")
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
    with tempfile.TemporaryDirectory(prefix="outrig-cli-start-") as scratch:
        root = Path(scratch)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPYCACHEPREFIX=str(root / "pycache"), COLUMNS="80")
        box = None
        if args.warm:
            box, host = start_box(root, env)
            status = [python, str(script), "status", "--host", str(host)]
            rows["outrig status, through the live keeper"] = status
            rows["outrig status --no-keep (its own SSH connection)"] = [*status, "--no-keep"]
        try:
            before = os.getloadavg()
            for argv in rows.values():  # fill the bytecode cache (and start the keeper)
                timed(argv, env)
            samples: dict[str, list[float]] = {name: [] for name in rows}
            for _ in range(args.repeat):
                for name, argv in rows.items():
                    samples[name].append(timed(argv, env))
            counts = {name: modules(argv, env) for name, argv in rows.items()}
            after = os.getloadavg()
        finally:
            if box is not None:
                stop_box(box)
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
