"""The whole DFlash loop, real on both sides: the drafter the real speculators trainer trained
(``trained_drafter``, the rehearsal's shared training on the real CPU vLLM) is evaluated by
``outrig evaluate`` on the sandbox box (a real sshd), served by the real CPU vLLM with method
``dflash``, and its acceptance comes from vLLM's own ``spec_decode`` counters, checked against
the server's own ``SpecDecoding metrics`` log lines.

The playbook is a dflash playbook with the training's paths, so every default is the one a
user gets: the newest complete checkpoint under ``dflash.save_path``, ``num_speculative_tokens``
from ``dflash.block_size`` (block - 1, what speculators writes into the checkpoint's
``speculators_config`` and vLLM reads), and the last training conversations as the prompts.
No baseline here: tests/realvllm/test_evaluate.py covers the speedup with ngram, and each
server start costs a minute or two on two cores.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.realvllm.evaluating import check_stopped, logged, outrig, server_settings
from tests.rehearsal.harness import KEEP_ENV, RealTraining, TrainedDrafter

pytestmark = pytest.mark.integration


def test_the_trained_drafter_is_measured_by_vllms_own_counters(
        box_project: Path, box_host: Path, vllm_python: str, real_training: RealTraining,
        trained_drafter: TrainedDrafter) -> None:
    playbook = {"name": "trained", "recipe": "dflash", "dflash": {
        "model": str(trained_drafter.verifier), "data_path": real_training.data_path,
        "save_path": real_training.save_path, "block_size": trained_drafter.block_size,
        "prepare": {"data": [str(trained_drafter.conversations)]},
        "server": {"gpus": [0], "python": vllm_python}, "trainer": {"gpus": [1]}},
        "evaluate": {"requests": 4, "concurrency": 2, "max_tokens": 24, "baseline": False,
                     "settle": 3, "server": server_settings(vllm_python)}}
    (box_project / "playbooks" / "trained.yaml").write_text(yaml.safe_dump(playbook))

    done = outrig(["evaluate", "--host", box_host.stem, "--playbook", "trained", "--json"],
                  box_project)
    assert done.returncode == 0, done.stderr[-4000:]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    workdir = Path(yaml.safe_load(box_host.read_text())["workdir"])
    check_stopped(doc, workdir)

    k = trained_drafter.num_speculative_tokens
    assert doc["checkpoint"]["path"] == str(trained_drafter.checkpoint)
    assert doc["speculative_config"] == {"method": "dflash",
                                         "model": str(trained_drafter.checkpoint),
                                         "num_speculative_tokens": k}
    assert k == trained_drafter.block_size - 1
    assert doc["requests"] == 4 and doc["completion_tokens"] > 0
    assert doc["drafts"] > 0, "vLLM proposed no drafts with the trained drafter"
    assert doc["draft_tokens"] == k * doc["drafts"]
    assert len(doc["per_position"]) == k
    assert doc["acceptance_length"] == pytest.approx(1 + doc["accepted_tokens"] / doc["drafts"])
    accepted, drafted, lengths = logged(workdir, doc["server_runs"][0])
    assert (accepted, drafted) == (doc["accepted_tokens"], doc["draft_tokens"])
    assert lengths and all(1.0 <= m <= k + 1 for m in lengths)

    # recorded with its checkpoint: --compare lists it
    listed = outrig(["evaluate", "--host", box_host.stem, "--playbook", "trained",
                     "--compare", "--json"], box_project)
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)["evaluations"]
    assert [(e["eval_id"], e["checkpoint"]["path"]) for e in found] == [
        (doc["eval_id"], str(trained_drafter.checkpoint))]


def test_the_drafter_is_evaluated_during_training_and_shown_by_status_and_the_report(
        real_training: RealTraining) -> None:
    """evaluate.during_training in the shared training: ``outrig watch`` followed the resumed
    run and evaluated its checkpoints on the real CPU vLLM while the trainer trained (GPU 2
    set aside), one at a time, each state once, then the final checkpoint; the points are in
    ``status`` and on the report's ``train/eal`` chart."""
    seen = real_training.during_training
    if not seen:
        pytest.skip("evaluate.during_training runs on the CPU rehearsal only")
    keep = os.environ.get(KEEP_ENV)
    if keep:  # the watch's output and what status and the report showed, for a reader
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / "during-training.json").write_text(json.dumps(seen, indent=1))
    assert seen["watch_error"] == [] and seen["watch_status"] == "finished", seen
    events = seen["events"]
    assert [e["event"] for e in events if e["event"] == "evaluation_failed"] == [], events
    kinds = [e["event"] for e in events]
    # one at a time: each evaluating is followed by its evaluated before the next starts
    assert kinds == ["evaluating", "evaluated"] * (len(kinds) // 2), kinds
    evaluations = seen["evaluations"]
    assert len(evaluations) >= 2, evaluations
    assert all(ev["checkpoint"]["local_step"] == 0 for ev in evaluations), evaluations  # epoch
    steps = [ev["checkpoint"]["global_step"] for ev in evaluations]
    assert len(set(steps)) == len(steps), f"a checkpoint evaluated twice: {steps}"
    for ev in evaluations:
        assert ev["drafts"] > 0 and 1.0 <= ev["acceptance_length"] <= ev[
            "num_speculative_tokens"] + 1, ev
        assert len(ev["server_runs"]) == 1  # no baseline: one server per checkpoint
    assert {e["eval_id"] for e in events if e["event"] == "evaluated"} == {
        ev["eval_id"] for ev in evaluations}
    # the final checkpoint (the trainer's last save) is among them
    final = max(steps)
    assert evaluations[0]["checkpoint"]["global_step"] == final  # newest first
    served = sorted((ev["checkpoint"]["global_step"], round(ev["acceptance_length"], 2))
                    for ev in evaluations)
    assert seen["status_served"] == [[[s, pytest.approx(v, abs=0.01)] for s, v in served]]
    line = next(t for t in seen["status_lines"] if "served acceptance length by" in t)
    assert line.endswith(", ".join(f"{s} {v:.2f}" for s, v in served)), line
    assert seen["report_chart"] == ["train/eal", "served/acceptance_length"]
    assert seen["report_served"]["s"] == [s for s, _ in served]
    assert seen["report_served"]["v"] == pytest.approx([v for _, v in served], abs=0.01)
