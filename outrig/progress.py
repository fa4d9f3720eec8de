"""Training progress from the trainer's own log text: a pure parser (no I/O).

The agent ships raw text (the last few KB of each log, plus the last line that mentions
``Training epoch``); everything else happens here on the workstation, where it can be tested
against real lines. The format is speculators' per-step metric line
(speculators 0.9 train/trainer.py; real logs in tests/fixtures/)::

    train/loss=2.345, train/full_acc=0.123, ..., train/eal=1.234, profile/step_ms=...,
    profile/tokens_per_s=..., epoch=0, lr/Muon=1.00e-03, lr/AdamW=1.00e-03, global_step=17

Floats print with 3 decimals, or as ``x.xxe±yy`` below 1e-3 or above 999. The trainer logs
through rich's ``RichHandler``, which, when stdout is not a TTY, wraps at 80 columns: a header
(``[time] LEVEL``, the time blank when repeated), the message wrapped at spaces onto indented
continuation lines, and the logger's ``file.py:line`` at the right of the first line. The
parser undoes that: it strips headers and the path column, and rejoins continuation lines.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)"
PAIR_RE = re.compile(rf"(?P<key>[A-Za-z_][\w/.\-]*)=(?P<val>{NUMBER})(?=,|\s|$)")
HEADER_RE = re.compile(r"^\s*(?:\[[^\]]*\]\s+)?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+")
PATH_COLUMN_RE = re.compile(r"\s{2,}[^\s=]+:\d+\s*$")
EPOCH_RE = re.compile(r"Training epoch (\d+)\s*/\s*(\d+)\s+(started|completed)")
STEP_KEY = "global_step"

# Metric keys worth a name of their own in status (others stay in ``metrics``).
ACCEPTANCE_PREFIXES = ("train/full_acc", "train/eal", "train/cond_acc")


@dataclass
class Progress:
    """The trainer's latest progress, as far as its log and argv tell."""

    step: int | None = None
    epoch: int | None = None  # 0-based, from the metric line's ``epoch=``
    metrics: dict[str, float] = field(default_factory=dict)
    epoch_number: int | None = None  # 1-based, from "Training epoch E/N ..."
    epochs_total: int | None = None  # from that line, else the trainer's --epochs
    epoch_state: str | None = None  # "started" / "completed"
    total_steps: int | None = None
    total_source: str | None = None  # how total_steps is known ("--max-steps", ...)
    eta_s: float | None = None
    loss_trend: str | None = None  # a sparkline of the run's loss (outrig.metrics.store)

    @property
    def loss(self) -> float | None:
        return self.metrics.get("train/loss")

    @property
    def step_ms(self) -> float | None:
        return self.metrics.get("profile/step_ms")

    @property
    def tokens_per_s(self) -> float | None:
        return self.metrics.get("profile/tokens_per_s")

    def acceptance(self) -> dict[str, float]:
        """Acceptance-style metrics: full_acc, eal (DFlash), full_acc_k / cond_acc_k (EAGLE-3)."""
        return {k: v for k, v in self.metrics.items() if k.startswith(ACCEPTANCE_PREFIXES)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Progress:
        """Back from :meth:`to_json` (derived fields are ignored)."""
        metrics = data.get("metrics")
        progress = cls(metrics=dict(metrics) if isinstance(metrics, dict) else {})
        for name in ("step", "epoch", "epoch_number", "epochs_total", "total_steps"):
            value = data.get(name)
            setattr(progress, name, value if isinstance(value, int) else None)
        for name in ("epoch_state", "total_source", "loss_trend"):
            value = data.get(name)
            setattr(progress, name, value if isinstance(value, str) else None)
        eta = data.get("eta_s")
        progress.eta_s = float(eta) if isinstance(eta, (int, float)) else None
        return progress

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(loss=self.loss, step_ms=self.step_ms, tokens_per_s=self.tokens_per_s,
                    acceptance=self.acceptance())
        return data


def _number(text: str) -> float:
    return float(text)


def logical_lines(text: str) -> list[str]:
    """Rejoin rich-wrapped log records into one line each (headers and path column removed).

    A record starts at a line with a ``[time] LEVEL`` header (time possibly blank) or at a line
    that is not indented; indented lines without a header continue the current record. Pieces
    are joined with a space when the previous one ends in a comma (rich broke at the space
    after it), else directly (rich folded a word longer than the column).
    """
    records: list[list[str]] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip():
            continue
        header = HEADER_RE.match(line)
        if header is not None:
            body = PATH_COLUMN_RE.sub("", line[header.end():]).strip()
            records.append([body])
        elif line[:1].isspace() and records:
            records[-1].append(PATH_COLUMN_RE.sub("", line).strip())
        else:
            records.append([PATH_COLUMN_RE.sub("", line).strip()])
    return [join_pieces(pieces) for pieces in records]


def join_pieces(pieces: list[str]) -> str:
    """One record's wrapped pieces as one line: a space after a piece ending in a comma
    (rich broke at the space after it), nothing otherwise (rich folded a long word)."""
    joined = pieces[0]
    for piece in pieces[1:]:
        joined += (" " + piece) if joined.endswith(",") else piece
    return joined


def parse_metric_line(line: str) -> dict[str, float] | None:
    """``{key: value}`` of one metric line, or None when it is not one (no ``global_step=``)."""
    pairs = {m.group("key"): _number(m.group("val")) for m in PAIR_RE.finditer(line)}
    if STEP_KEY not in pairs:
        return None
    return pairs


def last_metrics(text: str) -> dict[str, float] | None:
    """The newest complete metric record in the text (a record cut by the start of the text,
    i.e. missing its first keys, is still used if it has ``global_step``)."""
    for line in reversed(logical_lines(text)):
        parsed = parse_metric_line(line)
        if parsed is not None:
            return parsed
    return None


def last_epoch_marker(text: str) -> tuple[int, int, str] | None:
    """(E, N, started|completed) of the newest ``Training epoch E/N ...`` line."""
    found = None
    for line in logical_lines(text):
        match = EPOCH_RE.search(line)
        if match:
            found = (int(match.group(1)), int(match.group(2)), match.group(3))
    return found


def argv_option(argv: list[str], flag: str) -> str | None:
    """The value of ``--flag X`` or ``--flag=X`` in an argv (the last one wins), or None."""
    value: str | None = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    return value


def argv_int(argv: list[str], flag: str) -> int | None:
    """``--flag N`` or ``--flag=N`` (the last one wins); None if absent or not an int."""
    value = argv_option(argv, flag)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def steps_per_epoch(training_state: dict[str, Any] | None) -> int | None:
    """From an end-of-epoch checkpoint's training_state.json: global_step / (epoch + 1)."""
    if not isinstance(training_state, dict):
        return None
    epoch, step = training_state.get("epoch"), training_state.get("global_step")
    local = training_state.get("local_step", 0)
    if not (isinstance(epoch, int) and isinstance(step, int)) or local not in (0, None):
        return None
    if epoch < 0 or step <= 0:
        return None
    return step // (epoch + 1) or None


def parse_progress(text: str, *, argv: list[str] | None = None,
                   epoch_line: str | None = None,
                   training_state: dict[str, Any] | None = None) -> Progress | None:
    """Progress from a log tail (``text``), the trainer's argv, the last ``Training epoch``
    line found further back (``epoch_line``) and the newest checkpoint's training_state.

    Total steps, and so the ETA, are known from ``--max-steps``, or from the epoch count
    (``Training epoch E/N`` or ``--epochs``) times the steps per epoch of an end-of-epoch
    checkpoint; the smaller wins when both are known. Returns None when there is no metric line.
    """
    metrics = last_metrics(text)
    if metrics is None:
        return None
    progress = Progress(metrics=metrics)
    step = metrics.get(STEP_KEY)
    progress.step = int(step) if step is not None else None
    epoch = metrics.get("epoch")
    progress.epoch = int(epoch) if epoch is not None else None
    marker = last_epoch_marker(text) or (last_epoch_marker(epoch_line) if epoch_line else None)
    if marker is not None:
        progress.epoch_number, progress.epochs_total, progress.epoch_state = marker
    argv = argv or []
    epochs_total = progress.epochs_total or argv_int(argv, "--epochs")
    progress.epochs_total = epochs_total
    candidates: list[tuple[int, str]] = []
    max_steps = argv_int(argv, "--max-steps")
    if max_steps is not None and max_steps > 0:
        candidates.append((max_steps, "--max-steps"))
    per_epoch = steps_per_epoch(training_state)
    if per_epoch is not None and epochs_total:
        candidates.append((per_epoch * epochs_total, f"{epochs_total} epochs × {per_epoch} steps"))
    if candidates:
        progress.total_steps, progress.total_source = min(candidates)
    if progress.total_steps is not None and progress.step is not None and progress.step_ms:
        left = max(0, progress.total_steps - progress.step)
        progress.eta_s = left * progress.step_ms / 1000.0
    return progress


def format_duration(seconds: float) -> str:
    """``1h02m``, ``5m10s``, ``42s``."""
    total: int = max(0, round(seconds))
    if total >= 3600:
        return f"{total // 3600}h{total % 3600 // 60:02d}m"
    if total >= 60:
        return f"{total // 60}m{total % 60:02d}s"
    return f"{total}s"


def epoch_words(progress: Progress) -> str | None:
    """``epoch=5 (6/20)``: the trainer's own 0-based number, as its metric lines, checkpoint
    folders and "Resuming training on epoch 5" print it, then the 1-based count of its
    "Training epoch 6/20 started" line with the total. A bare "epoch 6" next to a log full of
    ``epoch=5`` reads as an off-by-one, whichever of the two it meant."""
    zero_based = progress.epoch
    if zero_based is None and progress.epoch_number is not None:
        zero_based = progress.epoch_number - 1
    if zero_based is None:
        return None
    if not progress.epochs_total:
        return f"epoch={zero_based}"
    return f"epoch={zero_based} ({zero_based + 1}/{progress.epochs_total})"


def summary(progress: Progress) -> str:
    """One line for humans: step/total, epoch, loss, acceptance, speed, ETA."""
    parts = []
    step = f"step {progress.step}" if progress.step is not None else "step ?"
    if progress.total_steps:
        step += f"/{progress.total_steps}"
    parts.append(step)
    epoch = epoch_words(progress)
    if epoch is not None:
        parts.append(epoch)
    if progress.loss is not None:
        trend = f"{progress.loss_trend} " if progress.loss_trend else ""
        parts.append(f"loss {trend}{progress.loss:.3f}")
    for key, value in progress.acceptance().items():
        parts.append(f"{key.split('/', 1)[-1]} {value:.3f}")
    if progress.step_ms is not None:
        parts.append(f"{progress.step_ms:.0f} ms/step")
    if progress.tokens_per_s is not None:
        parts.append(f"{progress.tokens_per_s:,.0f} tok/s")
    if progress.eta_s is not None:
        parts.append(f"ETA {format_duration(progress.eta_s)}")
    return ", ".join(parts)
