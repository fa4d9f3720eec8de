#!/usr/bin/env python3
"""``outrig metrics``, ``plot`` and ``report`` over a run with many metric records.

Makes a journal (a private temporary folder, as ``XDG_STATE_HOME``) holding one run whose
log mirror has ``--records`` training records (one line each: loss, full_acc, eal, two
profile values, a learning rate, epoch, global_step, with a time of day), then times the
command (``python -m outrig`` from this checkout's root), Python's start included:

- ``metrics (first)``: the mirror parsed into the series (every record is new);
- ``metrics (nothing new)``: the same again, the cursor at the mirror's end;
- ``plot`` (colour: plotext charts, ``FORCE_COLOR=1``) and ``report`` (the HTML file);
- ``read the store``: a Python that imports outrig and reads the run's points file
  (``MetricStore.points``): what the nothing-new case cannot go below.

Each is reported as wall time and CPU time (user + system of the command): on a shared
machine the CPU time is the one to compare.

Usage:  python bench/metrics_bench.py [--records 1000000] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from outrig.journal import Journal  # noqa: E402
from outrig.logs.mirror import mirror_root  # noqa: E402

START = 1_764_577_800.0
RUN = "big-run"
READ_STORE = ("import sys, pathlib; from outrig.journal import Journal; "
              "from outrig.metrics.store import MetricStore; "
              "print(len(MetricStore(Journal(pathlib.Path(sys.argv[1])), sys.argv[2]).points()))")


def make_journal(state: Path, records: int) -> Journal:
    journal = Journal(state / "outrig")
    journal.record_run(RUN, {"run_id": RUN, "host": "box", "playbook": "dflash",
                             "created": START, "status": "running"})
    folder = mirror_root(journal, "box", RUN)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "trainer.log", "w", encoding="utf-8") as log:
        for i in range(records):
            clock = f"{(8 + i // 3600) % 24:02d}:{(i // 60) % 60:02d}:{i % 60:02d}"
            log.write(f"[{clock}] INFO     train/loss={1.7 - i * 1e-7:.4f}, "
                      f"train/full_acc={0.1 + i * 1e-7:.4f}, train/eal={1.0 + i * 1e-7:.3f}, "
                      "profile/step_ms=524.816, profile/tokens_per_s=487.790, "
                      f"lr/Muon=2.40e-05, epoch=0, global_step={i}\n")
    return journal


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system of the child). The CPU time is what to
    compare on a shared machine: other load stretches the wall time, not the work."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    outrig = [sys.executable, "-m", "outrig"]  # this checkout's outrig (run from its root)
    results: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="outrig-metrics-bench-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "XDG_STATE_HOME": str(work / "state"), "COLUMNS": "100"}
        env.pop("NO_COLOR", None)
        for _ in range(args.repeat):
            state = work / "state"
            if state.exists():
                subprocess.run(["rm", "-rf", str(state)], check=True)
            journal = make_journal(state, args.records)
            cases = [
                ("metrics (first)", [*outrig, "metrics", "--run", RUN], env),
                ("metrics (nothing new)", [*outrig, "metrics", "--run", RUN], env),
                ("metrics --json (nothing new)",
                 [*outrig, "metrics", "--run", RUN, "--json"], env),
                ("plot (colour)", [*outrig, "plot", "--run", RUN], {**env, "FORCE_COLOR": "1"}),
                ("report", [*outrig, "report", "--run", RUN, "-o", str(work / "r.html")], env),
                ("read the store", [sys.executable, "-c", READ_STORE, str(journal.root), RUN],
                 env),
            ]
            for name, argv, case_env in cases:
                results.setdefault(name, []).append(timed(argv, case_env, REPO))
    summary = {name: {"wall_s": round(statistics.median(w for w, _ in v), 2),
                      "cpu_s": round(statistics.median(c for _, c in v), 2),
                      "runs_cpu_s": [round(c, 2) for _, c in v]}
               for name, v in results.items()}
    if args.json:
        print(json.dumps({"records": args.records, "results": summary}, indent=1))
        return
    print(f"{args.records} metric records, {args.repeat} run(s) each (medians, seconds)")
    print(f"  {'':<30} {'wall':>8} {'CPU':>8}")
    for name, row in summary.items():
        print(f"  {name:<30} {row['wall_s']:>8.2f} {row['cpu_s']:>8.2f}   {row['runs_cpu_s']}")


if __name__ == "__main__":
    main()
