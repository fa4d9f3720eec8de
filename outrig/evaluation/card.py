"""``outrig evaluate --card FILE.md``: the evaluation as a model-card section (Markdown).

What the good cards give (speedup and latency per concurrency, acceptance length and
per-position rates, per category, and the exact commands), from the evaluation's document
only, so a recorded evaluation can be carded again without a box.
"""

from __future__ import annotations

import shlex
from typing import Any

from outrig.text.layout import fmt


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [_row(head), _row(["---"] * len(head)), *(_row(r) for r in rows), ""]


def _p(block: dict[str, Any] | None, key: str = "p50") -> str:
    return fmt((block or {}).get(key), 1)


def card_markdown(doc: dict[str, Any]) -> str:
    """The section's Markdown text (ends with a newline)."""
    prov = doc.get("provenance") or {}
    ckpt = doc.get("checkpoint") or {}
    k = doc.get("num_speculative_tokens")
    lines = [f"## Speculative decoding: {doc.get('method')} on {doc.get('model')}", "",
             f"Measured by `outrig evaluate` on vLLM {prov.get('vllm') or '?'} "
             f"({prov.get('gpu') or '?'}), num_speculative_tokens {k}"
             + (f", drafter `{ckpt['path']}`" + (f" ({ckpt['order_text']})"
                                                 if ckpt.get("order_text") else "")
                if ckpt.get("path") else "") + ".", ""]
    lines += _table(
        ["concurrency", "output tokens/s", "baseline tokens/s", "speedup", "TTFT p50 ms",
         "TPOT p50 ms", "ITL p50 ms", "TPOT p99 ms"],
        [[str(lv.get("concurrency")), fmt(lv.get("tokens_per_s"), 1),
          fmt((lv.get("baseline") or {}).get("tokens_per_s"), 1),
          (fmt(lv.get("speedup")) + "×") if lv.get("speedup") is not None else "-",
          _p(lv.get("ttft_ms")), _p(lv.get("tpot_ms")), _p(lv.get("itl_ms")),
          _p(lv.get("tpot_ms"), "p99")] for lv in doc.get("levels") or []])
    per_pos = " / ".join(fmt(p) for p in doc.get("per_position") or []) or "-"
    lines += [f"**Acceptance length** {fmt(doc.get('acceptance_length'))} of at most "
              f"{1 + int(k or 0)} (vLLM's counters: 1 + accepted / drafts, "
              f"{doc.get('drafts')} drafts); **per position** {per_pos}.", ""]
    dist = doc.get("per_request")
    if dist:
        lines += [f"Per request (vLLM's per-request metrics, {dist.get('requests')} requests): "
                  f"p10 {fmt(dist.get('p10'))}, p50 {fmt(dist.get('p50'))}, p90 "
                  f"{fmt(dist.get('p90'))}.", ""]
    levels = doc.get("levels") or []
    cats = (levels[0].get("categories") if levels else None) or {}
    if cats:
        lines += _table(
            ["category", "requests", "acceptance length", "p50 per request", "TTFT p50 ms",
             "TPOT p50 ms"],
            [[name, str(fig.get("requests")),
              fmt((fig.get("acceptance") or {}).get("step_weighted")),
              fmt((fig.get("acceptance") or {}).get("p50")),
              _p(fig.get("ttft_ms")), _p(fig.get("tpot_ms"))] for name, fig in cats.items()])
    if doc.get("sweep"):
        lines += _table(["k", "acceptance length", "tokens/s", "speedup"],
                        [[str(s.get("k")), fmt(s.get("acceptance_length")),
                          fmt(s.get("tokens_per_s"), 1), fmt(s.get("speedup"))]
                         for s in doc["sweep"]])
    lines += ["Provenance:", ""]
    lines += _table(["", ""], [[key, str(value)] for key, value in prov.items()
                               if value is not None])
    for flag in doc.get("flags") or []:
        lines += [f"> **{flag['flag']}**: {flag['seen']}. Likely cause: {flag['cause']}. "
                  f"Fix: {flag['fix']}.", ""]
    cached = sorted({str((lv.get("baseline") or {}).get("run_id"))
                     for lv in doc.get("levels") or []
                     if (lv.get("baseline") or {}).get("cached")})
    if cached:
        lines += [f"Baseline cached from run {', '.join(cached)} (the same server without "
                  "--speculative-config).", ""]
    commands = doc.get("commands") or {}
    if commands:
        lines += ["Reproduce:", "", "```"]
        for argv in [commands.get("outrig"), *(commands.get("servers") or [])]:
            if argv:
                lines.append(" ".join(shlex.quote(str(a)) for a in argv))
        lines += ["```", ""]
    return "\n".join(lines).rstrip("\n") + "\n"
