"""Hub source strings: ``hf:ORG/NAME[@REV]`` and ``hf-dataset:ORG/NAME[@REV]``. Pure, no I/O.

A playbook (or ``inv stage``) names where a model or data set comes from; a hub source means
"the box can fetch this itself" (agent op ``hub_download``), which beats sending tens of GB
over the slow link. Anything that does not start with ``hf:`` / ``hf-dataset:`` is not a hub
source (:func:`parse_hub_source` returns None) so callers can fall through to paths and hosts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from outrig.errors import ConfigError

PREFIXES: dict[str, Literal["model", "dataset"]] = {"hf:": "model", "hf-dataset:": "dataset"}
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
REPO_RE = re.compile(rf"^(?:{_PART}/)?{_PART}$")
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}$")


@dataclass(frozen=True)
class HubSource:
    """A repo on the hub: what to pass to the agent's ``hub_download``."""

    kind: Literal["model", "dataset"]
    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        prefix = "hf:" if self.kind == "model" else "hf-dataset:"
        return f"{prefix}{self.repo_id}" + (f"@{self.revision}" if self.revision else "")

    def request(self) -> dict[str, str | None]:
        """The ``repo_id``, ``revision`` and ``kind`` fields of a ``hub_download`` request."""
        return {"repo_id": self.repo_id, "revision": self.revision, "kind": self.kind}


def is_hub_source(text: str) -> bool:
    """Whether ``text`` uses one of the hub prefixes (it may still be malformed)."""
    return text.strip().startswith(tuple(PREFIXES))


def parse_hub_source(text: str, *, where: str = "source") -> HubSource | None:
    """``hf:Qwen/Qwen3-8B@main`` → HubSource; not a hub prefix → None; malformed → ConfigError
    naming ``where`` and showing the expected form."""
    raw = text.strip()
    prefix = next((p for p in sorted(PREFIXES, key=len, reverse=True) if raw.startswith(p)), None)
    if prefix is None:
        return None
    body = raw[len(prefix):]
    form = f"{prefix}ORG/NAME or {prefix}ORG/NAME@REVISION (e.g. {prefix}Qwen/Qwen3-8B@main)"
    repo, sep, revision = body.partition("@")
    if not repo:
        raise ConfigError(f"{where}: {text!r} names no repo; write {form}")
    if not REPO_RE.match(repo) or "--" in repo or ".." in repo:
        raise ConfigError(f"{where}: {repo!r} in {text!r} is not a hub repo id; write {form}")
    if sep and not revision:
        raise ConfigError(f"{where}: {text!r} has '@' but no revision; write {form} or drop '@'")
    if revision and (not REVISION_RE.match(revision) or ".." in revision):
        raise ConfigError(f"{where}: revision {revision!r} in {text!r} is not a branch, tag or "
                          f"commit; write {form}")
    return HubSource(kind=PREFIXES[prefix], repo_id=repo, revision=revision or None)
