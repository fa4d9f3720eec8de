"""The progress parser against real metric lines: speculators' format from the reference doc
(speculators 0.9 train/trainer.py), e-notation, and rich's 80-column wrapping
produced by the real ``rich.logging.RichHandler``."""

from __future__ import annotations

import io
import json
import logging
import random
import re
import sys
from pathlib import Path

import pytest

from outrig.progress import (
    Progress,
    format_duration,
    last_epoch_marker,
    logical_lines,
    parse_metric_line,
    parse_progress,
    summary,
)

STANDINS = Path(__file__).resolve().parents[1] / "standins"

# The reference doc's DFlash line with its elided values filled in (as the trainer prints them).
DFLASH = ("train/loss=2.345, train/full_acc=0.123, train/position_1_acc=0.456, "
          "train/position_15_acc=0.012, train/eal=1.234, profile/fetch_ms=12.500, "
          "profile/fwd_ms=80.000, profile/bwd_ms=140.000, profile/opt_ms=9.000, "
          "profile/step_ms=250.000, profile/tokens_per_s=3.28e+04, profile/fetch_frac=0.050, "
          "epoch=0, lr/Muon=1.00e-03, lr/AdamW=1.00e-03, global_step=17")


def rich_wrapped(messages: list[str], width: int = 80) -> str:
    """What the trainer's RichHandler writes when stdout is not a TTY."""
    buf = io.StringIO()
    from rich.console import Console
    from rich.logging import RichHandler

    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    logger = logging.getLogger(f"speculators.train.test{random.random()}")
    logger.handlers = [RichHandler(console=console)]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for message in messages:
        logger.info(message)
    return buf.getvalue()


def test_reference_line_parses_with_three_decimals_and_e_notation() -> None:
    metrics = parse_metric_line(DFLASH)
    assert metrics is not None
    assert metrics["train/loss"] == 2.345
    assert metrics["profile/tokens_per_s"] == 32800.0
    assert metrics["lr/Muon"] == 1e-3
    assert metrics["global_step"] == 17 and metrics["epoch"] == 0
    assert parse_metric_line("INFO Training epoch 1/5 started") is None


def test_plain_line_with_header_and_small_values() -> None:
    line = ("[08/20/26 10:00:00] INFO     train/loss=4.56e-04, train/full_acc=0.999, "
            "train/eal=15.000, profile/step_ms=1.23e+03, epoch=3, global_step=123456")
    progress = parse_progress(line)
    assert progress is not None
    assert progress.loss == pytest.approx(4.56e-4)
    assert progress.step_ms == 1230.0 and progress.step == 123456 and progress.epoch == 3


def test_rich_wrapped_at_80_columns_is_rejoined() -> None:
    sys.path.insert(0, str(STANDINS))
    try:
        import fake_trainer
    finally:
        sys.path.pop(0)
    args = fake_trainer.parse(["--verifier-name-or-path", "m", "--speculator-type", "dflash",
                               "--total-seq-len", "8192"])
    items = fake_trainer.metrics(args, 1, 41, random.Random(3))
    line = ", ".join(items)
    text = rich_wrapped(["Training epoch 2/5 started", line, line.replace("=41", "=42")])
    assert max(len(x) for x in text.splitlines()) <= 80 and len(text.splitlines()) > 20
    progress = parse_progress(text)
    assert progress is not None
    assert progress.step == 42
    assert progress.metrics == {**parse_metric_line(line), "global_step": 42.0}  # type: ignore[dict-item]
    assert "train/position_15_acc" in progress.metrics
    assert (progress.epoch_number, progress.epochs_total) == (2, 5)


def test_eagle3_keys_are_acceptance_metrics() -> None:
    line = ("train/loss=1.000, train/loss_0=1.000, train/full_acc_0=0.700, train/cond_acc_0=0.750,"
            " train/full_acc_1=0.500, profile/step_ms=100.000, epoch=0, global_step=5")
    progress = parse_progress(rich_wrapped([line]))
    assert progress is not None
    assert progress.acceptance() == {"train/full_acc_0": 0.7, "train/cond_acc_0": 0.75,
                                     "train/full_acc_1": 0.5}


def test_wrapped_record_cut_by_the_start_of_the_tail_still_counts() -> None:
    text = rich_wrapped([DFLASH])
    cut = "\n".join(text.splitlines()[3:])  # the tail began in the middle of the record
    progress = parse_progress(cut)
    assert progress is not None and progress.step == 17
    assert progress.loss is None  # its first keys were cut off


def test_fold_inside_a_long_word_is_joined_without_a_space() -> None:
    text = ("[08/20/26 10:00:00] INFO     train/loss=2.345, train/some_really_long_metric_na\n"
            "                             me=0.500, global_step=9\n")
    assert logical_lines(text)[-1].endswith("train/some_really_long_metric_name=0.500, "
                                            "global_step=9")


def test_eta_from_max_steps_or_epochs_times_checkpoint_steps() -> None:
    progress = parse_progress(DFLASH, argv=["--max-steps", "117"])
    assert progress is not None and progress.total_steps == 117
    assert progress.eta_s == pytest.approx(100 * 0.25)
    state = {"epoch": 1, "global_step": 200, "local_step": 0}
    progress = parse_progress(DFLASH, argv=["--epochs=5"], training_state=state)
    assert progress is not None and progress.total_steps == 500
    assert progress.total_source == "5 epochs × 100 steps"
    progress = parse_progress(DFLASH, epoch_line="INFO Training epoch 2/3 started",
                              training_state=state)
    assert progress is not None and progress.total_steps == 300
    assert progress.epoch_number == 2
    assert parse_progress(DFLASH).eta_s is None  # type: ignore[union-attr]
    mid_epoch = {"epoch": 1, "global_step": 250, "local_step": 50}
    assert parse_progress(DFLASH, argv=["--epochs", "5"],
                          training_state=mid_epoch).total_steps is None  # type: ignore[union-attr]


def test_no_metric_lines_means_no_progress() -> None:
    assert parse_progress("Starting vLLM API server 0 on http://127.0.0.1:8000\n") is None
    assert parse_progress("") is None


def test_json_round_trip_and_summary() -> None:
    progress = parse_progress(DFLASH, argv=["--max-steps", "117"])
    assert progress is not None
    back = Progress.from_json(progress.to_json())
    assert back.step == 17 and back.eta_s == progress.eta_s
    text = summary(back)
    assert "step 17/117" in text and "loss 2.345" in text and "ETA 25s" in text
    assert "32,800 tok/s" in text and "eal 1.234" in text
    assert format_duration(3725) == "1h02m" and format_duration(65) == "1m05s"
    assert last_epoch_marker("Training epoch 3/4 completed") == (3, 4, "completed")


REAL_LOGS = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize("log", [
    "h200-real-trainer/trainer-run1.log", "h200-real-trainer/trainer-run2.log",
    "speculators-cpu/train-resume-mid-epoch.log",
    "h200x2-rehearsal/stop-during-save/cpu-box-rehearsal-trainer-run1.log",
    "h200x2-rehearsal/migrate/cpu-box-movable-trainer.log",
    "h200x2-rehearsal/migrate/new-box-movable-trainer.log"])
def test_progress_parses_logs_of_the_real_trainer(log: str) -> None:
    """Logs written by speculators 0.9 itself (rich, COLUMNS=300, wrapped metric lines)."""
    text = (REAL_LOGS / log).read_text()
    progress = parse_progress(text, argv=["--epochs", "20"])
    assert progress is not None and progress.step is not None and progress.step > 0
    assert progress.metrics["train/loss"] > 0 and "train/eal" in progress.metrics
    assert progress.step_ms is not None and progress.step_ms > 0


def test_the_real_h200_resume_continues_the_step_count() -> None:
    first = parse_progress((REAL_LOGS / "h200-real-trainer/trainer-run1.log").read_text())
    second = parse_progress((REAL_LOGS / "h200-real-trainer/trainer-run2.log").read_text())
    assert first is not None and second is not None
    assert first.step is not None and second.step is not None and second.step > first.step


def test_the_real_h200_migrate_resumes_where_the_old_box_stopped() -> None:
    """Migrate between two boxes on an H200 pair: the new box's trainer continues from the
    step of the checkpoint copied from the old one (h200x2-rehearsal/migrate/)."""
    folder = REAL_LOGS / "h200x2-rehearsal" / "migrate"
    old = (folder / "cpu-box-movable-trainer.log").read_text()
    new = (folder / "new-box-movable-trainer.log").read_text()
    resumed = re.search(r"Resuming mid-epoch from epoch=0 local_step=(\d+)", new)
    assert resumed is not None
    listing = (folder / "checkpoints.txt").read_text()
    old_box = listing.split("== new-box")[0]
    moved = re.search(r"^0/training_state.json\n  (\{.*\})$", old_box, re.M)
    assert moved is not None
    assert json.loads(moved.group(1))["local_step"] == int(resumed.group(1))
    assert "Received SIGTERM" in old and "Interrupt checkpoint saved" in old
    progress = parse_progress(new)
    assert progress is not None and progress.step is not None
    assert progress.step > int(resumed.group(1))
    assert "Starting fresh training run" not in new


def test_status_numbers_epochs_as_the_trainer_logs_them_with_the_total() -> None:
    """speculators 0.9 numbers epochs from 0 in its metric lines (``epoch=5``), in its
    checkpoint folders (``5/``), in training_state.json and in "Resuming training on epoch 5";
    only "Training epoch E/N started" counts from 1. Status shows the 0-based number as the
    log's ``epoch=`` key does, and the 1-based count of the marker line with the total."""
    max_steps = (REAL_LOGS / "speculators-cpu/train-max-steps.log").read_text()
    second = max_steps[:max_steps.index("Training epoch 2/2 completed")]
    progress = parse_progress(second)
    assert progress is not None and progress.epoch == 1
    assert "epoch=1 (2/2)" in summary(progress)

    first = parse_progress((REAL_LOGS / "h200-real-trainer/trainer-run1.log").read_text())
    assert first is not None and "epoch=0 (1/20)" in summary(first)

    # Only metric lines in the tail (the marker line lies further back than the agent looked):
    # the number still matches the log's epoch=5, and the total comes from --epochs.
    line = next(x for x in logical_lines(max_steps) if "global_step=" in x)
    only_metrics = line.replace("epoch=0", "epoch=5")
    fallback = parse_progress(only_metrics, argv=["--epochs", "20"])
    assert fallback is not None
    text = summary(fallback)
    assert "epoch=5 (6/20)" in text and "epoch 6" not in text
    assert "epoch=5," in summary(parse_progress(only_metrics))  # type: ignore[arg-type]
