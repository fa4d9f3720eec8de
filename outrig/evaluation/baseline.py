"""The cached no-speculation baseline: what it depends on, as one key.

A baseline is the verifier served without ``--speculative-config``; it depends on the
verifier, the vLLM version, the GPU, the prompts, the concurrency and ``max_tokens`` (and
on what else changes the server or the requests: temperature, ``max_model_len``, the extra
arguments and environment), never on the checkpoint. So one baseline per key is kept in the
journal (``baselines/<key>.json``) and every later evaluation with the same key reuses it:
the second checkpoint's evaluation starts one server, not two. ``--baseline fresh`` measures
it again (and replaces the cached one).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

FIGURES = ("tokens_per_s", "completion_tokens", "requests", "seconds", "ttft_ms", "tpot_ms",
           "itl_ms")


def baseline_key(*, model: str, vllm: str | None, gpu: str, prompts_sha256: str,
                 concurrency: int, max_tokens: int, temperature: float,
                 max_model_len: int | None, extra_args: list[str],
                 env: dict[str, str]) -> str:
    """The key of one baseline measurement (sha256 of the canonical JSON of its inputs)."""
    inputs = {"model": model, "vllm": vllm, "gpu": gpu, "prompts": prompts_sha256,
              "concurrency": concurrency, "max_tokens": max_tokens,
              "temperature": temperature, "max_model_len": max_model_len,
              "extra_args": list(extra_args), "env": dict(sorted(env.items()))}
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def baseline_record(key: str, level: dict[str, Any], run_id: str, at: float) -> dict[str, Any]:
    """What the journal keeps of one measured baseline level."""
    return {"key": key, "run_id": run_id, "at": at,
            **{name: level.get(name) for name in ("concurrency", *FIGURES)}}
