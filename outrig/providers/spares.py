"""``watch --spare auto``: on a confirmed death, rent the spare through a provider.

The watch's move path is unchanged: it takes a host and migrates there (check, provision,
stage, resume, fence). This module only turns ``auto`` into such a host, by renting one with
:func:`outrig.providers.renting.rent` (budget, offers in price order, a box that never
answers or has a bad GPU released and the next offer tried, every step an event), and ends
what is no longer needed: the dead box when ``release_dead`` says so and the provider no
longer reports it running, and a box whose run finished when ``release_when_done`` says so
and nothing else of ours is on it.

The spare's settings are ``spares:`` of the playbook, else of outrig.yaml: ``{provider: P,
gpus: 8xH100, max_price: 4.0, release_dead: true}``; ``release_when_done: true`` is a key of
outrig.yaml of its own.

One death, one rent: the rent is made under a lock named after the dead run, and a second
watch of the same run that finds a spare already rented for it rents nothing and moves
nothing (two copies of a job would train at once, as SkyPilot PR 9868 describes).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outrig.errors import ConfigError, OutrigError
from outrig.journal import Journal, record_lock
from outrig.providers import ledger
from outrig.providers.base import parse_gpus
from outrig.providers.registry import PROVIDERS, get_provider
from outrig.providers.renting import StopRuns, living_runs, release, rent
from outrig.session import Project

AUTO = "auto"
KEYS = ("provider", "gpus", "max_price", "release_dead", "disk", "image")
Send = Callable[..., None]


@dataclass(frozen=True)
class SpareSpec:
    provider: str
    gpus: str
    max_price: float | None = None
    release_dead: bool = False
    disk: int | None = None
    image: str | None = None


def _project_file(project: Project) -> dict[str, Any]:
    from outrig.formats.project_file import read_project_file

    return read_project_file(project.root)


def spare_spec(project: Project, playbook: str | None = None) -> SpareSpec | None:
    """``spares:`` of the playbook (when it has one), else of outrig.yaml; checked (a
    ConfigError names the file, the key and the fix)."""
    from outrig.formats.project_file import PROJECT_FILE

    if playbook:
        found = _playbook_spares(project, playbook)
        if found is not None:
            return _parse(found[1], f"{found[0]}: spares:")
    section = _project_file(project).get("spares")
    if section is None:
        return None
    return _parse(section, f"{project.root / PROJECT_FILE}: spares:")


def _playbook_spares(project: Project, playbook: str) -> tuple[Path, Any] | None:
    """The playbook's path and its ``spares:``, when the playbook is found and has one."""
    from outrig.playbook import find_playbook, load_job

    try:
        path = find_playbook(playbook, project.playbooks_dir)
        spares = load_job(path).spec.spares
    except OutrigError:
        return None  # a playbook that cannot be read here: outrig.yaml's spares apply
    return None if spares is None else (path, spares)


def _parse(section: Any, where: str) -> SpareSpec:
    if not isinstance(section, dict) or set(section) - set(KEYS) or \
            not {"provider", "gpus"} <= set(section):
        raise ConfigError(f"{where} must be a mapping with provider and gpus (and optionally "
                          f"{', '.join(KEYS[2:])}), e.g. 'spares: {{provider: sandbox, gpus: "
                          "8xH100, max_price: 4}'")
    if section["provider"] not in PROVIDERS:
        raise ConfigError(f"{where} provider {section['provider']!r} is not one of "
                          f"{', '.join(sorted(PROVIDERS))}")
    parse_gpus(str(section["gpus"]), f"{where} gpus")
    price = section.get("max_price")
    if price is not None and (isinstance(price, bool) or not isinstance(price, (int, float))):
        raise ConfigError(f"{where} max_price must be US dollars per hour, a number")
    return SpareSpec(str(section["provider"]), str(section["gpus"]),
                     None if price is None else float(price),
                     bool(section.get("release_dead", False)),
                     section.get("disk"), section.get("image"))


def spares_for_watch(project: Project, given: list[str],
                     playbook: str | None = None) -> list[str]:
    """The watch's spares: ``--spare`` as given (``auto`` only with ``spares:`` set), or
    ``[auto]`` when none is given and the playbook or outrig.yaml has ``spares:``."""
    spec = spare_spec(project, playbook)
    if AUTO in given and spec is None:
        raise ConfigError("--spare auto rents the spare through a provider, which needs "
                          "'spares: {provider: sandbox, gpus: 8xH100}' (and optionally "
                          "max_price) in the playbook or the project's outrig.yaml; add it "
                          "or name a spare box. Nothing was started.")
    if not given and spec is not None:
        return [AUTO]
    return given


def rent_spare(project: Project, journal: Journal, send: Send, old_host: str,
               old_run: str, playbook: str | None = None) -> str | None:
    """Rent the spare for the death of ``old_run`` on ``old_host``; its host name, or None
    when another watch rented one for this death already (this one must not move the job).
    Raises OutrigError when no box could be rented (the reason names each offer tried)."""
    spec = spare_spec(project, playbook)
    if spec is None:
        raise ConfigError("spare auto: neither the playbook nor outrig.yaml has a spares: "
                          "section any more")
    lock = journal.root / "rentals" / "deaths" / f"{old_run}.json"
    with record_lock(lock):
        taken = next((r for r in journal.rentals() if r.get("for_run") == old_run
                      and r.get("state") in ledger.LIVE), None)
        if taken is not None:
            raise SpareTaken(f"a spare was rented for this death already: {taken.get('name')}"
                             " (another watch of this run moves it); this watch moves nothing")
        result = rent(project, spec.provider, spec.gpus, max_price=spec.max_price,
                      disk_gb=spec.disk, image=spec.image, journal=journal, send=send,
                      why=f"spare for {old_run} (from {old_host})", for_run=old_run)
    return str(result["name"])


class SpareTaken(OutrigError):
    """Another watch rented the spare for this death."""


def release_dead(project: Project, journal: Journal, send: Send, old_host: str,
                 playbook: str | None = None, stop_runs: StopRuns | None = None) -> bool:
    """Terminate the dead box when it was rented through outrig, ``release_dead`` is on and
    its provider reports it not running (stopped or gone). True when released."""
    spec = spare_spec(project, playbook)
    record = ledger.for_host(journal, old_host)
    if spec is None or not spec.release_dead or record is None:
        return False
    try:
        listed = {i.instance_id: i for i in get_provider(str(record["provider"]),
                                                          project.root).list()}
    except OutrigError:
        return False
    instance = listed.get(str(record.get("instance_id")))
    if instance is not None and instance.state == "running":
        return False  # it answers its provider: only the link is gone; fencing handles it
    release(project, old_host, force=True, journal=journal, send=send,
            why="dead: released by watch", stop_runs=stop_runs)
    return True


def release_unused(project: Project, journal: Journal, send: Send, host: str,
                   for_run: str, stop_runs: StopRuns | None = None) -> bool:
    """The box rented for the death of ``for_run`` took no job (the move failed): release
    it rather than pay for it. True when released."""
    record = ledger.for_host(journal, host)
    if record is None or record.get("for_run") != for_run:
        return False
    with contextlib.suppress(OutrigError):
        release(project, host, force=True, journal=journal, send=send,
                why="the move onto it failed", stop_runs=stop_runs)
        return True
    return False


def release_finished(project: Project, journal: Journal, send: Send, host: str,
                     run_id: str) -> bool:
    """``release_when_done: true``: release the rented box whose run ``run_id`` finished,
    when no other run of ours is on it. True when released."""
    if _project_file(project).get("release_when_done") is not True:
        return False
    journal.record_run(run_id, {"status": "finished", "ended_at": time.time()})
    if ledger.for_host(journal, host) is None or living_runs(journal, host):
        return False
    with contextlib.suppress(OutrigError):
        release(project, host, journal=journal, send=send, why="its run finished")
        return True
    return False


def moved_entry_released(entry: dict[str, Any]) -> dict[str, Any]:
    """A watch record's moved entry whose box was terminated: nothing of it runs any more."""
    return {**entry, "fenced": time.time(), "stopped": "box released"}
