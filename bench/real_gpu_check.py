#!/usr/bin/env python3
"""The real-GPU check: outrig's GPU audit and cleanup against a real NVIDIA driver.

Run on a machine with NVIDIA GPUs, PyTorch and outrig importable (``--host local``: the agent
runs on this machine, no SSH). It records everything it sees (raw nvidia-smi output, parsed
results, cleanup reports, timings) into one JSON file, so the run can be turned into test
fixtures and the numbers into docs/real-gpu.md.

Steps:
1. versions and idle snapshots; outrig's parsers on the live nvidia-smi output;
2. deploy a vLLM-like tree (``tests/standins/gpu_tree.py``: a parent and two spawn children
   that rename themselves and hold GPU memory), SIGKILL the parent as ``pkill -9`` would,
   show the children keep their memory, then ``cleanup`` and show from nvidia-smi that no
   compute app remains and the memory is back;
3. a foreign process (not started by outrig) holding GPU 0: deploy must refuse and name it;
   ``cleanup --force-foreign PID`` frees it;
4. with two or more GPUs: ``gpus: [1]`` must land on physical GPU 1 (CUDA_DEVICE_ORDER=
   PCI_BUS_ID), not GPU 0.

Usage: python3 bench/real_gpu_check.py --out DIR
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GPU_QUERY = ("index,uuid,name,memory.total,memory.used,memory.free,utilization.gpu,pci.bus_id,"
             "driver_version")
APPS_QUERY = "pid,used_memory,gpu_uuid,process_name"
TREE = str(REPO / "tests" / "standins" / "gpu_tree.py")


def sh(argv: list[str], timeout: float = 60) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    return proc.stdout + (f"\n[stderr] {proc.stderr}" if proc.returncode else "")


def snapshot() -> dict[str, Any]:
    """Raw nvidia-smi CSV in the forms the fixtures use, plus processes with /dev/nvidia fds."""
    gpu = sh(["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"])
    apps = sh(["nvidia-smi", f"--query-compute-apps={APPS_QUERY}",
               "--format=csv,noheader,nounits"])
    holders = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            targets = {os.readlink(f"/proc/{entry}/fd/{fd}")
                       for fd in os.listdir(f"/proc/{entry}/fd")}
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
        except OSError:
            continue
        devices = sorted(t for t in targets if t.startswith("/dev/nvidia"))
        if devices:
            holders[entry] = {"comm": comm, "devices": devices}
    return {"t": time.time(), "gpu_csv": gpu, "apps_csv": apps, "nvidia_fd_holders": holders}


def used_mib(snap: dict[str, Any]) -> dict[int, int]:
    out = {}
    for line in snap["gpu_csv"].splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= 5 and cells[0].isdigit():
            out[int(cells[0])] = int(cells[4])
    return out


def app_pids(snap: dict[str, Any]) -> list[int]:
    return [int(line.split(",")[0]) for line in snap["apps_csv"].splitlines()
            if line.split(",")[0].strip().isdigit()]


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def wait(predicate: Any, timeout: float, step: float = 0.5) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(step)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="outrig-gpu-check-"))
    os.environ["XDG_STATE_HOME"] = str(state / "state")

    from outrig.console import Reporter
    from outrig.errors import OutrigError, RemoteError
    from outrig.journal import Journal
    from outrig.ops.cleanup import cleanup
    from outrig.ops.deploy import deploy
    from outrig.session import Project

    project = Project(REPO)
    journal = Journal(state / "journal")
    events_log = io.StringIO()
    reporter = Reporter(json_mode=True, out=events_log)
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "steps": {}, "checks": {}}
    checks = report["checks"]
    foreign: subprocess.Popen[str] | None = None

    def playbook(name: str, gpus: list[int], argv: list[str]) -> str:
        path = state / f"{name}.yaml"
        path.write_text(json.dumps({"name": name, "processes": {"server": {
            "command": argv, "gpus": gpus,
            "ready": {"log": "all children hold GPU memory", "timeout": 240},
            "stop": {"grace": 20}}}}))
        return str(path)

    try:
        report["versions"] = {
            "nvidia_smi": sh(["nvidia-smi", "--version"]),
            "table_idle": sh(["nvidia-smi"]),
            "torch": sh([sys.executable, "-c", "import torch; print(torch.__version__, "
                         "torch.version.cuda, torch.cuda.device_count())"]),
            "python": sys.version,
            "uname": sh(["uname", "-a"]),
        }
        idle = snapshot()
        report["steps"]["idle"] = idle
        gpu_count = len(used_mib(idle))
        report["gpu_count"] = gpu_count

        # 1. outrig's own parsers on the live output
        from outrig._box.agent.gpus import parse_compute_apps, query_gpus

        gpus, gpu_error = query_gpus()
        report["steps"]["parsed_idle"] = {"gpus": gpus, "error": gpu_error}
        checks["parser_sees_every_gpu"] = len(gpus) == gpu_count and gpu_error is None

        # 2. the vLLM-like tree, pkill -9 of its parent, cleanup
        tree = playbook("gputree", [0], [sys.executable, TREE, "--parent-gib", "1",
                                        "--child", "VLLM::EngineCore:6",
                                        "--child", "VLLM::Worker_TP1:3"])
        t0 = time.monotonic()
        result = deploy(project, "local", tree, reporter, journal=journal)
        report["steps"]["tree_deploy_seconds"] = round(time.monotonic() - t0, 2)
        busy = snapshot()
        report["steps"]["busy"] = busy
        report["steps"]["busy_parsed_apps"] = parse_compute_apps(
            sh(["nvidia-smi", "--query-compute-apps=pid,used_memory,gpu_uuid",
                "--format=csv,noheader,nounits"]))
        report["steps"]["busy_table"] = sh(["nvidia-smi"])
        dry = cleanup(project, "local", reporter, playbook="gputree", dry_run=True,
                      journal=journal)
        report["steps"]["busy_audit"] = dry["gpus_before"]
        holders = dry["gpus_before"]["holders"]
        checks["audit_marks_all_tree_holders_ours"] = bool(holders) and all(
            h.get("owner") and h["owner"]["run_id"] == result.plan.run_id for h in holders)
        leader = result.processes[0]["pid"]
        parent = children_of(leader)
        report["steps"]["tree_pids"] = {"wrapper": leader, "parent": parent,
                                        "apps": app_pids(busy)}
        os.kill(parent[0], signal.SIGKILL)  # what `pkill -9 -f gpu_tree` does
        time.sleep(4)
        after_kill = snapshot()
        report["steps"]["after_parent_kill"] = after_kill
        report["steps"]["after_parent_kill_table"] = sh(["nvidia-smi"])
        checks["children_survive_parent_kill_holding_memory"] = (
            len(app_pids(after_kill)) >= 2 and used_mib(after_kill)[0] > 8000)
        t0 = time.monotonic()
        cleaned = cleanup(project, "local", reporter, playbook="gputree", journal=journal,
                          timeout=60)
        report["steps"]["cleanup_seconds"] = round(time.monotonic() - t0, 2)
        report["steps"]["cleanup"] = cleaned
        after_cleanup = snapshot()
        report["steps"]["after_cleanup"] = after_cleanup
        report["steps"]["after_cleanup_table"] = sh(["nvidia-smi"])
        checks["no_compute_app_after_cleanup"] = app_pids(after_cleanup) == []
        checks["memory_back_after_cleanup"] = used_mib(after_cleanup)[0] <= used_mib(idle)[0] + 64
        checks["cleanup_verdict_released"] = bool(cleaned["gpu"]["released"])

        # 3. a foreign process on GPU 0: deploy refuses; --force-foreign frees it
        foreign = subprocess.Popen(
            [sys.executable, "-c", "import torch, time\n"
             "x = torch.empty(2 << 30, dtype=torch.uint8, device='cuda:0'); x.fill_(1)\n"
             "torch.cuda.synchronize(); print('held', flush=True); time.sleep(900)"],
            stdout=subprocess.PIPE, text=True, start_new_session=True,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
        assert foreign.stdout is not None
        checks["foreign_started"] = foreign.stdout.readline().strip() == "held"
        report["steps"]["foreign_pid"] = foreign.pid
        small = playbook("needs0", [0], [sys.executable, TREE, "--parent-gib", "0.5",
                                         "--child", "VLLM::EngineCore:0.5"])
        try:
            deploy(project, "local", small, reporter, journal=journal)
            checks["deploy_refuses_foreign_gpu"] = False
        except RemoteError as exc:
            report["steps"]["deploy_refused"] = str(exc)
            checks["deploy_refuses_foreign_gpu"] = (exc.kind == "gpu_busy"
                                                    and f"pid {foreign.pid}" in str(exc))
        t0 = time.monotonic()
        forced = cleanup(project, "local", reporter, force_foreign=[foreign.pid],
                         journal=journal, timeout=60)
        report["steps"]["force_foreign_seconds"] = round(time.monotonic() - t0, 2)
        report["steps"]["force_foreign"] = forced
        foreign.wait(30)
        after_force = snapshot()
        report["steps"]["after_force_foreign"] = after_force
        checks["force_foreign_frees_memory"] = (app_pids(after_force) == []
                                                and used_mib(after_force)[0]
                                                <= used_mib(idle)[0] + 64)

        # 4. placement: gpus [1] must land on physical GPU 1
        if gpu_count >= 2:
            placed = playbook("placement", [1], [sys.executable, TREE, "--parent-gib", "2",
                                                 "--child", "VLLM::Worker_TP0:1"])
            deploy(project, "local", placed, reporter, journal=journal)
            on1 = snapshot()
            report["steps"]["placement"] = on1
            report["steps"]["placement_table"] = sh(["nvidia-smi"])
            used = used_mib(on1)
            uuid1 = next(g["uuid"] for g in gpus if g["index"] == 1)
            app_uuids = {line.split(",")[2].strip() for line in on1["apps_csv"].splitlines()
                         if line.strip() and line.split(",")[0].strip().isdigit()}
            checks["gpus_1_lands_on_physical_gpu_1"] = (used[1] > 2500 and used[0]
                                                        <= used_mib(idle)[0] + 64
                                                        and app_uuids == {uuid1})
            cleaned1 = cleanup(project, "local", reporter, playbook="placement",
                               journal=journal)
            report["steps"]["placement_cleanup"] = cleaned1
            checks["placement_cleanup_released"] = bool(cleaned1["gpu"]["released"])
        else:
            report["steps"]["placement"] = "skipped: one GPU"
    except (OutrigError, Exception) as exc:
        report["error"] = "".join(traceback.format_exception(exc))
    finally:
        with_errors = []
        try:
            report["final_cleanup"] = cleanup(project, "local", Reporter(quiet=True),
                                              all_runs=True, journal=journal)
        except Exception as exc:
            with_errors.append(repr(exc))
        if foreign is not None and foreign.poll() is None:
            os.kill(foreign.pid, signal.SIGKILL)  # the pid we started
            foreign.wait(10)
        report["final"] = snapshot()
        report["final_errors"] = with_errors
        report["events"] = events_log.getvalue().splitlines()
        (out_dir / "real-gpu-report.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps({"checks": checks, "error": report.get("error", "")[-2000:]}, indent=1))
    return 0 if checks and all(checks.values()) and "error" not in report else 1


if __name__ == "__main__":
    sys.exit(main())
