"""A run's metric series: parsed from the real trainer's logs (tests/fixtures: the H200 run,
the CPU rehearsal, the H200x2 rehearsal's migrated run), kept in the journal with a cursor
so that a later call parses only new lines (counted), across mirror segments and a crash
between the points and the state; the log tails status and watch ship; the sparkline
status and watch show."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from outrig.journal import Journal
from outrig.logs.mirror import mirror_root
from outrig.metrics.series import (
    LOSS,
    Clock,
    Point,
    by_step,
    chain_ids,
    parse_chunk,
    sparkline,
    spread,
    tail_points,
    thin,
)
from outrig.metrics.store import MetricStore, loss_trends, remember_samples
from outrig.progress import Progress, summary

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H200 = FIXTURES / "h200-real-trainer" / "trainer-run1.log"
H200_RUN2 = FIXTURES / "h200-real-trainer" / "trainer-run2.log"
CPU_RESUME = FIXTURES / "speculators-cpu" / "train-resume-mid-epoch.log"
MIGRATE = FIXTURES / "h200x2-rehearsal" / "migrate"
START = 1_764_577_800.0  # a deploy at 08:30:00 UTC; the H200 log starts at 08:30:53


def metric_lines(path: Path) -> list[tuple[int, float]]:
    """(global_step, train/loss) straight from the text: the first line of a record holds
    ``train/loss=``; its step is the next ``global_step=`` (independent of the parser)."""
    text = path.read_text()
    losses = [float(m) for m in re.findall(r"train/loss=([-+\d.e]+),", text)]
    steps = [int(m) for m in re.findall(r"(?<![.\w])global_step=(\d+)\s*$", text, re.M)]
    return list(zip(steps, losses, strict=True))


def test_the_h200_trainers_every_record_with_every_key_and_its_time() -> None:
    data = H200.read_bytes()
    parsed = parse_chunk("trainer", data, Clock(ref=START), final=True)
    expected = metric_lines(H200)
    assert [(p.step, p.values[LOSS]) for p in parsed.points] == expected
    assert len(expected) == 34 and parsed.consumed == len(data)
    first = parsed.points[0]
    # every key the trainer prints, as printed (summary.json holds status' parse of step 32)
    summary_keys = set(json.loads((H200.parent / "summary.json").read_text())
                       ["status_progress"]["metrics"]) - {"global_step"}
    assert set(first.values) == summary_keys
    assert {f"train/position_{k}_acc" for k in range(1, 8)} <= set(first.values)
    assert "train/eal" in first.values and "lr/Muon" in first.values
    assert "profile/tokens_per_s" in first.values
    step32 = next(p for p in parsed.points if p.step == 32)
    assert step32.values["train/eal"] == 1.008 and step32.values[LOSS] == 1.68
    # [08:31:22] placed after the deploy at 08:30:00; blank (repeated) times keep the last
    assert first.t == START + 82
    times = [p.t for p in parsed.points]
    assert times == sorted(times) and all(t is not None for t in times)
    kinds = [(e.kind, e.step) for e in parsed.events]
    assert ("checkpoint", 30) in kinds and ("interrupt", 33) in kinds
    assert next(e.text for e in parsed.events if e.kind == "checkpoint") == "/work/run/ckpt/0"


def test_the_cpu_rehearsal_resume_with_its_validation_records() -> None:
    parsed = parse_chunk("trainer", CPU_RESUME.read_bytes(), Clock(ref=START), final=True)
    training = [p for p in parsed.points if LOSS in p.values]
    assert [(p.step, p.values[LOSS]) for p in training] == metric_lines(CPU_RESUME)
    # "Resuming mid-epoch from epoch=0 local_step=3 global_step=3." and "Fast-skipping 3
    # batches ... global_step=3." mention global_step but are no metric records
    resume = [e for e in parsed.events if e.kind == "resume"]
    assert [(e.step, e.text) for e in resume] == [(3, "epoch=0 local_step=3 global_step=3")]
    assert all("/" in k for p in training for k in p.values if k != "epoch")
    validation = [p for p in parsed.points if "val/loss_epoch" in p.values]
    assert [(p.step, p.values["val/loss_epoch"]) for p in validation] == [(12, 1.783),
                                                                          (25, 1.707)]
    assert "val/position_7_acc_epoch" in validation[0].values
    epochs = [e.text for e in parsed.events if e.kind == "epoch"]
    assert epochs == ["epoch 1/2 started", "epoch 1/2 completed", "epoch 2/2 started",
                      "epoch 2/2 completed"]


def test_any_cut_of_the_log_gives_the_same_points_as_the_whole() -> None:
    """The cursor may stop anywhere: mid-line, mid-record (a record is wrapped over several
    lines), between records. Each chunk holds its last record back until it is whole."""
    data = H200_RUN2.read_bytes()
    whole = parse_chunk("trainer", data, Clock(ref=START), final=True)
    clock = Clock(ref=START)
    points, offset, calls = [], 0, 0
    for cut in [*range(0, len(data), 977), len(data)]:
        if cut < offset:
            continue
        parsed = parse_chunk("trainer", data[offset:cut], clock, final=cut == len(data))
        points += parsed.points
        offset += parsed.consumed
        calls += 1
    assert calls > 50
    assert [(p.step, p.t, p.values) for p in points] == \
        [(p.step, p.t, p.values) for p in whole.points]


def make_run(journal: Journal, run_id: str, host: str, log: Path | None, **more: Any) -> Path:
    journal.record_run(run_id, {"run_id": run_id, "host": host, "playbook": "dflash",
                                "created": START, "status": "running", **more})
    root = mirror_root(journal, host, run_id)
    root.mkdir(parents=True, exist_ok=True)
    if log is not None:
        shutil.copy(log, root / "trainer.log")
    return root / "trainer.log"


def test_a_second_call_parses_only_the_new_lines(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    data = H200.read_bytes()
    lines = data.split(b"\n")
    mirror = make_run(journal, "r1", "uk-node", None)
    half = b"\n".join(lines[:80]) + b"\n"
    mirror.write_bytes(half)
    store = MetricStore(journal, "r1")
    first = store.ingest_mirror("uk-node", START)
    assert first.lines == 80
    held = len(half) - json.loads(store.state_file.read_text())["logs"]["trainer"]["offset"]
    held_lines = half[len(half) - held:].count(b"\n")  # the last record, maybe unfinished
    with open(mirror, "ab") as handle:
        handle.write(data[len(half):])
    second = store.ingest_mirror("uk-node", START)
    new_lines = data[len(half):].count(b"\n")
    assert second.lines == new_lines + held_lines
    assert store.ingest_mirror("uk-node", START).lines == 0  # nothing new: nothing parsed
    assert store.lines_parsed() == first.lines + second.lines
    assert [(p.step, p.values[LOSS]) for p in store.points()] == metric_lines(H200)
    assert first.points + second.points == 34


def test_a_rotated_segment_is_finished_from_the_cursor_then_the_new_file(tmp_path: Path
                                                                        ) -> None:
    journal = Journal(tmp_path)
    data = H200.read_bytes()
    cut = data.index(b"\n", len(data) // 2) + 1
    mirror = make_run(journal, "r1", "uk-node", None)
    mirror.write_bytes(data[:cut])
    store = MetricStore(journal, "r1")
    store.ingest_mirror("uk-node", START)
    mirror.write_bytes(data)  # the rest, written before tail-logs archived the segment
    mirror.rename(mirror.with_name("trainer.log.0"))  # as MirrorStore.new_segment does
    more = H200_RUN2.read_bytes()
    mirror.write_bytes(more)
    store.ingest_mirror("uk-node", START)
    steps = [p.step for p in store.points()]
    assert steps == [s for s, _ in metric_lines(H200)] + [s for s, _ in metric_lines(H200_RUN2)]
    assert store.ingest_mirror("uk-node", START).lines == 0


def test_points_past_the_state_after_a_crash_are_cut_not_doubled(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    make_run(journal, "r1", "uk-node", H200)
    store = MetricStore(journal, "r1")
    store.ingest_mirror("uk-node", START)
    before = store.path("points").read_bytes()
    with open(store.path("points"), "ab") as handle:  # appended, then the crash
        handle.write(before.splitlines(keepends=True)[-1])
    assert len(store.points()) == 34  # reads stop at the recorded size
    store.add_gpu_sample(START + 100, [{"i": 0, "used": 1923, "total": 143771, "util": 87}])
    assert store.path("points").read_bytes() == before
    assert len(store.points()) == 34 and len(store.gpu_samples()) == 1


def test_a_damaged_state_is_moved_aside_and_the_series_parsed_again(tmp_path: Path) -> None:
    notes: list[str] = []
    journal = Journal(tmp_path, notify=notes.append)
    make_run(journal, "r1", "uk-node", H200)
    store = MetricStore(journal, "r1")
    store.ingest_mirror("uk-node", START)
    store.state_file.write_text("{not json")
    again = store.ingest_mirror("uk-node", START)
    assert again.points == 34 and len(store.points()) == 34
    assert any("unreadable journal record" in n for n in notes)


def test_a_damaged_line_of_the_points_file_is_skipped_and_the_rest_read(
        tmp_path: Path) -> None:
    """The file is parsed in one piece (a million lines one by one cost seconds); a line
    that is not JSON makes the read fall back to line by line, that line skipped."""
    journal = Journal(tmp_path)
    make_run(journal, "r1", "uk-node", H200)
    store = MetricStore(journal, "r1")
    store.ingest_mirror("uk-node", START)
    whole = [(p.step, p.values[LOSS]) for p in store.points()]
    data = store.path("points").read_bytes()
    lines = data.splitlines(keepends=True)
    damaged = b"".join([*lines[:5], b"{torn" + b" " * (len(lines[5]) - 6) + b"\n", *lines[6:]])
    assert len(damaged) == len(data)  # the recorded size still covers every line
    store.path("points").write_bytes(damaged)
    assert [(p.step, p.values[LOSS]) for p in store.points()] == whole[:5] + whole[6:]


def status_answer(run_id: str, text: str, gpus: list[dict[str, Any]],
                  secret_keys: list[str] | None = None) -> dict[str, Any]:
    """The raw status answer's shape (remote/agent/status.py op_status, gpus.py)."""
    return {"facts": {"gpus": gpus}, "runs": [{
        "run_id": run_id, "playbook": "dflash", "status": "running",
        "secret_keys": secret_keys or [],
        "processes": [{"name": "trainer", "state": "running", "tail_text": text}]}]}


GPUS = [{"index": 0, "memory_used_mib": 1923, "memory_total_mib": 143771,
         "utilization_pct": 91},
        {"index": 1, "memory_used_mib": 2220, "memory_total_mib": 143771,
         "utilization_pct": 88},
        {"index": 2, "memory_used_mib": 0, "memory_total_mib": 143771, "utilization_pct": 0}]


def test_status_tails_add_the_newest_records_and_the_runs_gpus(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    make_run(journal, "r1", "uk-node", None,
             plan={"processes": [{"name": "trainer", "gpus": [0, 1]}]})
    data = H200.read_text()
    at = START + 3600 * 0 + 120  # the answer came at 08:32:00; the tail's last time 08:31:32
    tail = data[-16384:]
    remember_samples(journal, status_answer("r1", tail, GPUS), at=at)
    store = MetricStore(journal, "r1")
    points = store.points()
    assert points and all(p.source == "status" for p in points)
    steps = [p.step for p in points]
    assert steps == sorted(steps) and steps[-1] == 33
    whole = {p.step: p for p in parse_chunk("trainer", H200.read_bytes(), Clock(ref=START),
                                             final=True).points}
    for point in points:  # the same values and, placed before the answer, the same times
        assert point.values == whole[point.step].values
        assert point.t is None or point.t == whole[point.step].t
    samples = store.gpu_samples()
    assert samples == [{"t": at, "gpus": [{"i": 0, "used": 1923, "total": 143771, "util": 91},
                                          {"i": 1, "used": 2220, "total": 143771,
                                           "util": 88}]}]
    # the same answer again: no record doubled, and no second GPU sample within 10 s
    remember_samples(journal, status_answer("r1", tail, GPUS), at=at + 5)
    assert len(store.points()) == len(points) and len(store.gpu_samples()) == 1
    remember_samples(journal, status_answer("r1", tail, GPUS), at=at + 15)
    assert len(store.gpu_samples()) == 2


def test_a_status_tail_is_redacted_before_it_is_kept(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    journal = Journal(tmp_path)
    make_run(journal, "r1", "uk-node", None)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_123")
    text = H200.read_text()[-8000:].replace("/work/run/ckpt", "/hf_secret_value_123/ckpt")
    remember_samples(journal, status_answer("r1", text, [], ["HF_TOKEN"]), at=START + 120)
    kept = b"".join(p.read_bytes() for p in MetricStore(journal, "r1").root.iterdir())
    assert b"hf_secret_value_123" not in kept


def test_the_tail_drops_its_first_record_which_may_be_cut() -> None:
    text = H200.read_text()
    start = text.index("profile/memory_mb/opt=67.495, epoch=0, lr/Muon=2.40e-05")
    parsed = tail_points("trainer", text[start:start + 6000], START + 3600)
    assert parsed.points[0].step == 2  # step 1's record began before the tail: dropped


def test_a_migrated_run_goes_on_in_its_successor(tmp_path: Path) -> None:
    """The H200x2 rehearsal's move: the old box trained steps 0-6 and saved step 5; the new
    box resumed there (5-10). The chain is found from either end, and by step the curve
    goes on across the move."""
    journal = Journal(tmp_path)
    make_run(journal, "old", "cpu-box", MIGRATE / "cpu-box-movable-trainer.log")
    make_run(journal, "new", "new-box", MIGRATE / "new-box-movable-trainer.log",
             migrated_from={"run_id": "old", "host": "cpu-box"})
    journal.mark_moved("old", host="cpu-box", to_host="new-box", to_run_id="new", at=START)
    records = {r["run_id"]: r for r in journal.runs()}
    assert chain_ids(records, "old") == chain_ids(records, "new") == ["old", "new"]
    old, new = MetricStore(journal, "old"), MetricStore(journal, "new")
    old.ingest_mirror("cpu-box", START)
    new.ingest_mirror("new-box", START)
    old_steps = [s for s, _, _ in by_step(old.points(), LOSS)]
    new_steps = [s for s, _, _ in by_step(new.points(), LOSS)]
    assert old_steps == list(range(7)) and new_steps == list(range(5, 11))
    resumed = [e for e in new.events() if e.kind == "resume"]
    assert resumed and resumed[0].step == 5
    # the successor's first step is the one after the checkpoint the move carried (step 5)
    assert new_steps[0] == 5 and new_steps[0] <= old_steps[-1] + 1


def test_the_sparkline_status_and_watch_show(tmp_path: Path) -> None:
    assert sparkline([3.0, 2.0, 1.0], 3) == "█▅▁"
    assert sparkline([1.0, 1.0], 4) == "▄▄"
    assert len(sparkline([float(i) for i in range(1000)], 12)) == 12
    journal = Journal(tmp_path)
    make_run(journal, "r1", "uk-node", H200)
    MetricStore(journal, "r1").ingest_mirror("uk-node", START)
    result = {"runs": [{"run_id": "r1", "processes": [
        {"name": "trainer", "progress": {"step": 33, "metrics": {LOSS: 1.692}}}]}]}
    loss_trends(journal, result)
    trend = result["runs"][0]["processes"][0]["progress"]["loss_trend"]
    assert len(trend) == 12 and set(trend) <= set("▁▂▃▄▅▆▇█")
    progress = Progress.from_json(result["runs"][0]["processes"][0]["progress"])
    assert f"loss {trend} 1.692" in summary(progress)


def test_the_trend_stays_small_for_a_long_run(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    make_run(journal, "r1", "uk-node", None)
    store = MetricStore(journal, "r1")
    from outrig.metrics.store import TREND_KEEP, add_trend

    state: dict[str, Any] = {}
    for chunk in range(20):
        add_trend(state, [Point("trainer", s, None, {LOSS: 10.0 - s / 1000})
                          for s in range(chunk * 100, chunk * 100 + 100)])
    rows = state["trend"]["trainer"]
    assert len(rows) < 2 * TREND_KEEP and rows[0][0] == 0 and rows[-1][0] == 1999
    assert store.trend("trainer") == []


def test_thin_and_spread() -> None:
    assert thin(list(range(10)), 4) == [0, 3, 6, 9]
    assert thin([1, 2], 5) == [1, 2]
    assert spread([5.0, 5.0, 5.0, 6.0, None]) == [5.0, 5.0 + 1 / 3, 5.0 + 2 / 3, 6.0, None]
