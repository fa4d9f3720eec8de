"""The playbook's ``environments:`` and ``requires:`` sections (used by ``inv provision``).

An environment is a venv on the box with pinned packages (vLLM in one, speculators in another:
their torch/transformers pins differ, docs/provision.md). ``requires``
states what the box itself must offer. Both are validated here, when the playbook loads, so a
typo in a pin or a specifier fails on the workstation before anything is sent; the agent checks
the same things again on the box (remote/agent/versions.py and requires.py, for
``op_provision``).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ENV_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")
REQUIREMENT = re.compile(
    r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(\[[^\]]*\])?\s*(.*)$")
CLAUSE = re.compile(r"^(===|==|!=|~=|>=|<=|>|<)\s*([A-Za-z0-9.*+!_-]+)$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def check_specifier(spec: str) -> str:
    """``>=3.10``, ``>=580``, ``==0.33.0``, ``>=1,<2``: comma-separated comparison clauses."""
    clauses = [c.strip() for c in spec.split(",")]
    if not spec.strip() or any(CLAUSE.match(c) is None for c in clauses):
        raise ValueError(f"cannot read the version specifier {spec!r}; write it like '>=3.10' "
                         "or '>=580' (clauses: == != >= <= > < ~=, joined with commas)")
    return spec.strip()


def check_requirement(text: str) -> str:
    """A pip requirement the agent can verify: ``name[extras] <specifier>``, ``name @ URL``,
    optionally ``; marker``. Options such as ``--pre`` belong in ``pip_args``."""
    stripped = text.strip()
    if stripped.startswith("-"):
        raise ValueError(f"{text!r} is a pip option, not a package; put it in pip_args")
    match = REQUIREMENT.match(stripped.split(";", 1)[0].strip())
    if match is None:
        raise ValueError(f"{text!r} is not a requirement like 'vllm==0.33.0'")
    rest = match.group(3).strip()
    if rest and not rest.startswith("@"):
        check_specifier(rest)
    return stripped


class EnvironmentSpec(_Strict):
    """One venv on the box, with the packages it must hold at the pinned versions."""

    path: str = Field(description="venv directory on the box (absolute, or starting with ~)")
    python: str = Field("python3", description="base interpreter the venv is made from")
    packages: list[str] = Field(default_factory=list,
                                description="pip requirements with pins, e.g. vllm==0.33.0")
    index_url: str | None = Field(None, description="pip --index-url")
    extra_index_urls: list[str] = Field(default_factory=list, description="pip --extra-index-url")
    find_links: list[str] = Field(default_factory=list, description="pip --find-links (on the box)")
    no_index: bool = Field(False, description="pip --no-index (only find_links)")
    pip_args: list[str] = Field(default_factory=list, description="more pip install arguments")
    installer: Literal["auto", "uv", "pip"] = Field(
        "auto", description="auto: uv where it can, else pip (docs/provision.md); uv or pip: "
                            "only that one")

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not (value.startswith("/") or value.startswith("~")) or "\0" in value:
            raise ValueError(f"path {value!r} must be absolute on the box (or start with ~), "
                             "e.g. /workspace/venvs/vllm")
        return value

    @field_validator("packages")
    @classmethod
    def _requirements(cls, value: list[str]) -> list[str]:
        return [check_requirement(item) for item in value]

    def to_request(self, name: str) -> dict[str, Any]:
        """The agent's ``environments[]`` entry (docs/provision.md)."""
        return {"name": name, "path": self.path, "python": self.python,
                "packages": list(self.packages), "index_url": self.index_url,
                "extra_index_urls": list(self.extra_index_urls),
                "find_links": list(self.find_links), "no_index": self.no_index,
                "pip_args": list(self.pip_args), "installer": self.installer}


class RequiresSpec(_Strict):
    """What the box must offer before anything is installed."""

    python: str | None = Field(None, description="version specifier, e.g. '>=3.11'")
    driver: str | None = Field(None, description="NVIDIA driver specifier, e.g. '>=580'")
    disk_gb: float | None = Field(None, gt=0, description="free GB needed where venvs and the "
                                  "workdir live")

    @field_validator("python", "driver")
    @classmethod
    def _specifier(cls, value: str | None) -> str | None:
        return None if value is None else check_specifier(value)

    def to_request(self) -> dict[str, Any]:
        return {"python": self.python, "driver": self.driver, "disk_gb": self.disk_gb}


def check_environment_names(value: dict[str, EnvironmentSpec]) -> dict[str, EnvironmentSpec]:
    """Names are shown in messages and recorded in the journal: keep them simple."""
    for name in value:
        if not ENV_NAME.match(name):
            raise ValueError(f"environment name {name!r} must start with a letter and hold only "
                             "letters, digits, '-' and '_'")
    return value
