"""The journal's record of every box rented through outrig (``rentals/KEY.json``), and what
it costs.

Why the record comes first: ``rent`` writes it (state ``creating``) before it asks the
provider for the box and before it waits for the box to answer, so an outrig killed at any
moment leaves a record that names the box; the next ``boxes`` (or ``watch``) matches it with
the provider's own list (:func:`reconcile`). A box is never unknown, only not ready.

States: ``creating`` (asked for, no id yet), ``starting`` (the provider has it, SSH not
answering yet), ``ready``, ``released`` (terminated by outrig), ``gone`` (the provider no
longer has it). Cost is ``price_per_hour`` × the hours from ``created_at`` to
``released_at``/``gone_at`` (or now): what the provider bills from the create call on.
"""

from __future__ import annotations

import time
from typing import Any

from outrig.journal import Journal

LIVE = ("creating", "starting", "ready")


def begin(journal: Journal, key: str, *, name: str, provider: str, project: str,
          offer: dict[str, Any], price: float, why: str, for_run: str | None = None) -> None:
    """Record a rent about to be asked for (before the provider's create call). ``key`` is
    this attempt's own (a box name may be tried on several offers); ``name`` the box's."""
    journal.record_rental(key, {
        "key": key, "name": name, "provider": provider, "project": project, "offer": offer,
        "price_per_hour": price, "state": "creating", "created_at": time.time(),
        "why": why, "for_run": for_run, "instance_id": None})


def update(journal: Journal, key: str, **fields: Any) -> None:
    journal.record_rental(key, fields)


def finish(journal: Journal, key: str, state: str, why: str) -> None:
    """The box is no longer paid for: ``released`` by outrig or ``gone`` at the provider."""
    stamp = "released_at" if state == "released" else "gone_at"
    journal.record_rental(key, {"state": state, stamp: time.time(), "end_why": why})


def project_rentals(journal: Journal, project: str) -> list[dict[str, Any]]:
    return [r for r in journal.rentals() if r.get("project") == project]


def live(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("state") in LIVE]


def for_host(journal: Journal, name: str) -> dict[str, Any] | None:
    """The live rental whose box is the host ``name`` (its host file's name)."""
    return next((r for r in reversed(journal.rentals())
                 if r.get("name") == name and r.get("state") in LIVE), None)


def ended_at(record: dict[str, Any]) -> float | None:
    value = record.get("released_at") or record.get("gone_at")
    return float(value) if isinstance(value, (int, float)) else None


def uptime(record: dict[str, Any], now: float) -> float:
    start = float(record.get("created_at") or now)
    return max(0.0, (ended_at(record) or now) - start)


def box_cost(record: dict[str, Any], now: float) -> float:
    """US dollars so far: price × uptime (nothing for a create the provider refused)."""
    if not record.get("instance_id") and record.get("state") not in LIVE:
        return 0.0
    return float(record.get("price_per_hour") or 0.0) * uptime(record, now) / 3600.0


def run_cost(run: dict[str, Any], rental: dict[str, Any], now: float) -> float | None:
    """The share of the box's bill while ``run`` was on it (its start to its end, a move, or
    now, within the rental); None when the run has no start time."""
    started = run.get("created")
    if not isinstance(started, (int, float)):
        return None
    moved = run.get("moved_to") if isinstance(run.get("moved_to"), dict) else {}
    ends = [run.get("stopped_at"), run.get("ended_at"), (moved or {}).get("at")]
    end = min((float(e) for e in ends if isinstance(e, (int, float))), default=None)
    if end is None:
        end = now if run.get("status") == "running" else float(run.get("updated") or now)
    begin_at = max(float(started), float(rental.get("created_at") or started))
    end = min(end, ended_at(rental) or now)
    return float(rental.get("price_per_hour") or 0.0) * max(0.0, end - begin_at) / 3600.0


def spent(records: list[dict[str, Any]], now: float) -> float:
    return sum(box_cost(r, now) for r in records)


def rental_of(journal: Journal, host: str, at: float | None) -> dict[str, Any] | None:
    """The rental whose box was the host ``host`` at time ``at`` (a run's start): the newest
    one created before it, live or ended."""
    found = [r for r in journal.rentals() if r.get("name") == host
             and (at is None or float(r.get("created_at") or 0) <= at + 1)]
    return found[-1] if found else None


def runs_during(journal: Journal, rental: dict[str, Any]) -> list[dict[str, Any]]:
    """The journal's runs on the rental's box that started while it was rented (a box name
    can be rented again later, or tried on an offer that failed)."""
    if not rental.get("ready_at") and rental.get("state") != "ready":
        return []
    start = float(rental.get("created_at") or 0)
    end = ended_at(rental) or float("inf")
    return [r for r in journal.runs(host=str(rental.get("name")))
            if isinstance(r.get("created"), (int, float)) and start <= r["created"] <= end]


def annotate_costs(journal: Journal, rows: list[dict[str, Any]], now: float) -> None:
    """Add ``cost`` {usd, price_per_hour, provider} to each row (a run of ``outrig runs``,
    with run_id and host) that ran on a rented box."""
    for row in rows:
        record = journal.run(str(row.get("run_id"))) or {}
        created = record.get("created")
        rental = rental_of(journal, str(row.get("host")),
                           float(created) if isinstance(created, (int, float)) else None)
        if rental is None:
            continue
        usd = run_cost(record, rental, now)
        if usd is not None:
            row["cost"] = {"usd": round(usd, 4), "price_per_hour": rental.get("price_per_hour"),
                           "provider": rental.get("provider")}


def rental_summary(journal: Journal, host: str, now: float) -> dict[str, Any] | None:
    """What ``status`` shows of a rented box: provider, id, price, uptime, cost so far."""
    record = for_host(journal, host)
    if record is None:
        return None
    return {"provider": record.get("provider"), "instance_id": record.get("instance_id"),
            "price_per_hour": record.get("price_per_hour"),
            "uptime_s": round(uptime(record, now), 3), "cost": round(box_cost(record, now), 4)}


def rental_lines(summary: dict[str, Any] | None) -> list[str]:
    if not summary:
        return []
    cost = money(float(summary["cost"]))
    return [f"rented from {summary['provider']} ({summary['instance_id']}) at "
            f"${float(summary['price_per_hour'] or 0):.2f}/h: up "
            f"{float(summary['uptime_s']) / 3600:.2f} h, {cost} so far (outrig boxes)"]


def money(usd: float) -> str:
    """US dollars: cents, or hundredths of a cent below one cent (a sandbox minute)."""
    return f"${usd:.2f}" if usd >= 0.01 or usd == 0 else f"${usd:.4f}"
