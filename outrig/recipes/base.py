"""What recipes and the planner share: facts about the box, the context, the output, and
:class:`Recipe`, the one object that describes a recipe to the rest of outrig.

Kept apart from :mod:`outrig.recipes` (the registry) so that a recipe module can import these
while the registry imports the recipe modules. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

KeyPath = tuple[object, ...]
Section = TypeVar("Section", bound=BaseModel)


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
    # The playbook's node count: above 1 the same processes run on every node, with
    # ${node_rank}, ${nnodes}, ${head_host} and ${rdzv_port} substituted per node.
    nodes: int = 1
    # This node's rank, and what a recipe that gives nodes different processes (a vLLM server
    # spanning nodes) must check: each node's address as the others reach it (empty: not
    # known, a plan shown alone), whether node 0's was declared (``node_address:``), and the
    # ports the job already uses.
    node_rank: int = 0
    node_hosts: tuple[str, ...] = ()
    head_declared: bool = False
    rdzv_port: int | None = None


@dataclass
class Expansion:
    """A recipe's output: process mappings (ProcessSpec-shaped), where each came from in the
    playbook (for ``file:line`` messages), and the recipe's own problems and notes."""

    processes: dict[str, dict[str, Any]] = field(default_factory=dict)
    origins: dict[KeyPath, KeyPath] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Across nodes: this node must start with node 0, not after it (a part of a server that
    # spans nodes: the head is ready only once every part joined), and the group of nodes
    # that must have the same GPU count (vLLM and torchrun give each node an equal share).
    with_head: bool = False
    node_group: str = ""


@dataclass(frozen=True)
class StageItem:
    """A folder a recipe's processes need on the box (``inv stage`` puts it there).

    ``optional_because`` set: a missing ``source`` is a note (something on the box builds the
    folder), not an error."""

    name: str
    path: str
    source: str | None
    kind: str
    optional_because: str | None = None


@dataclass(frozen=True)
class EvalDefaults:
    """What a recipe's section gives ``outrig evaluate`` for each key its ``evaluate:`` leaves
    out (docs/evaluate.md): the verifier, vLLM's speculative config (without the drafter, which
    is the run's newest checkpoint under ``save_path``), the prompts' training data and the
    server. ``key`` is the section's key and ``prompt_data_key`` the data's, named in messages.
    """

    key: str
    model: str
    speculative: dict[str, Any]
    save_path: str
    prompt_data: tuple[str, ...]
    prompt_data_key: str
    python: str
    gpus: tuple[int, ...]
    max_model_len: int | None
    env: dict[str, Any]
    server_args: tuple[str, ...]  # the training server's own vLLM args (its chat template)
    scheduler: bool  # the trainer writes a scheduler state (not --scheduler-type none)
    seq_length: int | None  # what the drafter trained on


def _no_eval_defaults(section: Any) -> EvalDefaults | None:
    """Default: the recipe gives ``outrig evaluate`` nothing; its ``evaluate:`` says it all."""
    return None


def _no_models(section: Any, known: Mapping[str, ModelFacts]) -> list[str]:
    """Default: the recipe needs no model facts, so deploy opens no probe for it."""
    return []


def _no_pythons(section: Any) -> list[str]:
    """Default: no interpreter's packages decide what the recipe renders."""
    return []


def _no_items(section: Any) -> list[StageItem]:
    """Default: the recipe needs nothing on the box beyond the playbook's own ``stage:``."""
    return []


@dataclass(frozen=True)
class Recipe(Generic[Section]):
    """One recipe, everything about it that the rest of outrig asks.

    ``name`` is both the value of ``recipe:`` and the key of its section in a playbook, so it
    is a Python identifier (it becomes a field of the playbook schema). ``section`` is the
    pydantic model of that section: the playbook schema embeds it, so its errors name the key
    and line like any other. The functions are pure and take the validated section:

    * ``expand``: the processes (ProcessSpec-shaped mappings), problems and notes;
    * ``models_to_probe`` / ``pythons_to_probe``: what deploy reads on the box before planning
      (model facts, an interpreter's packages), in the same agent exec;
    * ``stage_items``: the folders ``inv stage`` puts on the box for it;
    * ``eval_defaults``: what ``outrig evaluate`` takes from the section, and
      ``drafter_method`` the vLLM speculative method whose drafter is the run's checkpoint.
    """

    name: str
    section: type[Section]
    expand: Callable[[Section, RecipeContext], Expansion]
    models_to_probe: Callable[[Section, Mapping[str, ModelFacts]], list[str]] = _no_models
    pythons_to_probe: Callable[[Section], list[str]] = _no_pythons
    stage_items: Callable[[Section], list[StageItem]] = _no_items
    eval_defaults: Callable[[Section], EvalDefaults | None] = _no_eval_defaults
    drafter_method: str | None = None
    docs: str | None = None  # where a user reads about the section, named in messages
