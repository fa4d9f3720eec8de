"""The host file's format, ``hosts/NAME.yaml`` (docs/hosts.md), as a pydantic model: the
authority on what a host file may hold, and the source of the messages that name the key and
line of a mistake.

Why a module of its own: pydantic takes about 80 ms to import, a warm command's whole budget
for its start. :mod:`outrig.inventory` reads a well-formed host file without it
(:func:`outrig.inventory.plain_host_file`, which takes only values this model would take
unchanged) and comes here for anything else, so a mistake is still reported by this model.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class HostFile(BaseModel):
    """The format of ``hosts/NAME.yaml`` (see docs/hosts.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hostname: str = Field(description="address or ~/.ssh/config alias; 'local' runs the "
                          "agent on this machine without SSH, in this file's workdir (two "
                          "such files are two boxes on one machine)")
    port: int | None = Field(None, ge=1, le=65535)
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = Field(
        None, description="known_hosts file to check and record keys in "
        "(default ~/.ssh/known_hosts)"
    )
    workdir: str = Field(description="absolute path on the box; everything outrig writes is here")
    env: dict[str, str] = Field(default_factory=dict)
    python: str = "python3"
    gpus: Literal["auto"] | int = "auto"
    connect_timeout: float | None = Field(None, gt=0, description="seconds; default from RTT")
    keep_seconds: float | None = Field(
        None, ge=0, description="seconds a warm connection to this box stays open when idle "
        "(default 600; 0: none)")
    node_address: str | None = Field(
        None, min_length=1, description="the address the other nodes of a multi-node job "
        "reach this box by (a cluster-internal IP or name), as ${head_host} when it is node "
        "0 (default: hostname; 127.0.0.1 for hostname: local)")
    provider: str | None = Field(
        None, min_length=1, description="the provider this box was rented from (written by "
        "`outrig rent`; `outrig boxes` and `release` use it)")
    instance_id: str | None = Field(
        None, min_length=1, description="the provider's id of the box (written by `outrig "
        "rent`)")

    @field_validator("workdir")
    @classmethod
    def _workdir_absolute(cls, value: str) -> str:
        if not (value.startswith("/") or value.startswith("~")):
            raise ValueError(f"workdir {value!r} must be an absolute path (or start with ~)")
        if value.rstrip("/") in {"", "~"}:
            raise ValueError("workdir must be a folder of its own, not / or ~")
        return value

    @field_validator("gpus")
    @classmethod
    def _gpu_count(cls, value: Literal["auto"] | int) -> Literal["auto"] | int:
        if isinstance(value, int) and value < 0:
            raise ValueError("gpus must be 'auto' or a count ≥ 0")
        return value
