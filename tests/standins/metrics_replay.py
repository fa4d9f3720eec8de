"""A stand-in for vLLM's ``/metrics`` around an evaluation: a real capture (vLLM 0.32, CPU
build, tests/fixtures/vllm-0.32-cpu) with the ``vllm:spec_decode_*_total`` values replaced by
constructed counts, every other line (HELP, TYPE, ``_created`` samples, labels, the rest of
the exposition) exactly as the real server printed it.

The constructed cases of the flags (outrig/evaluation/causes.py) are built from it: the
counts a broken serving path, a position cliff or a good drafter would make the real server
print. Stdlib only; it never imports outrig."""

from __future__ import annotations

import re
from pathlib import Path

CAPTURE = (Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu"
           / "metrics-ngram-after.txt")
_SAMPLE = re.compile(r'^(vllm:spec_decode_(\w+?)_total)\{([^}]*)\}\s+\S+\s*$')
_POSITION = re.compile(r'position="(\d+)"')


def replay(drafts: float, draft_tokens: float, accepted: float, per_position: list[float],
           capture: Path = CAPTURE) -> str:
    """The capture with these counts (per_position[k] for ``position="k"``; positions the
    capture lacks are added after its last per-position line, with its labels)."""
    values = {"num_drafts": drafts, "num_draft_tokens": draft_tokens,
              "num_accepted_tokens": accepted}
    out: list[str] = []
    last_pos_line = None
    seen: set[int] = set()
    for line in capture.read_text().splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            out.append(line)
            continue
        name, kind, labels = match.groups()
        if kind == "num_accepted_tokens_per_pos":
            pos = int(_POSITION.search(labels).group(1))  # type: ignore[union-attr]
            if pos >= len(per_position):
                continue
            seen.add(pos)
            out.append(f"{name}{{{labels}}} {float(per_position[pos])}")
            last_pos_line = (len(out), name, labels)
        else:
            out.append(f"{name}{{{labels}}} {float(values[kind])}")
    if last_pos_line is not None:
        index, name, labels = last_pos_line
        extra = []
        for k in range(len(per_position)):
            if k not in seen:
                moved = _POSITION.sub(f'position="{k}"', labels)
                extra.append(f"{name}{{{moved}}} {float(per_position[k])}")
        out[index:index] = extra
    return "\n".join(out) + "\n"


def zero(positions: int) -> str:
    """The capture as a fresh server prints it: every count 0."""
    return replay(0, 0, 0, [0.0] * positions)
