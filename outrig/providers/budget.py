"""The money limits of a project (``budget:`` in outrig.yaml) and the one rule that applies
them: a rent that would cross one is refused, before anything is asked of a provider.

``max_boxes``: boxes rented and not released at once; ``max_price_per_hour``: their prices
added up, the new one included; ``max_total``: US dollars spent on rented boxes of this
project so far plus one hour of the new box. A refusal names the limit, the value it would
reach and by how much it would cross it, and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outrig.errors import ConfigError
from outrig.providers.ledger import live, spent

KEYS = ("max_boxes", "max_price_per_hour", "max_total")


class BudgetRefused(ConfigError):
    """A rent the project's budget does not allow (exit 2: nothing was rented)."""


@dataclass(frozen=True)
class Budget:
    max_boxes: int | None = None
    max_price_per_hour: float | None = None
    max_total: float | None = None


def budget_for(root: Path) -> Budget:
    """``budget:`` of the project's outrig.yaml (no limits when absent)."""
    from outrig.formats.project_file import PROJECT_FILE, read_project_file

    where = root / PROJECT_FILE
    section = read_project_file(root).get("budget") or {}
    if not isinstance(section, dict) or set(section) - set(KEYS):
        wrong = sorted(set(section) - set(KEYS)) if isinstance(section, dict) else section
        raise ConfigError(f"{where}: budget: takes {', '.join(KEYS)} (e.g. 'budget: "
                          f"{{max_boxes: 2, max_price_per_hour: 30}}'), not {wrong!r}")
    values: dict[str, Any] = {}
    for key in KEYS:
        value = section.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"{where}: budget: {key}: must be a number ≥ 0, not {value!r}")
        values[key] = int(value) if key == "max_boxes" else float(value)
    return Budget(**values)


def refusal(budget: Budget, records: list[dict[str, Any]], price: float,
            now: float) -> str | None:
    """Why renting one more box at ``price`` $/h would cross the budget, or None."""
    rented = live(records)
    fix = "release a box (outrig release BOX) or raise budget: {key} in outrig.yaml"
    if budget.max_boxes is not None and len(rented) + 1 > budget.max_boxes:
        names = ", ".join(str(r.get("name")) for r in rented)
        return (f"budget max_boxes {budget.max_boxes} would be crossed by 1: "
                f"{len(rented)} box(es) rented now ({names}); "
                + fix.format(key="max_boxes"))
    hourly = sum(float(r.get("price_per_hour") or 0) for r in rented) + price
    if budget.max_price_per_hour is not None and hourly > budget.max_price_per_hour:
        return (f"budget max_price_per_hour ${budget.max_price_per_hour:.2f}/h would be "
                f"crossed by ${hourly - budget.max_price_per_hour:.2f}/h: the boxes rented now "
                f"cost ${hourly - price:.2f}/h and this one ${price:.2f}/h; "
                + fix.format(key="max_price_per_hour"))
    total = spent(records, now) + price
    if budget.max_total is not None and total > budget.max_total:
        return (f"budget max_total ${budget.max_total:.2f} would be crossed by "
                f"${total - budget.max_total:.2f}: ${total - price:.2f} spent so far plus one "
                f"hour of this box (${price:.2f}); " + fix.format(key="max_total"))
    return None
