"""Recipes: high-level playbook sections that expand into generic processes.

A playbook that says ``recipe: dflash`` plus a ``dflash:`` mapping gets its ``server``,
``prepare`` and ``trainer`` processes from :mod:`outrig.recipes.dflash` instead of writing
them by hand. Expansion happens inside the pure planner (:func:`outrig.plan.make_plan`): the
recipe returns plain process mappings, the planner validates them as ordinary
:class:`~outrig.playbook.ProcessSpec` and runs the *same* generic checks on them as on
hand-written processes (GPU overlap and range, tensor × data, ``after``, ``${names}``). The
recipe adds only the checks that need its own knowledge (layer ids, memory fit, token budgets).

Nothing here does I/O. Facts about the model that only the box knows (its layer count, the
size of its weights, whether the path exists) come in as :class:`ModelFacts`, declared in the
playbook, cached in the journal, or read on the box by the agent's ``model_facts`` op.

This module must not import :mod:`outrig.playbook` or :mod:`outrig.plan` (both import it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

KeyPath = tuple[object, ...]
RECIPE_NAMES = ("dflash",)


@dataclass(frozen=True)
class ModelFacts:
    """What is known about one model (a local path or a hub id) on one host.

    ``exists`` is None when nobody looked; ``source`` says where the numbers came from so a
    message can tell the user which value to fix.
    """

    model: str
    exists: bool | None = None
    num_hidden_layers: int | None = None
    weight_bytes: int | None = None
    path: str | None = None
    source: str = "unknown"
    vocab_size: int | None = None
    hidden_size: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str) -> ModelFacts:
        """From the agent's ``model_facts`` result (or the journal's copy of it)."""
        layers = data.get("num_hidden_layers")
        size = data.get("weight_bytes")
        exists = data.get("exists")
        path = data.get("path")
        vocab = data.get("vocab_size")
        hidden = data.get("hidden_size")
        return cls(
            vocab_size=vocab if isinstance(vocab, int) and vocab > 0 else None,
            hidden_size=hidden if isinstance(hidden, int) and hidden > 0 else None,
            model=str(data.get("model", "")),
            exists=exists if isinstance(exists, bool) else None,
            num_hidden_layers=layers if isinstance(layers, int) and layers > 0 else None,
            weight_bytes=size if isinstance(size, int) and size > 0 else None,
            path=path if isinstance(path, str) else None,
            source=source,
        )


@dataclass(frozen=True)
class EnvFacts:
    """What one Python environment on the box holds, read without importing anything heavy.

    The trainer's torch decides what works (torchrun's ``--shutdown-timeout``, which loss
    implementation trains), so deploy reads it on the box as it reads model facts.
    ``torchrun_shutdown_timeout`` is None when nobody looked."""

    python: str
    found: bool | None = None
    versions: Mapping[str, str] = field(default_factory=dict)
    torchrun_shutdown_timeout: bool | None = None
    source: str = "unknown"

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str) -> EnvFacts:
        versions = data.get("versions")
        flag = data.get("torchrun_shutdown_timeout")
        found = data.get("found")
        return cls(python=str(data.get("python", "")),
                   found=found if isinstance(found, bool) else None,
                   versions={str(k): str(v) for k, v in versions.items() if v}
                   if isinstance(versions, Mapping) else {},
                   torchrun_shutdown_timeout=flag if isinstance(flag, bool) else None,
                   source=source)

    def version(self, dist: str) -> tuple[int, ...] | None:
        """``2.11.0+cu130`` → (2, 11, 0); None when unknown."""
        text = self.versions.get(dist)
        if not text:
            return None
        parts: list[int] = []
        for piece in text.split("+")[0].split("."):
            digits = "".join(ch for ch in piece if ch.isdigit()) if piece[:1].isdigit() else ""
            if not digits:
                break
            parts.append(int(digits))
        return tuple(parts) or None


@dataclass(frozen=True)
class RecipeContext:
    """Everything a recipe may look at besides its own section. Built by the planner."""

    host: str
    playbook: str
    run_id: str
    run_dir: str
    test_mode: bool
    gpu_count: int | None
    gpu_memory_mib: int | None
    gpu_source: str
    models: Mapping[str, ModelFacts]
    where: Callable[[KeyPath], str]
    envs: Mapping[str, EnvFacts] = field(default_factory=dict)


@dataclass
class Expansion:
    """A recipe's output: process mappings (ProcessSpec-shaped), where each came from in the
    playbook (for ``file:line`` messages), and the recipe's own problems and notes."""

    processes: dict[str, dict[str, Any]] = field(default_factory=dict)
    origins: dict[KeyPath, KeyPath] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def expand(recipe: str, section: Any, ctx: RecipeContext) -> Expansion:
    """Expand ``section`` (the validated ``dflash:`` model) into processes. Pure."""
    if recipe == "dflash":
        from outrig.recipes import dflash

        return dflash.expand(section, ctx)
    raise ValueError(f"unknown recipe {recipe!r}")  # the playbook schema prevents this


def models_to_probe(recipe: str | None, section: Any,
                    known: Mapping[str, ModelFacts]) -> list[str]:
    """Models whose facts deploy must read on the box before planning (one agent exec).

    A local path is always probed (it must exist on *this* box, which may be a fresh one);
    anything else only when the recipe needs a number nobody declared and nothing cached.
    """
    if recipe == "dflash" and section is not None:
        from outrig.recipes import dflash

        return dflash.models_to_probe(section, known)
    return []


def pythons_to_probe(recipe: str | None, section: Any) -> list[str]:
    """Interpreters whose packages deploy reads on the box before planning (same exec)."""
    if recipe == "dflash" and section is not None:
        return [section.trainer.python]
    return []
