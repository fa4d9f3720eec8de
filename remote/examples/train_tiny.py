#!/usr/bin/env python3
"""A tiny, real CPU training loop: the demo's workload (pushed by playbooks/smoke.yaml as train.py).

It learns y = 3x + 2 from noisy samples with minibatch SGD (momentum, a decaying learning rate),
so the loss it prints really falls. It behaves the way outrig expects a speculators trainer to
behave, without needing a GPU, so the demo shows what a real run shows (status's checkpoint
line, resume, ``sync-checkpoints``, ``migrate``):
- prints speculators-style lines: ``Training epoch 1/25 started`` and metric lines
  (``train/loss=0.123, ..., profile/step_ms=50.000, epoch=0, global_step=7``) that
  ``outrig status``/``tail-logs`` and the journal parse;
- saves into ``<save>/<epoch>/`` (0-based) the files speculators 0.9 writes there, in its order:
  ``config.json`` and ``model.safetensors`` (the weights w and b as a real safetensors file),
  ``optimizer_state_dict.pt``, ``scheduler_state_dict.pt`` and, last, ``training_state.json``
  (``epoch``, ``local_step``, ``global_step``). The two ``.pt`` files hold JSON here (no torch
  on the box); outrig only checks that they are there and not newer than the state. That is
  the folder outrig's checkpoint rule deems complete (outrig/checkpoints.py;
  remote/agent/checkpoints.py ``checkpoint_verdict``), and nothing else is;
- saves at the end of every epoch, every ``--checkpoint-every`` steps within one (``local_step``
  > 0: a mid-epoch save rewrites that epoch's folder, as speculators' ``--checkpoint-freq``
  does), at the last step, and on SIGTERM (outrig's stop: it saves, then exits 0 within one step);
- on start resumes from the newest complete checkpoint by the same rule (after a migrate, the
  one outrig copied over), skipping folders that a killed save left torn.

Standard library only, Python 3.8+.
"""

import argparse
import json
import os
import random
import signal
import struct
import sys
import time

TRUE_W, TRUE_B = 3.0, 2.0
DATASET_SIZE, BATCH = 256, 16
STEPS_PER_EPOCH = DATASET_SIZE // BATCH
MOMENTUM = 0.5
# speculators' checkpoint files, in the order it writes them (training_state.json last).
MODEL_FILE, STATE_FILE = "model.safetensors", "training_state.json"
CHECKPOINT_FILES = ("config.json", MODEL_FILE, "optimizer_state_dict.pt",
                    "scheduler_state_dict.pt", STATE_FILE)


class LinearModel:
    """y_hat = w * x + b, trained on mean squared error with momentum SGD."""

    def __init__(self, w=0.0, b=0.0, vw=0.0, vb=0.0):
        self.w, self.b = w, b
        self.vw, self.vb = vw, vb  # the optimizer's state: its momentum buffers

    def loss_and_grads(self, batch):
        n = float(len(batch))
        loss = gw = gb = 0.0
        for x, y in batch:
            err = self.w * x + self.b - y
            loss += err * err / n
            gw += 2.0 * err * x / n
            gb += 2.0 * err / n
        return loss, gw, gb

    def sgd_step(self, batch, lr):
        loss, gw, gb = self.loss_and_grads(batch)
        self.vw = MOMENTUM * self.vw + gw
        self.vb = MOMENTUM * self.vb + gb
        self.w -= lr * self.vw
        self.b -= lr * self.vb
        return loss


def learning_rate(base, step, total):
    """The scheduler: linear decay from ``base`` to a tenth of it over the run."""
    return base * (1.0 - 0.9 * min(step, total) / float(max(total, 1)))


def make_dataset(seed=0):
    rng = random.Random(seed)
    data = []
    for _ in range(DATASET_SIZE):
        x = rng.uniform(-2.0, 2.0)
        data.append((x, TRUE_W * x + TRUE_B + rng.gauss(0.0, 0.1)))
    return data


def where(step):
    """(epoch, local_step) after ``step`` steps: local_step 0 is the end of that epoch."""
    if step > 0 and step % STEPS_PER_EPOCH == 0:
        return step // STEPS_PER_EPOCH - 1, 0
    return step // STEPS_PER_EPOCH, step % STEPS_PER_EPOCH


# ----------------------------------------------------------------------- safetensors (tiny)


def safetensors_bytes(tensors):
    """A safetensors file of float32 scalars-as-1-element tensors: an 8-byte little-endian
    header length, the JSON header, then the raw data (huggingface/safetensors' format)."""
    header, data = {}, b""
    for name in sorted(tensors):
        raw = struct.pack("<f", tensors[name])
        header[name] = {"dtype": "F32", "shape": [1], "data_offsets": [len(data),
                                                                       len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(text)) + text + data


def read_safetensors(path):
    """{name: float} of a file written by :func:`safetensors_bytes`."""
    with open(path, "rb") as f:
        blob = f.read()
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + size].decode())
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        out[name] = struct.unpack("<f", blob[8 + size + start:8 + size + end])[0]
    return out


# --------------------------------------------------------------------------- checkpoints


def verdict(path, epoch):
    """(complete, why) of ``<save>/<epoch>/`` by outrig's rule: every file is there, the
    state parses and names this epoch, and no file is newer than the state (written last)."""
    missing = [n for n in CHECKPOINT_FILES if not os.path.isfile(os.path.join(path, n))]
    if missing:
        return False, "missing " + ", ".join(missing)
    try:
        with open(os.path.join(path, STATE_FILE)) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return False, STATE_FILE + " does not parse"
    if not isinstance(state, dict) or state.get("epoch") != epoch:
        return False, STATE_FILE + " names another epoch"
    stamp = os.stat(os.path.join(path, STATE_FILE)).st_mtime
    if any(os.stat(os.path.join(path, n)).st_mtime > stamp for n in CHECKPOINT_FILES):
        return False, "a save into it started and did not finish"
    return True, "complete"


def latest_checkpoint(save_path):
    """(global_step, path, state) of the newest complete ``<save>/<epoch>/``, or None."""
    try:
        names = os.listdir(save_path)
    except OSError:
        return None
    found = None
    for name in names:
        path = os.path.join(save_path, name)
        if not name.isdigit() or os.path.islink(path) or not os.path.isdir(path):
            continue
        complete, why = verdict(path, int(name))
        if not complete:
            print(f"Skipping checkpoint {path}: {why}.", flush=True)
            continue
        with open(os.path.join(path, STATE_FILE)) as f:
            state = json.load(f)
        step = int(state["global_step"])
        if found is None or step > found[0]:
            found = (step, path, state)
    return found


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(save_path, step, model, loss, lr, args):
    """Write ``<save>/<epoch>/`` in place, in speculators' order, training_state.json last: a
    save cut short leaves files newer than the old state, which the rule calls incomplete."""
    epoch, local_step = where(step)
    folder = os.path.join(save_path, str(epoch))
    os.makedirs(folder, exist_ok=True)
    config = {"model_type": "tiny_linear", "inputs": 1, "outputs": 1}
    write(os.path.join(folder, "config.json"), json.dumps(config).encode())
    write(os.path.join(folder, MODEL_FILE), safetensors_bytes({"w": model.w, "b": model.b}))
    write(os.path.join(folder, "optimizer_state_dict.pt"), json.dumps(
        {"momentum": MOMENTUM, "buffers": {"w": model.vw, "b": model.vb}}).encode())
    write(os.path.join(folder, "scheduler_state_dict.pt"), json.dumps(
        {"kind": "linear", "base_lr": args.lr, "last_lr": lr, "total_steps": args.steps}).encode())
    state = {"epoch": epoch, "local_step": local_step, "global_step": step, "loss": loss,
             "saved_at": time.time()}
    write(os.path.join(folder, STATE_FILE), json.dumps(state).encode())
    print(f"Checkpoint saved to {folder}", flush=True)
    return folder


def resume(save_path):
    """(model, step) from the newest complete checkpoint, or a fresh model at step 0."""
    found = latest_checkpoint(save_path)
    if found is None:
        print(f"No checkpoint found in '{save_path}'; starting from step 0.", flush=True)
        return LinearModel(), 0
    step, path, _state = found
    weights = read_safetensors(os.path.join(path, MODEL_FILE))
    with open(os.path.join(path, "optimizer_state_dict.pt")) as f:
        buffers = json.load(f)["buffers"]
    print(f"Resuming from checkpoint {path} at step {step}.", flush=True)
    return LinearModel(weights["w"], weights["b"], buffers["w"], buffers["b"]), step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--save-path", default="./checkpoints")
    ap.add_argument("--checkpoint-every", type=int, default=0,
                    help="also save every N steps within an epoch (0: at epoch ends only)")
    ap.add_argument("--step-seconds", type=float, default=0.05)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args(argv)

    stop = {"signal": None}

    def on_signal(signum, frame):
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    model, step = resume(args.save_path)
    saved = step  # the newest step already in a checkpoint
    epochs = -(-args.steps // STEPS_PER_EPOCH)
    data = make_dataset()
    rng = random.Random(step)  # a resumed run continues with a different, reproducible order
    loss, lr = None, learning_rate(args.lr, step, args.steps)
    first = True
    while step < args.steps:
        if stop["signal"] is not None:
            name = signal.Signals(stop["signal"]).name
            if step > saved:
                print(f"Received {name}: saving checkpoint at step {step} and exiting.",
                      flush=True)
                save_checkpoint(args.save_path, step, model, loss, lr, args)
            else:
                print(f"Received {name}: step {step} is saved already; exiting.", flush=True)
            return 0
        if first or step % STEPS_PER_EPOCH == 0:
            print(f"Training epoch {step // STEPS_PER_EPOCH + 1}/{epochs} started", flush=True)
            first = False
        t0 = time.monotonic()
        lr = learning_rate(args.lr, step, args.steps)
        loss = model.sgd_step(rng.sample(data, BATCH), lr)
        step += 1
        time.sleep(args.step_seconds)
        epoch, local_step = where(step)
        print(f"train/loss={loss:.3f}, train/w={model.w:.3f}, train/b={model.b:.3f}, "
              f"profile/step_ms={(time.monotonic() - t0) * 1000:.3f}, epoch={epoch}, "
              f"global_step={step}", flush=True)
        every = args.checkpoint_every
        if local_step == 0 or step == args.steps or (every > 0 and step % every == 0):
            save_checkpoint(args.save_path, step, model, loss, lr, args)
            saved = step
    print(f"Training finished at step {step}: w={model.w:.3f} b={model.b:.3f} (true 3, 2).",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
