"""A recipe is one object in one registry: a new one (tests/example_recipe.py) needs no edit
to the playbook schema, the planner, deploy or ``inv stage``, and is validated, planned,
staged and deployed like the built-in dflash recipe."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig import recipes
from outrig.console import Reporter
from outrig.errors import ConfigError
from outrig.inventory import Host
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import deploy
from outrig.ops.stage import stage_items
from outrig.plan import HostFacts, make_plan
from outrig.playbook import load_job
from outrig.session import Project
from tests import example_recipe
from tests.support.processes import alive, wait_gone

REPO = Path(__file__).resolve().parents[2]
HOST = Host(name="box", hostname="127.0.0.1", workdir="/workspace/echo")


@pytest.fixture
def echo() -> Iterator[recipes.Recipe[Any]]:
    """The example recipe, registered for one test (the registry is process-wide)."""
    recipe = recipes.register(example_recipe.RECIPE)
    yield recipe
    recipes.unregister(recipe.name)


def write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "echo.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_registered_recipe_plans_through_the_generic_checks(
        tmp_path: Path, echo: recipes.Recipe[Any]) -> None:
    job = load_job(write(tmp_path, {"name": "echo", "recipe": "echo",
                                    "echo": {"message": "hello", "seconds": 5}}))
    plan = make_plan(job, HOST, HostFacts(), "r1")
    assert plan.problems == []
    assert plan.order == ["echo"]
    assert plan.processes["echo"].argv == ["python3", "-c", example_recipe.SCRIPT, "hello", "5"]
    assert plan.processes["echo"].ready is not None
    assert plan.processes["echo"].ready.log == "^hello$"


def test_a_registered_recipes_own_check_names_its_key_and_line(
        tmp_path: Path, echo: recipes.Recipe[Any]) -> None:
    job = load_job(write(tmp_path, {"recipe": "echo", "echo": {"message": "two\nlines"}}))
    plan = make_plan(job, HOST, HostFacts(), "r1")
    assert plan.problems == [f"{job.doc.path}:3: echo.message: the message has several lines; "
                             "give one (the process is ready when it is logged)"]


def test_a_registered_recipes_section_is_validated_like_any_key(
        tmp_path: Path, echo: recipes.Recipe[Any]) -> None:
    with pytest.raises(ConfigError) as info:
        load_job(write(tmp_path, {"recipe": "echo", "echo": {"mesage": "hi"}}))
    text = str(info.value)
    assert "echo.mesage: unknown key" in text
    assert "echo.message: required key is missing" in text
    with pytest.raises(ConfigError, match="recipe: echo needs a 'echo:' section"):
        load_job(write(tmp_path, {"recipe": "echo"}))


def test_an_unregistered_recipe_is_not_part_of_the_format(tmp_path: Path) -> None:
    path = write(tmp_path, {"recipe": "echo", "echo": {"message": "hi"}})
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert "recipe: Input should be 'dflash'" in str(info.value)
    assert "echo: unknown key" in str(info.value)


def test_inv_stage_takes_a_registered_recipes_folders(
        tmp_path: Path, echo: recipes.Recipe[Any]) -> None:
    job = load_job(write(tmp_path, {"recipe": "echo",
                                    "echo": {"message": "hi", "data": "${workdir}/greetings"}}))
    items = stage_items(job, HOST)
    assert [(i.name, i.path, i.kind) for i in items] == [
        ("data", "/workspace/echo/greetings", "data")]


def test_a_recipe_name_must_be_usable_as_a_playbook_key() -> None:
    bad = recipes.Recipe(name="sleep-server", section=example_recipe.EchoSpec,
                         expand=example_recipe.expand)
    with pytest.raises(ValueError, match="lower-case letters, digits and '_'"):
        recipes.register(bad)
    assert "sleep-server" not in recipes.names()


def test_a_registered_recipe_deploys_on_the_local_host(
        tmp_path: Path, echo: recipes.Recipe[Any]) -> None:
    path = write(tmp_path, {"name": "echo", "recipe": "echo",
                            "echo": {"message": "hello from a recipe",
                                     "python": sys.executable}})
    journal = Journal(tmp_path / "state")
    result = deploy(Project(REPO), "local", str(path), Reporter(quiet=True), journal=journal)
    [proc] = result.processes
    assert proc["name"] == "echo"
    assert alive(proc["pid"])
    log = Path(os.environ["HOME"]) / "outrig" / "runs" / result.plan.run_id / "logs" / "echo.log"
    assert "hello from a recipe" in log.read_text()
    cleanup(Project(REPO), "local", Reporter(quiet=True), playbook="echo", journal=journal)
    assert wait_gone([proc["pid"]]) == []


def test_a_recipe_named_like_a_playbook_key_is_refused_when_the_schema_is_built(
        tmp_path: Path) -> None:
    clash = recipes.register(recipes.Recipe(name="processes", section=example_recipe.EchoSpec,
                                            expand=example_recipe.expand))
    try:
        with pytest.raises(ValueError, match=r"\['processes'\] are playbook keys already"):
            load_job(write(tmp_path, {"processes": {"a": {"command": "true"}}}))
    finally:
        recipes.unregister(clash.name)
    assert load_job(write(tmp_path, {"processes": {"a": {"command": "true"}}})).spec.processes


def test_evaluate_takes_its_defaults_through_the_recipe_hook(tmp_path: Path) -> None:
    """The evaluation names no recipe: a registered recipe's ``eval_defaults`` and
    ``drafter_method`` give the verifier, the drafter's method and the server, and a method
    whose drafter is its checkpoint waits for one."""
    import dataclasses

    from outrig.evaluation.spec import settings_for

    def defaults(section: example_recipe.EchoSpec) -> recipes.EvalDefaults:
        return recipes.EvalDefaults(
            key="echo", model=f"/models/{section.message}",
            speculative={"method": "echo-draft", "num_speculative_tokens": 3},
            save_path="${run_dir}/ckpt", prompt_data=("${workdir}/chats.jsonl",),
            prompt_data_key="echo.data", python=section.python, gpus=(2, 3),
            max_model_len=4096, env={"A": 1}, server_args=(), scheduler=False, seq_length=512)

    recipe = recipes.register(dataclasses.replace(example_recipe.RECIPE, eval_defaults=defaults,
                                                  drafter_method="echo-draft"))
    try:
        assert "echo-draft" in recipes.drafter_methods()
        job = load_job(write(tmp_path, {"name": "echo", "recipe": "echo",
                                        "echo": {"message": "m", "python": "/venv/bin/python"}}))
        given = recipes.eval_defaults(job.spec.recipe, job.spec.recipe_section())
        settings, problems = settings_for(job.spec.evaluate, given,
                                          {"run_dir": "/w/runs/r1", "workdir": "/w"}, "e.yaml")
    finally:
        recipes.unregister(recipe.name)
    assert problems == [] and settings is not None
    assert settings.model == "/models/m"
    assert settings.speculative == {"method": "echo-draft", "num_speculative_tokens": 3}
    assert settings.needs_checkpoint and settings.save_path == "/w/runs/r1/ckpt"
    assert (settings.python, settings.gpus, settings.max_model_len) == ("/venv/bin/python",
                                                                        [2, 3], 4096)
    assert settings.env == {"A": "1"} and settings.scheduler is False
    assert settings.prompts.kind == "conversations"
    assert settings.prompts.paths == ("${workdir}/chats.jsonl",)
    assert settings.training_seq_length == 512
    assert "echo-draft" not in recipes.drafter_methods(), "unregistered: its method is gone"
