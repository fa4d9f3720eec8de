"""The ``runpod`` provider: RunPod's GraphQL API (``POST https://api.runpod.io/graphql``),
as RunPod's own SDK calls it (runpod/runpod-python 1.12.0, ``runpod/api/``), with the
standard library only. docs/providers.md traces each query, field and status value.

* search: ``gpuTypes { id displayName memoryInGb lowestPrice(input: {gpuCount: N})
  { uninterruptablePrice } }``: one offer per GPU type that has a price for N GPUs;
* create: ``podFindAndDeployOnDemand(input: {..., gpuTypeId, gpuCount, supportPublicIp:
  true, startSsh: true, ports: "22/tcp"})`` → ``{id}``;
* list: ``myself { pods { id name desiredStatus costPerHr runtime { ports { ip isIpPublic
  privatePort publicPort type } } } }``;
* terminate: ``podTerminate(input: {podId})``.

A pod behind RunPod's basic SSH proxy cannot scp or sftp, which staging needs: outrig asks
for a public IP and full SSH on TCP 22 and connects to the public port mapped to 22. Values
go into the query as JSON string literals (valid GraphQL strings), never pasted raw.
"""

from __future__ import annotations

import json
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

NAME = "runpod"
BASE_URL = "https://api.runpod.io"
DEFAULT_IMAGE = "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04"
# desiredStatus values mapped to outrig's words
STATES = {"RUNNING": "running", "EXITED": "stopped", "TERMINATED": "gone"}


def _text(value: str) -> str:
    """A GraphQL string literal (JSON's escaping is GraphQL's for these values)."""
    return json.dumps(str(value))


class RunPodProvider:
    """See the module docstring. ``config`` is ``providers: runpod:`` of outrig.yaml."""

    name = NAME

    def __init__(self, config: dict[str, Any], root: Path) -> None:
        self.config = config
        self.api = JsonApi(NAME, str(config.get("url") or BASE_URL),
                           load_key(NAME, "RUNPOD_API_KEY", config, root))

    def _query(self, query: str) -> dict[str, Any]:
        """One GraphQL call: its ``data``; an ``errors`` answer is a ProviderError with the
        first message (graphql.py 45-51)."""
        try:
            answer = self.api.call("POST", "/graphql", {"query": query})
        except HttpError as exc:
            if exc.status == 401:
                raise ProviderError("runpod refused the API key (HTTP 401); check "
                                    "RUNPOD_API_KEY or the api_key_file") from None
            raise
        if isinstance(answer, dict) and answer.get("errors"):
            first = answer["errors"][0]
            message = first.get("message") if isinstance(first, dict) else first
            raise ProviderError(self.api.clean(f"runpod answered an error: {message}"))
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, dict):
            raise ProviderError(f"runpod answered without data: {answer!r:.200}")
        return data

    def search(self, spec: GpuSpec, max_price: float | None) -> list[Offer]:
        data = self._query(
            "query GpuTypes { gpuTypes { id displayName memoryInGb "
            f"lowestPrice(input: {{gpuCount: {int(spec.count)}}}) "
            "{ uninterruptablePrice } } }")
        offers = []
        for row in data.get("gpuTypes") or []:
            price = ((row or {}).get("lowestPrice") or {}).get("uninterruptablePrice")
            if not isinstance(price, (int, float)) or price <= 0:
                continue  # no machine of this type with N GPUs now
            offers.append(Offer(NAME, str(row["id"]), spec.count,
                                str(row.get("displayName") or row["id"]),
                                round(float(price) * spec.count, 4)))
        found = [o for o in offers
                 if (spec.matches(o.gpus, o.gpu_name) or spec.matches(o.gpus, o.offer_id))
                 and (max_price is None or o.price_per_hour <= max_price)]
        return sorted(found, key=lambda o: o.price_per_hour)

    def create(self, offer: Offer, request: CreateRequest) -> Instance:
        image = request.image or self.config.get("image") or DEFAULT_IMAGE
        fields = [f"name: {_text(request.name)}", f"imageName: {_text(image)}",
                  f"cloudType: {self.config.get('cloud_type') or 'SECURE'}",
                  "startSsh: true", f"gpuTypeId: {_text(offer.offer_id)}",
                  "supportPublicIp: true", f"gpuCount: {int(offer.gpus)}",
                  f"volumeInGb: {int(request.disk_gb or 100)}",
                  f"containerDiskInGb: {int(self.config.get('container_disk_gb') or 50)}",
                  'ports: "22/tcp"', "dataCenterId: null"]
        try:
            data = self._query("mutation { podFindAndDeployOnDemand(input: { "
                               + ", ".join(fields) + " }) { id machineId } }")
        except ProviderError as exc:
            if "available" in str(exc).lower():  # no machine free for this request now
                raise NoCapacity(str(exc)) from None
            raise
        pod = data.get("podFindAndDeployOnDemand")
        if not isinstance(pod, dict) or not pod.get("id"):
            raise NoCapacity(f"runpod deployed no pod for {offer.offer_id} "
                             f"x{offer.gpus}: {data!r:.200}")
        return Instance(NAME, str(pod["id"]), request.name, "starting", offer.price_per_hour)

    def wait_ssh(self, instance: Instance, deadline: float) -> Instance:
        while True:
            current = next((i for i in self.list() if i.instance_id == instance.instance_id),
                           None)
            if current is None or current.state == "gone":
                raise NeverAnswered(f"runpod pod {instance.instance_id} is gone")
            host = current.host
            if current.state == "running" and host.get("port") and \
                    _banner(str(host["hostname"]), int(host["port"])):
                return current
            if time.monotonic() >= deadline:
                raise NeverAnswered(f"runpod pod {instance.instance_id} did not answer SSH "
                                    f"before its deadline (last status {current.state})")
            time.sleep(float(self.config.get("poll_seconds") or 10))

    def list(self) -> list[Instance]:
        data = self._query(
            "query myPods { myself { pods { id name desiredStatus costPerHr "
            "runtime { ports { ip isIpPublic privatePort publicPort type } } } } }")
        pods = ((data.get("myself") or {}).get("pods")) or []
        return [self._instance(p) for p in pods if isinstance(p, dict)]

    def terminate(self, instance_id: str) -> None:
        self._query(f"mutation {{ podTerminate(input: {{ podId: {_text(instance_id)} }}) }}")

    def _instance(self, pod: dict[str, Any]) -> Instance:
        ports = ((pod.get("runtime") or {}).get("ports")) or []
        ssh = next((p for p in ports if isinstance(p, dict) and p.get("privatePort") == 22
                    and p.get("isIpPublic") and p.get("type") == "tcp"), None)
        host: dict[str, Any] = {}
        if ssh is not None:
            host = {"hostname": str(ssh.get("ip")), "port": int(ssh.get("publicPort") or 0),
                    "user": "root",
                    "workdir": str(self.config.get("workdir") or "/workspace/outrig")}
            if self.config.get("identity_file"):
                host["identity_file"] = str(self.config["identity_file"])
        status = str(pod.get("desiredStatus") or "")
        state = STATES.get(status, "starting")
        if state == "running" and not pod.get("runtime"):
            state = "starting"  # RUNNING is wanted; the container is not up yet
        return Instance(NAME, str(pod.get("id")), str(pod.get("name") or ""), state,
                        float(pod.get("costPerHr") or 0.0), host)


def _banner(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=5.0) as conn:
            conn.settimeout(5.0)
            return conn.recv(64).startswith(b"SSH-")
    except OSError:
        return False
