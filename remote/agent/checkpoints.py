"""Checkpoints: which save folders a trainer wrote completely (verdicts, quarantine of partial
ones before a resume) and the ``checkpoints`` op that lists them for ``stage``."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from .constants import JSONDict
from .events import AgentError, Emitter
from .layout import read_json
from .transfer import walk_files
from .validation import Request, get_bool, get_str

# speculators 0.9 ``maybe_save_checkpoint`` (train/trainer.py) writes, into ``<save>/<epoch>/``
# and in this order: config.json + model.safetensors (save_pretrained), optimizer_state_dict.pt,
# scheduler_state_dict.pt (not with --scheduler-type none), training_state.json, then the
# ``epoch<E>_step<K>``/``epoch<E>_end`` symlink and the "Checkpoint saved to" log line. With
# --checkpoint-freq < 1 the same folder is rewritten in place several times per epoch, and the
# trainer resumes from the highest integer folder without checking it (checkpointer.py
# ``_get_previous_epoch``). So a folder is complete only when training_state.json, written
# last, is at least as new as every other file of the set and names the folder's epoch.
CKPT_FILES = ("config.json", "optimizer_state_dict.pt", "training_state.json")
CKPT_MODEL = ("model.safetensors", "model.safetensors.index.json")
CKPT_SCHEDULER = "scheduler_state_dict.pt"
CKPT_STATE = "training_state.json"


def checkpoint_verdict(epoch: int, files: Dict[str, JSONDict], state: Any, scheduler: bool,
                       max_steps: Optional[int]) -> Tuple[bool, str, Optional[str]]:
    """(complete, why, note) for one numbered checkpoint folder; see the rule above."""
    wanted = list(CKPT_FILES) + ([CKPT_SCHEDULER] if scheduler else [])
    missing = [n for n in wanted if n not in files]
    if not any(n in files for n in CKPT_MODEL):
        missing.insert(0, "model.safetensors")
    if missing:
        return False, f"missing {', '.join(missing)}", None
    if not isinstance(state, dict) or not isinstance(state.get("epoch"), int):
        return False, "training_state.json does not parse (being written?)", None
    if state["epoch"] != epoch:
        return False, (f"training_state.json names epoch {state['epoch']}, not {epoch}"), None
    stamp = float(files[CKPT_STATE]["mtime"])
    model_files = [n for n in files if n.endswith(".safetensors")] + [
        n for n in CKPT_MODEL if n in files]
    newer = sorted({n for n in wanted + model_files
                    if n in files and float(files[n]["mtime"]) > stamp})
    if newer:
        return False, (f"{', '.join(newer)} newer than training_state.json: a save into this "
                       "folder started and did not finish"), None
    step = state.get("local_step")
    where = (f"epoch {epoch}, step {step}" if isinstance(step, int) and step > 0
             else f"end of epoch {epoch}")
    note = None
    total = state.get("global_step")
    if (max_steps is not None and isinstance(total, int) and total >= max_steps
            and not (isinstance(step, int) and step > 0)):
        note = (f"training stopped at --max-steps {max_steps} (global step {total}); "
                f"speculators saved it as the end of epoch {epoch}, so a resume starts "
                f"epoch {epoch + 1}")
    return True, f"complete ({where}, global step {total})", note


def checkpoint_entry(full: str, scheduler: bool, max_steps: Optional[int]) -> JSONDict:
    """One numbered folder: files with sizes and mtimes, training state and the verdict."""
    name = os.path.basename(full)
    files: Dict[str, JSONDict] = {}
    for rel in walk_files(full):
        with contextlib.suppress(OSError):
            st = os.stat(os.path.join(full, rel))
            files[rel] = {"size": st.st_size, "mtime": st.st_mtime}
    state: Any = None
    with contextlib.suppress(OSError, ValueError):
        if files.get(CKPT_STATE, {}).get("size", 1 << 20) <= 65536:
            state = read_json(os.path.join(full, CKPT_STATE))
    complete, why, note = checkpoint_verdict(int(name), files, state, scheduler, max_steps)
    return {"name": name, "epoch": int(name), "path": full,
            "files": {k: v["size"] for k, v in files.items()},
            "mtimes": {k: v["mtime"] for k, v in files.items()},
            "newest_mtime": max((v["mtime"] for v in files.values()), default=0.0),
            "training_state": state if isinstance(state, dict) else None,
            "complete": complete, "why": why, "note": note}


def quarantine_checkpoints(save: str, scheduler: bool, out: Emitter) -> List[str]:
    """Move incomplete numbered folders aside before the trainer starts.

    speculators resumes from the highest integer folder without checking it, so a folder left
    half-written by a killed save would be loaded (or crash the load). Renamed to
    ``<N>.incomplete-<unix time>``, it is kept for inspection and skipped by the trainer
    (non-integer names are ignored there)."""
    moved: List[str] = []
    try:
        names = os.listdir(save)
    except OSError:
        return moved
    for name in sorted(names, key=lambda n: int(n) if n.isdigit() else -1):
        full = os.path.join(save, name)
        if not name.isdigit() or os.path.islink(full) or not os.path.isdir(full):
            continue
        entry = checkpoint_entry(full, scheduler, None)
        if entry["complete"]:
            continue
        target = f"{full}.incomplete-{int(time.time())}"
        try:
            os.rename(full, target)
        except OSError as exc:
            raise AgentError("workdir", f"checkpoint {full} is incomplete ({entry['why']}) "
                             f"and cannot be moved aside ({exc.strerror}); the trainer would "
                             f"resume from it. Move or delete it by hand, then deploy again"
                             ) from None
        moved.append(target)
        out.warning(f"checkpoint {full} is incomplete ({entry['why']}); moved it to "
                    f"{target} so the trainer resumes from the newest complete one")
    return moved


def newest_checkpoint(save: str, scheduler: bool = True,
                      max_steps: Optional[int] = None) -> Optional[JSONDict]:
    """The highest complete ``<save>/<int>/`` (what a resume should start from)."""
    try:
        names = os.listdir(save)
    except OSError:
        return None
    numbered = sorted((int(n) for n in names if n.isdigit()
                       and os.path.isdir(os.path.join(save, n))
                       and not os.path.islink(os.path.join(save, n))), reverse=True)
    interrupted = os.path.isdir(os.path.join(save, "interrupted"))
    incomplete: List[JSONDict] = []
    for epoch in numbered:
        entry = checkpoint_entry(os.path.join(save, str(epoch)), scheduler, max_steps)
        if not entry["complete"]:
            incomplete.append({"name": entry["name"], "why": entry["why"]})
            continue
        state_mtime = entry["mtimes"].get(CKPT_STATE)
        return {"save_path": save, "path": entry["path"], "name": entry["name"],
                "count": len(numbered), "mtime": round(state_mtime, 3) if state_mtime else None,
                "training_state": entry["training_state"], "interrupted": interrupted,
                "incomplete": incomplete, "note": entry["note"]}
    return {"save_path": save, "path": None, "count": 0, "interrupted": interrupted,
            "incomplete": incomplete}


def op_checkpoints(req: Request, out: Emitter) -> JSONDict:
    """The save folder's checkpoint dirs with their files, sizes, mtimes and verdicts."""
    raw = req.raw
    save = os.path.expanduser(get_str(raw, "save_path", ""))
    scheduler = get_bool(raw, "scheduler", "", True)
    max_steps_raw = raw.get("max_steps")
    max_steps = int(max_steps_raw) if isinstance(max_steps_raw, int) else None
    try:
        names = sorted(os.listdir(save))
    except OSError:
        return {"save_path": save, "exists": False, "checkpoints": [], "others": []}
    found: List[JSONDict] = []
    others: List[str] = []
    for name in names:
        full = os.path.join(save, name)
        if os.path.islink(full) or not os.path.isdir(full):
            continue
        if not name.isdigit():
            others.append(name)
            continue
        found.append(checkpoint_entry(full, scheduler, max_steps))
    return {"save_path": save, "exists": True, "checkpoints": found, "others": others,
            "now": time.time()}
