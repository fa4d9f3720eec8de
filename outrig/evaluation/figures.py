"""The figures of one window of requests, from the bench op's per-request records.

Each record (remote/agent/bench.py) holds one answered request: its prompt's ``category``,
its output ``tokens``, ``ttft_ms`` (send to first streamed text), ``latency_ms``, ``itl_ms``
(the gaps between streamed chunks) and ``spec``, vLLM's per-request
``metrics.speculative_decoding`` (``--per-request-spec-decode-metrics``; None without it).

The arithmetic is ``vllm bench serve``'s (vllm/benchmarks/serve.py ``calculate_metrics``):
TPOT = (latency - TTFT) / (tokens - 1) per request with more than one token; percentiles by
linear interpolation (``numpy.percentile``'s default). The per-request acceptance length is
vLLM's own ``mean_acceptance_length`` (vllm/v1/metrics/stats.py
``RequestSpecDecodeMetrics.to_dict``: 1 + accepted / verify steps of that request); a counter
ratio weights each request by its verify steps, a distribution of these does not (vllm#42690).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

PERCENTILES = (50, 95, 99)
SPREAD = (10, 50, 90)  # of the per-request acceptance lengths
HISTOGRAM_BIN = 0.5  # width of the per-request acceptance length histogram's bins


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile, linearly interpolated between the two nearest ranks (numpy's
    default); None for no values."""
    data = sorted(v for v in values if v is not None and not math.isnan(v))
    if not data:
        return None
    pos = (len(data) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def spread(values: Sequence[float], qs: Iterable[int] = PERCENTILES) -> dict[str, float | None]:
    """``{"p50": ..., "p95": ..., "p99": ...}`` (or the ``qs`` given)."""
    return {f"p{q}": _round(percentile(values, q)) for q in qs}


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def tpot_ms(record: dict[str, Any]) -> float | None:
    """Time per output token after the first, of one request (None for one token)."""
    tokens = int(record.get("tokens") or 0)
    ttft, latency = record.get("ttft_ms"), record.get("latency_ms")
    if tokens < 2 or ttft is None or latency is None:
        return None
    return (float(latency) - float(ttft)) / (tokens - 1)


def latency(records: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """Output tokens/s over the window's wall time, and TTFT, TPOT and ITL at p50/p95/p99."""
    tokens = sum(int(r.get("tokens") or 0) for r in records)
    itls = [float(g) for r in records for g in (r.get("itl_ms") or []) if g is not None]
    return {
        "requests": len(records), "completion_tokens": tokens,
        "tokens_per_s": _round(tokens / seconds if seconds > 0 and tokens else None),
        "ttft_ms": spread([float(r["ttft_ms"]) for r in records
                           if r.get("ttft_ms") is not None]),
        "tpot_ms": spread([t for t in (tpot_ms(r) for r in records) if t is not None]),
        "itl_ms": spread(itls)}


def _spec_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["spec"] for r in records if isinstance(r.get("spec"), dict)
            and int(r["spec"].get("num_spec_steps") or 0) > 0]


def per_request(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The distribution of per-request acceptance lengths (p10/p50/p90, the unweighted mean,
    a histogram in bins of :data:`HISTOGRAM_BIN`), the step-weighted figure the same records
    give (what the counters say for them), and vLLM's accepted-per-step histogram summed over
    requests. None when no record carries vLLM's per-request metrics."""
    specs = _spec_records(records)
    if not specs:
        return None
    lengths = [float(s["mean_acceptance_length"]) for s in specs]
    steps = sum(int(s["num_spec_steps"]) for s in specs)
    accepted = sum(int(s.get("num_accepted_draft_tokens") or 0) for s in specs)
    width = max(len(s.get("acceptance_histogram") or []) for s in specs)
    steps_hist = [sum(int((s.get("acceptance_histogram") or [])[j])
                      for s in specs if j < len(s.get("acceptance_histogram") or []))
                  for j in range(width)]
    return {"requests": len(specs), **spread(lengths, SPREAD),
            "mean": _round(sum(lengths) / len(lengths)),
            "step_weighted": _round(1 + accepted / steps),
            "histogram": histogram(lengths), "accepted_per_step": steps_hist}


def histogram(lengths: Sequence[float]) -> list[dict[str, Any]]:
    """Counts of per-request acceptance lengths in bins ``[lo, lo + HISTOGRAM_BIN)`` from
    1.0 up to the largest (empty bins between kept, so the shape reads as it is)."""
    if not lengths:
        return []
    top = max(lengths)
    bins = int((top - 1.0) // HISTOGRAM_BIN) + 1
    counts = [0] * bins
    for value in lengths:
        counts[min(int((value - 1.0) // HISTOGRAM_BIN), bins - 1)] += 1
    return [{"from": round(1.0 + i * HISTOGRAM_BIN, 2),
             "to": round(1.0 + (i + 1) * HISTOGRAM_BIN, 2), "requests": n}
            for i, n in enumerate(counts)]


def by_category(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every figure per ``category`` (records without one under ``-``): requests, tokens,
    TTFT/TPOT/ITL percentiles, and the acceptance figures of :func:`per_request`. Empty
    when no prompt carried a category."""
    if not any(r.get("category") for r in records):
        return {}
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(str(record.get("category") or "-"), []).append(record)
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(groups):
        rows = groups[name]
        figures = latency(rows, 0.0)
        figures.pop("tokens_per_s")
        figures["acceptance"] = per_request(rows)
        out[name] = figures
    return out
