"""The incremental cursor as ``outrig metrics`` sees it, over the real H200 trainer's log:
nothing new gives what a full read gives (and parses nothing), a new record appears, and a
store or mirror changed behind the cursor's back (the points file cut, the mirror rewritten
or cut in place) is parsed again from the start rather than doubled or left short. Also:
the quick series of a one-process run (:attr:`outrig.metrics.RunData.in_order`) equals the
merged one on every shape of points."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from outrig.journal import Journal
from outrig.metrics.series import (
    LOSS,
    Point,
    RunData,
    by_step,
    iter_rows,
    merged,
    metric_names,
)
from outrig.metrics.store import MetricStore
from tests.support.cli import outrig
from tests.unit.test_metrics import H200, START, make_run, metric_lines

RECORD = (b"[09:14:03] INFO     train/loss=0.5000, train/full_acc=0.9000, epoch=0, "
          b"global_step=999\n")


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Journal:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.chdir(tmp_path)
    journal = Journal(tmp_path / "state" / "outrig")
    make_run(journal, "r1", "uk-node", H200)
    return journal


def export(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[dict[str, Any], str]:
    """``metrics --json`` (the document) and the table ``metrics`` prints."""
    code, out, err = outrig(["metrics", "--run", "r1", "--json", *flags], capsys)
    assert code == 0, err
    code, table, err = outrig(["metrics", "--run", "r1", *flags], capsys)
    assert code == 0, err
    return json.loads(out), table


def full_read(journal: Journal, capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any],
                                                                             str]:
    """What a journal with no series yet gives: the mirror parsed from its start."""
    shutil.rmtree(journal.root / "metrics")
    return export(capsys)


def test_nothing_new_gives_what_a_full_read_gives(journal: Journal,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    first, _ = export(capsys)
    assert first["lines_parsed"] > 0
    again, table = export(capsys)
    assert again["lines_parsed"] == 0  # the cursor: nothing parsed
    fresh, fresh_table = full_read(journal, capsys)
    assert fresh["lines_parsed"] == first["lines_parsed"]
    assert again["runs"] == fresh["runs"] and table == fresh_table
    assert [(p["step"], p["values"][LOSS]) for p in again["runs"][0]["points"]] == \
        metric_lines(H200)
    assert "34 records" in table


def test_a_new_record_appears_and_only_it_is_parsed(journal: Journal,
                                                   capsys: pytest.CaptureFixture[str]
                                                   ) -> None:
    export(capsys)
    log = journal.root / "logs" / "uk-node" / "r1" / "trainer.log"
    with open(log, "ab") as handle:
        handle.write(RECORD)
    doc, table = export(capsys)
    points = doc["runs"][0]["points"]
    assert points[-1]["step"] == 999 and points[-1]["values"][LOSS] == 0.5
    assert len(points) == 35 and "35 records" in table and "–999" in table
    assert 1 <= doc["lines_parsed"] < 20  # the new line (and the held-back last record)
    fresh, fresh_table = full_read(journal, capsys)
    assert doc["runs"] == fresh["runs"] and table == fresh_table


@pytest.mark.parametrize("change", ["rewritten", "cut in place"])
def test_a_mirror_changed_behind_the_cursor_is_parsed_again(
        journal: Journal, capsys: pytest.CaptureFixture[str], change: str) -> None:
    export(capsys)
    log = journal.root / "logs" / "uk-node" / "r1" / "trainer.log"
    data = H200.read_bytes()
    head = data[: data.index(b"\n", len(data) // 2) + 1]
    if change == "rewritten":  # a new file (a new inode) with the first half and a record
        log.unlink()
        log.write_bytes(head + RECORD)
    else:  # the same file, cut short, then the record
        with open(log, "r+b") as handle:
            handle.truncate(len(head))
        with open(log, "ab") as handle:
            handle.write(RECORD)
    doc, table = export(capsys)
    steps = [p["step"] for p in doc["runs"][0]["points"]]
    want = [s for s, _ in metric_lines(H200) if s <= steps[-2]] + [999]
    assert steps == want  # each step once: no copy of the old points kept beside the new
    assert len(steps) < 35 and f"{len(steps)} records" in table
    assert doc["runs"] == full_read(journal, capsys)[0]["runs"]


def test_a_points_file_cut_behind_the_store_is_parsed_again(
        journal: Journal, capsys: pytest.CaptureFixture[str]) -> None:
    whole, table = export(capsys)
    points = MetricStore(journal, "r1").path("points")
    data = points.read_bytes()
    points.write_bytes(data[: len(data) // 2])  # cut behind the state's recorded size
    doc, again = export(capsys)
    assert doc["lines_parsed"] > 0  # parsed again from the mirror's start
    assert doc["runs"] == whole["runs"] and again == table


def _point(step: int, values: dict[str, float], process: str = "trainer",
           t: float | None = None, source: str = "log") -> Point:
    return Point(process, step, START + step if t is None else t, values, source)


SHAPES: dict[str, list[Point]] = {
    "the usual log": [_point(s, {LOSS: 2.0 - s / 10, "train/eal": 1 + s / 10, "epoch": 0.0})
                      for s in range(1, 8)],
    "keys missing, not finite, huge": [
        _point(1, {LOSS: 2.0, "val/loss": 3.0}), _point(2, {LOSS: math.nan}),
        _point(3, {LOSS: math.inf, "val/loss": -math.inf}), _point(4, {LOSS: 1e300}),
        _point(5, {LOSS: 1e300, "val/loss": 1.0}), _point(6, {"val/loss": 0.5})],
    "keys in another order": [_point(1, {LOSS: 2.0, "epoch": 0.0}),
                              _point(2, {"epoch": 0.0, LOSS: 1.5})],
    "one point without a time": [_point(1, {LOSS: 2.0}), _point(2, {LOSS: 1.0}, t=None)],
    "a step again (a resume)": [_point(1, {LOSS: 2.0}), _point(2, {LOSS: 1.0}),
                                _point(2, {LOSS: 1.2, "val/loss": 1.1}), _point(3, {LOSS: 1.0})],
    "two processes": [_point(1, {LOSS: 2.0}), _point(1, {LOSS: 3.0}, process="other"),
                      _point(2, {LOSS: 1.0})],
    "a status tail and the log": [_point(2, {LOSS: 9.0}, source="status"),
                                  _point(1, {LOSS: 2.0}), _point(2, {LOSS: 1.0})],
    "one point": [_point(5, {LOSS: 2.0})],
    "none": [],
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_quick_series_is_the_merged_one(shape: str) -> None:
    points = SHAPES[shape]
    run = RunData(record={"run_id": "r1", "host": "h"}, points=points)
    names = metric_names(points)
    assert run.names == names
    assert run.count() == len(merged(points))
    assert list(run.rows(names)) == list(iter_rows(points, names))
    for metric in [*names, "no/such"]:
        series = by_step(points, metric)
        assert run.series(metric) == series
        assert run.pairs(metric) == [(s, v) for s, _, v in series]
        assert run.values(metric) == [v for _, _, v in series]
        assert run.column(metric) == ([s for s, _, _ in series], [t for _, t, _ in series],
                                      [v for _, _, v in series])
    steps = sorted({p.step for p in points})
    assert run.step_span() == ((steps[0], steps[-1]) if steps else None)
    assert (run.in_order is not None) == (shape in {
        "the usual log", "keys missing, not finite, huge", "keys in another order",
        "one point without a time", "one point"})


def test_nothing_new_reads_no_point_and_prints_the_same_table(
        journal: Journal, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The kept summary (outrig/metrics/summary.py): with the series and the served
    evaluations as they were, ``metrics`` prints its table without reading a point; a new
    record or a new served evaluation makes it read them again."""
    code, first, err = outrig(["metrics", "--run", "r1"], capsys)
    assert code == 0 and "34 records" in first, err
    assert (journal.root / "metrics" / "r1" / "summary.json").exists()
    real_points = MetricStore.points
    reads: list[str] = []

    def counted(self: MetricStore) -> list[Point]:
        reads.append("points")
        return real_points(self)

    monkeypatch.setattr(MetricStore, "points", counted)
    code, again, err = outrig(["metrics", "--run", "r1"], capsys)
    assert code == 0 and again == first and reads == [], err
    log = journal.root / "logs" / "uk-node" / "r1" / "trainer.log"
    with open(log, "ab") as handle:
        handle.write(RECORD)
    code, grown, err = outrig(["metrics", "--run", "r1"], capsys)
    assert code == 0 and reads == ["points"] and "35 records" in grown and "–999" in grown, err
    journal.record_evaluation("e1", {"eval_id": "e1", "run_id": "r1", "at": 1.0,
                                     "checkpoint": {"path": "/c/999", "global_step": 999},
                                     "acceptance_length": 2.5, "per_position": [0.9]})
    code, served, err = outrig(["metrics", "--run", "r1"], capsys)
    assert code == 0 and reads == ["points", "points"] and "served/acceptance_length" in served
    code, still, err = outrig(["metrics", "--run", "r1"], capsys)
    assert code == 0 and still == served and reads == ["points", "points"], err


def test_a_damaged_kept_summary_is_made_again(journal: Journal,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, first, err = outrig(["metrics", "--run", "r1"], capsys)
    assert code == 0, err
    kept = journal.root / "metrics" / "r1" / "summary.json"
    doc = json.loads(kept.read_text())
    doc["stats"] = {"train/loss": ["x"]}
    kept.write_text(json.dumps(doc))
    code, again, err = outrig(["metrics", "--run", "r1"], capsys)
    assert code == 0 and again == first, err
    assert json.loads(kept.read_text())["stats"] != {"train/loss": ["x"]}
