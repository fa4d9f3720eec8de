"""``watch`` catching a hung trainer on a real GPU with the default bounds, restarting it in
place, and the real trainer resuming from its newest complete checkpoint.

Runs on the GPU machine itself (``hostname: local``), with the project of
``bench/real_trainer_gpu.py`` (the real speculators trainer on GPU 0, the hidden-state
stand-in as its server). ``watch --restarts 1`` follows the run from its deploy (in a thread of
this process, as the CLI runs it); after ``--healthy`` seconds of training the rank (torchrun's
child) is SIGSTOPped, the way a rank blocked for good stops writing. Nothing else is done by
hand: the watch must call the run hung (the default ``hang:`` section unless ``--hang`` gives
one), stop it, deploy it again, and the trainer must resume. Every ``--every`` seconds GPU 0's
utilisation and memory are appended to ``samples.jsonl``; the watch's own lines, each with the
seconds since the deploy began, go to ``watch.log``; ``summary.json`` holds the times.

    python3 bench/real_gpu_watch_hang.py --out DIR [--healthy 230] [--every 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from real_gpu_hang import STOPPED, descendants, gpu_sample, rank_of  # noqa: E402
from real_trainer_gpu import leave_nothing_behind, trainer_project, wait  # noqa: E402

from outrig.console import Reporter  # noqa: E402
from outrig.journal import Journal  # noqa: E402
from outrig.ops.cleanup import cleanup  # noqa: E402
from outrig.ops.deploy import deploy  # noqa: E402
from outrig.ops.watch import watch  # noqa: E402
from outrig.ops.watch_record import WatchOptions  # noqa: E402
from outrig.session import Project  # noqa: E402

RESUMED = ("Resuming mid-epoch from epoch", "Resuming training on epoch")


class Stamped:
    """A text sink that writes each line with the seconds since ``began`` in front."""

    def __init__(self, path: Path, began: float) -> None:
        self.sink = path.open("a")
        self.began = began
        self.lines: list[tuple[float, str]] = []
        self.partial = ""
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            self.partial += text
            *whole, self.partial = self.partial.split("\n")
            for line in whole:
                t = round(time.monotonic() - self.began, 1)
                self.lines.append((t, line))
                self.sink.write(f"{t:8.1f}  {line}\n")
            self.sink.flush()
        return len(text)

    def flush(self) -> None:
        self.sink.flush()

    def isatty(self) -> bool:
        return False

    def first(self, word: str) -> float | None:
        with self.lock:
            return next((t for t, line in self.lines if word in line), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--healthy", type=float, default=230.0)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--limit", type=float, default=1500.0,
                        help="seconds after the stop to wait for the resume at most")
    parser.add_argument("--hang", type=json.loads, default=None,
                        help="the playbook's hang: section, as JSON (default: outrig's)")
    parser.add_argument("--cpu", action="store_true",
                        help="a dry run of the script without a GPU (the CPU shim)")
    parser.add_argument("--trainer-python", default=None,
                        help="the interpreter with torch and speculators (default: this one)")
    args = parser.parse_args()
    out = args.out.resolve()
    save = trainer_project(out, cpu=args.cpu, python=args.trainer_python,
                           extra_keys={"hang": args.hang} if args.hang else {})
    project, journal = Project(out), Journal(out / "state")
    began = time.monotonic()
    summary: dict[str, Any] = {"hang": args.hang or "outrig's defaults"}
    samples = (out / "samples.jsonl").open("a")
    done = threading.Event()

    def now() -> float:
        return round(time.monotonic() - began, 1)

    def sampler() -> None:
        while not done.is_set():
            samples.write(json.dumps({"t": now(), "gpu": gpu_sample()}) + "\n")
            samples.flush()
            done.wait(args.every)

    threading.Thread(target=sampler, daemon=True).start()
    first = deploy(project, "gpu-box", "real-trainer", Reporter(quiet=True), journal=journal)
    summary["deployed_at"] = now()
    runs = out / "box" / "runs"

    def trainer_log(run_id: str) -> str:
        path = runs / run_id / "logs" / "trainer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    stamped = Stamped(out / "watch.log", began)
    stop = threading.Event()
    outcome: dict[str, Any] = {}

    def follow() -> None:
        try:
            outcome["record"] = watch(project, "gpu-box", "real-trainer",
                                      Reporter(out=stamped, err=stamped),  # type: ignore[arg-type]
                                      options=WatchOptions(restarts=1), journal=journal,
                                      stop=stop)
        except Exception as exc:  # a capture: record how the watch ended
            outcome["error"] = f"{type(exc).__name__}: {exc}"

    watcher = threading.Thread(target=follow, daemon=True)
    watcher.start()
    wait(lambda: (save / "0" / "training_state.json").exists(), 600, "a checkpoint")
    leader = next(int(p["pid"]) for p in first.processes if p.get("name") == "trainer")
    wait(lambda: rank_of(leader) is not None, 60, "the rank process")
    rank = rank_of(leader)
    assert rank is not None
    summary["pids"] = {"leader": leader, "rank": rank, "tree": [leader, *descendants(leader)]}
    time.sleep(args.healthy)
    summary["checkpoint_before_stop"] = json.loads(
        (save / "0" / "training_state.json").read_text())
    log_path = runs / first.plan.run_id / "logs" / "trainer.log"
    summary["last_line_before_stop_at"] = round(
        log_path.stat().st_mtime - time.time() + time.monotonic() - began, 1)
    STOPPED.append(rank)
    os.kill(rank, signal.SIGSTOP)
    summary["stopped_at"] = now()
    print(f"{now():7.1f} s  rank {rank} SIGSTOPped", flush=True)

    def resumed() -> str | None:
        for run in runs.iterdir():
            if run.name != first.plan.run_id:
                text = trainer_log(run.name)
                if any(word in text for word in RESUMED):
                    return run.name
        return None

    wait(lambda: resumed() is not None or "error" in outcome, args.limit, "the resume")
    second = resumed()
    summary["resumed_at"] = now()
    summary["hung_at"] = stamped.first("hung")
    summary["watch_error"] = outcome.get("error")
    if second is not None:
        text = trainer_log(second)
        summary["second_run"] = second
        summary["resume_lines"] = [line.strip() for line in text.splitlines()
                                   if "Resuming" in line or "Found checkpoint" in line][:4]
        first_text = trainer_log(first.plan.run_id)
        summary["first_run_end"] = [line.strip() for line in first_text.splitlines()
                                    if "SIGTERM" in line or "Interrupt" in line][:4]
        wait(lambda: "Checkpoint saved to" in trainer_log(second).split(RESUMED[0])[-1],
             240, "a checkpoint after the resume")
        summary["saved_after_resume_at"] = now()
    stop.set()
    watcher.join(120)
    done.set()
    cleanup(project, "gpu-box", Reporter(quiet=True), all_runs=True, journal=journal)
    summary["gpu_after_cleanup"] = gpu_sample()
    for run in sorted(runs.iterdir()):
        log = run / "logs" / "trainer.log"
        if log.exists():
            shutil.copy(log, out / f"trainer-{run.name}.log")
    print(json.dumps(summary, indent=1, default=str), flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:  # never leave a run behind, whatever failed
        leave_nothing_behind(STOPPED)
