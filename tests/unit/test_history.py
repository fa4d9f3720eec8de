"""The history of runs, pure: which runs ``outrig runs`` shows, each run's document (state
as last seen and when, length, progress, checkpoint, a move), the table at 80 columns, the
status fallback's lines, and what the journal keeps of a status answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from outrig.journal import Journal
from outrig.run_history import (
    RECENT,
    HostView,
    chosen,
    history_document,
    history_lines,
    last_known_document,
    last_known_lines,
    run_row,
    seen_from_status,
)

NOW = 1_800_000_000.0
WIDTH = 80


def record(run_id: str, created: float, **more: Any) -> dict[str, Any]:
    return {"run_id": run_id, "host": "uk-node", "playbook": "dflash-qwen36",
            "created": created, "status": "finished", **more}


def test_without_all_the_newest_and_every_run_that_may_hold_a_box() -> None:
    records = [record(f"r{i}", NOW - i) for i in range(RECENT + 5)]
    records[-1]["status"] = "running"  # old, but still holds its GPUs as last seen
    records[-2].update(moved_to={"host": "b", "run_id": "x", "at": NOW})  # not fenced
    records[-3].update(moved_to={"host": "b", "run_id": "y", "at": NOW}, fenced={"at": NOW})
    shown, hidden = chosen(records, show_all=False)
    ids = [r["run_id"] for r in shown]
    assert ids[:RECENT] == [f"r{i}" for i in range(RECENT)]
    assert ids[RECENT:] == [f"r{RECENT + 3}", f"r{RECENT + 4}"] and hidden == 3
    assert chosen(records, show_all=True) == (records, 0)


def test_a_run_seen_now_and_one_of_a_box_that_did_not_answer() -> None:
    running = record("live", NOW - 600, status="running", box_seen=NOW - 590,
                     last_seen={"at": NOW - 5, "step": 40, "epoch": 1, "loss": 0.41234,
                                "checkpoint": {"name": "1", "path": "/w/ckpt/1",
                                               "at": NOW - 5}})
    answered = HostView("uk-node", answered=True, seen_at=NOW, listed={"live"})
    row = run_row(running, answered, NOW)
    assert row["seen_now"] and row["seen_at"] == NOW and row["duration_s"] == 600
    assert row["progress"]["step"] == 40 and row["checkpoint"]["path"] == "/w/ckpt/1"

    gone = HostView("uk-node", answered=False, error="connection refused",
                    seen_at=NOW - 100, listed={"live"})
    row = run_row(running, gone, NOW)
    assert not row["seen_now"] and row["seen_at"] == NOW - 100
    assert row["duration_s"] == 500  # up to when it was last seen running

    ended = record("done", NOW - 600, ended_at=NOW - 60, box_seen=NOW - 50)
    row = run_row(ended, gone, NOW)  # not in the last index: its own box_seen
    assert row["seen_at"] == NOW - 50 and row["duration_s"] == 540


def test_a_moved_run_shows_moved_or_fenced_and_keeps_the_box_state() -> None:
    moved = record("old", NOW - 60, status="running",
                   moved_to={"host": "new-node", "run_id": "new", "at": NOW - 30})
    row = run_row(moved, None, NOW)
    assert (row["state"], row["box_state"]) == ("moved", "running")
    row = run_row({**moved, "fenced": {"at": NOW - 10, "stopped": []}}, None, NOW)
    assert row["state"] == "fenced" and row["fenced"]["at"] == NOW - 10


def test_the_table_fits_80_columns_and_says_what_was_not_seen() -> None:
    records = [record("dflash-qwen36-20260101-120000-ab12", NOW - 3600, status="running",
                      last_seen={"at": NOW - 7, "step": 1200, "epoch": 2, "loss": 0.5,
                                 "checkpoint": {"name": "2", "at": NOW - 7,
                                                "path": "/root/outrig/runs/ckpt/2"}}),
               {**record("smoke-20260101-110000-cd34", NOW - 7200, ended_at=NOW - 7000),
                "host": "a-box-with-a-rather-long-name.example.org", "playbook": "smoke"}]
    views = [HostView("uk-node", answered=True, seen_at=NOW,
                      listed={"dflash-qwen36-20260101-120000-ab12"}),
             HostView("a-box-with-a-rather-long-name.example.org", answered=False,
                      error="no answer within 12 s", seen_at=NOW - 86400,
                      listed={"smoke-20260101-110000-cd34"})]
    doc = history_document(records, views, now=NOW, show_all=False)
    lines = history_lines(doc, WIDTH)
    assert all(len(line) <= WIDTH for line in lines), "\n".join(lines)
    text = "\n".join(lines)
    # the long host name does not fit in the row: it goes under it
    assert lines[0].split() == ["run", "state", "started", "took"]
    assert "on a-box-with-a-rather-long-name.example.org" in text
    assert "step 1200, epoch 2, loss 0.500" in text
    assert "newest complete checkpoint 2: /root/outrig/runs/ckpt/2" in text
    assert "not seen since 2027-01-14 08:00:00 UTC" in text  # NOW - 1 day
    assert "did not answer: no answer within 12 s;" in " ".join(text.split())  # wrapped
    assert "1h" in lines[1] and "3m" in text  # the lengths
    assert doc["runs"][1]["seen_now"] is False and doc["hidden"] == 0


def test_short_hosts_stay_in_the_row() -> None:
    doc = history_document([record("r1", NOW - 60)], [HostView("uk-node", answered=True)],
                           now=NOW, show_all=True)
    lines = history_lines(doc, WIDTH)
    assert lines[0].split() == ["run", "host", "state", "started", "took"]
    assert lines[1].split()[:3] == ["r1", "uk-node", "finished"]
    assert history_lines({"runs": [], "hidden": 0}, WIDTH) == ["no runs in the journal"]


def test_status_fallback_is_marked_as_the_journals() -> None:
    rec = record("r1", NOW - 600, status="running", box_seen=NOW - 300,
                 last_seen={"at": NOW - 200, "step": 7, "loss": 1.0,
                            "checkpoint": {"name": "3", "path": "/w/3", "at": NOW - 250}})
    lines = last_known_lines(rec, "connection refused", WIDTH)
    assert all(len(line) <= WIDTH for line in lines), lines
    text = " ".join("\n".join(lines).split())
    assert text.startswith("run r1 (dflash-qwen36) on uk-node: running as last seen at")
    assert "journal's last known state, not the box's answer now" in text
    assert "progress: step 7, loss 1.000" in text and "checkpoint: 3 (/w/3)" in text
    doc = last_known_document(rec, "connection refused")
    assert doc["source"] == "journal" and not doc["reachable"]
    assert doc["run"]["progress"]["step"] == 7


def test_status_answer_is_kept_as_last_seen_and_unknown_values_keep_the_old(
        tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.record_run("r1", record("r1", NOW))
    run = {"run_id": "r1", "processes": [
        {"name": "server", "progress": None},
        {"name": "trainer", "progress": {"step": 12, "epoch": 0, "loss": 2.5},
         "checkpoint": {"name": "0", "path": "/w/ckpt/0", "count": 1}}]}
    journal.record_seen("r1", seen_from_status(run, NOW))
    # a later answer whose log tail had no metric line: the step seen before stays
    journal.record_seen("r1", seen_from_status({"run_id": "r1", "processes": [
        {"name": "trainer", "progress": None, "checkpoint": {"path": None}}]}, NOW + 10))
    seen = (journal.run("r1") or {})["last_seen"]
    assert seen["step"] == 12 and seen["loss"] == 2.5 and seen["at"] == NOW + 10
    assert seen["checkpoint"]["path"] == "/w/ckpt/0" and seen["process"] == "trainer"
    journal.record_seen("nosuch", {"at": NOW})  # a run the journal lacks: nothing made
    assert journal.run("nosuch") is None


def test_the_run_index_arrival_is_noted_per_host(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    assert journal.runs_seen("uk-node") == (None, set())
    journal.note_runs_seen("uk-node", ["b", "a"], at=NOW)
    assert journal.runs_seen("uk-node") == (NOW, {"a", "b"})
