"""Peak GPU memory of a DFlash draft at Qwen3.6 size, full vocabulary vs a 32k draft vocabulary.

Runs the real speculators trainer (one rank) against the hidden-state stand-in
(tests/standins/hs_vllm.py) on a random verifier with Qwen3.6-27B's width and vocabulary
(hidden 5120, ~248k tokens) but only a couple of layers, with ``--max-anchors 3072`` and
``--total-seq-len 8192``, for a few steps each way. Prints one JSON document: peak memory as
torch saw it (``max_memory_allocated`` / ``max_memory_reserved``, written by a sitecustomize
hook when the rank exits) and as nvidia-smi saw it (polled), and whether the run finished.
The planner's draft-logits check (outrig/recipes/dflash.py ``LOGIT_BYTES``) is fitted to
these numbers; docs/real-gpu.md has the measured ones.

    python3 bench/draft_memory.py --out /tmp/mem [--steps 3] [--vocab 248320] ...

Needs a GPU and speculators 0.9 + torch + transformers in the running interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "rehearsal"))

HOOK = '''
import atexit, json, os
def _report():
    try:
        import torch
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out = {"pid": os.getpid(),
                   "max_allocated": torch.cuda.max_memory_allocated(),
                   "max_reserved": torch.cuda.max_memory_reserved()}
            with open(os.environ["OUTRIG_MEM_REPORT"], "a") as f:
                f.write(json.dumps(out) + "\\n")
    except Exception as exc:
        print("memory hook failed:", exc, flush=True)
if os.environ.get("OUTRIG_MEM_REPORT"):
    atexit.register(_report)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def long_conversations(path: Path, count: int, words: int, seed: int = 0) -> None:
    from make_verifier import WORDS

    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(count):
            answer = " ".join(rng.choice(WORDS) for _ in range(words)) + "."
            f.write(json.dumps({"conversations": [
                {"role": "user", "content": "explain the draft model please?"},
                {"role": "assistant", "content": answer}]}) + "\n")


def gpu_used(pids: set[int]) -> int:
    """MiB that nvidia-smi lists for ``pids`` right now."""
    try:
        text = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                               "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    total = 0
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) in pids:
            total += int(parts[1]) if parts[1].isdigit() else 0
    return total


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                raw = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(raw[raw.rfind(")") + 2:].split()[1]), []).append(int(name))
    out, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def train(args: argparse.Namespace, model: Path, data: Path, port: int, label: str,
          loss: str, extra: list[str]) -> dict[str, Any]:
    out = args.out / label
    out.mkdir(parents=True, exist_ok=True)
    report = out / "memory.jsonl"
    hook = out / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(HOOK)
    env = {**os.environ, "OUTRIG_MEM_REPORT": str(report), "COLUMNS": "300",
           "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")])}
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    if not Path(torchrun).exists():
        torchrun = "torchrun"
    argv = [torchrun, "--standalone", "--nproc_per_node", "1", "-m", "speculators.train",
            "--speculator-type", "dflash", "--verifier-name-or-path", str(model),
            "--data-path", str(data), "--save-path", str(out / "ckpt"),
            "--vllm-endpoint", f"http://127.0.0.1:{port}/v1", "--target-layer-ids",
            *[str(i) for i in args.aux], "--total-seq-len", str(args.seq),
            "--max-anchors", str(args.anchors), "--max-steps", str(args.steps),
            "--epochs", "1", "--num-workers", "1", "--loss-implementation", loss,
            *extra]
    log = out / "train.log"
    started = time.monotonic()
    with log.open("w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
    peak = 0
    while proc.poll() is None and time.monotonic() - started < args.timeout:
        peak = max(peak, gpu_used(descendants(proc.pid)))
        time.sleep(0.5)
    if proc.poll() is None:
        proc.kill()
    code = proc.wait()
    torch_peaks = [json.loads(line) for line in report.read_text().splitlines()] \
        if report.exists() else []
    text = log.read_text(errors="replace")
    return {"label": label, "loss": loss, "extra": extra, "exit": code,
            "seconds": round(time.monotonic() - started, 1),
            "nvidia_smi_peak_mib": peak,
            "torch_max_allocated_gib": max((p["max_allocated"] for p in torch_peaks),
                                           default=0) / 2**30,
            "torch_max_reserved_gib": max((p["max_reserved"] for p in torch_peaks),
                                          default=0) / 2**30,
            "oom": "OutOfMemoryError" in text or "CUDA out of memory" in text,
            "steps_logged": text.count("train/loss="), "log": str(log),
            "tail": text.splitlines()[-5:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--hidden", type=int, default=5120)
    parser.add_argument("--intermediate", type=int, default=17408)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=248320)
    parser.add_argument("--anchors", type=int, default=3072)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--draft-vocab", type=int, default=32000)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--loss", default="eager",
                        help="comma-separated: each loss implementation is measured")
    parser.add_argument("--server-device", default="cuda",
                        help="where the hidden-state stand-in runs the verifier")
    parser.add_argument("--timeout", type=float, default=400)
    parser.add_argument("--only", choices=["full", "draft"], default=None)
    args = parser.parse_args()
    from make_verifier import make_verifier

    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    model = args.out / "model"
    if not (model / "config.json").exists():
        make_verifier(model, config={
            "hidden_size": args.hidden, "intermediate_size": args.intermediate,
            "num_hidden_layers": args.layers, "num_attention_heads": 40,
            "num_key_value_heads": 8, "head_dim": 128,
            "max_position_embeddings": args.seq * 2},
            # the tokenizer has ~420 tokens; the rest are unused rows, as in real Qwen
            spare_vocab=args.vocab - 420, device=args.server_device)
    config = json.loads((model / "config.json").read_text())
    layers = config["num_hidden_layers"]
    args.aux = sorted({1, layers // 2} & set(range(1, layers))) or [1]
    convs = args.out / "long.jsonl"
    long_conversations(convs, args.samples, words=int(args.seq * 1.2))
    made = round(time.monotonic() - t0, 1)

    port = free_port()
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {
                "eagle_aux_hidden_state_layer_ids": [*args.aux, layers]}}}
    kv = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
          "kv_connector_extra_config": {"shared_storage_path": str(args.out / "hs")}}
    server_log = (args.out / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "standins" / "hs_vllm.py"), "serve", str(model),
         "--speculative_config", json.dumps(spec), "--kv_transfer_config", json.dumps(kv),
         "--max-model-len", str(args.seq + 1), "--enable-scale-out", "--port", str(port),
         "--host", "127.0.0.1"], stdout=server_log, stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HS_VLLM_DEVICE": args.server_device})
    results: dict[str, Any] = {"verifier": {k: config[k] for k in (
        "hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")},
        "anchors": args.anchors, "seq": args.seq, "steps": args.steps,
        "verifier_made_s": made, "runs": []}
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                time.sleep(1)
        data = args.out / "data"
        prep = subprocess.run(
            [sys.executable, "-m", "speculators", "prepare-data", "--model", str(model),
             "--data", str(convs), "--render-endpoint", f"http://127.0.0.1:{port}",
             "--output", str(data), "--seq-length", str(args.seq), "--no-skip-token-freq"],
            capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
            timeout=600)
        results["prepare_exit"] = prep.returncode
        results["prepare_tail"] = (prep.stdout + prep.stderr).splitlines()[-5:]
        runs: list[tuple[str, str, list[str]]] = []
        for loss in args.loss.split(","):
            if args.only != "draft":
                runs.append((f"full-{loss}", loss, []))
            if args.only != "full":
                runs.append((f"draft-{loss}", loss,
                             ["--draft-vocab-size", str(args.draft_vocab)]))
        for label, loss, extra in runs:
            results["runs"].append(train(args, model, data, port, label, loss, extra))
            print(json.dumps(results["runs"][-1]), flush=True)
    finally:
        server.terminate()
        server.wait(60)
    print(json.dumps(results, indent=1))
    (args.out / "summary.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
