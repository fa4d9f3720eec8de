"""Pure parts of staging: checkpoint completeness, manifest diffs, stream split, stage items."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from outrig._box.agent.checkpoints import op_checkpoints, quarantine_checkpoints
from outrig._box.agent.events import Emitter
from outrig._box.agent.validation import Request
from outrig.checkpoints import assess, listing_request, newest_complete
from outrig.errors import ConfigError
from outrig.inventory import Host
from outrig.ops.stage import stage_items
from outrig.playbook import load_job
from outrig.transfer import diff, split

REPO = Path(__file__).resolve().parents[2]
SET = ("config.json", "model.safetensors", "optimizer_state_dict.pt",
       "scheduler_state_dict.pt", "training_state.json")


def save(folder: Path, epoch: int, *, step: int = 0, total: int = 10,
         files: tuple[str, ...] = SET, state: Any = None, t0: float = 1_000_000.0) -> Path:
    """A checkpoint folder written in speculators' order, one second per file."""
    target = folder / str(epoch)
    target.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(f for f in SET if f in files):
        path = target / name
        if name == "training_state.json":
            body = state if state is not None else {"epoch": epoch, "local_step": step,
                                                      "global_step": total}
            path.write_text(body if isinstance(body, str) else json.dumps(body))
        else:
            path.write_bytes(b"x" * 10)
        os.utime(path, (t0 + index, t0 + index))
    return target


def listing(folder: Path, **fields: Any) -> dict[str, Any]:
    request = Request({"op": "checkpoints", "workdir": str(folder),
                             "save_path": str(folder), **fields})
    result: dict[str, Any] = op_checkpoints(request, Emitter(io.BytesIO()))
    return result


def test_missing_file_or_unreadable_state_is_incomplete(tmp_path: Path) -> None:
    save(tmp_path, 0, files=SET[:3])
    save(tmp_path, 1, state="{broken")
    verdicts = assess(listing(tmp_path))
    assert [c.complete for c in verdicts] == [False, False]
    assert "missing training_state.json, scheduler_state_dict.pt" in verdicts[0].why
    assert "does not parse" in verdicts[1].why
    assert newest_complete(listing(tmp_path)) is None


def test_a_save_into_a_folder_that_stopped_part_way_is_incomplete(tmp_path: Path) -> None:
    """--checkpoint-freq < 1 rewrites folder N in place: an older complete N whose model file
    was rewritten by a save that was then killed must not be chosen (speculators would)."""
    save(tmp_path, 0)
    folder = save(tmp_path, 1, step=40)
    os.utime(folder / "model.safetensors", (2_000_000.0, 2_000_000.0))  # the killed rewrite
    verdicts = assess(listing(tmp_path))
    assert [c.complete for c in verdicts] == [True, False]
    assert "model.safetensors newer than training_state.json" in verdicts[1].why
    best = newest_complete(listing(tmp_path))
    assert best is not None and best.epoch == 0 and not best.mid_epoch


def test_mid_epoch_state_and_no_scheduler_file_with_the_scheduler_off(tmp_path: Path) -> None:
    save(tmp_path, 2, step=17, total=57, files=tuple(f for f in SET if "scheduler" not in f))
    assert newest_complete(listing(tmp_path)) is None  # a scheduler file is expected
    best = newest_complete(listing(tmp_path, scheduler=False))
    assert best is not None and best.mid_epoch and best.local_step == 17
    assert best.global_step == 57
    assert listing_request(["torchrun", "--scheduler-type", "none", "--max-steps", "5"]) == {
        "scheduler": False, "max_steps": 5}


def test_a_save_ended_by_max_steps_is_named_as_such(tmp_path: Path) -> None:
    save(tmp_path, 0, step=0, total=50)
    best = newest_complete(listing(tmp_path, max_steps=50))
    assert best is not None and best.note is not None
    assert "--max-steps 50" in best.note and "resume starts epoch 1" in best.note


def test_quarantine_moves_incomplete_folders_aside_and_keeps_complete_ones(
        tmp_path: Path) -> None:
    save(tmp_path, 0)
    broken = save(tmp_path, 1, step=3)
    (broken / "training_state.json").unlink()
    (tmp_path / "interrupted").mkdir()
    stream = io.BytesIO()
    moved = quarantine_checkpoints(str(tmp_path), True, Emitter(stream))
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(moved) == 1 and moved[0].startswith(str(tmp_path / "1.incomplete-"))
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("1.")) == [
        "0", "interrupted"]
    assert any("missing training_state.json" in str(e) for e in events)


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


@pytest.mark.parametrize("streams", [0, -1])
def test_streams_below_one_are_refused_before_connecting(tmp_path: Path, streams: int) -> None:
    from outrig.console import Reporter
    from outrig.ops.stage import stage
    from outrig.session import Project

    # the host is not reachable: an attempt to connect would fail differently
    with pytest.raises(ConfigError, match=f"--streams {streams}: .* at least 1"):
        stage(Project(tmp_path), "user@192.0.2.1:22", "nothing", Reporter(quiet=True),
              streams=streams)
