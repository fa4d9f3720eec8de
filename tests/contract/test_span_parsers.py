"""Contract: the commands a verifier across nodes renders, for every node, are what the real
tools read: the CPU vLLM's own ``serve`` parser (``make_arg_parser`` through the serve
subcommand, then ``AsyncEngineArgs.from_cli_args``), and speculators 0.9's trainer config
(``TrainConfig.resolve`` with the Mooncake backend's flags), torchrun's launcher parser and
the Mooncake KV-transfer config its ``launch_vllm.py`` builds from ``--hidden-states-backend
mooncake --mooncake-master HOST:PORT``.

They run in the real tools' interpreters (``OUTRIG_VLLM_PYTHON``, ``OUTRIG_REHEARSAL_PYTHON``,
which ``make test`` sets from .ci/venvs): unset, they skip with a hint; set to a broken
interpreter, they fail. Nothing is started: each check parses and prints what it read."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from outrig.plan import Plan
from tests.support.span import colocated_doc, node_plans, split_doc

# vLLM's CLI exactly as ``vllm.entrypoints.cli.main`` builds it, then the engine arguments
# (the same steps tests/contract/test_real_parsers.py takes in-process).
VLLM_PARSE = r"""
import json, sys
import vllm.platforms
if not vllm.platforms.current_platform.device_type:
    vllm.platforms.current_platform.device_type = "cuda"
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(description="vLLM CLI")
sub = parser.add_subparsers(required=False, dest="subparser")
command = ServeSubcommand()
command.subparser_init(sub).set_defaults(dispatch_function=command.cmd)
out = []
for argv in json.load(sys.stdin):
    args = parser.parse_args(argv)
    command.validate(args)
    args.model = args.model_tag
    engine = AsyncEngineArgs.from_cli_args(args)
    kv = engine.kv_transfer_config
    out.append({"headless": args.headless, "nnodes": engine.nnodes,
                "node_rank": engine.node_rank, "master_addr": engine.master_addr,
                "master_port": engine.master_port, "backend": engine.data_parallel_backend,
                "tp": engine.tensor_parallel_size, "dp": engine.data_parallel_size,
                "pp": engine.pipeline_parallel_size, "host": args.host, "port": args.port,
                "kv_connector": kv.kv_connector,
                "kv_module": kv.kv_connector_module_path,
                "kv_extra": kv.kv_connector_extra_config})
print(json.dumps(out))
"""

# speculators' side: the trainer config, torchrun's launch config and, for the Mooncake
# backend, the KV-transfer config launch_vllm.py builds (scripts/launch_vllm.py parse_args:
# one argparse parser, every registered backend's add_launch_args, then the chosen backend's
# build_kv_transfer_config; the script itself ships in the repository, not the wheel).
SPECULATORS_PARSE = r"""
import argparse, json, os, sys
from hs_connectors import HiddenStatesBackend
from speculators.train.config import TrainConfig
from torch.distributed.run import config_from_args, get_args_parser
request = json.load(sys.stdin)
launcher = get_args_parser().parse_args(request["torchrun"])
config, _, _ = config_from_args(launcher)
train = TrainConfig.resolve(list(launcher.training_script_args)).flatten()
parser = argparse.ArgumentParser()
parser.add_argument("model")
registry = dict(HiddenStatesBackend.registry)
parser.add_argument("--hidden-states-backend", choices=list(registry), default="file")
for backend in registry.values():
    backend.add_launch_args(parser)
parser.add_argument("--target-layer-ids", type=int, nargs="+")
args, rest = parser.parse_known_args(request["launch"])
os.environ["MOONCAKE_LOCAL_HOSTNAME"] = request["node_host"]
kv = registry[args.hidden_states_backend].build_kv_transfer_config(args)
print(json.dumps({"nnodes": [config.min_nodes, config.max_nodes],
                  "rank": config.rdzv_configs.get("rank"), "endpoint": config.rdzv_endpoint,
                  "run_id": config.run_id, "backend": train.get("hidden_states_backend"),
                  "master": train.get("mooncake_master"),
                  "endpoint_url": train.get("vllm_endpoint"), "kv": kv, "rest": rest}))
"""


def interpreter(env: str, hint: str) -> str:
    python = os.environ.get(env)
    if not python:
        pytest.skip(f"set {env} to {hint} (make test sets it from .ci/venvs)")
    return python


def run(python: str, script: str, request: Any) -> Any:
    done = subprocess.run([python, "-c", script], input=json.dumps(request), text=True,
                          capture_output=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def servers(plans: list[Plan]) -> list[list[str]]:
    return [p.processes["server"].argv[3:] for p in plans if "server" in p.processes]


@pytest.mark.parametrize("layout", ["split", "colocated"])
def test_every_node_server_command_parses_with_vllm(tmp_path: Path, layout: str) -> None:
    python = interpreter("OUTRIG_VLLM_PYTHON", "the CPU vLLM venv's python")
    plans = node_plans(tmp_path, split_doc() if layout == "split" else colocated_doc())
    parsed = run(python, VLLM_PARSE, servers(plans))
    assert [p["node_rank"] for p in parsed] == [0, 1]
    assert [p["headless"] for p in parsed] == [False, True]
    for seen, own in zip(parsed, ("10.0.0.1", "10.0.0.2"), strict=True):
        assert (seen["nnodes"], seen["master_addr"], seen["master_port"]) == (
            2, "10.0.0.1", 29501)
        assert seen["backend"] == "mp" and seen["pp"] == 1
        # vLLM's own rule (arg_utils.py): the world divides evenly over the nodes
        assert (seen["tp"] * seen["dp"]) % seen["nnodes"] == 0
        assert seen["kv_connector"] == "MooncakeHiddenStatesConnector"
        assert seen["kv_module"] == "hs_connectors.mooncake_hidden_states_connector"
        store = seen["kv_extra"]["mooncake"]
        assert store["local_hostname"] == own
        assert store["master_server_address"] == "10.0.0.1:50051"
    assert (parsed[0]["host"], parsed[0]["port"]) == ("0.0.0.0", 8000)


@pytest.mark.parametrize("layout", ["split", "colocated"])
def test_trainer_and_launch_vllm_parse_with_speculators(tmp_path: Path, layout: str) -> None:
    """The trainer node's torchrun and speculators flags, and the head's KV-transfer config
    equal to what speculators' launch_vllm.py builds for the same master and node."""
    python = interpreter("OUTRIG_REHEARSAL_PYTHON", "the speculators 0.9 venv's python")
    plans = node_plans(tmp_path, split_doc() if layout == "split" else colocated_doc())
    trainer = plans[-1]
    argv = trainer.processes["trainer"].argv
    server = plans[0].processes["server"].argv
    launch = [server[4], "--hidden-states-backend", "mooncake",
              "--mooncake-master", "10.0.0.1:50051"]
    seen = run(python, SPECULATORS_PARSE, {"torchrun": argv[1:], "launch": launch,
                                           "node_host": "10.0.0.1"})
    assert seen["backend"] == "mooncake" and seen["master"] == "10.0.0.1:50051"
    assert seen["endpoint_url"] == "http://10.0.0.1:8000/v1"
    if layout == "split":  # node 2 is the trainer's only node: its own rendezvous
        assert seen["nnodes"] == [1, 1] and seen["endpoint"] == "10.0.0.3:29400"
        assert seen["rank"] == 0
    else:  # node 1 of the two, meeting at the head
        assert seen["nnodes"] == [2, 2] and seen["endpoint"] == "10.0.0.1:29400"
        assert seen["rank"] == 1
    assert seen["run_id"] == "job-1"
    rendered = json.loads(server[server.index("--kv_transfer_config") + 1])
    assert rendered == seen["kv"]
