"""A vLLM-like process tree on a real GPU, with PyTorch (test stand-in for the real-GPU check).

The parent allocates GPU memory and spawns children with multiprocessing's *spawn* context,
like vLLM; each child renames itself (``prctl(PR_SET_NAME)``, as vLLM's setproctitle changes
``comm``) and allocates GPU memory of its own. When every child holds its memory the parent
prints ``all children hold GPU memory`` (the readiness line). On SIGTERM the parent terminates
its children and exits, as vLLM does; on SIGKILL of the parent the children live on and keep
their memory: vLLM issue #55510, and what ``pkill -9`` leaves behind.

Usage: python3 gpu_tree.py [--parent-gib 1] [--child NAME:GIB ...]
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import time
from typing import Any


def rename(name: str) -> None:
    libc = ctypes.CDLL(None)
    libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def hold(gib: float) -> Any:
    import torch

    block = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda:0")
    block.fill_(1)
    torch.cuda.synchronize()
    return block


def child(name: str, gib: float, ready: Any) -> None:
    rename(name)
    block = hold(gib)
    print(f"{name} pid={os.getpid()} pgid={os.getpgid(0)} sid={os.getsid(0)} holds {gib} GiB "
          f"on {os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
    ready.release()
    while block is not None:
        time.sleep(1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parent-gib", type=float, default=1.0)
    parser.add_argument("--child", action="append", default=[],
                        help="NAME:GIB, e.g. VLLM::EngineCore:6 (repeatable)")
    args = parser.parse_args()
    specs = [(c.rsplit(":", 1)[0], float(c.rsplit(":", 1)[1])) for c in args.child] or [
        ("VLLM::EngineCore", 6.0), ("VLLM::Worker_TP1", 3.0)]
    ctx = mp.get_context("spawn")
    ready = ctx.Semaphore(0)
    children = [ctx.Process(target=child, args=(name, gib, ready), name=name)
                for name, gib in specs]
    for proc in children:
        proc.start()

    def on_term(signum: int, frame: Any) -> None:
        for proc in children:
            proc.terminate()
        for proc in children:
            proc.join(10)
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    block = hold(args.parent_gib) if args.parent_gib > 0 else None
    for _ in children:
        ready.acquire()
    print(f"parent pid={os.getpid()} holds {args.parent_gib} GiB; "
          "all children hold GPU memory", flush=True)
    while block is not None or children:
        time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
