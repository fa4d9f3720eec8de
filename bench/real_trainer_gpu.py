"""The real speculators trainer on a real GPU, driven by outrig's own deploy/status/cleanup.

A one-GPU machine cannot hold the dflash recipe (vLLM and the trainer need GPUs of their own),
so this runs the recipe's trainer command as a hand-written playbook: the hidden-state
stand-in (tests/standins/hs_vllm.py, a tiny random Qwen3 on the CPU) as ``server``, the real
``speculators prepare-data`` as ``prepare`` and ``torchrun -m speculators.train`` on GPU 0 as
``trainer``, with the recipe's stop (``children_first``) and checkpoint quarantine. Steps:
fresh start → a mid-epoch checkpoint → ``cleanup`` (the ranks save ``interrupted/``) → GPU
free → redeploy → "Resuming mid-epoch" → cleanup → GPU free. Prints one JSON summary and
leaves the logs under ``--out``.

    python3 bench/real_trainer_gpu.py --out /tmp/real [--cpu]

``--cpu`` runs the same on a machine without a GPU (with the tests' CPU shim).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "rehearsal"))

from outrig.console import Reporter  # noqa: E402
from outrig.journal import Journal  # noqa: E402
from outrig.ops.cleanup import cleanup  # noqa: E402
from outrig.ops.deploy import deploy  # noqa: E402
from outrig.ops.status import status  # noqa: E402
from outrig.session import Project  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gpu_apps() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi: {exc}"


def wait(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


def trainer_project(out: Path, *, cpu: bool = False, loss: str = "eager",
                    epochs: int = 20, extra_keys: dict[str, Any] | None = None,
                    python: str | None = None) -> Path:
    """A fresh project under ``out`` whose playbook ``real-trainer`` runs the recipe's trainer
    command on GPU 0 (the hidden-state stand-in as its server, the real prepare-data): the
    host file ``gpu-box`` (``hostname: local``), the verifier, the conversations. Returns
    the trainer's save path. ``extra_keys``: top-level playbook keys added (``hang:``);
    ``python``: the interpreter with torch and speculators (default: this one)."""
    from make_verifier import make_verifier, write_conversations

    if out.exists():
        shutil.rmtree(out)
    (out / "hosts").mkdir(parents=True)
    (out / "playbooks").mkdir()
    model = make_verifier(out / "model")
    convs = write_conversations(out / "convs.jsonl", 160 if not cpu else 48)
    (out / "hosts" / "gpu-box.yaml").write_text(yaml.safe_dump(
        {"hostname": "local", "workdir": str(out / "box")}))
    shims = out / "shims" / "vllm" / "entrypoints" / "cli"
    shims.mkdir(parents=True)
    for folder in (shims.parents[1], shims.parent, shims):
        (folder / "__init__.py").write_text("")
    (shims / "main.py").write_text(
        "import os, sys\nos.execv(sys.executable, [sys.executable, "
        f"{str(REPO / 'tests' / 'standins' / 'hs_vllm.py')!r}, *sys.argv[1:]])\n")
    port = free_port()
    py = python or sys.executable
    torchrun = str(Path(py).with_name("torchrun"))
    if not Path(torchrun).exists():
        torchrun = shutil.which("torchrun") or "torchrun"
    save, data = out / "ckpt", out / "data"
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]}}}
    kv = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
          "kv_connector_extra_config": {"shared_storage_path": str(out / "hs")}}
    trainer_env: dict[str, str] = {"COLUMNS": "300", "PYTHONUNBUFFERED": "1",
                                   "HF_HUB_OFFLINE": "1", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "150"}
    extra: list[str] = []
    if cpu:
        trainer_env["PYTHONPATH"] = str(REPO / "tests" / "rehearsal" / "cpu_shim")
        extra = ["--draft-attn-impl", "sdpa"]
    book = {"name": "real-trainer", "processes": {
        "server": {"command": [py, "-m", "vllm.entrypoints.cli.main", "serve", str(model),
                               "--speculative_config", json.dumps(spec),
                               "--kv_transfer_config", json.dumps(kv), "--max-model-len", "257",
                               "--enable-scale-out", "--port", str(port), "--host", "127.0.0.1"],
                   "env": {"PYTHONPATH": str(out / "shims"), "HF_HUB_OFFLINE": "1"},
                   "ready": {"http": f"http://127.0.0.1:{port}/health", "model": str(model),
                             "timeout": 300},
                   "stop": {"grace": 30}, "scratch": [str(out / "hs")]},
        "prepare": {"after": "server",
                    "command": [py, "-m", "speculators", "prepare-data", "--model", str(model),
                                "--data", str(convs), "--render-endpoint",
                                f"http://127.0.0.1:{port}", "--output", str(data),
                                "--seq-length", "256", "--num-preprocessing-workers", "1"],
                    "env": {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"},
                    "ready": {"exit": True, "timeout": 600}, "stop": {"grace": 10}},
        "trainer": {"after": "prepare", "gpus": [] if cpu else [0],
                    "command": [torchrun, "--standalone", "--nproc_per_node", "1",
                                "-m", "speculators.train", "--speculator-type", "dflash",
                                "--verifier-name-or-path", str(model), "--data-path", str(data),
                                "--save-path", str(save), "--vllm-endpoint",
                                f"http://127.0.0.1:{port}/v1", "--target-layer-ids", "1", "2",
                                "3", "--block-size", "8", "--epochs", str(epochs), "--lr", "6e-4",
                                "--total-seq-len", "256", "--num-workers", "1",
                                "--checkpoint-freq", "0.25", "--loss-implementation",
                                loss, *extra],
                    "env": trainer_env,
                    "ready": {"log": "Starting fresh training run|Resuming training on epoch|"
                              "Resuming mid-epoch from epoch", "timeout": 600},
                    "fatal": ["Traceback \\(most recent call last\\)"],
                    "stop": {"grace": 150, "children_first": True},
                    "checkpoints": {"path": str(save)}}}}
    book.update(extra_keys or {})
    playbook = out / "playbooks" / "real-trainer.yaml"
    playbook.write_text(yaml.safe_dump(book, sort_keys=False))
    return save


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--loss", default="eager")
    args = parser.parse_args()
    out = args.out.resolve()
    save = trainer_project(out, cpu=args.cpu, loss=args.loss)
    project, journal = Project(out), Journal(out / "state")
    reporter = Reporter(quiet=True)
    summary: dict[str, Any] = {"gpu_before": gpu_apps()}

    def trainer_log(run_id: str) -> str:
        path = out / "box" / "runs" / run_id / "logs" / "trainer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    t0 = time.monotonic()
    first = deploy(project, "gpu-box", "real-trainer", reporter, journal=journal)
    summary["deploy_s"] = round(time.monotonic() - t0, 1)
    wait(lambda: any(p.name.startswith("epoch0_step") for p in save.glob("epoch0_*")), 600,
         "a mid-epoch checkpoint")
    wait(lambda: "Checkpoint saved to" in trainer_log(first.plan.run_id), 120, "its log line")
    summary["gpu_while_training"] = gpu_apps()
    st = status(project, "gpu-box", reporter, journal=journal)
    trainer_state = next(p for r in st.get("runs") or [] for p in r.get("processes") or []
                         if p.get("name") == "trainer")
    summary["status_progress"] = trainer_state.get("progress")
    summary["status_checkpoint"] = trainer_state.get("checkpoint")
    t1 = time.monotonic()
    print(json.dumps(summary, default=str), flush=True)
    stopped = cleanup(project, "gpu-box", reporter, playbook="real-trainer", journal=journal)
    summary["cleanup_s"] = round(time.monotonic() - t1, 1)
    summary["cleanup"] = [(p["process"], p["how"], p["seconds"])
                          for r in stopped["runs"] for p in r["processes"]]
    log1 = trainer_log(first.plan.run_id)
    summary["interrupt_saved"] = "Interrupt checkpoint saved to" in log1
    summary["interrupted_files"] = sorted(os.listdir(save / "interrupted")) \
        if (save / "interrupted").is_dir() else []
    exit_file = out / "box" / "runs" / first.plan.run_id / "exit" / "trainer.json"
    summary["torchrun_exit"] = json.loads(exit_file.read_text()) if exit_file.exists() else None
    summary["gpu_after_cleanup"] = gpu_apps()
    summary["state_before_resume"] = json.loads((save / "0" / "training_state.json").read_text())

    second = deploy(project, "gpu-box", "real-trainer", reporter, journal=journal)
    wait(lambda: "Checkpoint saved to" in trainer_log(second.plan.run_id), 600,
         "a checkpoint after the resume")
    log2 = trainer_log(second.plan.run_id)
    summary["resume_lines"] = [line.strip() for line in log2.splitlines()
                               if "Resuming" in line or "Found checkpoint" in line][:4]
    cleanup(project, "gpu-box", reporter, playbook="real-trainer", journal=journal)
    summary["gpu_after_second_cleanup"] = gpu_apps()
    summary["checkpoint_layout"] = sorted(p.name for p in save.iterdir())
    for index, (run, text) in enumerate(((first, log1), (second, log2)), 1):
        (out / f"trainer-{index}.log").write_text(text)
        server = out / "box" / "runs" / run.plan.run_id / "logs" / "server.log"
        if server.exists():
            shutil.copy(server, out / f"server-{index}.log")
    print(json.dumps(summary, indent=1, default=str))
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return 0


def leave_nothing_behind(stopped: Sequence[int] = ()) -> Path:
    """What a bench script's ``finally`` does, whatever failed: continue what it SIGSTOPped
    (a pid, or a negative process group; first, since a stopped process cannot act on the
    stop's SIGTERM), then stop every run of the project under ``--out``. Returns that
    folder. A failing cleanup is printed, never raised over the first error."""
    for target in stopped:
        try:
            os.kill(target, signal.SIGCONT)  # negative: the whole group
        except OSError:
            pass
    out_dir = Path(sys.argv[sys.argv.index("--out") + 1]).resolve()
    if (out_dir / "hosts").is_dir():
        try:
            cleanup(Project(out_dir), "gpu-box", Reporter(quiet=True), all_runs=True,
                    journal=Journal(out_dir / "state"))
        except Exception as exc:  # report, do not mask the first error
            print(f"final cleanup: {exc}", file=sys.stderr)
    return out_dir


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:  # never leave the run behind, whatever failed
        out_dir = leave_nothing_behind()
        for index, log in enumerate(sorted(out_dir.glob("box/runs/*/logs/trainer.log"))):
            shutil.copy(log, out_dir / f"trainer-run{index + 1}.log")
