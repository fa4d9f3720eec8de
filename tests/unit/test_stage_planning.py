"""Pure parts of staging: checkpoint completeness, manifest diffs, stream split, stage items."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from outrig.checkpoints import REQUIRED_FILES, assess, newest_complete
from outrig.errors import ConfigError
from outrig.inventory import Host
from outrig.ops.stage import stage_items
from outrig.playbook import load_job
from outrig.transfer import diff, split

REPO = Path(__file__).resolve().parents[2]
NOW = 10_000.0


def entry(epoch: int, *, files: tuple[str, ...] = REQUIRED_FILES, age: float = 600,
          state: Any = None, logged: bool = False) -> dict[str, Any]:
    return {"epoch": epoch, "path": f"/save/{epoch}", "files": {f: 10 for f in files},
            "newest_mtime": NOW - age, "training_state": {"epoch": epoch} if state is None
            else state, "logged_saved": logged}


def listing(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"checkpoints": list(entries), "now": NOW}


def test_missing_file_or_unreadable_state_is_incomplete() -> None:
    verdicts = assess(listing(entry(0, files=REQUIRED_FILES[:3]), entry(1, state="broken")))
    assert [c.complete for c in verdicts] == [False, False]
    assert "missing scheduler_state_dict.pt, training_state.json" in verdicts[0].why
    assert "does not parse" in verdicts[1].why


def test_fresh_checkpoint_needs_the_log_line_or_a_later_epoch() -> None:
    fresh = listing(entry(0), entry(1, age=3))
    assert newest_complete(fresh).epoch == 0  # type: ignore[union-attr]
    logged = listing(entry(0), entry(1, age=3, logged=True))
    assert newest_complete(logged).epoch == 1  # type: ignore[union-attr]
    later = listing(entry(1, age=3), entry(2, age=600))
    assert [c.complete for c in assess(later)] == [True, True]


def test_nothing_complete_gives_none() -> None:
    assert newest_complete(listing(entry(0, age=1))) is None
    assert newest_complete({"checkpoints": [], "now": NOW}) is None


def test_diff_skips_matching_files_and_resumes_part_files() -> None:
    source = {"a": {"size": 10, "sha256": "x"}, "b": {"size": 20, "sha256": "y"},
              "c": {"size": 30, "sha256": "z"}}
    dest = {"a": {"size": 10, "sha256": "x"}, "b": {"size": 20, "sha256": "other"}}
    plan = diff(source, dest, {"c": 12, "b": 99})
    assert plan.skipped == 1
    assert plan.files == [{"path": "b", "offset": 0}, {"path": "c", "offset": 12}]
    assert plan.bytes == 20 + 18


def test_split_balances_bytes_over_streams() -> None:
    expect = {f"f{i}": {"size": size} for i, size in enumerate([100, 90, 50, 40, 10, 10])}
    groups = split([{"path": p, "offset": 0} for p in expect], expect, 3)
    loads = sorted(sum(expect[f["path"]]["size"] for f in g) for g in groups)
    assert loads == [100, 100, 100]
    assert split([], expect, 4) == []


def test_dflash_playbook_stage_items() -> None:
    job = load_job(REPO / "playbooks" / "dflash-qwen36.yaml")
    host = Host(name="h", hostname="h", workdir="/workspace/dflash")
    items = {i.name: i for i in stage_items(job, host)}
    assert items["model"].path == "/workspace/dflash/models/Qwen3.6-27B"
    assert items["model"].source == "hf:Qwen/Qwen3.6-27B"
    assert items["data"].optional_because, "prepare can rebuild the data on the box"
    assert items["checkpoints"].kind == "checkpoints"


def test_stage_item_paths_are_rendered_and_checked(tmp_path: Path) -> None:
    book = tmp_path / "p.yaml"
    book.write_text("processes: {a: {command: 'true'}}\n"
                    "stage: {ckpt: {path: '${workdir}/ckpt', kind: checkpoints}}\n")
    host = Host(name="h", hostname="h", workdir="/w")
    assert stage_items(load_job(book), host)[0].path == "/w/ckpt"
    book.write_text("processes: {a: {command: 'true'}}\n"
                    "stage: {ckpt: {path: '${nope}/ckpt'}}\n")
    with pytest.raises(ConfigError, match="is not defined"):
        stage_items(load_job(book), host)
