"""A second recipe, small enough to read at a glance: what adding a recipe takes.

``recipe: echo`` plus an ``echo:`` section becomes one process that prints the message and
stays up (ready when the message is in its log). Everything a recipe is, is here: the
section's schema, ``expand`` with one check of its own, and the folder ``inv stage`` puts on
the box. A built-in recipe would add ``echo.RECIPE,`` to the table in outrig/recipes; the
tests register it at run time with :func:`outrig.recipes.register` instead.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from outrig.recipes import Expansion, Recipe, RecipeContext, StageItem

# Prints its first argument, then sleeps until stopped.
SCRIPT = "import sys, time; print(sys.argv[1], flush=True); time.sleep(float(sys.argv[2]))"


class EchoSpec(BaseModel):
    """The ``echo:`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    message: str = Field(min_length=1, description="the line the process prints")
    python: str = Field("python3", min_length=1, description="the interpreter on the box")
    seconds: float = Field(600.0, gt=0, description="how long it stays up")
    data: str | None = Field(None, description="a folder inv stage puts on the box for it")


def expand(spec: EchoSpec, ctx: RecipeContext) -> Expansion:
    """One process; a message of several lines is refused (readiness waits for one line)."""
    out = Expansion()
    if "\n" in spec.message:
        out.problems.append(f"{ctx.where(('echo', 'message'))}: the message has several "
                            "lines; give one (the process is ready when it is logged)")
    out.processes["echo"] = {
        "command": [spec.python, "-c", SCRIPT, spec.message, f"{spec.seconds:g}"],
        "ready": {"log": f"^{re.escape(spec.message)}$", "timeout": 30},
        "stop": {"grace": 2},
    }
    out.origins[("processes", "echo")] = ("echo",)
    return out


def stage_items(spec: EchoSpec) -> list[StageItem]:
    """The ``data`` folder, when given; the box has no source for it but another box."""
    return [StageItem("data", spec.data, None, "data")] if spec.data else []


RECIPE = Recipe(name="echo", section=EchoSpec, expand=expand, stage_items=stage_items)
