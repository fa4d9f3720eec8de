#!/usr/bin/env python3
"""Recovery benchmark: from a box's death to training resumed on the spare, with ``watch``.

Two sandbox boxes (each a real OpenSSH sshd on 127.0.0.1) sit behind latency proxies
(one-way delay = RTT / 2). Box A runs the job (the vLLM and trainer stand-ins of
tests/standins, 4 fake GPUs); box B (8 fake GPUs) is the spare. ``watch`` follows A in this
process until the newest checkpoint is mirrored; then A dies (its sshd and sessions stop,
every live connection is reset, every process of the run is killed; or, with ``--death
blackhole``, its link goes silent for good and new TCP connects are never answered) and
nothing else is done by hand. Printed, in seconds:

- ``detect``: death → the ``dead`` verdict (the threshold, scaled by the RTT, plus up to one
  probe period and the confirming connection);
- ``spare``: ``dead`` → ``migrating`` (``check`` on the spare);
- the migrate flow, ``migrating`` → ``resumed``, with migrate's own breakdown (``probe``,
  ``provision``, ``stage``, ``checkpoint``, ``deploy``) when its report carries ``timings``;
- the same steps timed from outside (migrate's functions wrapped: ``probe``,
  ``check+provision``, ``stage``, ``checkpoint``, ``deploy``);
- ``resume``: ``resumed`` → the trainer's "Resuming training" line in its log on B (deploy
  already waits for the trainer's first step, so this is ~0: resuming is inside deploy);
- ``total``: death → that line.

Usage:  python bench/watch_recovery.py [--rtt-ms 240] [--threshold 20] [--death sshd|blackhole]
        [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def time_steps(steps: dict[str, float]) -> None:
    """Time migrate's steps from outside (its report's ``timings``, where present, is printed
    as well): each function migrate calls is wrapped to add its seconds under a step name."""
    import outrig.ops.migrate as mig

    def wrap(name: str, func: Any, step: Any) -> None:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return func(*args, **kwargs)
            finally:
                key = step(kwargs) if callable(step) else step
                steps[key] = round(steps.get(key, 0.0) + time.monotonic() - started, 2)

        setattr(mig, name, timed)

    wrap("probe", mig.probe, "probe")
    wrap("_prepare", mig._prepare, "check+provision")
    wrap("stage_on", mig.stage_on,
         lambda kw: "checkpoint" if "checkpoint" in (kw.get("parts") or ()) else "stage")
    wrap("deploy_on", mig.deploy_on, "deploy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtt-ms", type=float, default=240.0)
    parser.add_argument("--threshold", type=float, default=20.0,
                        help="watch --threshold (seconds, before RTT scaling)")
    parser.add_argument("--death", choices=("sshd", "blackhole"), default="sshd",
                        help="how A dies: its sshd and processes stop (default), or its link "
                             "is blackholed for good (new TCP connects unanswered)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    one_way = args.rtt_ms / 2000.0
    root = Path(tempfile.mkdtemp(prefix="outrig-recovery-"))
    os.environ["XDG_STATE_HOME"] = str(root / "state")
    os.environ.setdefault("OUTRIG_KEEP_SECONDS", "0")

    import yaml

    from outrig.console import Reporter
    from outrig.journal import Journal, read_json
    from outrig.ops.cleanup import cleanup
    from outrig.ops.deploy import deploy
    from outrig.ops.watch import watch
    from outrig.ops.watch_record import WatchOptions, watch_file
    from outrig.sandbox.box import start_sandbox
    from outrig.sandbox.proxy import LatencyProxy
    from outrig.watching.health import limits_for
    from outrig.watching.notify import Notifier
    from tests.support.network import free_port
    from tests.support.runs import kill_run, write_playbooks

    quiet = Reporter(quiet=True)
    box_a = start_sandbox(root / "box-a", name="a", gpus=4, gpu_memory_mib=49152)
    box_b = start_sandbox(root / "box-b", name="b", gpus=8, gpu_memory_mib=98304)
    proxies = [LatencyProxy("127.0.0.1", box.port, one_way_delay=one_way).start()
               for box in (box_a, box_b)]
    stop = threading.Event()
    try:
        hosts: list[Path] = []
        for box, proxy in zip((box_a, box_b), proxies, strict=True):
            path = box.write_host_file(root / "proj" / "hosts" / f"{box.name}.yaml",
                                       workdir=box.workdir)
            config = yaml.safe_load(path.read_text())
            config["port"] = proxy.port
            path.write_text(yaml.safe_dump(config))
            hosts.append(path)
        project = write_playbooks(root / "proj", free_port())
        journal = Journal()
        first = deploy(project, str(hosts[0]), "mig-4gpu", quiet, journal=journal)
        notifier = Notifier(None)
        steps: dict[str, float] = {}
        time_steps(steps)
        options = WatchOptions(spares=[str(hosts[1])], threshold=args.threshold)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                watch(project, str(hosts[0]), "mig-4gpu", quiet, options=options,
                      journal=journal, notifier=notifier, stop=stop)
            except BaseException as exc:  # reported below
                errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        record_path = watch_file(journal, str(hosts[0]), "mig-4gpu")
        wait_for(lambda: (read_json(record_path) or {}).get("mirrored") is not None, 300,
                 "the first mirrored checkpoint")

        died = time.time()
        if args.death == "blackhole":  # the link goes for good: nothing through, no new TCP
            proxies[0].blackhole_all(drop_new=True)
        else:
            box_a.stop()
            proxies[0].cut_all()
        # the run's processes go as well (both boxes share this machine's ports)
        kill_run(box_a.workdir, first.plan.run_id)

        def event(name: str) -> dict[str, Any] | None:
            if errors:
                raise SystemExit(f"watch failed: {errors[0]}")
            return next((e for e in notifier.sent if e["event"] == name), None)

        dead = wait_for(lambda: event("dead"), 600, "the dead verdict")
        migrating = wait_for(lambda: event("migrating"), 600, "migrating")
        resumed = wait_for(lambda: event("resumed"), 900, "resumed")
        log = box_b.workdir / "runs" / str(resumed["run_id"]) / "logs" / "trainer.log"
        wait_for(lambda: log.is_file() and "Resuming training" in log.read_text(), 300,
                 "the trainer's resume line")
        training = time.time()
        limits = limits_for(args.threshold, args.rtt_ms / 1000.0)
        figures: dict[str, Any] = {
            "rtt_ms": args.rtt_ms, "threshold": args.threshold, "death": args.death,
            "threshold_scaled": round(limits.threshold, 1),
            "probe_period": round(limits.period, 2),
            "detect": round(float(dead["time"]) - died, 1),
            "spare": round(float(migrating["time"]) - float(dead["time"]), 1),
            "migrate": round(float(resumed["time"]) - float(migrating["time"]), 1),
            "migrate_steps": steps,
            "migrate_timings": resumed.get("timings"),
            "resume": round(training - float(resumed["time"]), 1),
            "total": round(training - died, 1),
            "checkpoint": resumed.get("checkpoint"),
        }
        if args.json:
            print(json.dumps(figures, indent=2))
        else:
            print(f"death: {args.death}; RTT {args.rtt_ms:.0f} ms, threshold {args.threshold:g} s "
                  f"(scaled {figures['threshold_scaled']} s, probe every "
                  f"{figures['probe_period']} s)")
            print(f"  detect   {figures['detect']:6.1f} s  death → dead verdict")
            print(f"  spare    {figures['spare']:6.1f} s  dead → migrating (check the spare)")
            print(f"  migrate  {figures['migrate']:6.1f} s  migrating → resumed")
            for step, seconds in figures["migrate_steps"].items():
                print(f"    {step:<16} {float(seconds):6.1f} s")
            if figures["migrate_timings"]:
                print("    migrate's own timings: " + ", ".join(
                    f"{k} {float(v):.1f} s" for k, v in figures["migrate_timings"].items()))
            print(f"  resume   {figures['resume']:6.1f} s  deployed → 'Resuming training' "
                  "(deploy waits for the trainer's first step, so this is in deploy)")
            print(f"  total    {figures['total']:6.1f} s  death → training resumed "
                  f"(from checkpoint {figures['checkpoint']})")
        stop.set()
        thread.join(60)
        cleanup(project, str(hosts[1]), quiet, all_runs=True, journal=journal)
        return 0
    finally:
        stop.set()
        for proxy in proxies:
            proxy.close()
        box_a.stop()
        box_b.stop()


if __name__ == "__main__":
    raise SystemExit(main())
