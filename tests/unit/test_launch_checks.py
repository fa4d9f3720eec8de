"""The job people paste: a hand-written ``vllm serve`` or ``torchrun`` command's own parallel
flags are checked against ``gpus:`` by the planner, as a recipe's ``parallel:`` is; a shell
command the planner cannot read says that nothing was checked."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from outrig.inventory import Host
from outrig.launchers import read_launch
from outrig.plan import HostFacts, Plan, make_plan
from outrig.playbook import load_job

HOST = Host(name="box", hostname="127.0.0.1", workdir="/workspace")


def plan_for(tmp_path: Path, command: str, gpus: str = "[0, 1]", extra: str = "",
             top: str = "") -> Plan:
    path = tmp_path / "job.yaml"
    path.write_text(f"{top}processes:\n  server:\n    command: {command}\n"
                    f"    gpus: {gpus}\n{extra}")
    return make_plan(load_job(path), HOST, HostFacts(gpu_count=8), "run-1")


def launch_notes(plan: Plan) -> list[str]:
    """The plan's notes but the one about the box's GPUs no process is given (these jobs use
    2 of its 8: tests/unit/test_dflash.py checks that note)."""
    return [note for note in plan.notes if "stay idle" not in note]


def test_the_issue_playbook_tp_2_dp_2_on_two_gpus_is_a_problem(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "vllm serve M --tensor-parallel-size 2 --data-parallel-size 2")
    assert len(plan.problems) == 1
    problem = plan.problems[0]
    assert problem.startswith(f"{tmp_path / 'job.yaml'}:3: processes.server.command: ")
    assert ("vLLM's --tensor-parallel-size 2 × --data-parallel-size 2 = 4 GPU(s), but server "
            "has 2 GPU(s) [0, 1]") in problem
    assert "DP adjusted local rank N is out of bounds" in problem
    assert "Give it 4 GPU(s) in gpus:" in problem


@pytest.mark.parametrize("command", [
    "vllm serve M -tp 2 -dp 2",
    "vllm serve M -tp=2 -dp=2",
    "vllm serve M --tensor_parallel_size=2 --data_parallel_size 2",
    "python -m vllm.entrypoints.openai.api_server --model M -tp 4",
    "/opt/venv/bin/python3.11 -u -m vllm.entrypoints.cli.main serve M -tp 2 -pp 2",
    "env HF_HOME=/tmp nohup vllm serve M --pipeline-parallel-size 4",
    "vllm serve M -tp 1 -tp 4",  # the last one wins, as in argparse
])
def test_every_spelling_of_four_gpus_on_two_is_caught(tmp_path: Path, command: str) -> None:
    plan = plan_for(tmp_path, command)
    assert len(plan.problems) == 1, plan.problems
    assert "= 4 GPU(s), but server has 2 GPU(s) [0, 1]" in plan.problems[0]


@pytest.mark.parametrize("command", [
    "vllm serve M -tp 2",
    "vllm serve M --data-parallel-size=2",
    "python -m vllm.entrypoints.openai.api_server --model M -tp 2 --port 8000",
    "python3 -m vllm.entrypoints.cli.main serve M --tensor-parallel-size 2",
    "torchrun --nproc-per-node 2 train.py",
    "torchrun --nproc_per_node=gpu -m speculators.train --epochs 3",
    "python -m torch.distributed.run --standalone --nproc-per-node 2 train.py -tp 9",
])
def test_commands_that_fit_their_gpus_plan_clean(tmp_path: Path, command: str) -> None:
    plan = plan_for(tmp_path, command)
    assert plan.ok, plan.problems
    assert not launch_notes(plan), plan.notes


def test_fewer_ranks_than_gpus_names_the_idle_ones(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "vllm serve M", gpus="[0, 1, 2, 3]")
    assert len(plan.problems) == 1
    assert ("vLLM without parallel flags uses 1 GPU, but server has 4 GPU(s) [0, 1, 2, 3]; "
            "3 of them would sit idle") in plan.problems[0]


def test_the_command_and_parallel_must_agree(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "vllm serve M -tp 2", extra="    parallel: {tensor: 1, "
                    "data: 2}\n")
    assert len(plan.problems) == 2
    assert "parallel: says tensor 1, but the command has -tp 2" in plan.problems[0]
    assert ("parallel: says data 2, but the command has no --data-parallel-size (so 1)"
            in plan.problems[1])


def test_a_parameter_is_checked_after_substitution(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "vllm serve M -tp ${tp}", top="params: {tp: 4}\n")
    assert len(plan.problems) == 1 and "-tp 4 = 4 GPU(s)" in plan.problems[0]


def test_a_value_the_parser_would_refuse_is_a_problem(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "vllm serve M -tp two")
    assert plan.problems == [f"{tmp_path / 'job.yaml'}:3: processes.server.command: vLLM's "
                             "-tp 'two' is not a whole number of 1 or more; its parser would "
                             "refuse it"]


def test_torchrun_more_ranks_than_gpus_and_nnodes_beyond_the_job(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "torchrun --nnodes 2 --nproc_per_node 4 -m train")
    assert len(plan.problems) == 2
    assert ("torchrun's --nproc_per_node 4 starts 4 rank(s), but server has 2 GPU(s) [0, 1]"
            in plan.problems[0])
    assert "invalid device ordinal" in plan.problems[0]
    assert ("torchrun's --nnodes 2 waits for 2 node(s), but the playbook has nodes: 1"
            in plan.problems[1])


def test_torchrun_reads_its_rank_count_from_pet_env(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "torchrun train.py", extra="    env: {PET_NPROC_PER_NODE: '3'}\n")
    assert len(plan.problems) == 1
    assert "torchrun's PET_NPROC_PER_NODE 3 starts 3 rank(s)" in plan.problems[0]


def test_nnodes_by_name_is_left_to_outrig(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "torchrun --nnodes ${nnodes} --nproc-per-node 2 train.py",
                    top="nodes: 2\n")
    assert plan.ok, plan.problems


@pytest.mark.parametrize(("command", "said"), [
    ("bash -c 'vllm serve M -tp 4'", "bash -c: outrig cannot read the flags of what it "
     "launches, so nothing was checked against the 2 GPU(s) [0, 1] of server"),
    ("./serve.sh --fast", "serve.sh: outrig cannot read"),
    ("vllm serve M --config serve.yaml", "--config serve.yaml: vLLM reads more flags from "
     "that file, which outrig does not open; outrig did not check vLLM's parallel sizes"),
    ("vllm serve M --tensor-par 4", "--tensor-par is an abbreviation vLLM may read as "
     "--tensor-parallel-size (write the flag in full)"),
    ("vllm serve M -tp 4 --nnodes 2 --node-rank 0", "--nnodes, --node-rank spreads vLLM over "
     "nodes; outrig did not check"),
    ("vllm serve M -tp 4 --headless", "--headless spreads vLLM over nodes"),
])
def test_what_cannot_be_read_says_nothing_was_checked(tmp_path: Path, command: str,
                                                      said: str) -> None:
    plan = plan_for(tmp_path, json_quote(command))
    assert plan.ok, plan.problems
    notes = launch_notes(plan)
    assert len(notes) == 1 and said in notes[0], plan.notes
    assert notes[0].startswith(f"{tmp_path / 'job.yaml'}:3: processes.server.command: ")


def test_a_shell_without_gpus_is_not_mentioned(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "bash -c 'sleep 1'", gpus="[]")
    assert plan.ok and not launch_notes(plan)


def test_other_programs_are_not_read() -> None:
    for command in ("python train.py -tp 9", "vllm bench serve -tp 9", "sleep 5",
                    "python -m mypkg.serve -tp 9"):
        assert read_launch(shlex.split(command)).program == ""


def json_quote(text: str) -> str:
    """A YAML flow scalar for ``text`` (the commands hold quotes of their own)."""
    return "'" + text.replace("'", "''") + "'"
