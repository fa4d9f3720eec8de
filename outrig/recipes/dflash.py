"""``recipe: dflash``: vLLM serving hidden states + ``speculators`` DFlash training on one box.

The hand-run scripts this replaces failed in ways a planner can see before anything starts
(docs/dflash.md has the facts and their sources): TP × DP larger than the server's
GPUs, a forgotten ``--max-num-batched-tokens``, ``--max-model-len`` shorter than a training
sample, layer ids off by one, a verifier name that differs from what vLLM serves, a model
pulled from the hub at launch. This module renders the three processes from a short section
and checks each of those, with a message that names the key and the fix.

Rendered processes (argv lists; no shell anywhere):

* ``server``: ``<vllm python> -m vllm.entrypoints.cli.main serve MODEL`` with the
  ``extract_hidden_states`` speculative config and the ``ExampleHiddenStatesConnector`` KV
  transfer config (what speculators' ``scripts/launch_vllm.py`` execs, rendered here so that
  ``inv plan`` shows the real command and no script has to be pushed into the vLLM venv).
  Ready when ``/health`` answers and ``/v1/models`` serves exactly the verifier string.
* ``prepare``: ``<speculators python> -m speculators prepare-data ...`` through the server's
  render endpoint; a one-shot step. When its output already holds ``*.arrow`` files,
  speculators itself skips preprocessing and exits 0 (0.9.0 behaviour), so a redeploy costs
  one short process start, and outrig needs no shell or skip logic of its own.
* ``trainer``: ``torchrun --standalone --nproc_per_node N -m speculators.train ...``.

Pure: no I/O. Model facts come in through :class:`~outrig.recipes.RecipeContext`.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from outrig.progress import argv_option
from outrig.recipes import EnvFacts, Expansion, KeyPath, ModelFacts, RecipeContext

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
    r"Engine core initialization failed",
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


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


EnvMap = dict[str, str | int | float | bool]


class ServerSpec(_Section):
    """vLLM, serving the target model's hidden states on ``gpus``."""

    gpus: list[int] = Field(min_length=1, description="physical GPU indices for vLLM")
    tensor: int = Field(1, ge=1, description="--tensor-parallel-size")
    data: int = Field(1, ge=1, description="--data-parallel-size (tensor × data = len(gpus))")
    port: int = Field(8000, ge=1, le=65535, description="--port, on 127.0.0.1 only")
    gpu_memory_utilization: float = Field(
        0.85, gt=0, le=1, description="--gpu-memory-utilization (fraction of each GPU)")
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="--max-num-batched-tokens; default: max_model_len (one whole "
        "sample per scheduler step, valid with or without chunked prefill)")
    max_num_seqs: int | None = Field(None, ge=1, description="--max-num-seqs (vLLM default "
                                     "when unset)")
    max_model_len: int | None = Field(None, ge=2, description="--max-model-len; default "
                                      "seq_length + 1 (the trainer sends a whole sample "
                                      "with max_tokens=1)")
    chunked_prefill: bool = Field(True, description="--enable-chunked-prefill; hybrid models "
                                  "(Qwen3.5/3.6 Gated DeltaNet) require it")
    min_kv_cache_gib: float = Field(4.0, ge=0, description="GiB per GPU that must stay free "
                                    "for KV cache and activations after the weights")
    python: str = Field("python3", min_length=1, description="the vLLM venv's interpreter")
    extra_args: list[str] = Field(default_factory=list, description="more vLLM args, appended")
    env: EnvMap = Field(default_factory=dict)
    ready_timeout: float = Field(1800.0, gt=0, description="seconds for /health to answer")
    stop_grace: float = Field(60.0, ge=0, description="SIGTERM → SIGKILL seconds")


class TrainerSpec(_Section):
    """``torchrun -m speculators.train`` on ``gpus`` (one rank per GPU)."""

    gpus: list[int] = Field(min_length=1, description="physical GPU indices, one rank each")
    python: str = Field("python3", min_length=1,
                        description="the speculators venv's interpreter (runs prepare-data)")
    torchrun: str | None = Field(None, description="torchrun of the speculators venv; default: "
                                 "next to python (…/bin/torchrun), else 'torchrun' on PATH")
    num_workers: int | None = Field(None, ge=1, description="--num-workers per rank (each sends "
                                    "requests to vLLM). At least 1: with 0 a SIGTERM that lands "
                                    "in a hidden-state request is swallowed by speculators' "
                                    "retry loop and the trainer ignores the stop (seen on the "
                                    "CPU rehearsal)")
    extra_args: list[str] = Field(default_factory=list, description="more train args, appended")
    env: EnvMap = Field(default_factory=dict)
    ready_timeout: float = Field(900.0, gt=0, description="seconds until the trainer logs its "
                                 "start (fresh or resuming)")
    stop_grace: float = Field(150.0, ge=0, description="SIGTERM → SIGKILL seconds (≥ 130: "
                              "speculators saves interrupted/ within 120 s)")


class PrepareSpec(_Section):
    """``speculators prepare-data`` through the running server's render endpoint."""

    enabled: bool = Field(True, description="false: data_path is already prepared")
    data: list[str] = Field(default_factory=list, description="--data inputs: files, dirs, "
                            "presets (sharegpt, ...) or hf:<id>")
    workers: int | None = Field(None, ge=1, description="--num-preprocessing-workers")
    extra_args: list[str] = Field(default_factory=list)
    env: EnvMap = Field(default_factory=dict)
    timeout: float = Field(7200.0, gt=0, description="seconds for the one-shot step")


class RegenerateSpec(_Section):
    """``speculators regenerate-responses``: answers regenerated by the served target model
    (on-policy data), written as JSONL for prepare to read. Off unless enabled."""

    enabled: bool = Field(False, description="run it before prepare")
    dataset: str = Field("ultrachat", min_length=1, description="--dataset: a preset or a "
                         ".json/.jsonl file on the box")
    output: str = Field("${run_dir}/regenerated.jsonl", min_length=1,
                        description="--outfile; prepare reads it (add it to prepare.data)")
    limit: int | None = Field(None, ge=1, description="--limit rows")
    max_tokens: int | None = Field(None, ge=1, description="--max-tokens per answer")
    concurrency: int | None = Field(None, ge=1, description="--concurrency")
    extra_args: list[str] = Field(default_factory=list)
    env: EnvMap = Field(default_factory=dict)
    timeout: float = Field(86400.0, gt=0, description="seconds for the one-shot step")


class DFlashSpec(_Section):
    """The ``dflash:`` section of a playbook with ``recipe: dflash``."""

    model: str = Field(min_length=1, description="what vLLM serves and the trainer verifies "
                       "against: an absolute path on the box (runs offline) or a hub id")
    source: str | None = Field(None, description="hub id the model is staged from "
                               "(e.g. Qwen/Qwen3.6-27B)")
    data_path: str = Field(min_length=1, description="prepare's --output = trainer --data-path")
    save_path: str = Field(min_length=1, description="trainer --save-path (checkpoints)")
    hidden_states_path: str = Field("${run_dir}/hidden_states", description="vLLM's "
                                    "shared_storage_path for extracted hidden states")
    seq_length: int = Field(8192, ge=16, description="prepare --seq-length = --total-seq-len")
    max_samples: int | None = Field(None, ge=1, description="prepare --max-samples")
    test_max_samples: int = Field(64, ge=1, description="--max-samples under --test")
    epochs: int = Field(1, ge=1)
    lr: float = Field(1e-3, gt=0)
    block_size: int = Field(16, ge=1)
    max_steps: int | None = Field(None, ge=1, description="trainer --max-steps")
    checkpoint_freq: float = Field(
        0.1, gt=0, description="trainer --checkpoint-freq: < 1 saves every that fraction of an "
        "epoch (0.1: ten checkpoints an epoch, something to resume from when a box dies); "
        "speculators' own default 1 saves once an epoch")
    draft_vocab_size: int | None = Field(
        None, ge=1, description="trainer --draft-vocab-size (e.g. 32000): a smaller draft "
        "vocabulary built from prepare's token frequencies; default: the verifier's whole "
        "vocabulary (the draft's logits then cost tens of GB at 3072 anchors)")
    loss_implementation: Literal["auto", "fused", "eager"] = Field(
        "auto", description="trainer --loss-implementation; auto: eager when the trainer's "
        "torch is older than 2.13 (the fused Triton loss fails to compile there), else fused")
    target_layer_ids: list[int] | None = Field(None, description="auxiliary layer ids; default "
                                               "[2, L//2, L-3] from num_hidden_layers L")
    num_hidden_layers: int | None = Field(None, ge=1, description="declared L; else read from "
                                          "the model's config.json on the box")
    model_size_gb: float | None = Field(None, gt=0, description="declared weight size in GB "
                                        "(1e9 bytes); else read on the box")
    server: ServerSpec
    trainer: TrainerSpec
    prepare: PrepareSpec = Field(default_factory=lambda: PrepareSpec())
    regenerate: RegenerateSpec = Field(default_factory=lambda: RegenerateSpec())
    env: EnvMap = Field(default_factory=dict, description="added to all three processes")

    @field_validator("checkpoint_freq")
    @classmethod
    def _freq_form(cls, value: float) -> float:
        # speculators' schema (train/config/schema.py _validate_checkpoint_freq) refuses
        # these at start-up, minutes into a deploy; refuse them here instead.
        if value > 1 and not float(value).is_integer():
            raise ValueError(f"checkpoint_freq {value} is not a whole number; values above 1 "
                             "count epochs (use 2, 3, ...) and values below 1 fractions of one")
        return value

    @field_validator("model")
    @classmethod
    def _model_form(cls, value: str) -> str:
        if value.startswith(("./", "../", "~")):
            raise ValueError(f"model {value!r}: give an absolute path on the box (the "
                             "processes' working directory is not the model's) or a hub id")
        return value


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


# ------------------------------------------------------------------------------------------ expand


def expand(spec: DFlashSpec, ctx: RecipeContext) -> Expansion:
    """Render server, prepare and trainer; check what only this recipe knows about."""
    out = Expansion()
    at = ctx.where  # keypath → 'file:line: key.path'
    server, trainer = spec.server, spec.trainer
    facts = model_facts(spec, ctx.models)
    served = spec.model  # vLLM serves the model argument as given: no --served-model-name
    local = is_local(spec.model)

    data_path, save_path, epochs, max_samples = (
        spec.data_path, spec.save_path, spec.epochs, spec.max_samples)
    if ctx.test_mode:
        data_path, save_path, epochs = TEST_DATA_DIR, TEST_SAVE_DIR, 1
        max_samples = min(spec.test_max_samples, spec.max_samples or spec.test_max_samples)
        shown = {"${run_dir}": ctx.run_dir}
        out.notes.append(
            f"--test: one epoch, --max-samples {max_samples}, data prepared into "
            f"{_shown(data_path, shown)} and checkpoints in {_shown(save_path, shown)} (the "
            f"real {spec.data_path} and {spec.save_path} are not touched); same GPUs and "
            "flags as the real run")

    # --- model facts and layer ids
    if local and facts.exists is False:
        out.problems.append(
            f"{at(('dflash', 'model'))}: {spec.model} does not exist on {ctx.host} "
            f"({facts.source}). Stage it first: `outrig stage --host {ctx.host} --playbook "
            f"{ctx.playbook}`, or by hand on the box: `hf download "
            f"{spec.source or '<hub id>'} --local-dir {spec.model}`")
    vllm_ids: list[int] = []
    trainer_ids: list[int] = []
    if facts.num_hidden_layers is None:
        out.problems.append(
            f"{at(('dflash', 'model'))}: num_hidden_layers of {spec.model} is not known, so "
            "the layer ids cannot be rendered. Declare it (dflash: num_hidden_layers: N, from "
            "the model's config.json) or run `outrig deploy`, which reads it on the box first")
    else:
        vllm_ids, trainer_ids, layer_problems = layer_ids(spec, facts.num_hidden_layers)
        key = ("dflash", "target_layer_ids")
        out.problems.extend(f"{at(key)}: {p}" for p in layer_problems)

    # --- token budgets
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

    # --- memory fit
    _check_fit(spec, facts, ctx, at, out)
    _check_draft_fit(spec, facts, ctx, at, out)

    # --- flags the recipe owns must not come in again through extra_args
    _check_extras(at, out, ("dflash", "server", "extra_args"), server.extra_args, {
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
    })
    _check_extras(at, out, ("dflash", "trainer", "extra_args"), trainer.extra_args, {
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
    })
    _check_extras(at, out, ("dflash", "prepare", "extra_args"), spec.prepare.extra_args, {
        "--model": "it is always dflash.model", "--output": "set dflash.data_path",
        "--render-endpoint": "derived from dflash.server.port",
        "--seq-length": "set dflash.seq_length", "--max-samples": "set dflash.max_samples",
        "--data": "list inputs under dflash.prepare.data",
    })
    if trainer.stop_grace < MIN_TRAINER_GRACE:
        out.problems.append(
            f"{at(('dflash', 'trainer', 'stop_grace'))}: {trainer.stop_grace:g}s is too short: "
            "on SIGTERM speculators saves interrupted/ under a 120 s watchdog; a SIGKILL "
            f"before that loses the checkpoint. Use ≥ {MIN_TRAINER_GRACE:g}")
    if spec.prepare.enabled and not spec.prepare.data:
        out.problems.append(
            f"{at(('dflash', 'prepare'))}: prepare is enabled but lists no inputs; add "
            "data: [conversations.jsonl, ...] or set enabled: false when data_path already "
            "holds prepared *.arrow files")

    # --- render
    endpoint = f"http://127.0.0.1:{server.port}"
    offline = {"HF_HUB_OFFLINE": "1"} if local else {}
    speculative = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                   "draft_model_config": {"hf_config": {
                       "eagle_aux_hidden_state_layer_ids": vllm_ids}}}
    kv_transfer = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                   "kv_connector_extra_config": {"shared_storage_path": spec.hidden_states_path}}
    server_argv = [
        server.python, "-m", "vllm.entrypoints.cli.main", "serve", spec.model,
        "--speculative_config", _json(speculative),
        "--kv_transfer_config", _json(kv_transfer),
        "--tensor-parallel-size", str(server.tensor),
        "--data-parallel-size", str(server.data),
        "--max-num-batched-tokens", str(batched),
        "--max-model-len", str(max_model_len),
        "--gpu-memory-utilization", f"{server.gpu_memory_utilization:g}",
        *(["--max-num-seqs", str(server.max_num_seqs)] if server.max_num_seqs else []),
        "--enable-chunked-prefill" if server.chunked_prefill else "--no-enable-chunked-prefill",
        "--port", str(server.port), "--host", "127.0.0.1",
        # prepare-data tokenizes through POST /v1/chat/completions/render, which vLLM 0.33
        # answers 403 "Scale-out endpoints are disabled" without this flag
        # (vllm/entrypoints/scale_out/factories.py register_scale_out_api_routers).
        "--enable-scale-out",
        *server.extra_args,
    ]
    out.processes["server"] = {
        "command": server_argv,
        "env": {**spec.env, **offline, **server.env},
        "gpus": list(server.gpus),
        "parallel": {"tensor": server.tensor, "data": server.data},
        "ready": {"http": f"{endpoint}/health", "model": served,
                  "timeout": server.ready_timeout},
        "fatal": list(SERVER_FATAL),
        "stop": {"grace": server.stop_grace},
        # The trainer deletes each hidden-state file after reading it (--on-generate delete);
        # files of requests in flight when something died stay behind, ~0.5 GB each.
        "scratch": [spec.hidden_states_path],
    }
    out.origins[("processes", "server")] = ("dflash", "server")
    out.origins[("processes", "server", "parallel")] = ("dflash", "server", "tensor")
    out.origins[("processes", "server", "command")] = ("dflash", "model")

    trainer_after = "server"
    prepare_after = "server"
    regen = spec.regenerate
    if regen.enabled:
        regen_argv = [
            trainer.python, "-m", "speculators", "regenerate-responses",
            "--endpoint", f"{endpoint}/v1/chat/completions",
            "--model", served,
            "--dataset", regen.dataset,
            "--outfile", regen.output,
            "--resume",  # a redeploy continues the file instead of starting over
            *(["--limit", str(regen.limit)] if regen.limit else []),
            *(["--max-tokens", str(regen.max_tokens)] if regen.max_tokens else []),
            *(["--concurrency", str(regen.concurrency)] if regen.concurrency else []),
            *regen.extra_args,
        ]
        out.processes["regenerate"] = {
            "command": regen_argv,
            "env": {**spec.env, **(offline if not is_hub_input(regen.dataset) else {}),
                    "PYTHONUNBUFFERED": "1", **regen.env},
            "gpus": [], "after": "server",
            "ready": {"exit": True, "timeout": regen.timeout},
            "fatal": list(PREPARE_FATAL), "stop": {"grace": 10},
        }
        out.origins[("processes", "regenerate")] = ("dflash", "regenerate")
        prepare_after = trainer_after = "regenerate"
        if spec.prepare.enabled and regen.output not in spec.prepare.data:
            out.notes.append(f"regenerate writes {regen.output}, which prepare.data does not "
                             "list: prepare will not train on the regenerated answers")
        out.notes.append("regenerate-responses runs against the hidden-state server: each "
                         "answer also leaves a hidden-state file, cleared when the run stops")
    if spec.prepare.enabled:
        prep = spec.prepare
        hub_inputs = [d for d in prep.data if is_hub_input(d)]
        prepare_argv = [
            trainer.python, "-m", "speculators", "prepare-data",
            "--model", spec.model,
            *[arg for item in prep.data for arg in ("--data", item)],
            "--render-endpoint", endpoint,
            "--output", data_path,
            "--seq-length", str(spec.seq_length),
            *(["--max-samples", str(max_samples)] if max_samples else []),
            *(["--num-preprocessing-workers", str(prep.workers)] if prep.workers else []),
            # --draft-vocab-size maps the draft's vocabulary from token_freq.pt, which
            # speculators 0.9 prepare-data skips by default (--skip-token-freq).
            *(["--no-skip-token-freq"] if spec.draft_vocab_size else []),
            *prep.extra_args,
        ]
        out.processes["prepare"] = {
            "command": prepare_argv,
            # Inputs that are presets or hf: ids must be fetched, so only local inputs run
            # offline (the model itself is read from its local path either way).
            "env": {**spec.env, **(offline if not hub_inputs else {}),
                    "PYTHONUNBUFFERED": "1", **prep.env},
            "gpus": [],
            "after": prepare_after,
            "ready": {"exit": True, "timeout": prep.timeout},
            "fatal": list(PREPARE_FATAL),
            "stop": {"grace": 10},
        }
        out.origins[("processes", "prepare")] = ("dflash", "prepare")
        out.origins[("processes", "prepare", "command")] = ("dflash", "prepare", "data")
        trainer_after = "prepare"

    torchrun = trainer.torchrun or _sibling(trainer.python, "torchrun")
    env_facts = ctx.envs.get(trainer.python)
    loss = _loss_implementation(spec, env_facts, out)
    launcher = _shutdown_timeout(trainer, env_facts, out)
    scheduler_off = argv_option(trainer.extra_args, "--scheduler-type") == "none"
    if spec.checkpoint_freq >= 1 and epochs <= spec.checkpoint_freq:
        out.notes.append(
            f"checkpoint_freq {spec.checkpoint_freq:g} with {epochs} epoch(s): the first "
            "checkpoint is written when training ends, so a box that dies mid-run leaves "
            "nothing to resume from. Use a fraction (0.1 saves ten times an epoch)")
    trainer_argv = [
        torchrun, "--standalone", "--nproc_per_node", str(len(trainer.gpus)), *launcher,
        "-m", "speculators.train",
        "--speculator-type", "dflash",
        "--verifier-name-or-path", served,
        "--data-path", data_path,
        "--save-path", save_path,
        "--vllm-endpoint", f"{endpoint}/v1",
        "--target-layer-ids", *[str(i) for i in trainer_ids],
        "--block-size", str(spec.block_size),
        "--epochs", str(epochs),
        "--lr", f"{spec.lr:g}",
        "--total-seq-len", str(spec.seq_length),
        *(["--num-workers", str(trainer.num_workers)] if trainer.num_workers is not None else []),
        *(["--max-steps", str(spec.max_steps)] if spec.max_steps else []),
        "--checkpoint-freq", f"{spec.checkpoint_freq:g}",
        *(["--draft-vocab-size", str(spec.draft_vocab_size)] if spec.draft_vocab_size else []),
        *(["--loss-implementation", loss] if loss else []),
        *trainer.extra_args,
    ]
    out.processes["trainer"] = {
        "command": trainer_argv,
        # TORCH_ELASTIC_SHUTDOWN_TIMEOUT: what torchrun waits between SIGTERM and SIGKILL
        # where it reads it (the torch releases with --shutdown-timeout); ignored elsewhere.
        "env": {**spec.env, **offline, "COLUMNS": "300", "PYTHONUNBUFFERED": "1",
                "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": f"{int(trainer.stop_grace)}",
                **trainer.env},
        "gpus": list(trainer.gpus),
        "after": trainer_after,
        "ready": {"log": TRAINER_STARTED, "timeout": trainer.ready_timeout},
        "fatal": list(TRAINER_FATAL),
        # SIGTERM to the ranks themselves, not to torchrun: see _shutdown_timeout.
        "stop": {"grace": trainer.stop_grace, "children_first": True},
        "checkpoints": {"path": save_path, "scheduler": not scheduler_off},
    }
    out.origins[("processes", "trainer")] = ("dflash", "trainer")
    out.origins[("processes", "trainer", "command")] = ("dflash", "trainer")
    if local:
        out.notes.append(f"{spec.model} is a local path: server and trainer run with "
                         "HF_HUB_OFFLINE=1 (nothing is pulled from the hub at launch)")
    if facts.num_hidden_layers is not None:
        origin = "declared" if spec.num_hidden_layers else facts.source
        out.notes.append(f"layers: num_hidden_layers {facts.num_hidden_layers} ({origin}); "
                         f"vLLM extracts {vllm_ids}, the trainer gets the auxiliary ids "
                         f"{trainer_ids}")
    return out


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
    if not facts.hidden_size:
        text += "; the hidden size is not known yet, so activations are not counted"
    if ctx.gpu_memory_mib is None:
        out.notes.append(text + " (GPU memory not known yet)")
        return
    total = ctx.gpu_memory_mib / 1024
    if need > 0.8 * total:
        fixes = ["pass a smaller --max-anchors"]
        if not spec.draft_vocab_size:
            fixes.insert(0, "set dflash.draft_vocab_size: 32000 (what upstream DFlash "
                            "examples use)")
        out.problems.append(
            f"{at(('dflash', 'trainer'))}: {text}, more than 80% of the {total:.0f} GiB GPU: "
            f"the trainer would run out of memory. {' or '.join(fixes).capitalize()}")
    else:
        out.notes.append(text + f" of {total:.0f} GiB")


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


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
