"""The served acceptance length over a run's checkpoints, as a metric series of the run.

Each recorded evaluation of a run's checkpoint is one point ``served/acceptance_length`` at
the checkpoint's global step (process ``evaluate``; of two evaluations of one checkpoint the
newer counts), so ``metrics``, ``plot``, ``report`` and ``status`` show it on the step axis
of the trainer's ``train/eal``: the gap between what training estimates and what vLLM
accepts (speculators#613) is seen checkpoint by checkpoint.
"""

from __future__ import annotations

import math
from typing import Any

from outrig.metrics.series import Point

SERVED = "served/acceptance_length"
PROCESS = "evaluate"


def served_points(evaluations: list[dict[str, Any]]) -> list[Point]:
    """The points of a run's evaluations, oldest first (those without a checkpoint step or
    an acceptance length are left out)."""
    points = []
    for ev in sorted(evaluations, key=lambda e: float(e.get("at") or 0)):
        ckpt = ev.get("checkpoint") if isinstance(ev.get("checkpoint"), dict) else {}
        step, length = (ckpt or {}).get("global_step"), ev.get("acceptance_length")
        if (isinstance(step, int) and not isinstance(step, bool)
                and isinstance(length, (int, float)) and math.isfinite(length)):
            at = ev.get("at")
            points.append(Point(PROCESS, step, float(at) if isinstance(at, (int, float))
                                else None, {SERVED: float(length)}, PROCESS))
    return points


def served_trend(evaluations: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """``(step, acceptance length)`` per evaluated checkpoint, by step (the newest of each)."""
    rows: dict[int, float] = {}
    for point in served_points(evaluations):
        rows[point.step] = point.values[SERVED]
    return sorted(rows.items())
