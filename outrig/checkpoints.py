"""Which checkpoint is complete? Pure rules over the agent's ``checkpoints`` listing.

speculators writes ``<save>/<epoch>/`` with five files (config.json, model.safetensors,
optimizer_state_dict.pt, scheduler_state_dict.pt, training_state.json), logs
``Checkpoint saved to <dir>`` when done, and resumes from the highest integer-named dir.
``interrupted/`` (written on SIGTERM) is not resumed automatically, so it is never chosen.

A dir counts as complete only when every file is there, ``training_state.json`` parses,
and the trainer is done with it: the log says it was saved, or a later epoch exists, or
nothing in it changed for ``quiet_seconds``. A checkpoint still being written is never
chosen: resuming from half a checkpoint is worse than losing an epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "optimizer_state_dict.pt",
    "scheduler_state_dict.pt",
    "training_state.json",
)
QUIET_SECONDS = 120.0


@dataclass(frozen=True)
class Checkpoint:
    epoch: int
    path: str
    complete: bool
    why: str
    size: int


def assess(listing: dict[str, Any], *, quiet_seconds: float = QUIET_SECONDS) -> list[Checkpoint]:
    """Every integer-named checkpoint dir with a verdict, oldest first."""
    entries = sorted(listing.get("checkpoints") or [], key=lambda c: int(c["epoch"]))
    now = float(listing.get("now") or 0.0)
    out: list[Checkpoint] = []
    for index, entry in enumerate(entries):
        files: dict[str, int] = entry.get("files") or {}
        size = sum(int(v) for v in files.values())
        missing = [name for name in REQUIRED_FILES if name not in files]
        later = any(other.get("files") and all(n in other["files"] for n in REQUIRED_FILES)
                    for other in entries[index + 1:])
        if missing:
            verdict = (False, f"missing {', '.join(missing)}")
        elif not isinstance(entry.get("training_state"), dict):
            verdict = (False, "training_state.json does not parse (still being written?)")
        elif entry.get("logged_saved"):
            verdict = (True, "the trainer logged 'Checkpoint saved to' it")
        elif later:
            verdict = (True, "a later epoch exists")
        elif now - float(entry.get("newest_mtime") or 0) >= quiet_seconds:
            verdict = (True, f"unchanged for {now - float(entry['newest_mtime']):.0f} s")
        else:
            verdict = (False, f"written {now - float(entry.get('newest_mtime') or 0):.0f} s ago "
                              "and not logged as saved: may still be in progress")
        out.append(Checkpoint(epoch=int(entry["epoch"]), path=str(entry["path"]),
                              complete=verdict[0], why=verdict[1], size=size))
    return out


def newest_complete(listing: dict[str, Any], *,
                    quiet_seconds: float = QUIET_SECONDS) -> Checkpoint | None:
    complete = [c for c in assess(listing, quiet_seconds=quiet_seconds) if c.complete]
    return complete[-1] if complete else None
