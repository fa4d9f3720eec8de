"""The ``sandbox`` provider: rents sandbox boxes on this machine (a real sshd on 127.0.0.1,
fake GPUs), each started detached by :mod:`outrig.sandbox.service` as ``sandbox-up`` does.

Why a real provider and not a mock: the whole rent → check → provision → stage → migrate →
release loop then runs end to end, in the tests and for anyone trying outrig, against the
same SSH, agent and GPU checks as a rented box. Its market (the offers, and the faults the
next boxes come with) is a JSON file in its state folder, ``market.json``
(:func:`set_market`), so every failure path can be had on purpose:

* ``no_capacity``: the next N creates are refused as a sold-out offer is;
* ``no_ssh``: the next N boxes are created but their SSH never answers;
* ``bad_gpu``: the next N boxes come with GPU 0 reporting uncorrectable ECC errors.

Its boxes cost nothing, but each offer carries a price so the money paths run as for a real
provider. :func:`power_off` is the box dying (its sshd and sessions stop; the provider then
lists it as ``stopped``).
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any

from outrig.journal import atomic_write_json, make_private_dir, read_json, state_dir
from outrig.providers.base import (
    CreateRequest,
    GpuSpec,
    Instance,
    NeverAnswered,
    NoCapacity,
    Offer,
)
from outrig.sandbox import nvidia_smi, service
from outrig.sandbox.box import _banner_ok, free_port

NAME = "sandbox"
DEFAULT_OFFERS: list[dict[str, Any]] = [
    {"id": "sb-h100-1", "gpus": 8, "gpu_name": "NVIDIA H100 80GB HBM3", "price": 2.49,
     "disk_gb": 500, "where": "this machine"},
    {"id": "sb-h100-2", "gpus": 8, "gpu_name": "NVIDIA H100 80GB HBM3", "price": 2.89,
     "disk_gb": 1000, "where": "this machine"},
    {"id": "sb-h200-1", "gpus": 8, "gpu_name": "NVIDIA H200", "price": 3.59,
     "disk_gb": 1000, "where": "this machine"},
    {"id": "sb-a100-1", "gpus": 1, "gpu_name": "NVIDIA A100-SXM4-80GB", "price": 1.19,
     "disk_gb": 200, "where": "this machine"},
]
FAULTS = ("no_capacity", "no_ssh", "bad_gpu")


def provider_root() -> Path:
    return state_dir() / "providers" / NAME


def set_market(*, offers: list[dict[str, Any]] | None = None,
               faults: dict[str, int] | None = None) -> None:
    """Write the sandbox market: its offers (default :data:`DEFAULT_OFFERS`) and how many of
    the next boxes come with each fault of :data:`FAULTS`."""
    unknown = set(faults or {}) - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown sandbox faults {sorted(unknown)}; one of {FAULTS}")
    make_private_dir(provider_root())
    atomic_write_json(provider_root() / "market.json",
                      {"offers": offers if offers is not None else DEFAULT_OFFERS,
                       "faults": dict(faults or {})})


def _market() -> dict[str, Any]:
    data = read_json(provider_root() / "market.json")
    if not isinstance(data, dict):
        return {"offers": DEFAULT_OFFERS, "faults": {}}
    return data


def _take_fault(name: str) -> bool:
    """Consume one of the market's ``name`` faults; True when there was one."""
    market = _market()
    faults = dict(market.get("faults") or {})
    if int(faults.get(name) or 0) <= 0:
        return False
    faults[name] = int(faults[name]) - 1
    set_market(offers=market.get("offers"), faults=faults)
    return True


def _instances_dir() -> Path:
    return provider_root() / "instances"


def _box_name(instance_id: str) -> str:
    return f"rent-{instance_id}"


class SandboxProvider:
    """See the module docstring. ``config`` is ``providers: sandbox:`` of outrig.yaml (it
    takes no keys today)."""

    name = NAME

    def __init__(self, config: dict[str, Any] | None = None, root: Path | None = None) -> None:
        self.config = dict(config or {})
        del root  # the sandbox needs nothing of the project

    def search(self, spec: GpuSpec, max_price: float | None) -> list[Offer]:
        offers = [Offer(NAME, str(o["id"]), int(o["gpus"]), str(o["gpu_name"]),
                        float(o["price"]), o.get("disk_gb"), str(o.get("where") or ""))
                  for o in _market().get("offers") or []]
        found = [o for o in offers if spec.matches(o.gpus, o.gpu_name)
                 and (max_price is None or o.price_per_hour <= max_price)]
        return sorted(found, key=lambda o: o.price_per_hour)

    def create(self, offer: Offer, request: CreateRequest) -> Instance:
        if _take_fault("no_capacity"):
            raise NoCapacity(f"sandbox offer {offer.offer_id} has no machine free right now")
        instance_id = "sb" + secrets.token_hex(4)
        folder = _instances_dir() / instance_id
        make_private_dir(folder)
        record: dict[str, Any] = {
            "instance_id": instance_id, "name": request.name, "offer": offer.offer_id,
            "gpus": offer.gpus, "gpu_name": offer.gpu_name, "price": offer.price_per_hour,
            "created": time.time(), "silent": _take_fault("no_ssh")}
        atomic_write_json(folder / "instance.json", record)
        if record["silent"]:  # created, but nothing will ever listen on its port
            atomic_write_json(folder / "instance.json", {**record, "port": free_port()})
            return self._instance(instance_id)
        service.sandbox_up(_box_name(instance_id), folder / "host.yaml", gpus=offer.gpus,
                           gpu_name=offer.gpu_name)
        if _take_fault("bad_gpu"):
            gpu_dir = service.sandbox_root(_box_name(instance_id)) / "box" / "gpu"
            nvidia_smi.set_gpu_health(gpu_dir, 0, "uncorrectable_ecc")
        return self._instance(instance_id)

    def wait_ssh(self, instance: Instance, deadline: float) -> Instance:
        while True:
            current = self._instance(instance.instance_id)
            address = current.host.get("hostname"), current.host.get("port")
            if current.state == "running" and address[1] and \
                    _banner_ok(str(address[0]), int(address[1])):
                return current
            if current.state == "gone":
                raise NeverAnswered(f"sandbox box {instance.instance_id} is gone")
            if time.monotonic() >= deadline:
                raise NeverAnswered(f"sandbox box {instance.instance_id} did not answer SSH "
                                    "before its deadline")
            time.sleep(0.2)

    def list(self) -> list[Instance]:
        folder = _instances_dir()
        if not folder.is_dir():
            return []
        return [self._instance(p.name) for p in sorted(folder.iterdir()) if p.is_dir()]

    def terminate(self, instance_id: str) -> None:
        service.sandbox_down(_box_name(instance_id))
        folder = _instances_dir() / instance_id
        for name in ("instance.json", "host.yaml"):
            (folder / name).unlink(missing_ok=True)
        if folder.is_dir():
            os.rmdir(folder)

    def _instance(self, instance_id: str) -> Instance:
        record = read_json(_instances_dir() / instance_id / "instance.json")
        if not isinstance(record, dict):
            return Instance(NAME, instance_id, "", "gone")
        host: dict[str, Any] = {}
        if record.get("silent"):
            state = "starting"
            host = {"hostname": "127.0.0.1", "port": record.get("port")}
        else:
            box = service.read_state(_box_name(instance_id))
            state = "running" if box is not None and service.is_up(box) else "stopped"
            host_file = _instances_dir() / instance_id / "host.yaml"
            if state == "running" and host_file.is_file():
                import yaml

                host = dict(yaml.safe_load(host_file.read_text()) or {})
        return Instance(NAME, instance_id, str(record.get("name") or ""), state,
                        float(record.get("price") or 0.0), host)


def power_off(instance_id: str) -> None:
    """The box dies: its sshd and every SSH session stop at once (the provider lists it as
    ``stopped`` from then on). What runs on it is the caller's to stop; a dead machine's
    processes would be gone too."""
    service.sandbox_down(_box_name(instance_id), keep_box=True)
