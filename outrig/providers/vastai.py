"""The ``vastai`` provider: vast.ai's REST API (``https://console.vast.ai/api/v0``), four
calls, the standard library only. docs/providers.md traces each call, field and status value
to vast.ai's own CLI source (vast-ai/vast-python ``vast.py``) and API reference.

* search: ``POST /api/v0/bundles/`` with a query of ``{"field": {"op": value}}`` →
  ``{"offers": [{id, gpu_name, num_gpus, dph_total, disk_space, geolocation}]}``;
* create: ``PUT /api/v0/asks/{offer id}/`` ``{client_id: "me", image, disk, label, runtype}``
  → ``{"success": true, "new_contract": ID}``;
* list: ``GET /api/v0/instances/?owner=me`` → ``{"instances": [{id, label, actual_status,
  public_ipaddr, ports{"22/tcp": [{HostPort}]}, ssh_host, ssh_port, dph_total}]}``;
* terminate: ``DELETE /api/v0/instances/{id}/``.

outrig asks for direct SSH (``runtype: "ssh_direc ssh_proxy"``, offers with a direct port)
and connects to ``public_ipaddr`` on the host port mapped to 22: vast.ai's proxy SSH is not
used. The account's SSH keys are what the box accepts; ``identity_file`` in outrig.yaml names
the private half.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from outrig.providers.base import (
    CreateRequest,
    GpuSpec,
    Instance,
    NeverAnswered,
    NoCapacity,
    Offer,
    ProviderError,
)
from outrig.providers.keys import load_key
from outrig.providers.webapi import HttpError, JsonApi

NAME = "vastai"
BASE_URL = "https://console.vast.ai"
DEFAULT_IMAGE = "pytorch/pytorch:latest"
DEFAULT_DISK_GB = 100
# actual_status values (vast.py 5099: running, offline, exited, created; "loading" while the
# image is pulled) mapped to outrig's words
STATES = {"running": "running", "loading": "starting", "created": "starting",
          "offline": "stopped", "exited": "stopped"}
# the create call's refusals that mean "this offer is taken": try again, then the next (an
# error code of these, or a message that says it is no longer available)
TAKEN = ("no_such_ask", "ask_not_available")


class VastProvider:
    """See the module docstring. ``config`` is ``providers: vastai:`` of outrig.yaml."""

    name = NAME

    def __init__(self, config: dict[str, Any], root: Path) -> None:
        self.config = config
        self.api = JsonApi(NAME, str(config.get("url") or BASE_URL),
                           load_key(NAME, "VAST_API_KEY", config, root))

    def search(self, spec: GpuSpec, max_price: float | None) -> list[Offer]:
        query: dict[str, Any] = {
            "verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True},
            "rented": {"eq": False}, "num_gpus": {"eq": spec.count},
            "direct_port_count": {"gte": 1}, "order": [["dph_total", "asc"]],
            "type": "on-demand", "limit": 64}
        if max_price is not None:
            query["dph_total"] = {"lte": max_price}
        answer = self.api.call("POST", "/api/v0/bundles/", query)
        rows = answer.get("offers") if isinstance(answer, dict) else None
        if not isinstance(rows, list):
            raise ProviderError(f"vastai search answered without offers: {answer!r:.200}")
        offers = [Offer(NAME, str(o["id"]), int(o.get("num_gpus") or 0),
                        str(o.get("gpu_name") or ""), float(o.get("dph_total") or 0.0),
                        o.get("disk_space"), str(o.get("geolocation") or ""))
                  for o in rows if isinstance(o, dict) and "id" in o]
        found = [o for o in offers if spec.matches(o.gpus, o.gpu_name)
                 and (max_price is None or o.price_per_hour <= max_price)]
        return sorted(found, key=lambda o: o.price_per_hour)

    def create(self, offer: Offer, request: CreateRequest) -> Instance:
        image = request.image or self.config.get("image") or DEFAULT_IMAGE
        body: dict[str, Any] = {"client_id": "me", "image": image,
                                "disk": request.disk_gb or DEFAULT_DISK_GB,
                                "label": request.name, "runtype": "ssh_direc ssh_proxy",
                                "env": {}}
        try:
            answer = self.api.call("PUT", f"/api/v0/asks/{offer.offer_id}/", body)
        except HttpError as exc:
            if _taken(exc.body):
                raise NoCapacity(str(exc)) from None
            raise
        if not isinstance(answer, dict) or not answer.get("success") or \
                not answer.get("new_contract"):
            if _taken(answer):
                raise NoCapacity(f"vastai offer {offer.offer_id} is taken: {answer!r:.200}")
            raise ProviderError(f"vastai create answered without an instance: {answer!r:.200}")
        return Instance(NAME, str(answer["new_contract"]), request.name, "starting",
                        offer.price_per_hour)

    def wait_ssh(self, instance: Instance, deadline: float) -> Instance:
        while True:
            current = next((i for i in self.list() if i.instance_id == instance.instance_id),
                           None)
            if current is None:
                raise NeverAnswered(f"vastai instance {instance.instance_id} is gone")
            host = current.host
            if current.state == "running" and host.get("port") and \
                    _banner(str(host["hostname"]), int(host["port"])):
                return current
            if time.monotonic() >= deadline:
                raise NeverAnswered(f"vastai instance {instance.instance_id} did not answer "
                                    f"SSH before its deadline (last status {current.state})")
            time.sleep(float(self.config.get("poll_seconds") or 10))

    def list(self) -> list[Instance]:
        answer = self.api.call("GET", "/api/v0/instances/?owner=me")
        rows = answer.get("instances") if isinstance(answer, dict) else None
        if not isinstance(rows, list):
            raise ProviderError(f"vastai list answered without instances: {answer!r:.200}")
        return [self._instance(row) for row in rows if isinstance(row, dict)]

    def terminate(self, instance_id: str) -> None:
        try:
            self.api.call("DELETE", f"/api/v0/instances/{instance_id}/")
        except HttpError as exc:
            if exc.status != 404:  # already gone: nothing to end
                raise

    def _instance(self, row: dict[str, Any]) -> Instance:
        ports = row.get("ports") if isinstance(row.get("ports"), dict) else {}
        mapped = (ports or {}).get("22/tcp")
        host: dict[str, Any] = {}
        if isinstance(mapped, list) and mapped and row.get("public_ipaddr"):
            host = {"hostname": str(row["public_ipaddr"]).strip(),
                    "port": int(mapped[0].get("HostPort") or 0), "user": "root",
                    "workdir": str(self.config.get("workdir") or "/root/outrig")}
            if self.config.get("identity_file"):
                host["identity_file"] = str(self.config["identity_file"])
        state = STATES.get(str(row.get("actual_status") or ""), "starting")
        return Instance(NAME, str(row.get("id")), str(row.get("label") or ""), state,
                        float(row.get("dph_total") or 0.0), host)


def _taken(body: Any) -> bool:
    if not isinstance(body, dict):
        return False
    words = str(body.get("msg") or body.get("message") or "").lower()
    return body.get("error") in TAKEN or "available" in words


def _banner(host: str, port: int) -> bool:
    """True when host:port speaks SSH (its first line starts ``SSH-``)."""
    try:
        with socket.create_connection((host, port), timeout=5.0) as conn:
            conn.settimeout(5.0)
            return conn.recv(64).startswith(b"SSH-")
    except OSError:
        return False
