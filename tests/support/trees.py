"""File trees for the staging tests: random trees, their comparison by content, and
checkpoint folders laid out as speculators writes them."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_tree(root: Path, sizes: dict[str, int]) -> None:
    for rel, size in sizes.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))


def same_tree(a: Path, b: Path) -> bool:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*")
                     if p.is_file() and not p.name.startswith(".outrig-"))
    files_b = sorted(p.relative_to(b) for p in b.rglob("*")
                     if p.is_file() and not p.name.startswith(".outrig-"))
    return files_a == files_b and all(sha(a / f) == sha(b / f) for f in files_a)


def checkpoint(save: Path, epoch: int, *, complete: bool = True) -> None:
    folder = save / str(epoch)
    folder.mkdir(parents=True)
    names = ["config.json", "model.safetensors", "optimizer_state_dict.pt",
             "scheduler_state_dict.pt"]
    for name in names[: 4 if complete else 2]:
        (folder / name).write_bytes(os.urandom(20_000))
    if complete:
        (folder / "training_state.json").write_text(json.dumps({"epoch": epoch}))
        # written ten minutes ago, one file a second in speculators' order (the training
        # state last): the trainer is done with it
        old = time.time() - 600
        for index, name in enumerate([*names, "training_state.json"]):
            os.utime(folder / name, (old + index, old + index))
