"""Recipes: high-level playbook sections that expand into generic processes.

A playbook that says ``recipe: dflash`` plus a ``dflash:`` mapping gets its ``server``,
``prepare`` and ``trainer`` processes from :mod:`outrig.recipes.dflash` instead of writing
them by hand. Expansion happens inside the pure planner (:func:`outrig.plan.make_plan`): the
recipe returns plain process mappings, the planner validates them as ordinary
:class:`~outrig.playbook.ProcessSpec` and runs the *same* generic checks on them as on
hand-written processes (GPU overlap and range, tensor × data, ``after``, ``${names}``). The
recipe adds only the checks that need its own knowledge (layer ids, memory fit, token budgets).

A recipe is one :class:`~outrig.recipes.base.Recipe` object, listed once in :data:`RECIPES`
below. The playbook schema (one optional section per recipe, ``recipe:`` choosing among their
names), the planner, deploy's probes and ``inv stage`` all ask this registry; none of them
names a recipe. Adding one is a new module that defines its ``RECIPE`` plus one line in the
table (``register`` does the same at run time, for tests).

Nothing here does I/O. Facts about the model that only the box knows (its layer count, the
size of its weights, whether the path exists) come in as :class:`ModelFacts`, declared in the
playbook, cached in the journal, or read on the box by the agent's ``model_facts`` op.

This package must not import :mod:`outrig.playbook` or :mod:`outrig.plan` (both import it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from outrig.recipes import dflash_evaluate
from outrig.recipes.base import (
    EnvFacts,
    EvalDefaults,
    Expansion,
    KeyPath,
    ModelFacts,
    Recipe,
    RecipeContext,
    StageItem,
)

__all__ = ["RECIPES", "EnvFacts", "EvalDefaults", "Expansion", "KeyPath", "ModelFacts",
           "Recipe", "RecipeContext", "StageItem", "drafter_methods", "eval_defaults", "get",
           "models_to_probe", "names", "pythons_to_probe", "register", "stage_items",
           "unregister"]

# The registry: recipe name → recipe. One line per recipe.
RECIPES: dict[str, Recipe[Any]] = {recipe.name: recipe for recipe in (
    dflash_evaluate.RECIPE,  # dflash.RECIPE with its evaluation defaults
)}

# The name is a playbook key and a field of the playbook schema, so a Python identifier.
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


def register(recipe: Recipe[Any]) -> Recipe[Any]:
    """Add ``recipe`` at run time (tests, plugins); the playbook schema picks it up on the next
    load. Built-in recipes go in :data:`RECIPES` instead."""
    if not _NAME.match(recipe.name):
        raise ValueError(f"recipe name {recipe.name!r} must be lower-case letters, digits and "
                         "'_', starting with a letter: it is a key of the playbook")
    if recipe.name in RECIPES and RECIPES[recipe.name] is not recipe:
        raise ValueError(f"a recipe named {recipe.name!r} is already registered; pick "
                         "another name")
    RECIPES[recipe.name] = recipe
    return recipe


def unregister(name: str) -> None:
    """Remove a recipe added with :func:`register` (a test's teardown)."""
    RECIPES.pop(name, None)


def names() -> tuple[str, ...]:
    """The registered names, in registration order (what ``recipe:`` accepts)."""
    return tuple(RECIPES)


def get(name: str) -> Recipe[Any]:
    """The recipe called ``name``; the playbook schema only lets registered names through."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}") from None


def models_to_probe(recipe: str | None, section: Any,
                    known: Mapping[str, ModelFacts]) -> list[str]:
    """Models whose facts deploy must read on the box before planning (one agent exec).

    A local path is always probed (it must exist on *this* box, which may be a fresh one);
    anything else only when the recipe needs a number nobody declared and nothing cached.
    """
    if recipe is None or section is None:
        return []
    return get(recipe).models_to_probe(section, known)


def pythons_to_probe(recipe: str | None, section: Any) -> list[str]:
    """Interpreters whose packages deploy reads on the box before planning (same exec)."""
    if recipe is None or section is None:
        return []
    return get(recipe).pythons_to_probe(section)


def stage_items(recipe: str | None, section: Any) -> list[StageItem]:
    """The folders the recipe's processes need on the box (model, data, checkpoints)."""
    if recipe is None or section is None:
        return []
    return get(recipe).stage_items(section)


def eval_defaults(recipe: str | None, section: Any) -> EvalDefaults | None:
    """What the playbook's recipe gives ``outrig evaluate`` (None without a recipe)."""
    if recipe is None or section is None:
        return None
    return get(recipe).eval_defaults(section)


def drafter_methods() -> tuple[str, ...]:
    """The vLLM speculative methods whose drafter is a recipe's checkpoint, by recipe."""
    return tuple(r.drafter_method for r in RECIPES.values() if r.drafter_method is not None)
