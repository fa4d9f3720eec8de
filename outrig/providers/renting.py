"""``outrig rent`` and ``outrig release``: a box from a provider's offer to a host file that
answers SSH and passes ``check`` (GPU health included), and back.

The order is what makes it safe (docs/providers.md): bad input and the budget are judged
before any call that costs money; the journal records the rent before the provider is asked
(:mod:`outrig.providers.ledger`); an offer that is sold out is tried again once, then the
next; a box that never answers SSH, or whose check or GPUs fail, is terminated and the next
offer tried. Events go to ``send`` (``rent_started``, ``rented``, ``released``) with their
duration and price, so ``watch`` can pass them on.
"""

from __future__ import annotations

import contextlib
import io
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from outrig.console import Reporter
from outrig.errors import ConfigError, OutrigError
from outrig.hosts import gpu_health
from outrig.inventory import Host, HostBook
from outrig.journal import Journal
from outrig.providers import ledger
from outrig.providers.base import (
    NAME_PREFIX,
    CreateRequest,
    NoCapacity,
    Offer,
    Provider,
    ProviderError,
    parse_gpus,
)
from outrig.providers.budget import BudgetRefused, budget_for, refusal
from outrig.providers.registry import get_provider, provider_settings
from outrig.session import Project, host_session

Send = Callable[..., None]
StopRuns = Callable[[Project, str, Journal], None]
"""Stops every run of ours on a box by its host file's name (the ops layer's cleanup,
handed down by whoever calls :func:`release`: providers sit below the ops)."""
CAPACITY_TRIES = 2  # a sold-out offer is asked again once (it may free up), then the next
CAPACITY_PAUSE = 2.0
SSH_DEADLINE = 900.0  # seconds a new box may take to answer SSH (providers: P: ssh_deadline)


def _quiet_send(event: str, **fields: Any) -> None:
    del event, fields


def box_name(name: str | None, model: str) -> str:
    """``--name``, else ``outrig-h100-1a2b``: also the provider's name for the box, so its
    own list shows which boxes are outrig's (an unknown one there is an orphan)."""
    if name:
        if not all(c.isalnum() or c in "-_." for c in name) or name.startswith("."):
            raise ConfigError(f"--name {name!r}: use letters, digits, '-', '_' and '.' only "
                              "(it names hosts/NAME.yaml). Nothing was rented.")
        return name
    return f"{NAME_PREFIX}{model.lower()}-{secrets.token_hex(2)}"


def choose_offers(provider: Provider, spec_text: str, max_price: float | None) -> list[Offer]:
    """The offers to try, cheapest first; a spec that no offer matches, or a max price
    below every match, is a ConfigError (nothing rented) naming what there is."""
    spec = parse_gpus(spec_text)
    offers = provider.search(spec, None)
    if not offers:
        raise ConfigError(f"--gpus {spec}: no offer of {provider.name} matches it now; try "
                          "another count or model (e.g. 8xH100, 1xA100). Nothing was rented.")
    within = [o for o in offers if max_price is None or o.price_per_hour <= max_price]
    if not within:
        raise ConfigError(f"--max-price ${max_price:.2f}/h is below every offer for {spec} "
                          f"(the cheapest is ${offers[0].price_per_hour:.2f}/h); raise "
                          "--max-price. Nothing was rented.")
    return within


def check_box(project: Project, journal: Journal, host_spec: str, host: Host) -> str | None:
    """Why the new box ``host`` (``host_spec`` as named) cannot take a job (``check``
    failed, workdir not writable, a GPU judged bad), or None."""
    quiet = Reporter(quiet=True, out=io.StringIO(), err=io.StringIO())
    try:
        with host_session(project, host_spec, quiet, journal, host=host) as session:
            result = session.call("check", stream=False)
            verdicts, _ = gpu_health.look(journal, session.host.name,
                                          result.get("facts") or {})
    except OutrigError as exc:
        return str(exc).split(". ")[0]
    if not result.get("workdir_writable"):
        return "its workdir is not writable"
    bad = [v for v in verdicts if v["verdict"] == gpu_health.BAD]
    if bad:
        return "unhealthy GPU: " + "; ".join(gpu_health.summary(v) for v in bad)
    return None


def write_host_file(path: Path, host: dict[str, Any], provider: str, instance_id: str,
                    price: float) -> None:
    import yaml

    from outrig.journal import atomic_write_text

    data = {k: v for k, v in host.items() if k not in ("provider", "instance_id")}
    data.update(provider=provider, instance_id=instance_id)
    text = (f"# rented through outrig from {provider} ({instance_id}) at ${price:.2f}/h; "
            "`outrig release` terminates it\n") + yaml.safe_dump(data, sort_keys=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)


def rent(project: Project, provider_name: str, gpus: str, *, max_price: float | None = None,
         disk_gb: int | None = None, image: str | None = None, name: str | None = None,
         journal: Journal | None = None, send: Send = _quiet_send, why: str = "rent",
         for_run: str | None = None) -> dict[str, Any]:
    """Rent one box and write hosts/NAME.yaml for it (the module docstring says how).
    Returns {name, host_file, provider, instance_id, price_per_hour, seconds, tried}."""
    journal = journal or Journal()
    provider = get_provider(provider_name, project.root)
    offers = choose_offers(provider, gpus, max_price)
    name = box_name(name, parse_gpus(gpus).model)
    host_file = project.hosts_dir / f"{name}.yaml"
    if host_file.exists():
        raise ConfigError(f"{host_file} exists already; pass another --name. Nothing was "
                          "rented.")
    budget = budget_for(project.root)
    records = ledger.project_rentals(journal, str(project.root))
    why_not = refusal(budget, records, offers[0].price_per_hour, time.time())
    if why_not:
        raise BudgetRefused(why_not + ". Nothing was rented.")
    deadline_s = float(provider_settings(project.root, provider_name).get("ssh_deadline")
                       or SSH_DEADLINE)
    started = time.monotonic()
    tried: list[str] = []
    for offer in offers:
        refused = refusal(budget, ledger.project_rentals(journal, str(project.root)),
                          offer.price_per_hour, time.time())
        if refused:
            tried.append(f"{offer.offer_id}: {refused}")
            continue
        result = _try_offer(project, journal, provider, offer, name, host_file,
                            CreateRequest(name=name, disk_gb=disk_gb, image=image),
                            deadline_s, send, why, for_run, tried)
        if result is not None:
            return {**result, "seconds": round(time.monotonic() - started, 3), "tried": tried}
    raise OutrigError(f"no {provider.name} offer for {gpus} gave a box that answers and passes "
                      "check: " + "; ".join(tried) + ". Nothing is left rented (outrig boxes "
                      "shows them released).")


def _try_offer(project: Project, journal: Journal, provider: Provider, offer: Offer,
               name: str, host_file: Path, request: CreateRequest, deadline_s: float,
               send: Send, why: str, for_run: str | None,
               tried: list[str]) -> dict[str, Any] | None:
    """One offer: create (a sold-out offer asked again once), wait for SSH, check. The box is
    terminated and None returned when it fails; the reason is added to ``tried``."""
    offer_doc = {"offer_id": offer.offer_id, "gpus": offer.gpus, "gpu_name": offer.gpu_name,
                 "where": offer.where}
    start = time.monotonic()
    instance = None
    for attempt in range(CAPACITY_TRIES):
        key = f"{name}.{secrets.token_hex(3)}"  # this attempt's record
        ledger.begin(journal, key, name=name, provider=provider.name, project=str(project.root),
                     offer=offer_doc, price=offer.price_per_hour, why=why, for_run=for_run)
        send("rent_started", provider=provider.name, offer=offer.offer_id, box=name,
             price_per_hour=offer.price_per_hour, attempt=attempt + 1,
             why=f"asking {provider.name} for {name}: offer {offer.offer_id} "
                 f"({offer.gpus}x {offer.gpu_name}) at ${offer.price_per_hour:.2f}/h")
        try:
            instance = provider.create(offer, request)
            break
        except NoCapacity as exc:
            ledger.finish(journal, key, "released", f"not created: {exc}")
            tried.append(f"{offer.offer_id}: {exc}")
            if attempt + 1 < CAPACITY_TRIES:
                time.sleep(CAPACITY_PAUSE)
        except ProviderError as exc:
            ledger.finish(journal, key, "released", f"not created: {exc}")
            tried.append(f"{offer.offer_id}: {exc}")
            return None
    if instance is None:
        return None
    ledger.update(journal, key, instance_id=instance.instance_id, state="starting")
    problem = None
    try:
        instance = provider.wait_ssh(instance, time.monotonic() + deadline_s)
    except ProviderError as exc:
        problem = str(exc)
    if problem is None:
        write_host_file(host_file, instance.host, provider.name, instance.instance_id,
                        offer.price_per_hour)
        # the file just written, read once: the box is checked as every later command sees it
        problem = check_box(project, journal, name, HostBook(project.hosts_dir)(name))
    if problem is not None:
        _terminate(provider, journal, key, instance.instance_id, problem, send)
        host_file.unlink(missing_ok=True)
        tried.append(f"{offer.offer_id} ({instance.instance_id}): {problem}")
        return None
    seconds = round(time.monotonic() - start, 3)
    ledger.update(journal, key, state="ready", ready_at=time.time(), host_file=str(host_file),
                  ready_seconds=seconds)
    send("rented", provider=provider.name, box=name, instance_id=instance.instance_id,
         price_per_hour=offer.price_per_hour, seconds=seconds,
         why=f"{name} ({provider.name} {instance.instance_id}) at "
             f"${offer.price_per_hour:.2f}/h, answering and checked in {seconds:.1f}s")
    return {"name": name, "host_file": str(host_file), "provider": provider.name,
            "instance_id": instance.instance_id, "price_per_hour": offer.price_per_hour,
            "offer": offer.offer_id}


def _terminate(provider: Provider, journal: Journal, key: str, instance_id: str, why: str,
               send: Send) -> None:
    provider.terminate(instance_id)
    ledger.finish(journal, key, "released", why)
    record = journal.rental(key) or {}
    cost = ledger.box_cost(record, time.time())
    send("released", provider=provider.name, box=record.get("name"), instance_id=instance_id,
         cost=round(cost, 4), seconds=round(ledger.uptime(record, time.time()), 3),
         why=f"{record.get('name')} ({provider.name} {instance_id}) terminated after "
             f"{ledger.uptime(record, time.time()):.0f}s, {ledger.money(cost)}: {why}")


def living_runs(journal: Journal, name: str) -> list[str]:
    """Runs of ours on the box as the journal knows them: running and not moved away."""
    return [str(r.get("run_id")) for r in journal.runs(host=name)
            if r.get("status") == "running" and not r.get("moved_to")]


def release(project: Project, box: str, *, force: bool = False, journal: Journal | None = None,
            send: Send = _quiet_send, why: str = "released by hand",
            stop_runs: StopRuns | None = None) -> dict[str, Any]:
    """Terminate the rented box ``box`` (its host file's name). Refused (ConfigError) while
    a run of ours lives on it, unless ``force``: then its runs are stopped first with
    ``stop_runs`` when it answers. The host file is removed; the cost is recorded."""
    journal = journal or Journal()
    record = ledger.for_host(journal, box)
    if record is None:
        raise ConfigError(f"{box!r} is not a box rented through outrig that is still rented; "
                          "`outrig boxes` lists them. Nothing was released.")
    runs = living_runs(journal, box)
    if runs and not force:
        raise ConfigError(f"{box} still has run(s) of ours: {', '.join(runs)}; stop them "
                          f"(outrig cleanup --host {box}) or pass --force to stop them and "
                          "release the box. Nothing was released.")
    stopped: list[str] = []
    if runs and stop_runs is not None and (project.hosts_dir / f"{box}.yaml").is_file():
        with contextlib.suppress(OutrigError):  # a dead box's runs died with it
            stop_runs(project, box, journal)
            stopped = runs
    provider = get_provider(str(record["provider"]), project.root)
    if record.get("instance_id"):
        _terminate(provider, journal, str(record["key"]), str(record["instance_id"]), why,
                   send)
    else:
        ledger.finish(journal, str(record["key"]), "released", why + " (never created)")
    record_run_costs(journal, journal.rental(str(record["key"])) or record)
    for run in journal.moved_runs(box):  # nothing of them runs on a terminated box
        if not run.get("fenced") and run.get("run_id"):
            journal.mark_fenced(str(run["run_id"]), stopped=[])
    host_file = project.hosts_dir / f"{box}.yaml"
    if _rented_host_file(host_file):
        host_file.unlink()
    final = journal.rental(str(record["key"])) or record
    now = time.time()
    return {"box": box, "provider": record["provider"], "instance_id": record.get("instance_id"),
            "stopped_runs": stopped, "uptime_s": round(ledger.uptime(final, now), 3),
            "cost": round(ledger.box_cost(final, now), 4),
            "price_per_hour": record.get("price_per_hour")}


def _rented_host_file(path: Path) -> bool:
    try:
        return path.is_file() and "rented through outrig" in path.read_text().splitlines()[0]
    except (OSError, IndexError):
        return False


def record_run_costs(journal: Journal, rental: dict[str, Any]) -> None:
    """Write each run's share of the box's bill into the run's journal record (``cost``)."""
    now = time.time()
    for run in ledger.runs_during(journal, rental):
        cost = ledger.run_cost(run, rental, now)
        if cost is not None and run.get("run_id"):
            journal.record_run(str(run["run_id"]), {"cost": {
                "usd": round(cost, 4), "price_per_hour": rental.get("price_per_hour"),
                "box": rental.get("name"), "provider": rental.get("provider")}})
