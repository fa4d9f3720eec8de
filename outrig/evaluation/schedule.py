"""Which checkpoint ``watch`` evaluates next while training goes on (``evaluate.
during_training``, docs/evaluate.md "During training"). Pure: the box's listing, the journal's
evaluations and the watch's failure counts in, a decision out.

A checkpoint is named by what its training_state.json says, not by its folder: speculators
rewrites ``<save>/<epoch>/`` in place at each mid-epoch save, so one folder holds several
states of training over time. The key is ``epoch:local_step:global_step``; an evaluation
recorded in the journal with that key (by any watch, or by ``outrig evaluate`` by hand) makes
the state done, so no state is evaluated twice, across restarts of the watch, redeploys and
moves alike. The next one is always the newest complete state not yet done and newer than
every done one: evaluations take minutes, saves may come faster, and a user wants the curve
to reach the present rather than to fill in the past (older mid-epoch states are overwritten
anyway). One that fails is tried once more while it is still the newest, then given up on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from outrig.checkpoints import Checkpoint, checkpoint_order

Every = Literal["checkpoint", "epoch"]
MAX_ATTEMPTS = 2  # an evaluation that fails is tried once more, never a third time


def key_of(epoch: int, local_step: int, global_step: int | None) -> str:
    """``epoch:local_step:global_step`` (``-`` for an unknown global step)."""
    return f"{epoch}:{local_step}:{'-' if global_step is None else global_step}"


def checkpoint_key(ckpt: Checkpoint) -> str:
    return key_of(ckpt.epoch, ckpt.local_step, ckpt.global_step)


def document_key(doc: dict[str, Any]) -> str | None:
    """The key of the checkpoint an evaluation document measured (None: no numbered
    checkpoint, e.g. an exported drafter or ngram)."""
    ckpt = doc.get("checkpoint")
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("epoch"), int):
        return None
    step = ckpt.get("local_step")
    total = ckpt.get("global_step")
    return key_of(int(ckpt["epoch"]), step if isinstance(step, int) else 0,
                  total if isinstance(total, int) else None)


def key_order(key: str) -> tuple[int, int, int]:
    """Where the state of ``key`` stands in training (:func:`checkpoint_order`)."""
    epoch, step, _ = key.split(":")
    return checkpoint_order(int(epoch), int(step))


def done_keys(evaluations: Iterable[dict[str, Any]]) -> set[str]:
    """The checkpoint states the journal has an evaluation of."""
    return {k for k in (document_key(doc) for doc in evaluations) if k is not None}


def wanted(ckpt: Checkpoint, every: Every) -> bool:
    """Complete, and of the kind ``every`` asks for (``epoch``: end-of-epoch saves only)."""
    return ckpt.complete and (every == "checkpoint" or not ckpt.mid_epoch)


def choose(checkpoints: Iterable[Checkpoint], done: set[str], failures: dict[str, int],
           every: Every) -> Checkpoint | None:
    """The checkpoint to evaluate now, or None: the newest wanted state that is not done,
    newer than every done state, and has failed fewer than :data:`MAX_ATTEMPTS` times."""
    newest_done = max((key_order(k) for k in done), default=None)
    candidates = [c for c in checkpoints if wanted(c, every)
                  and checkpoint_key(c) not in done
                  and failures.get(checkpoint_key(c), 0) < MAX_ATTEMPTS
                  and (newest_done is None or c.order > newest_done)]
    return max(candidates, key=lambda c: c.order) if candidates else None


def gives_up(failures: dict[str, int], key: str) -> bool:
    """Whether the checkpoint ``key`` has used its attempts."""
    return failures.get(key, 0) >= MAX_ATTEMPTS
