"""The human report of one evaluation beyond its headline (outrig.evaluation.spec.report_lines):
the per-request distribution, a line per concurrency level, a line per category, the k
sweep, the provenance and the flags with their causes and fixes."""

from __future__ import annotations

from typing import Any

from outrig.evaluation.causes import flag_lines
from outrig.evaluation.spec import report_lines
from outrig.text.layout import fmt


def _pcts(block: dict[str, Any] | None, keys: tuple[str, ...] = ("p50", "p95", "p99"),
          digits: int = 1) -> str:
    block = block or {}
    return "/".join(fmt(block.get(k), digits) for k in keys)


def per_request_line(doc: dict[str, Any]) -> str:
    """The per-request acceptance distribution, or why there is none."""
    dist = doc.get("per_request")
    if not dist:
        return ("per request       - (" + str(doc.get("per_request_note") or "not reported")
                + ")")
    bins = " ".join(f"[{b['from']:.1f},{b['to']:.1f}):{b['requests']}"
                    for b in dist.get("histogram") or [])
    return (f"per request       p10 {fmt(dist.get('p10'))}  p50 {fmt(dist.get('p50'))}  p90 "
            f"{fmt(dist.get('p90'))}  mean {fmt(dist.get('mean'))} over {dist.get('requests')}"
            f" request(s); histogram {bins}")


def level_lines(doc: dict[str, Any]) -> list[str]:
    """One line per concurrency level: tokens/s, TTFT, TPOT, ITL (p50/p95/p99 ms), the
    baseline's tokens/s and the speedup."""
    levels = doc.get("levels") or []
    if not levels:
        return []
    lines = ["concurrency  tokens/s  TTFT ms p50/p95/p99  TPOT ms p50/p95/p99  "
             "ITL ms p50/p95/p99  baseline tokens/s  speedup"]
    for level in levels:
        base = level.get("baseline") or {}
        cached = " (cached)" if base.get("cached") else ""
        lines.append(f"{level['concurrency']:>11}  {fmt(level.get('tokens_per_s'), 1):>8}  "
                     f"{_pcts(level.get('ttft_ms')):>20}  {_pcts(level.get('tpot_ms')):>19}  "
                     f"{_pcts(level.get('itl_ms')):>18}  "
                     f"{fmt(base.get('tokens_per_s'), 1) + cached:>17}  "
                     f"{fmt(level.get('speedup'))}×")
    return lines


def category_lines(doc: dict[str, Any]) -> list[str]:
    """Per category (of the first level): requests, acceptance (step-weighted and p50),
    TTFT and TPOT p50."""
    levels = doc.get("levels") or []
    cats = (levels[0].get("categories") if levels else None) or {}
    if not cats:
        return []
    lines = [f"per category (concurrency {levels[0]['concurrency']})",
             "  category        requests  accept len  p50   TTFT p50 ms  TPOT p50 ms"]
    for name, fig in cats.items():
        acc = fig.get("acceptance") or {}
        ttft = fmt((fig.get("ttft_ms") or {}).get("p50"), 1)
        tpot = fmt((fig.get("tpot_ms") or {}).get("p50"), 1)
        lines.append(f"  {name:<15} {fig.get('requests'):>8}  "
                     f"{fmt(acc.get('step_weighted')):>10}  {fmt(acc.get('p50')):>4}  "
                     f"{ttft:>11}  {tpot:>11}")
    return lines


def sweep_lines(doc: dict[str, Any]) -> list[str]:
    sweep = doc.get("sweep") or []
    if not sweep:
        return []
    lines = ["k sweep (first concurrency level)", "   k  accept len  tokens/s  speedup"]
    for entry in sweep:
        mark = "  ← fastest" if entry.get("k") == doc.get("fastest_k") else ""
        lines.append(f"  {entry.get('k'):>2}  {fmt(entry.get('acceptance_length')):>10}  "
                     f"{fmt(entry.get('tokens_per_s'), 1):>8}  {fmt(entry.get('speedup'))}×"
                     f"{mark}")
    return lines


def provenance_line(doc: dict[str, Any]) -> str:
    prov = doc.get("provenance") or {}
    parts = [f"vLLM {prov.get('vllm') or '?'}", f"GPU {prov.get('gpu') or '?'}",
             f"k {prov.get('num_speculative_tokens')}",
             f"max_model_len {prov.get('served_max_model_len') or 'vLLM default'}"
             + (f" (trained {prov['training_seq_length']})"
                if prov.get("training_seq_length") else ""),
             f"prompts {str(prov.get('prompts_sha256') or '?')[:12]}"]
    if prov.get("train_eal") is not None:
        parts.append(f"train/eal {fmt(prov.get('train_eal'))}")
    return "provenance        " + ", ".join(parts)


def full_report(doc: dict[str, Any]) -> list[str]:
    """Every line of the report (docs/evaluate.md shows one)."""
    lines = report_lines(doc)
    lines.insert(4, per_request_line(doc))
    lines += level_lines(doc) + category_lines(doc) + sweep_lines(doc)
    lines.append(provenance_line(doc))
    lines += flag_lines(list(doc.get("flags") or []))
    return lines
