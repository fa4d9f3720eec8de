"""One evaluation's document from what the box measured (pure: no I/O).

The bench op answers once per concurrency level with the counters before and after, the
wall time and the per-request records; :func:`level_figures` turns one answer into the
level's figures (vLLM's counter arithmetic, the latency percentiles, the per-request
distribution, every figure per category). :func:`side_summary` sums the counters over the
levels of one server for the headline numbers; :func:`with_baseline` puts the baseline's
figures and the speedup beside each level.
"""

from __future__ import annotations

from typing import Any

from outrig.evaluation.figures import by_category, latency, per_request
from outrig.evaluation.spec import Counters, acceptance, measured, speedup


def add(one: Counters, other: Counters) -> Counters:
    """The counts of two windows together."""
    positions = sorted(set(one.per_position) | set(other.per_position))
    return Counters(drafts=one.drafts + other.drafts,
                    draft_tokens=one.draft_tokens + other.draft_tokens,
                    accepted_tokens=one.accepted_tokens + other.accepted_tokens,
                    per_position={k: one.per_position.get(k, 0.0) + other.per_position.get(
                        k, 0.0) for k in positions},
                    seen=one.seen or other.seen)


def level_counts(bench: dict[str, Any]) -> Counters:
    return measured(str(bench.get("metrics_before") or ""), str(bench.get("metrics_after") or ""))


def level_figures(concurrency: int, bench: dict[str, Any], *,
                  speculative: bool = True) -> dict[str, Any]:
    """One level's figures: requests, output tokens/s, TTFT/TPOT/ITL percentiles and, for a
    speculative server, the counters' acceptance figures, the per-request distribution and
    the per-category figures."""
    records = list(bench.get("per_request") or [])
    seconds = float(bench.get("seconds") or 0)
    figures: dict[str, Any] = {"concurrency": concurrency, **latency(records, seconds),
                               "seconds": seconds}
    figures["requests"] = bench.get("sent", figures["requests"])
    figures["completion_tokens"] = int(bench.get("completion_tokens")
                                       or figures["completion_tokens"])
    if seconds > 0 and figures["completion_tokens"]:
        figures["tokens_per_s"] = round(figures["completion_tokens"] / seconds, 3)
    if speculative:
        figures.update(acceptance(level_counts(bench)))
        figures["per_request"] = per_request(records)
        figures["categories"] = by_category(records)
    return figures


def side_summary(benches: list[tuple[int, dict[str, Any]]]) -> tuple[dict[str, Any], Counters]:
    """The headline acceptance numbers of one speculative server: its counters summed over
    every level's window (what vLLM's log would print for all of them), and those counts."""
    total = Counters()
    for _, bench in benches:
        total = add(total, level_counts(bench))
    return acceptance(total), total


def with_baseline(levels: list[dict[str, Any]],
                  baselines: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each level with its baseline's figures (``baseline``) and the ``speedup`` in output
    tokens/s; levels without a baseline keep ``speedup`` None."""
    out = []
    for level in levels:
        base = baselines.get(int(level["concurrency"]))
        out.append({**level, "baseline": base,
                    "speedup": speedup(level.get("tokens_per_s"),
                                       (base or {}).get("tokens_per_s"))})
    return out
