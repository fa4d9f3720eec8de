"""Which checkpoint is complete? The verdicts of the agent's ``checkpoints`` listing, typed.

speculators 0.9 writes ``<save>/<epoch>/`` in place, in this order (train/trainer.py
``maybe_save_checkpoint``): config.json and model.safetensors, optimizer_state_dict.pt,
scheduler_state_dict.pt (absent with ``--scheduler-type none``), training_state.json, then an
``epoch<E>_step<K>`` / ``epoch<E>_end`` symlink and the "Checkpoint saved to" line. With
``--checkpoint-freq`` < 1 one folder is rewritten several times an epoch, so neither an old log
line nor the files' presence proves the folder is whole now. The rule, applied on the box by
the agent (``checkpoint_verdict`` in remote/agent/checkpoints.py, so that the quarantine
before a trainer launch and every workstation decision use the same one): every file of the
set is there, training_state.json parses and names the folder's epoch, and no file of the set
is newer than training_state.json, which is written last. ``interrupted/`` (the SIGTERM save)
has no training_state.json and speculators never resumes from it, so it is never chosen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from outrig.progress import argv_int, argv_option

# Required in every complete folder (plus scheduler_state_dict.pt unless the scheduler is off).
REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "optimizer_state_dict.pt",
    "scheduler_state_dict.pt",
    "training_state.json",
)


@dataclass(frozen=True)
class Checkpoint:
    epoch: int
    path: str
    complete: bool
    why: str
    size: int
    local_step: int = 0
    global_step: int | None = None
    note: str | None = None

    @property
    def mid_epoch(self) -> bool:
        """Saved part-way through its epoch (a resume skips the steps already done)."""
        return self.local_step > 0

    @property
    def order(self) -> tuple[int, int, int]:
        """Where this checkpoint stands in training (see :func:`checkpoint_order`)."""
        return checkpoint_order(self.epoch, self.local_step)


def checkpoint_order(epoch: int, local_step: int) -> tuple[int, int, int]:
    """A sort key for "which checkpoint is newer": by epoch, then within one epoch every
    mid-epoch save (``local_step`` > 0, by step) before the end-of-epoch save
    (``local_step`` 0). speculators rewrites ``<save>/<epoch>/`` in place at each save, so the
    same folder name holds older and newer states of training; the folder name alone cannot
    tell them apart."""
    return (epoch, 0, local_step) if local_step > 0 else (epoch, 1, 0)


def state_order(epoch: int, training_state: Any) -> tuple[int, int, int]:
    """:func:`checkpoint_order` of a folder from its parsed training_state.json; a state
    without a usable ``local_step`` counts as the end of the epoch (the newest the folder
    can be, so nothing replaces it on a guess)."""
    step = training_state.get("local_step") if isinstance(training_state, dict) else None
    return checkpoint_order(epoch, step if isinstance(step, int) and step > 0 else 0)


def order_text(order: tuple[int, int, int]) -> str:
    """``epoch 3, step 40`` or ``end of epoch 3``."""
    return f"end of epoch {order[0]}" if order[1] else f"epoch {order[0]}, step {order[2]}"


def assess(listing: dict[str, Any]) -> list[Checkpoint]:
    """Every integer-named checkpoint folder with the agent's verdict, oldest first."""
    entries = sorted(listing.get("checkpoints") or [], key=lambda c: int(c["epoch"]))
    out: list[Checkpoint] = []
    for entry in entries:
        files: dict[str, int] = entry.get("files") or {}
        state = entry.get("training_state") if isinstance(entry.get("training_state"),
                                                          dict) else {}
        step = state.get("local_step")
        total = state.get("global_step")
        out.append(Checkpoint(
            epoch=int(entry["epoch"]), path=str(entry["path"]),
            complete=bool(entry.get("complete")),
            why=str(entry.get("why") or "no verdict from the agent"),
            size=sum(int(v) for v in files.values()),
            local_step=step if isinstance(step, int) else 0,
            global_step=total if isinstance(total, int) else None,
            note=entry.get("note") if isinstance(entry.get("note"), str) else None))
    return out


def newest_complete(listing: dict[str, Any]) -> Checkpoint | None:
    """The checkpoint a resume should start from: the highest complete folder."""
    complete = [c for c in assess(listing) if c.complete]
    return complete[-1] if complete else None


def listing_request(trainer_argv: list[str]) -> dict[str, Any]:
    """The ``checkpoints`` op fields that depend on how the trainer was started."""
    return {"scheduler": argv_option(trainer_argv, "--scheduler-type") != "none",
            "max_steps": argv_int(trainer_argv, "--max-steps")}
