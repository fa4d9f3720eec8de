"""``outrig boxes``: every box rented through outrig, matched with each provider's own list.

The journal's rentals (:mod:`outrig.providers.ledger`) against ``provider.list()``:

* a live record whose box the provider no longer has is marked ``gone`` (billing ended);
* a record left ``creating`` by an outrig killed mid-rent is matched to the provider's box
  of the same name and takes its id (``starting``), so ``release`` can end it;
* a box the provider has, named as outrig names its boxes, with no record is an ``orphan``:
  shown with the command that ends it.

A provider that cannot be asked leaves its records as they were, said so.
"""

from __future__ import annotations

import time
from typing import Any

from outrig.errors import OutrigError
from outrig.journal import Journal
from outrig.providers import ledger
from outrig.providers.base import NAME_PREFIX, Instance
from outrig.providers.registry import get_provider
from outrig.session import Project


def reconcile(project: Project, journal: Journal,
              providers: list[str] | None = None) -> dict[str, Any]:
    """Match the project's rentals with the providers' lists (the module docstring); the
    ``boxes`` document: {boxes, orphans, unreachable, total_cost, hourly, at}."""
    records = ledger.project_rentals(journal, str(project.root))
    names = sorted({str(r.get("provider")) for r in ledger.live(records)} | set(providers or []))
    unreachable: dict[str, str] = {}
    orphans: list[dict[str, Any]] = []
    states: dict[tuple[str, str], Instance] = {}
    for name in names:
        try:
            listed = get_provider(name, project.root).list()
        except OutrigError as exc:
            unreachable[name] = str(exc).split(". ")[0]
            continue
        by_id = {i.instance_id: i for i in listed}
        by_name = {i.name: i for i in listed}
        known_ids = {str(r.get("instance_id")) for r in records if r.get("provider") == name}
        for record in ledger.live([r for r in records if r.get("provider") == name]):
            key = str(record["key"])
            instance = by_id.get(str(record.get("instance_id"))) if record.get(
                "instance_id") else by_name.get(str(record.get("name")))
            if instance is None:
                if record.get("state") != "creating" or time.time() - float(
                        record.get("created_at") or 0) > 600:
                    ledger.finish(journal, key, "gone", f"{name} no longer lists it")
                continue
            if not record.get("instance_id"):
                ledger.update(journal, key, instance_id=instance.instance_id, state="starting",
                              adopted=time.time())
                known_ids.add(instance.instance_id)
            states[(name, key)] = instance
        for instance in listed:
            if instance.instance_id not in known_ids and instance.name.startswith(
                    (NAME_PREFIX, "rent-")) and instance.state != "gone":
                orphans.append({"provider": name, "instance_id": instance.instance_id,
                                "name": instance.name, "state": instance.state,
                                "price_per_hour": instance.price_per_hour})
    return _document(project, journal, states, orphans, unreachable)


def _document(project: Project, journal: Journal, states: dict[tuple[str, str], Instance],
              orphans: list[dict[str, Any]], unreachable: dict[str, str]) -> dict[str, Any]:
    now = time.time()
    records = ledger.project_rentals(journal, str(project.root))
    boxes = []
    for record in records:
        key = str(record.get("key"))
        instance = states.get((str(record.get("provider")), key))
        runs = [{"run_id": r.get("run_id"), "status": r.get("status"),
                 "moved": bool(r.get("moved_to")),
                 "cost": _round(ledger.run_cost(r, record, now))}
                for r in ledger.runs_during(journal, record)]
        boxes.append({
            "name": record.get("name"), "key": key, "provider": record.get("provider"),
            "instance_id": record.get("instance_id"), "state": record.get("state"),
            "provider_state": instance.state if instance else None,
            "price_per_hour": record.get("price_per_hour"),
            "created_at": record.get("created_at"), "ended_at": ledger.ended_at(record),
            "uptime_s": round(ledger.uptime(record, now), 3),
            "cost": round(ledger.box_cost(record, now), 4), "why": record.get("why"),
            "end_why": record.get("end_why"), "runs": runs})
    live = ledger.live(records)
    return {"boxes": boxes, "orphans": orphans, "unreachable": unreachable,
            "total_cost": round(ledger.spent(records, now), 4),
            "hourly": round(sum(float(r.get("price_per_hour") or 0) for r in live), 4),
            "at": now}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def boxes_lines(doc: dict[str, Any], *, show_all: bool = False) -> list[str]:
    """``outrig boxes`` for people: the rented boxes (released ones with ``--all``), each
    with its runs and cost; then orphans and providers that did not answer."""
    from outrig.progress import format_duration
    from outrig.text.layout import columns

    shown = [b for b in doc["boxes"] if show_all or b["state"] in ledger.LIVE]
    out: list[str] = []
    if not shown:
        out.append("no boxes rented through outrig" + ("" if show_all else
                                                         " now (released ones: --all)"))
    else:
        headers = ["box", "provider", "state", "up", "$/h", "cost"]
        rows = [[b["name"], f"{b['provider']} {b['instance_id'] or '-'}",
                 _state_text(b), format_duration(float(b["uptime_s"])),
                 f"{float(b['price_per_hour'] or 0):.2f}", ledger.money(b["cost"])]
                for b in shown]
        header, lines = columns(headers, rows)
        out.append(header)
        for box, line in zip(shown, lines, strict=False):
            out.append(line)
            for run in box["runs"]:
                cost = "" if run["cost"] is None else f", {ledger.money(run['cost'])}"
                state = "moved" if run["moved"] else run["status"]
                out.append(f"    run {run['run_id']} ({state}{cost})")
    for orphan in doc["orphans"]:
        out.append(f"orphan: {orphan['provider']} has {orphan['instance_id']} "
                   f"({orphan['name']}, {orphan['state']}) that outrig has no record of; end "
                   f"it in the provider's console if it is yours")
    for name, error in doc["unreachable"].items():
        out.append(f"{name} did not answer ({error}); its boxes are shown as last recorded")
    out.append(f"now ${doc['hourly']:.2f}/h; spent {ledger.money(doc['total_cost'])} in all")
    return out


def _state_text(box: dict[str, Any]) -> str:
    state = str(box["state"])
    seen = box.get("provider_state")
    if state in ledger.LIVE and seen and seen != "running":
        return f"{state} ({seen})"
    return state
