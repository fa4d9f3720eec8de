"""What a provider is: five calls (search offers, create, wait until SSH answers, list,
terminate) and the values they pass.

Why so small: everything else outrig does with a rented box (check, provision, stage, deploy,
migrate, fence) goes through its host file and SSH, as for any box. A provider only has to
turn an offer into a box that answers SSH, and to say which boxes it still has. A new
provider is one module with a class that has these methods, and one line in
:mod:`outrig.providers.registry`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from outrig.errors import ConfigError, OutrigError

NAME_PREFIX = "outrig-"  # every box outrig creates is named so: its own list finds orphans


class ProviderError(OutrigError):
    """A provider's API refused or failed a call; the message says which call and why."""


class NoCapacity(ProviderError):
    """The offer is gone or has no machine free right now: retry, then take the next one."""


class NeverAnswered(ProviderError):
    """The box was created but its SSH did not answer before the deadline."""


@dataclass(frozen=True)
class GpuSpec:
    """``8xH100``: how many GPUs of which model (matched as a word in the offer's GPU name,
    case-insensitive: ``H100`` matches ``NVIDIA H100 80GB HBM3``)."""

    count: int
    model: str

    def matches(self, gpus: int, gpu_name: str) -> bool:
        words = re.split(r"[\s_-]+", gpu_name.upper())
        return gpus == self.count and (self.model.upper() in words
                                       or self.model.upper() == gpu_name.upper())

    def __str__(self) -> str:
        return f"{self.count}x{self.model}"


def parse_gpus(text: str, where: str = "--gpus") -> GpuSpec:
    """``8xH100`` → GpuSpec(8, "H100"); anything else is a ConfigError naming ``where``."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*", text or "")
    if not match or int(match.group(1)) < 1:
        raise ConfigError(f"{where} {text!r} is not a GPU spec; write COUNTxMODEL, e.g. "
                          "8xH100 or 1xA100. Nothing was rented.")
    return GpuSpec(int(match.group(1)), match.group(2))


@dataclass(frozen=True)
class Offer:
    """A machine a provider would rent now, at ``price_per_hour`` US dollars."""

    provider: str
    offer_id: str
    gpus: int
    gpu_name: str
    price_per_hour: float
    disk_gb: float | None = None
    where: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Instance:
    """A box the provider has. ``state`` is the provider's word mapped to one of
    ``starting``, ``running``, ``stopped``, ``gone``; ``host`` is the host-file mapping
    (hostname, port, user, ...) once SSH details are known."""

    provider: str
    instance_id: str
    name: str
    state: str
    price_per_hour: float | None = None
    host: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class CreateRequest:
    """What ``rent`` asks for beyond the offer."""

    name: str
    disk_gb: int | None = None
    image: str | None = None


class Provider(Protocol):
    """The interface every provider module implements (docs/providers.md)."""

    name: str

    def search(self, spec: GpuSpec, max_price: float | None) -> list[Offer]:
        """Offers for ``spec`` at or below ``max_price``, cheapest first."""

    def create(self, offer: Offer, request: CreateRequest) -> Instance:
        """Ask for the box; returns at once (state ``starting``). NoCapacity when the offer
        is taken."""

    def wait_ssh(self, instance: Instance, deadline: float) -> Instance:
        """Poll until the box's SSH answers (its banner); the instance with ``host`` filled.
        NeverAnswered at ``deadline`` (a ``time.monotonic()`` value)."""

    def list(self) -> list[Instance]:
        """Every box of this account, as the provider sees it now."""

    def terminate(self, instance_id: str) -> None:
        """Destroy the box (harmless when it is already gone)."""
