"""Test stand-in for ``torchrun --standalone --nproc_per_node N -m speculators.train ...``.

Not product code. Reproduces what outrig reads from or relies on in the speculators trainer
(tests/standins/README.md traces each behaviour):
- the verifier check against vLLM: ``GET <endpoint>/models`` and ``ValueError: An explicit model
  name was passed (X) which doesn't match found model_id Y``;
- checkpoint layout, write order and resume, as speculators 0.9 does them (file:line below):
  ``<save>/<epoch>/`` written IN PLACE in the order config.json + model.safetensors,
  optimizer_state_dict.pt, scheduler_state_dict.pt (absent with ``--scheduler-type none``),
  training_state.json ``{"epoch", "local_step", "global_step"}``, then the
  ``epoch{E}_step{K}`` / ``epoch{E}_end`` symlink and "Checkpoint saved to" (trainer.py
  ``maybe_save_checkpoint``, ``_save_training_state``); ``--checkpoint-freq`` < 1 saves every
  ``max(1, round(steps × freq))`` steps into the same epoch folder (trainer.py ``train_epoch``);
  resume from the highest integer-named folder WITHOUT checking it (checkpointer.py
  ``_get_previous_epoch``), mid-epoch when ``local_step`` > 0 ("Resuming mid-epoch from
  epoch=E local_step=S global_step=G.", trainer.py ``setup_trainer``), else the next epoch;
  ``run.yaml`` + ``train_command.txt``; ``--max-steps`` ends the epoch early and saves it as
  an epoch end (``local_step`` 0);
- the per-step metric line format (3 decimals, ``%.2e`` outside [1e-3, 999]);
- SIGTERM: ``Received SIGTERM — interrupting training to save checkpoint`` and
  ``<save>/interrupted/`` without training_state.json (graceful_shutdown.py; the label is not
  an int, so ``_save_training_state`` is skipped), never resumed automatically;
- one process per rank holding GPU memory on CUDA_VISIBLE_DEVICES (holder files read by the
  fake nvidia-smi) when OUTRIG_FAKE_GPU_DIR is set. ``--fake-save-seconds`` spreads a save over
  time so tests can stop the trainer in the middle of one.

Differences, none of which outrig relies on: rank 0 is this process (no separate torchrun
agent); further ranks are its children and hold GPUs only.
Standard library only; no outrig import.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional

GPU_DIR_ENV = "OUTRIG_FAKE_GPU_DIR"
STOP = threading.Event()


class TrainingInterrupted(Exception):
    """graceful_shutdown.py: the first SIGTERM/SIGINT raises in the main thread, wherever it
    is (inside a step or inside a periodic checkpoint save); later ones are ignored."""


def on_interrupt(signum: int, frame: Any) -> None:
    if STOP.is_set():
        return
    STOP.set()
    log(f"Received {signal.Signals(signum).name} — interrupting training to save checkpoint. "
        "Send again to force immediate exit.", level="WARNING")
    raise TrainingInterrupted(signal.Signals(signum).name)


def log(msg: str, level: str = "INFO") -> None:
    """A RichHandler-like line (rank 0 only, like the real trainer)."""
    print(f"[{time.strftime('%m/%d/%y %H:%M:%S')}] {level:<8} {msg}", flush=True)


def fmt(key: str, value: Any) -> str:
    """speculators' metric formatting: ints as is; lr in e-notation; floats with 3 decimals,
    or ``%.2e`` when below 1e-3 or above 999 (in magnitude)."""
    if isinstance(value, int):
        return f"{key}={value}"
    v = float(value)
    if key.startswith("lr/") or (v != 0 and (abs(v) < 1e-3 or abs(v) > 999)):
        return f"{key}={v:.2e}"
    return f"{key}={v:.3f}"


def register_holder(physical: int, mib: int) -> None:
    """holders/<pid>.json for the fake nvidia-smi (same format as outrig.sandbox.nvidia_smi)."""
    d = os.environ.get(GPU_DIR_ENV)
    if not d:
        return
    hdir = os.path.join(d, "holders")
    os.makedirs(hdir, exist_ok=True)
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
        ticks: Optional[int] = int(raw[raw.rfind(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        ticks = None
    tmp = os.path.join(hdir, f".{pid}.tmp")
    with open(tmp, "w") as f:
        json.dump({"pid": pid, "gpu": physical, "mib": mib, "util": 90, "start_ticks": ticks}, f)
    os.replace(tmp, os.path.join(hdir, f"{pid}.json"))


def parse(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="speculators.train", add_help=False)
    p.add_argument("--verifier-name-or-path", required=True)
    p.add_argument("--speculator-type", default="eagle3")
    p.add_argument("--data-path", default="./output")
    p.add_argument("--save-path", default="./output/checkpoints")
    p.add_argument("--vllm-endpoint", default=None)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--total-seq-len", type=int, default=8192)
    p.add_argument("--target-layer-ids", type=int, nargs="+", default=None)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--log-freq", type=int, default=1)
    p.add_argument("--no-resume-from-checkpoint", action="store_true")
    p.add_argument("--checkpoint-freq", type=float, default=1.0)
    p.add_argument("--scheduler-type", default="linear")
    p.add_argument("--fake-save-seconds", type=float, default=0.0)
    p.add_argument("--fake-dataloader-workers", type=int, default=0)
    # torchrun's own flags, accepted so the rendered torchrun command works unchanged
    p.add_argument("--nproc_per_node", "--nproc-per-node", type=int, default=None)
    p.add_argument("--standalone", action="store_true")
    p.add_argument("--fake-steps-per-epoch", type=int, default=5)
    p.add_argument("--fake-step-seconds", type=float, default=0.2)
    p.add_argument("--fake-mib", type=int, default=20000)
    p.add_argument("--fake-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--fake-gpu", type=int, default=None, help=argparse.SUPPRESS)
    args, _unknown = p.parse_known_args(argv)
    return args


# ----------------------------------------------------------------------------- ranks
def rank_main(rank: int, physical: int, mib: int) -> None:
    """A non-zero rank: holds its GPU until SIGTERM (torchrun forwards it) or death."""
    signal.signal(signal.SIGTERM, lambda s, f: os._exit(0))
    register_holder(physical, mib)
    while True:
        time.sleep(3600)


def start_ranks(args: argparse.Namespace) -> List[subprocess.Popen[bytes]]:
    """Rank 0 is this process; ranks 1.. are children in our group (like torchrun's)."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None or not os.environ.get(GPU_DIR_ENV):
        return []
    gpus = [int(x) for x in cvd.split(",") if x.strip() != ""]
    if args.nproc_per_node:
        gpus = gpus[: args.nproc_per_node]
    if not gpus:
        return []
    register_holder(gpus[0], args.fake_mib)
    children = []
    for rank, phys in enumerate(gpus[1:], start=1):
        children.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--verifier-name-or-path", "-",
             "--fake-rank", str(rank), "--fake-gpu", str(phys), "--fake-mib", str(args.fake_mib)],
            stdin=subprocess.DEVNULL))
    # Like DDP's init barrier: training starts once every rank holds its GPU.
    holders = os.path.join(os.environ[GPU_DIR_ENV], "holders")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(holders, f"{c.pid}.json")) or c.poll() is not None
            for c in children):
        time.sleep(0.05)
    return children


# ----------------------------------------------------------------------------- checkpoints
def find_checkpoint(save: str) -> Optional[str]:
    """speculators' resume rule: the highest integer-named dir, symlinks and ``interrupted``
    skipped, nothing checked (checkpointer.py ``_get_previous_epoch``)."""
    try:
        names = os.listdir(save)
    except OSError:
        return None
    epochs = sorted((int(n) for n in names if n.isdigit()
                     and not os.path.islink(os.path.join(save, n))
                     and os.path.isdir(os.path.join(save, n))), reverse=True)
    return os.path.join(save, str(epochs[0])) if epochs else None


def _write_json(path: str, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f)


def _symlink(save: str, name: str, target: str) -> None:
    path = os.path.join(save, name)
    if os.path.lexists(path):
        os.unlink(path)
    os.symlink(target, path)


def save_checkpoint(save: str, name: str, args: argparse.Namespace,
                    state: Optional[Dict[str, Any]]) -> str:
    """Write in place, in speculators' order; a kill part-way leaves a mixed folder."""
    final = os.path.join(save, name)
    os.makedirs(final, exist_ok=True)
    pause = args.fake_save_seconds / 4
    _write_json(os.path.join(final, "config.json"), {
        "speculators_model_type": args.speculator_type,
        "verifier": args.verifier_name_or_path, "block_size": args.block_size,
        "target_layer_ids": args.target_layer_ids})
    with open(os.path.join(final, "config.py"), "w") as f:  # save_pretrained copies it
        f.write("# speculators draft config\n")
    with open(os.path.join(final, "model.safetensors"), "wb") as f:
        f.write(os.urandom(64))
    time.sleep(pause)
    with open(os.path.join(final, "optimizer_state_dict.pt"), "wb") as f:
        f.write(os.urandom(16))
    time.sleep(pause)
    command = os.path.join(save, "train_command.txt")  # _copy_train_command
    if os.path.exists(command):
        with open(command) as src, open(os.path.join(final, "train_command.txt"), "w") as dst:
            dst.write(src.read())
    if args.scheduler_type != "none":
        with open(os.path.join(final, "scheduler_state_dict.pt"), "wb") as f:
            f.write(os.urandom(16))
    time.sleep(pause)
    if state is not None:
        _write_json(os.path.join(final, "training_state.json"), state)
    time.sleep(pause)
    return final


def checkpoint(save: str, epoch: int, local: int, step: int, args: argparse.Namespace) -> None:
    """``maybe_save_checkpoint(epoch, local_step)`` for an integer epoch."""
    target = os.path.join(save, str(epoch))
    log(f"Saving checkpoint to {target}")
    save_checkpoint(save, str(epoch), args,
                    {"epoch": epoch, "local_step": local, "global_step": step})
    for old in os.listdir(save):
        if old.startswith(f"epoch{epoch}_") and os.path.islink(os.path.join(save, old)):
            os.unlink(os.path.join(save, old))
    _symlink(save, f"epoch{epoch}_step{local}" if local > 0 else f"epoch{epoch}_end",
             str(epoch))
    log(f"Checkpoint saved to {target}")


def write_run_files(save: str, args: argparse.Namespace, argv: List[str]) -> None:
    lines = [f"{k.replace('_', '-')}: {json.dumps(v)}" for k, v in sorted(vars(args).items())
             if not k.startswith("fake_")]
    with open(os.path.join(save, "run.yaml"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(save, "train_command.txt"), "w") as f:
        f.write("torchrun -m speculators.train " + " ".join(shlex.quote(a) for a in argv) + "\n")


# ----------------------------------------------------------------------------- vLLM check
def check_verifier(endpoint: str, verifier: str) -> Optional[str]:
    """None when vLLM serves ``verifier``; else the error line the real trainer dies with."""
    url = endpoint.rstrip("/") + "/models"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            data = json.loads(resp.read())
        found = data["data"][0]["id"]
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as e:
        return f"openai.APIConnectionError: Connection error. ({url}: {e})"
    if found != verifier:
        return (f"ValueError: An explicit model name was passed ({verifier}) which doesn't "
                f"match found model_id {found}")
    return None


# ----------------------------------------------------------------------------- training
def metrics(args: argparse.Namespace, epoch: int, step: int, rng: random.Random) -> List[str]:
    loss = 6.0 * math.exp(-0.04 * step) + 0.5 + rng.random() * 0.05
    acc = min(0.95, 1.0 - loss / 7.0)
    items: List[str] = [fmt("train/loss", loss)]
    if args.speculator_type == "eagle3":
        for k in range(3):
            items += [fmt(f"train/loss_{k}", loss * (1 + 0.1 * k)),
                      fmt(f"train/full_acc_{k}", acc * 0.9 ** k),
                      fmt(f"train/cond_acc_{k}", acc * 0.95 ** k)]
    else:
        items.append(fmt("train/full_acc", acc))
        for pos in range(1, args.block_size):
            items.append(fmt(f"train/position_{pos}_acc", acc * 0.93 ** pos))
        items.append(fmt("train/eal", 1.0 + 4.0 * acc))
    step_ms = args.fake_step_seconds * 1000
    fetch_ms = step_ms * 0.1 * (1 + rng.random())
    items += [fmt("profile/fetch_ms", fetch_ms), fmt("profile/fwd_ms", step_ms * 0.3),
              fmt("profile/bwd_ms", step_ms * 0.5), fmt("profile/opt_ms", step_ms * 0.05),
              fmt("profile/step_ms", step_ms),
              fmt("profile/tokens_per_s", args.total_seq_len / max(step_ms / 1000, 1e-6)),
              fmt("profile/fetch_frac", fetch_ms / step_ms if step_ms else 0.0),
              fmt("epoch", epoch), fmt("lr/Muon", args.lr), fmt("lr/AdamW", args.lr),
              fmt("global_step", step)]
    return items


def train(args: argparse.Namespace, argv: List[str]) -> int:
    save = args.save_path
    os.makedirs(save, exist_ok=True)
    write_run_files(save, args, argv)
    if args.vllm_endpoint:
        err = check_verifier(args.vllm_endpoint, args.verifier_name_or_path)
        if err:
            print("Traceback (most recent call last):", flush=True)
            print('  File "speculators/train/data.py", line 412, in _check_model', flush=True)
            print(err, flush=True)
            return 1

    start_epoch, global_step, skip = 0, 0, 0
    ckpt = None if args.no_resume_from_checkpoint else find_checkpoint(save)
    if ckpt:
        epoch_dir = int(os.path.basename(ckpt))
        log(f"Found checkpoint at {ckpt}.")
        try:
            with open(os.path.join(ckpt, "training_state.json")) as f:
                state = json.load(f)
        except (OSError, ValueError):
            state = {}
        start_epoch = epoch_dir + 1
        global_step = int(state.get("global_step", 0))
        if state.get("epoch") == epoch_dir and state.get("local_step", 0) > 0:
            start_epoch, skip = epoch_dir, int(state["local_step"])
            log(f"Resuming mid-epoch from epoch={start_epoch} local_step={skip} "
                f"global_step={global_step}.")
        else:
            log(f"Resuming training on epoch {start_epoch}.")
    else:
        log(f"No previous training checkpoint found in '{save}'. Starting fresh training run.")
    if os.path.isdir(os.path.join(save, "interrupted")):
        log(f"Found interrupted checkpoint at {os.path.join(save, 'interrupted')}. To resume "
            "from it, rename it to an epoch number (e.g., 'mv interrupted 5' to resume as "
            "epoch 5).", level="WARNING")

    rng = random.Random(1234 + global_step)
    steps = args.fake_steps_per_epoch
    interval = (max(1, round(steps * args.checkpoint_freq)) if args.checkpoint_freq < 1
                else None)
    for epoch in range(start_epoch, args.epochs):
        log(f"Training epoch {epoch + 1}/{args.epochs} started")
        for local in range(skip + 1, steps + 1):
            time.sleep(args.fake_step_seconds)
            items = metrics(args, epoch, global_step, rng)
            if global_step % max(1, args.log_freq) == 0:
                log(", ".join(items))
            global_step += 1
            if args.max_steps is not None and global_step >= args.max_steps:
                break
            if interval is not None and local % interval == 0 and steps - local >= interval:
                checkpoint(save, epoch, local, global_step, args)
        skip = 0
        log(f"Training epoch {epoch + 1}/{args.epochs} completed")
        if args.checkpoint_freq < 1 or (epoch + 1) % int(args.checkpoint_freq) == 0 \
                or epoch == 0:
            checkpoint(save, epoch, 0, global_step, args)
        _symlink(save, "checkpoint_best", str(epoch))
        log(f"Updated checkpoint_best -> {epoch} (loss_epoch=0.500000)")
        if args.max_steps is not None and global_step >= args.max_steps:
            break
    log("Training complete.")
    return 0


# ----------------------------------------------------------------------------- DataLoader
WORKERS: List[subprocess.Popen[bytes]] = []
EXITING = threading.Event()


class WorkerDied(RuntimeError):
    pass


def start_dataloader_workers(count: int) -> None:
    """Persistent DataLoader workers: children in this rank's group (so torchrun's killpg
    reaches them) with the default SIGTERM action. torch's SIGCHLD handler
    (utils/data/_utils/signal_handling.py ``_set_SIGCHLD_handler``) raises in the main thread
    when one dies: "DataLoader worker (pid X) is killed by signal: Terminated."."""
    for _ in range(count):
        WORKERS.append(subprocess.Popen(
            [sys.executable, "-c", "import time\nwhile True: time.sleep(3600)"],
            stdin=subprocess.DEVNULL))

    def on_child(signum: int, frame: Any) -> None:
        if EXITING.is_set():
            return
        for w in WORKERS:
            code = w.poll()
            if code is not None and code < 0:
                raise WorkerDied(f"DataLoader worker (pid {w.pid}) is killed by signal: "
                                 f"{signal.strsignal(-code)}.")

    if count:
        signal.signal(signal.SIGCHLD, on_child)


def stop_dataloader_workers() -> None:
    EXITING.set()
    for w in WORKERS:
        if w.poll() is None:
            w.terminate()
    for w in WORKERS:
        w.wait()


def interrupted(save: str, args: argparse.Namespace) -> int:
    """graceful_shutdown.py: save ``interrupted/`` (no training_state.json: the label is not
    an epoch number) and return normally."""
    try:
        return _interrupted(save, args)
    except WorkerDied as exc:  # raised before the save began: the rank crashes
        print("Traceback (most recent call last):", flush=True)
        print(f"RuntimeError: {exc}", flush=True)
        return 1


def _interrupted(save: str, args: argparse.Namespace) -> int:
    log("Training interrupted — attempting to save checkpoint (timeout=120s, send Ctrl+C "
        "again to force exit)...", level="WARNING")
    target = os.path.join(save, "interrupted")
    try:
        log(f"Saving checkpoint to {target}")
        save_checkpoint(save, "interrupted", args, None)
        log(f"Checkpoint saved to {target}")
        log(f"Interrupt checkpoint saved to '{target}'")
    except WorkerDied as exc:  # graceful_shutdown.py: logger.exception, then return normally
        log("Failed to save interrupt checkpoint", level="ERROR")
        print("Traceback (most recent call last):", flush=True)
        print('  File "speculators/train/graceful_shutdown.py", line 160, in wrapper',
              flush=True)
        print(f"RuntimeError: {exc}", flush=True)
    return 0


def main(argv: List[str]) -> int:
    args = parse(argv)
    if args.fake_rank is not None:
        rank_main(args.fake_rank, int(args.fake_gpu or 0), args.fake_mib)
        return 0
    launched_rank = os.environ.get("RANK")
    if launched_rank is not None:
        # Every rank logs this once init_process_group returned, past the rank-0 filter
        # (speculators 0.9 train/distributed.py:163-167, override_rank0_filter); the ranks of
        # a node without global rank 0 print nothing else.
        world = int(os.environ.get("WORLD_SIZE") or 1)
        print(f"Started distributed with local_rank={os.environ.get('LOCAL_RANK', '0')}, "
              f"dp_size={world}, sp_size=1", flush=True)
    if launched_rank not in (None, "0"):  # a further rank under (fake) torchrun
        cvd = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
        rank = int(launched_rank)
        # each rank takes its node's LOCAL_RANK-th GPU (speculators: device_id=local_rank,
        # train/distributed.py:156); the global rank indexes nothing on a node > 0
        local = int(os.environ.get("LOCAL_RANK") or rank)
        physical = int(cvd[local]) if local < len(cvd) else 0
        if os.environ.get(GPU_DIR_ENV):
            rank_main(rank, physical, args.fake_mib)
        signal.signal(signal.SIGTERM, lambda s, f: os._exit(0))
        while True:
            time.sleep(3600)
    signal.signal(signal.SIGTERM, on_interrupt)
    signal.signal(signal.SIGINT, on_interrupt)
    ranks = [] if launched_rank is not None else start_ranks(args)
    if launched_rank is not None and os.environ.get(GPU_DIR_ENV):
        cvd = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
        if cvd:
            register_holder(int(cvd[0]), args.fake_mib)
    start_dataloader_workers(args.fake_dataloader_workers)
    try:
        try:
            try:
                return train(args, argv)
            except TrainingInterrupted:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second TERM now kills
                return interrupted(args.save_path, args)
        except WorkerDied as exc:  # a worker killed while training: the run fails
            print("Traceback (most recent call last):", flush=True)
            print(f"RuntimeError: {exc}", flush=True)
            return 1
    finally:
        stop_dataloader_workers()
        for p in ranks:  # torchrun forwards the signal to its ranks and waits for them
            if p.poll() is None:
                p.terminate()
        for p in ranks:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
