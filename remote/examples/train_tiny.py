#!/usr/bin/env python3
"""A tiny, real CPU training loop: the demo's workload (pushed by playbooks/smoke.yaml as train.py).

It learns y = 3x + 2 from noisy samples with minibatch SGD, so the loss it prints really falls.
It behaves the way outrig expects a long-running trainer to behave, without needing a GPU:
- prints speculators-style metric lines (``train/loss=0.123, ..., epoch=0, global_step=7``) that
  ``inv tail-logs`` and the journal can parse;
- writes a checkpoint every K steps to ``<save>/<step>/training_state.json``, atomically (a temp
  dir renamed into place), so a checkpoint is either complete or absent when outrig syncs it;
- on start resumes from the highest complete checkpoint (after a migrate, the synced one);
- on SIGTERM (outrig's stop) saves a checkpoint and exits 0 within one step.

Standard library only, Python 3.8+.
"""

import argparse
import json
import os
import random
import shutil
import signal
import sys
import time

TRUE_W, TRUE_B = 3.0, 2.0
DATASET_SIZE, BATCH = 256, 16


class LinearModel:
    """y_hat = w * x + b, trained on mean squared error."""

    def __init__(self, w=0.0, b=0.0):
        self.w = w
        self.b = b

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
        self.w -= lr * gw
        self.b -= lr * gb
        return loss


def make_dataset(seed=0):
    rng = random.Random(seed)
    data = []
    for _ in range(DATASET_SIZE):
        x = rng.uniform(-2.0, 2.0)
        data.append((x, TRUE_W * x + TRUE_B + rng.gauss(0.0, 0.1)))
    return data


def latest_checkpoint(save_path):
    """(step, path) of the highest-numbered dir that holds training_state.json, or None."""
    best = None
    try:
        entries = os.listdir(save_path)
    except OSError:
        return None
    for name in entries:
        path = os.path.join(save_path, name)
        complete = os.path.isfile(os.path.join(path, "training_state.json"))
        if name.isdigit() and complete and (best is None or int(name) > best[0]):
            best = (int(name), path)
    return best


def save_checkpoint(save_path, step, model, loss):
    """Write <save>/<step>/training_state.json via a temp dir + rename (complete or absent)."""
    os.makedirs(save_path, exist_ok=True)
    final = os.path.join(save_path, str(step))
    tmp = os.path.join(save_path, f".tmp-{step}-{os.getpid()}")
    os.makedirs(tmp, exist_ok=True)
    state = {"global_step": step, "w": model.w, "b": model.b, "loss": loss, "saved_at": time.time()}
    with open(os.path.join(tmp, "training_state.json"), "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    if os.path.isdir(final):
        shutil.rmtree(final)
    os.rename(tmp, final)
    print(f"Checkpoint saved to {final}", flush=True)
    return final


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--save-path", default="./checkpoints")
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--step-seconds", type=float, default=0.05)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args(argv)

    stop = {"signal": None}

    def on_signal(signum, frame):
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    model, step = LinearModel(), 0
    found = latest_checkpoint(args.save_path)
    if found:
        with open(os.path.join(found[1], "training_state.json")) as f:
            state = json.load(f)
        model = LinearModel(state["w"], state["b"])
        step = int(state["global_step"])
        print(f"Resuming from checkpoint {found[1]} at step {step}.", flush=True)
    else:
        print(f"No checkpoint found in '{args.save_path}'; starting from step 0.",
              flush=True)

    data = make_dataset()
    steps_per_epoch = DATASET_SIZE // BATCH
    rng = random.Random(step)  # a resumed run continues with a different, reproducible order
    loss = float("nan")
    while step < args.steps:
        if stop["signal"] is not None:
            name = signal.Signals(stop["signal"]).name
            print(f"Received {name}: saving checkpoint at step {step} and exiting.",
                  flush=True)
            save_checkpoint(args.save_path, step, model, loss)
            return 0
        batch = rng.sample(data, BATCH)
        loss = model.sgd_step(batch, args.lr)
        step += 1
        epoch = (step - 1) // steps_per_epoch
        print(f"train/loss={loss:.3f}, train/w={model.w:.3f}, train/b={model.b:.3f}, "
              f"epoch={epoch}, global_step={step}", flush=True)
        if step % args.checkpoint_every == 0 or step == args.steps:
            save_checkpoint(args.save_path, step, model, loss)
        time.sleep(args.step_seconds)
    print(f"Training finished at step {step}: w={model.w:.3f} b={model.b:.3f} (true 3, 2).",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
