"""What a hang looks like on a real GPU: the signals outrig's hang detection reads, captured.

Runs on the GPU machine itself (``hostname: local``), with the same project as
``bench/real_trainer_gpu.py`` (the real speculators trainer on GPU 0, the hidden-state
stand-in as its server). Every ``--every`` seconds a sampler records, per phase: nvidia-smi's
utilisation, memory, power and SM clock of GPU 0 and its compute processes; the trainer log's
size, line count and newest metric step; each trainer process's state letter
(``/proc/PID/stat``); and what ``outrig status`` says about the run. The phases:

1. ``healthy``: training as deployed;
2. ``rank-stopped``: the rank process (torchrun's child) SIGSTOPped, torchrun running;
3. ``rank-resumed``: SIGCONT;
4. ``group-stopped``: the whole process group (torchrun and the rank) SIGSTOPped;
5. ``group-resumed``: SIGCONT, then ``cleanup`` (GPU memory back is recorded);
6. ``spinning``: a process that logs a few steps, then waits on a flag in GPU memory with a
   spinning kernel, the way an NCCL collective waits for a peer that never comes (alive, GPU
   busy, no log line): deployed through outrig on GPU 0.

Writes ``samples.jsonl`` (one line per sample, written as it is taken, so a cut run still
leaves its captures), the logs and ``summary.json`` under ``--out``.

    python3 bench/real_gpu_hang.py --out DIR [--every 5] [--stopped 180]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from real_trainer_gpu import leave_nothing_behind, trainer_project, wait  # noqa: E402

from outrig.console import Reporter  # noqa: E402
from outrig.journal import Journal  # noqa: E402
from outrig.ops.cleanup import cleanup  # noqa: E402
from outrig.ops.deploy import deploy  # noqa: E402
from outrig.ops.status import status  # noqa: E402
from outrig.session import Project  # noqa: E402

STOPPED: list[int] = []  # process groups and pids SIGSTOPped here, continued on any exit
GPU_FIELDS = "utilization.gpu,memory.used,power.draw,clocks.sm"
SPIN = '''"""Logs steps, then waits on a GPU flag with a spinning kernel (an NCCL-style wait)."""
import sys, time
import cupy
kernel = cupy.RawKernel(r"""
extern "C" __global__ void spin(volatile int* flag) { while (flag[0] == 0) { } }
""", "spin")
buffer = cupy.ones((256, 1024, 1024), dtype=cupy.float32)  # 1 GiB held, like a rank's state
for step in range(int(sys.argv[1])):
    buffer *= 1.0001
    cupy.cuda.Device().synchronize()
    print(f"step {step} loss {float(buffer[0, 0, 0]):.4f}", flush=True)
    time.sleep(1)
print("entering the collective", flush=True)
flag = cupy.zeros(1, dtype=cupy.int32)
kernel((1,), (32,), (flag,))
cupy.cuda.Device().synchronize()  # never returns: nobody sets the flag
'''


def gpu_sample() -> dict[str, Any]:
    """GPU 0's utilisation, memory, power and clock, and its compute processes."""
    def query(args: list[str]) -> str:
        try:
            done = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, timeout=20)
            return done.stdout.strip() or done.stderr.strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"error: {exc}"
    values = query([f"--query-gpu={GPU_FIELDS}", "-i", "0"]).split(", ")
    sample: dict[str, Any] = dict(zip(GPU_FIELDS.split(","), values, strict=False))
    sample["apps"] = query(["--query-compute-apps=pid,used_memory"])
    return sample


def proc_state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat[stat.rindex(")") + 2]


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def descendants(pid: int) -> list[int]:
    found = []
    for child in children(pid):
        found += [child, *descendants(child)]
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def rank_of(leader: int) -> int | None:
    """The rank: the process running ``speculators.train`` whose parent is torchrun (the
    leader outrig recorded is its wrapper, torchrun below it, the rank below that)."""
    for pid in descendants(leader):
        if "-m speculators.train" in cmdline(pid) and "torchrun" not in cmdline(pid):
            return pid
    return None


class Sampler:
    """One sample every ``every`` seconds on a thread, appended to ``samples.jsonl``."""

    def __init__(self, out: Path, project: Project, journal: Journal, every: float) -> None:
        self.out, self.project, self.journal, self.every = out, project, journal, every
        self.phase = "starting"
        self.playbook = "real-trainer"  # status asks about this playbook's runs
        self.log: Path | None = None
        self.pids: list[int] = []
        self.began = time.monotonic()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def sample(self) -> dict[str, Any]:
        row: dict[str, Any] = {"t": round(time.monotonic() - self.began, 1),
                               "phase": self.phase, "gpu": gpu_sample(),
                               "states": {str(p): proc_state(p) for p in self.pids}}
        if self.log is not None and self.log.exists():
            text = self.log.read_bytes()
            row["log_bytes"], row["log_lines"] = len(text), text.count(b"\n")
            row["log_age_s"] = round(time.time() - self.log.stat().st_mtime, 1)
        try:
            reply = status(self.project, "gpu-box", Reporter(quiet=True),
                           playbook=self.playbook, journal=self.journal)
            row["runs"] = [{k: v for k, v in r.items() if k != "processes"}
                           for r in reply.get("runs") or []]
            # every field status gives a process, less its log tail and its argv
            row["status"] = [{k: v for k, v in p.items() if k not in ("logs", "argv", "tail")}
                             for r in reply.get("runs") or [] for p in r.get("processes") or []]
        except Exception as exc:  # a capture, not a test: record what status said
            row["status_error"] = f"{type(exc).__name__}: {exc}"
        return row

    def loop(self) -> None:
        with (self.out / "samples.jsonl").open("a") as sink:
            while not self.stop.is_set():
                sink.write(json.dumps(self.sample(), default=str) + "\n")
                sink.flush()
                self.stop.wait(self.every)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--every", type=float, default=5.0)
    parser.add_argument("--healthy", type=float, default=45.0)
    parser.add_argument("--stopped", type=float, default=180.0)
    parser.add_argument("--group-stopped", type=float, default=90.0)
    parser.add_argument("--spinning", type=float, default=45.0)
    parser.add_argument("--hang", type=json.loads, default=None,
                        help="the playbooks' hang: section, as JSON (default: outrig's)")
    args = parser.parse_args()
    out = args.out.resolve()
    hang = {"hang": args.hang} if args.hang else {}
    save = trainer_project(out, extra_keys=hang)
    project, journal = Project(out), Journal(out / "state")
    reporter = Reporter(quiet=True)
    summary: dict[str, Any] = {"phases": {}}
    sampler = Sampler(out, project, journal, args.every)
    sampler.thread.start()

    def phase(name: str, seconds: float) -> None:
        sampler.phase = name
        summary["phases"][name] = round(time.monotonic() - sampler.began, 1)
        print(f"{summary['phases'][name]:7.1f} s  {name}", flush=True)
        time.sleep(seconds)

    t0 = time.monotonic()
    run = deploy(project, "gpu-box", "real-trainer", reporter, journal=journal)
    summary["deploy_s"] = round(time.monotonic() - t0, 1)
    run_dir = out / "box" / "runs" / run.plan.run_id
    sampler.log = run_dir / "logs" / "trainer.log"
    wait(lambda: any(save.glob("epoch0_*")) or (save / "0").is_dir(), 600, "a checkpoint")
    leader = next(int(p["pid"]) for p in run.processes if p.get("name") == "trainer")
    wait(lambda: rank_of(leader) is not None, 60, "the rank process")
    rank = rank_of(leader)
    assert rank is not None
    sampler.pids = [leader, *descendants(leader)]
    summary["pids"] = {"leader": leader, "rank": rank, "pgid": os.getpgid(leader),
                       "tree": {str(p): cmdline(p)[:80] for p in sampler.pids}}
    phase("healthy", args.healthy)
    STOPPED.append(rank)
    os.kill(rank, signal.SIGSTOP)
    phase("rank-stopped", args.stopped)
    os.kill(rank, signal.SIGCONT)
    phase("rank-resumed", 20)
    STOPPED.append(-summary["pids"]["pgid"])
    os.killpg(summary["pids"]["pgid"], signal.SIGSTOP)
    phase("group-stopped", args.group_stopped)
    os.killpg(summary["pids"]["pgid"], signal.SIGCONT)
    phase("group-resumed", 15)
    sampler.phase = "cleanup"
    t1 = time.monotonic()
    cleanup(project, "gpu-box", reporter, playbook="real-trainer", journal=journal)
    summary["cleanup_s"] = round(time.monotonic() - t1, 1)
    summary["gpu_after_cleanup"] = gpu_sample()
    shutil.copy(sampler.log, out / "trainer.log")

    (out / "spin.py").write_text(SPIN)
    (out / "playbooks" / "spin-hang.yaml").write_text(yaml.safe_dump({
        "name": "spin-hang", "files": {"spin.py": str(out / "spin.py")},
        **hang,
        "processes": {"trainer": {"command": [sys.executable, "spin.py", "8"], "gpus": [0],
                                  "env": {"PYTHONUNBUFFERED": "1"},
                                  "ready": {"log": "step 0", "timeout": 120}}}},
        sort_keys=False))
    spin = deploy(project, "gpu-box", "spin-hang", reporter, journal=journal)
    sampler.playbook = "spin-hang"
    sampler.log = out / "box" / "runs" / spin.plan.run_id / "logs" / "trainer.log"
    sampler.pids = [int(p["pid"]) for p in spin.processes]
    wait(lambda: "entering the collective" in sampler.log.read_text(), 60, "the spin")
    phase("spinning", args.spinning)
    sampler.phase = "cleanup"
    cleanup(project, "gpu-box", reporter, playbook="spin-hang", journal=journal)
    summary["gpu_after_spin_cleanup"] = gpu_sample()
    sampler.stop.set()
    sampler.thread.join(30)
    shutil.copy(sampler.log, out / "spin.log")
    print(json.dumps(summary, indent=1, default=str))
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:  # never leave a run behind, whatever failed
        leave_nothing_behind(STOPPED)
