"""Contract: the commands the dflash recipe renders are accepted by the real programs' parsers.

Our own tests only prove that outrig renders what *we* think vLLM and speculators accept. These
tests parse the rendered argv with vLLM's own ``serve`` argument parser and speculators' own
CLI (typer/click for ``prepare-data``, ``TrainConfig.resolve`` for ``-m speculators.train``,
torch's ``torchrun`` parser for the launcher part), so a renamed or retyped flag upstream
fails here instead of minutes into a run on a rented box.

They need vLLM and speculators importable, which is a multi-GB install that CI skips. Run them
from a separate venv (docs/dflash.md, "Contract with the real tools"):

    python3.11 -m venv /tmp/contract-venv
    /tmp/contract-venv/bin/pip install "vllm==0.33.*" "speculators==0.9.*" pytest -e .
    /tmp/contract-venv/bin/python -m pytest tests/contract -q

vLLM builds its parser's defaults from the current platform; on a machine without GPUs that is
``UnspecifiedPlatform`` with no device type, and building the parser fails ("Failed to infer
device type"). Setting the platform's ``device_type`` to ``cuda`` (what the box has) is enough
to build and run the parser; nothing touches a GPU.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from outrig.plan import HostFacts, make_plan
from outrig.playbook import load_job
from tests.support.plans import HOST, REPO, SKIP, cases, rendered


@pytest.fixture(scope="module")
def vllm_serve() -> Any:
    """(parser, serve subcommand) exactly as ``vllm.entrypoints.cli.main`` builds them."""
    pytest.importorskip("vllm", reason=SKIP.format("vllm"))
    import vllm.platforms

    if not vllm.platforms.current_platform.device_type:
        vllm.platforms.current_platform.device_type = "cuda"
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
    return parser, command


@pytest.mark.parametrize(("playbook", "test"), cases())
def test_server_argv_parses_with_vllm(vllm_serve: Any, playbook: str, test: bool) -> None:
    from vllm.config.speculative import SpeculativeMethod
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.engine.arg_utils import AsyncEngineArgs

    parser, command = vllm_serve
    server = rendered(playbook, test=test).processes["server"]
    assert server.argv[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]
    args = parser.parse_args(server.argv[3:])  # what `python -m vllm.entrypoints.cli.main` sees
    command.validate(args)
    model = server.argv[4]
    assert args.model_tag == model
    args.model = args.model_tag  # ServeSubcommand.cmd does this before building the engine
    engine = AsyncEngineArgs.from_cli_args(args)
    assert engine.model == model
    assert engine.tensor_parallel_size * engine.data_parallel_size == len(server.gpus)
    assert engine.max_model_len == 8193
    assert engine.max_num_batched_tokens is not None
    assert engine.max_num_batched_tokens >= engine.max_model_len
    assert engine.enable_chunked_prefill is True
    assert (args.host, args.port) == ("127.0.0.1", 8000)
    spec = engine.speculative_config
    assert isinstance(spec, dict) and spec["method"] == "extract_hidden_states"
    assert "extract_hidden_states" in _literal_values(SpeculativeMethod)
    layers = spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"]
    assert layers == [1, 16, 31, 46, 61, 64]
    kv = engine.kv_transfer_config
    assert kv is not None and kv.kv_connector == "ExampleHiddenStatesConnector"
    assert kv.kv_role == "kv_producer"
    assert kv.kv_connector_extra_config["shared_storage_path"].startswith("/workspace/dflash/runs/")
    assert kv.kv_connector in KVConnectorFactory._registry


def _literal_values(tp: Any) -> set[str]:
    """Every string of a (nested) typing.Literal alias."""
    from typing import get_args

    out: set[str] = set()
    for arg in get_args(tp):
        out |= _literal_values(arg) if get_args(arg) else {arg}
    return out


@pytest.mark.parametrize(("playbook", "test"), cases())
def test_prepare_argv_parses_with_speculators_cli(playbook: str, test: bool) -> None:
    pytest.importorskip("speculators", reason=SKIP.format("speculators"))
    import typer
    from speculators.cli import app

    prepare = rendered(playbook, test=test).processes["prepare"]
    assert prepare.argv[1:4] == ["-m", "speculators", "prepare-data"]
    group = typer.main.get_command(app)
    argv = list(prepare.argv[3:])  # what `python -m speculators` hands to its typer app
    with group.make_context("speculators", list(argv)) as ctx:
        name, sub, rest = group.resolve_command(ctx, argv)
        assert sub is not None and name == "prepare-data"
        sub_ctx = sub.make_context(name, list(rest), parent=ctx)  # parses + converts types
    params = sub_ctx.params
    assert params["model"] == "/workspace/dflash/models/Qwen3.6-27B"
    assert params["data"] == ["/workspace/dflash/data/conversations.jsonl"]
    assert params["render_endpoint"] == "http://127.0.0.1:8000"  # base URL: no /v1
    assert params["seq_length"] == 8192
    if test:
        assert params["max_samples"] == 64
        assert params["output"] == "/workspace/dflash/runs/run-1/test-data"
    else:
        assert params["output"] == "/workspace/dflash/data/tokenized"


@pytest.mark.parametrize(("playbook", "test"), cases())
def test_trainer_argv_parses_with_torchrun_and_speculators(playbook: str, test: bool) -> None:
    pytest.importorskip("speculators", reason=SKIP.format("speculators"))
    pytest.importorskip("torch", reason=SKIP.format("torch"))
    from speculators.train.config import TrainConfig
    from torch.distributed.run import get_args_parser

    trainer = rendered(playbook, test=test).processes["trainer"]
    launcher = get_args_parser().parse_args(trainer.argv[1:])
    assert launcher.standalone and launcher.module
    assert launcher.training_script == "speculators.train"
    assert int(launcher.nproc_per_node) == len(trainer.gpus)
    config = TrainConfig.resolve(list(launcher.training_script_args))
    assert config.speculator_type == "dflash"
    assert config.verifier.verifier_name_or_path == "/workspace/dflash/models/Qwen3.6-27B"
    assert config.generation.vllm_endpoint == "http://127.0.0.1:8000/v1"
    assert config.draft.target_layer_ids == [1, 16, 31, 46, 61]  # aux only: no 64
    assert config.dflash.block_size == 16
    assert config.optimizer.lr == pytest.approx(6e-4)
    assert config.data.total_seq_len == 8192
    assert config.trainer.epochs == 1
    if test:
        assert config.trainer.save_path == "/workspace/dflash/runs/run-1/checkpoints"
        assert config.trainer.max_steps == 50
    else:
        assert config.trainer.save_path == "/workspace/dflash/checkpoints"
    json.dumps(config.model_dump(), default=str)  # the whole config resolved


@pytest.mark.parametrize("backend", ["c10d", "static"])
def test_multi_node_launcher_parses_with_torchrun(backend: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``nodes: 2`` the launcher flags, substituted for node 1, are what torchrun reads:
    the node count, the rendezvous backend, endpoint, id and the join wait."""
    pytest.importorskip("torch", reason=SKIP.format("torch"))
    import dataclasses

    from torch.distributed.run import config_from_args, get_args_parser

    from outrig import plan as plan_module

    job = load_job(REPO / "playbooks" / "dflash-qwen36.yaml", test=False)
    section = job.spec.recipe_section().model_copy(update={
        "trainer": job.spec.recipe_section().trainer.model_copy(update={"rendezvous": backend})})
    spec = job.spec.model_copy(update={"nodes": 2, "dflash": section})
    builtin = plan_module.builtin_params
    monkeypatch.setattr(plan_module, "builtin_params", lambda *a, **k: {
        **builtin(*a, **k), "node_rank": 1, "nnodes": 2, "head_host": "gpu-head",
        "rdzv_port": 29400, "job_id": "job-1", "is_head": False})
    plan = make_plan(dataclasses.replace(job, spec=spec), HOST,
                     HostFacts(gpu_count=8, gpu_memory_mib=97_871), "run-1")
    assert plan.ok, plan.problems
    args = get_args_parser().parse_args(plan.processes["trainer"].argv[1:])
    assert not args.standalone and args.module and args.training_script == "speculators.train"
    config, _, _ = config_from_args(args)
    assert (config.min_nodes, config.max_nodes) == (2, 2)
    assert config.rdzv_backend == backend and config.run_id == "job-1"
    assert config.rdzv_endpoint == "gpu-head:29400"
    key = "join_timeout" if backend == "c10d" else "timeout"
    assert int(config.rdzv_configs[key]) > 600
    if backend == "static":
        assert config.rdzv_configs["rank"] == 1  # --node-rank reaches the static backend
    else:  # node 1 does not host the c10d store, whatever its own names are
        assert config.rdzv_configs["is_host"] in ("false", False)
