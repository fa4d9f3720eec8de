"""The ``evaluate:`` key of a playbook: what ``outrig evaluate`` serves and sends.

A generic key (any playbook may have it), validated strictly like the rest of the file: an
unknown key is an error naming its line. Every key may be left out in a playbook whose
recipe gives evaluation defaults (``Recipe.eval_defaults``: the verifier, the drafter as the
run's newest complete checkpoint, held-out prompts, the training server's interpreter, GPUs
and length; :mod:`outrig.evaluation.spec` fills them in). The defaults are the recipe's, so
this key names none of them; docs/evaluate.md has each recipe's table.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

EnvMap = dict[str, str | int | float | bool]
BOX_PREFIX = "box:"  # prompts read on the box rather than pushed from the workstation
SMOKE = "smoke"  # evaluate.prompts: the smoke set shipped with outrig (code, math, chat, ...)


def gpu_list(value: list[int] | None) -> list[int] | None:
    """A ``gpus:`` list of an evaluation server: indices 0 or more, each once."""
    if value is not None:
        if any(g < 0 for g in value):
            raise ValueError("GPU indices are 0 or more")
        if len(set(value)) != len(value):
            raise ValueError(f"{value} lists a GPU twice")
    return value

class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EvalServerSpec(_Section):
    """The vLLM server the evaluation starts (and stops) on the box."""

    python: str | None = Field(None, min_length=1, description="the vLLM venv's interpreter "
                               "(default: the recipe's training server's, else python3)")
    entrypoint: str = Field("vllm.entrypoints.openai.api_server", min_length=1,
                            description="the module run with -m (the CPU build has no "
                            "working `vllm` command)")
    port: int = Field(8100, ge=1, le=65535, description="--port, on 127.0.0.1 only")
    gpus: list[int] | None = Field(None, description="physical GPU indices (default: "
                                   "the recipe's training server's, else none)")
    max_model_len: int | None = Field(None, ge=2, description="--max-model-len (default: "
                                      "the recipe's training server's, else vLLM's)")
    env: EnvMap = Field(default_factory=dict)
    extra_args: list[str] = Field(default_factory=list, description="more vLLM args, appended")
    ready_timeout: float = Field(1800.0, gt=0, description="seconds for /health to answer")
    stop_grace: float = Field(30.0, ge=0, description="SIGTERM → SIGKILL seconds")

    @field_validator("gpus")
    @classmethod
    def _gpus_ok(cls, value: list[int] | None) -> list[int] | None:
        return gpu_list(value)


class DuringTrainingSpec(_Section):
    """``evaluate.during_training``: each new complete checkpoint evaluated while training goes
    on, driven by ``outrig watch`` (docs/evaluate.md "During training"). The evaluation needs
    hardware of its own: GPUs of the training box that no process of the run uses (the
    planner checks), or a second box."""

    every: Literal["checkpoint", "epoch"] = Field(
        "checkpoint", description="checkpoint: each new complete save (mid-epoch ones too); "
        "epoch: only the end-of-epoch saves")
    gpus: list[int] | None = Field(None, description="GPUs of the training box set aside for "
                                   "the evaluation server ([] on a CPU-only vLLM build)")
    host: str | None = Field(None, min_length=1, description="a second box (its host file "
                             "name) that serves the evaluation; the verifier and each "
                             "checkpoint are staged there from the training box")

    @field_validator("gpus")
    @classmethod
    def _gpus_ok(cls, value: list[int] | None) -> list[int] | None:
        return gpu_list(value)

    @model_validator(mode="after")
    def _where(self) -> DuringTrainingSpec:
        if (self.gpus is None) == (self.host is None):
            raise ValueError("say where the evaluation runs: gpus: [GPUs of the training box "
                             "no process of the run uses] or host: A_SECOND_BOX, not both "
                             "and not neither")
        return self


class EvaluateSpec(_Section):
    """The ``evaluate:`` key."""

    model: str | None = Field(None, min_length=1, description="the verifier vLLM serves "
                              "(default: the recipe's model)")
    speculative: dict[str, Any] | None = Field(
        None, description="vLLM's --speculative-config (default: the recipe's "
        "drafter method, model = the run's checkpoint, and its num_speculative_tokens)")
    prompts: str | None = Field(
        None, min_length=1, description="a JSONL file of {\"prompt\": ...} or "
        "{\"messages\": [...]} lines, each with an optional \"category\": on this "
        "workstation (relative to the project), or box:PATH on the box (relative to the "
        "workdir), or smoke (outrig's own set); default: the last conversations of the "
        "recipe's training data, else smoke")
    dataset: str | None = Field(
        None, min_length=1, description="vLLM's own prompt set instead of prompts: "
        "spec_bench or speed_bench, optionally :CATEGORY, read on the box by vLLM's own "
        "dataset classes (needs dataset_path)")
    dataset_path: str | None = Field(
        None, min_length=1, description="where the dataset is on the box (relative to the "
        "workdir): Spec-Bench's question.jsonl, or the SPEED-Bench folder of <subset>.jsonl")
    dataset_subset: str | None = Field(
        None, min_length=1, description="speed_bench only: qualitative (the default), "
        "throughput_1k, ..., throughput_32k")
    requests: int = Field(32, ge=1, le=100_000, description="requests sent (at most the "
                          "number of prompts)")
    concurrency: int | list[int] = Field(
        4, description="requests in flight at once; a list evaluates each level")
    max_tokens: int = Field(64, ge=1, description="max_tokens of each request")
    temperature: float = Field(0.0, ge=0, description="0: greedy, what acceptance is "
                               "usually quoted at")
    request_timeout: float = Field(600.0, gt=0, description="seconds one request may take")
    settle: float = Field(2.0, ge=0, description="seconds between the /metrics reads after "
                          "the last answer, repeated until the counters stop moving")
    baseline: bool = Field(True, description="also serve without speculation and report "
                           "the speedup")
    enable_thinking: bool | None = Field(
        None, description="sent as chat_template_kwargs.enable_thinking with chat prompts "
        "(default: the chat template's own)")
    per_request_metrics: Literal["auto", "summary", "detailed", "off"] = Field(
        "auto", description="--per-request-spec-decode-metrics for the speculative server: "
        "auto turns summary on where the box's vLLM has the flag")
    server: EvalServerSpec = Field(default_factory=lambda: EvalServerSpec())
    during_training: DuringTrainingSpec | None = Field(
        None, description="evaluate each new complete checkpoint while training goes on "
        "(outrig watch drives it)")

    @field_validator("concurrency")
    @classmethod
    def _levels_ok(cls, value: int | list[int]) -> int | list[int]:
        levels = value if isinstance(value, list) else [value]
        if not levels or any(isinstance(v, bool) or not 1 <= v <= 1024 for v in levels):
            raise ValueError(f"{value!r}: give a whole number from 1 to 1024, or a list of "
                             "them, e.g. [1, 16]")
        if len(set(levels)) != len(levels):
            raise ValueError(f"{value!r} lists a level twice")
        return value

    @field_validator("speculative")
    @classmethod
    def _method_named(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            method = value.get("method")
            if not isinstance(method, str) or not method:
                raise ValueError("name the method, e.g. {method: ngram, "
                                 "num_speculative_tokens: 3, prompt_lookup_max: 3}")
            count = value.get("num_speculative_tokens")
            if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                                      or count < 1):
                raise ValueError(f"num_speculative_tokens: {count!r} is not a whole number "
                                 "≥ 1")
        return value
