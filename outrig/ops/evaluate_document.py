"""``outrig evaluate``'s document: the figures of every server, the provenance, the flags.

The headline (``acceptance_length``, ``per_position``, ``tokens_per_s``, ``speedup``, ...) is
the speculative server's (the fastest one of a ``--k`` sweep), its counters summed over
every concurrency level, its rates those of the first (lowest) level; ``levels`` holds each
level's figures beside the baseline's. The provenance reads the trainer's ``train/eal`` at
the checkpoint's step from the run's metric series in the journal (what ``status``,
``watch`` and ``report`` parsed), where there is one.
"""

from __future__ import annotations

import secrets as _secrets
import time
from typing import Any

from outrig.evaluation.causes import fastest, flags
from outrig.evaluation.document import level_figures, side_summary, with_baseline
from outrig.evaluation.spec import EvalSettings
from outrig.metrics.store import MetricStore
from outrig.playbook import Job
from outrig.session import HostSession

EAL_PREFIX = "train/eal"


def train_eal(session: HostSession, run: dict[str, Any] | None,
              ckpt: dict[str, Any] | None) -> float | None:
    """The trainer's last ``train/eal`` at or before the checkpoint's global step (None when
    the journal has no series for the run, or the checkpoint has no step)."""
    if run is None or not ckpt or ckpt.get("global_step") is None:
        return None
    step = int(ckpt["global_step"])
    best: tuple[int, float] | None = None
    for point in MetricStore(session.journal, str(run.get("run_id"))).points():
        for name, value in point.values.items():
            if name.startswith(EAL_PREFIX) and point.step <= step and (
                    best is None or point.step >= best[0]):
                best = (point.step, float(value))
    return best[1] if best else None


def _side(settings: EvalSettings, side: dict[str, Any],
          base: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """One speculative server's figures: its headline numbers and its levels."""
    numbers, counts = side_summary(side["benches"])
    levels = with_baseline([level_figures(c, b) for c, b in side["benches"]], base)
    first = levels[0] if levels else {}
    spec = side.get("speculative") or {}
    return {**numbers, "k": spec.get("num_speculative_tokens"), "levels": levels,
            "tokens_per_s": first.get("tokens_per_s"), "speedup": first.get("speedup"),
            "counters_seen": counts.seen, "side": side}


def prompts_text(settings: EvalSettings) -> str:
    """``smoke``, ``local prompts.jsonl``, ``dataset speed_bench:coding (qualitative of
    /data/speed)``, ..."""
    data = settings.dataset
    if settings.prompts.kind == "dataset" and data is not None:
        subset = f"{data.subset} of " if data.name == "speed_bench" else ""
        return f"dataset {data.text} ({subset}{data.path})"
    return settings.prompts.kind + (f" {settings.prompts.paths[0]}"
                                    if settings.prompts.paths else "")


def provenance(settings: EvalSettings, facts: dict[str, Any], k: Any,
               ckpt: dict[str, Any] | None, eal: float | None) -> dict[str, Any]:
    return {"vllm": facts.get("vllm"), "speculators": facts.get("speculators"),
            "torch": facts.get("torch"), "transformers": facts.get("transformers"),
            "gpu": facts.get("gpu"), "num_speculative_tokens": k,
            "served_max_model_len": settings.max_model_len,
            "training_seq_length": settings.training_seq_length,
            "enable_thinking_training": settings.training_thinking,
            "enable_thinking_serving": settings.serving_thinking,
            "prompts": prompts_text(settings),
            "prompts_sha256": facts.get("prompts_sha256"),
            "checkpoint_step": (ckpt or {}).get("global_step"), "train_eal": eal}


def document(session: HostSession, job: Job, run: dict[str, Any] | None,
             settings: EvalSettings, ckpt: dict[str, Any] | None,
             sides: list[dict[str, Any]], base: dict[int, dict[str, Any]],
             base_side: dict[str, Any] | None, *, facts: dict[str, Any],
             command: list[str]) -> dict[str, Any]:
    """The evaluation's one document (``--json``, the journal, the card)."""
    measured = [_side(settings, side, base) for side in sides]
    chosen = (fastest(measured) if len(measured) > 1 else None) or measured[0]
    side = chosen["side"]
    speculative = side.get("speculative")
    first = chosen["levels"][0] if chosen["levels"] else {}
    at = time.time()
    per_request = first.get("per_request")
    note = facts.get("per_request_note")
    if per_request is None and facts.get("per_request"):
        note = "the server returned no per-request metrics (vLLM reports them only for " \
               "single-sequence requests)"
    doc: dict[str, Any] = {
        "eval_id": f"{job.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(at))}-"
                   f"{_secrets.token_hex(2)}",
        "playbook": job.name, "host": session.host.name,
        "run_id": run.get("run_id") if run else None, "checkpoint": ckpt,
        "model": settings.model, "method": (speculative or {}).get("method"),
        "num_speculative_tokens": (speculative or {}).get("num_speculative_tokens"),
        "speculative_config": speculative,
        **{k: chosen[k] for k in ("acceptance_length", "per_position", "drafts",
                                  "draft_tokens", "accepted_tokens", "draft_acceptance_rate")},
        "per_request": per_request, "per_request_note": None if per_request else note,
        "requests": first.get("requests"), "completion_tokens": first.get("completion_tokens"),
        "seconds": first.get("seconds"), "tokens_per_s": chosen["tokens_per_s"],
        "baseline_tokens_per_s": (first.get("baseline") or {}).get("tokens_per_s"),
        "speedup": chosen["speedup"], "baseline_cached": bool(base) and base_side is None,
        "max_tokens": settings.max_tokens, "concurrency": list(settings.levels),
        "temperature": settings.temperature, "levels": chosen["levels"],
        "server_start_seconds": side["start_seconds"],
        "baseline_start_seconds": base_side["start_seconds"] if base_side else None,
        "server_runs": [s["run_id"] for s in sides] + ([base_side["run_id"]]
                                                       if base_side else []),
        "counters_seen": chosen["counters_seen"], "at": at,
        "commands": {"outrig": command, "servers": [s["argv"] for s in sides]
                     + ([base_side["argv"]] if base_side else [])}}
    if len(measured) > 1:
        doc["sweep"] = [{"k": m["k"], "acceptance_length": m["acceptance_length"],
                         "per_position": m["per_position"], "tokens_per_s": m["tokens_per_s"],
                         "speedup": m["speedup"], "run_id": m["side"]["run_id"]}
                        for m in measured]
        doc["fastest_k"] = chosen["k"]
    doc["provenance"] = provenance(settings, facts, doc["num_speculative_tokens"], ckpt,
                                   train_eal(session, run, ckpt))
    doc["flags"] = flags(doc)
    if not chosen["drafts"]:
        session.reporter.warn(
            "the server counted no drafts: speculative decoding was not in effect (no "
            "vllm:spec_decode counters moved). Check the speculative config and the server log"
            " (a runner setting can silence a drafter, vllm#49559)")
    return doc
