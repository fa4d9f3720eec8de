"""Why a served number is bad: an evaluation's provenance and the flags it raises.

Each flag names what was seen, the likely cause and the fix. They are the known ways a
drafter that trained well serves badly (speculators#613: position-1 accuracy 0.87 in
training, acceptance length 1.04 of 16 served):

- ``broken_serving``: vLLM drafted and accepted (almost) nothing. A drafter that learned
  anything accepts some tokens; ≈ 1.00 with drafts counted is a serving fault (a padded or
  other draft vocabulary, other verifier weights, wrong hidden-state layers, a runner
  setting: vllm#49559), not a training one.
- ``position_cliff``: the per-position rate is exactly 0 from some position on while the
  earlier ones are not: the drafter's attention or length differs from training (sliding-
  window drafter layers run as full attention drop to 0 after position 4-5; more
  speculative tokens than the block it was trained for).
- ``max_model_len_above_training``: vLLM serves longer sequences than the trainer saw.
- ``thinking_differs``: ``enable_thinking`` in training and serving differ (one card saw
  25 % against 60 % acceptance).
- ``far_below_training``: the served acceptance length is far below the trainer's
  ``train/eal`` at that checkpoint.
"""

from __future__ import annotations

from typing import Any

BROKEN_BELOW = 1.02  # acceptance length at or under this with drafts counted: ≈ 1
FAR_BELOW = 0.75  # served acceptance length under this share of train/eal: far below


def _flag(name: str, seen: str, cause: str, fix: str) -> dict[str, str]:
    return {"flag": name, "seen": seen, "cause": cause, "fix": fix}


def cliff_position(per_position: list[float]) -> int | None:
    """The first position (0-based) from which every rate is exactly 0 while some earlier
    one is not; None when there is no such cliff."""
    if not per_position or per_position[0] == 0:
        return None
    for pos in range(1, len(per_position)):
        if all(rate == 0 for rate in per_position[pos:]):
            return pos
    return None


def flags(doc: dict[str, Any]) -> list[dict[str, str]]:
    """The flags of one evaluation document (its counters and ``provenance``)."""
    out: list[dict[str, str]] = []
    prov = doc.get("provenance") or {}
    length = doc.get("acceptance_length")
    drafts = int(doc.get("drafts") or 0)
    if drafts and length is not None and length <= BROKEN_BELOW:
        out.append(_flag(
            "broken_serving",
            f"acceptance length {length:.2f} with {drafts} drafts counted",
            "the serving path is broken, not the drafter: vLLM drafts but the verifier "
            "rejects almost every token (a padded or different draft vocabulary, other "
            "verifier weights than training used, the wrong hidden-state layers, a runner "
            "setting such as VLLM_USE_V2_MODEL_RUNNER: vllm#49559)",
            "check the checkpoint's config.json (verifier name, target layer ids, draft "
            "vocabulary) against the served model; serve it with VLLM_USE_V2_MODEL_RUNNER=0 "
            "where vLLM has that runner; more training will not help"))
    cliff = cliff_position(list(doc.get("per_position") or []))
    if cliff is not None:
        out.append(_flag(
            "position_cliff",
            f"per-position acceptance exactly 0 from position {cliff + 1} on",
            "an attention or length mismatch: drafter layers trained with sliding-window "
            "attention served as full attention, or more speculative tokens than the block "
            "the drafter was trained for",
            f"serve num_speculative_tokens {cliff} or fewer, and check the drafter's "
            "layer_types and sliding_window against what this vLLM runs"))
    served, trained = prov.get("served_max_model_len"), prov.get("training_seq_length")
    if served and trained and int(served) > int(trained):
        out.append(_flag(
            "max_model_len_above_training",
            f"served max_model_len {served} above the training seq_length {trained}",
            "positions beyond what the drafter saw in training draft worse, and long "
            "prompts move every answer there",
            f"serve with --max-model-len {trained} (evaluate.server.max_model_len), or "
            "train on longer sequences"))
    think_train, think_serve = prov.get("enable_thinking_training"), prov.get(
        "enable_thinking_serving")
    if think_train is not None and think_serve is not None and think_train != think_serve:
        out.append(_flag(
            "thinking_differs",
            f"enable_thinking {think_train} in training, {think_serve} when served",
            "the drafter learned the other mode's text (thinking traces or their absence)",
            "serve with the training's mode (evaluate.enable_thinking), or train on "
            "conversations generated in the mode you serve"))
    eal = prov.get("train_eal")
    if eal and length is not None and float(eal) > 1 and length < FAR_BELOW * float(eal):
        out.append(_flag(
            "far_below_training",
            f"served acceptance length {length:.2f} against train/eal {float(eal):.2f} at "
            "this checkpoint",
            "the drafter is not served the way it was trained (see the other flags), or the "
            "prompts are far from the training data",
            "look at the other flags first; then evaluate on prompts like the training data "
            "(evaluate.prompts) to tell a serving fault from a data gap"))
    return out


def flag_lines(found: list[dict[str, str]]) -> list[str]:
    """The report's lines for the flags: what was seen, the likely cause, the fix."""
    lines: list[str] = []
    for item in found:
        lines += [f"! {item['flag']}: {item['seen']}",
                  f"    likely cause: {item['cause']}", f"    fix: {item['fix']}"]
    return lines


def fastest(sweep: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The sweep entry (one per ``num_speculative_tokens``) with the most output tokens/s at
    the first concurrency level; None when none has a rate."""
    rated = [s for s in sweep if s.get("tokens_per_s")]
    return max(rated, key=lambda s: float(s["tokens_per_s"])) if rated else None
