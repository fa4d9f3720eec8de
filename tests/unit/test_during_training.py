"""``evaluate.during_training``: the section's checks, the planner's set-aside check, which
checkpoint is evaluated next (pure), and the watch's evaluator driven with fakes of the box,
the journal and the clock (no sleeps): one at a time, none twice, going on after a restart
or a move, a failure said and tried once more, the final checkpoint at the run's end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.checkpoints import Checkpoint
from outrig.errors import ConfigError
from outrig.evaluation import schedule
from outrig.evaluation.section import DuringTrainingSpec
from outrig.inventory import Host
from outrig.ops.evaluate import CheckpointRewritten, unchanged
from outrig.ops.watch_evaluate import CheckpointEvaluator
from outrig.plan import HostFacts, make_plan
from outrig.playbook import load_job
from tests.unit.test_dflash import base

HOST = Host(name="box", hostname="127.0.0.1", workdir="/workspace/dflash")


def ckpt(epoch: int, step: int, total: int, complete: bool = True) -> Checkpoint:
    return Checkpoint(epoch=epoch, path=f"/d/ckpt/{epoch}", complete=complete,
                      why="complete" if complete else "missing training_state.json", size=1,
                      local_step=step, global_step=total)


def doc_of(c: Checkpoint, length: float = 1.5) -> dict[str, Any]:
    return {"eval_id": f"e-{c.global_step}", "acceptance_length": length,
            "per_position": [0.4, 0.1], "checkpoint": {"path": c.path, "epoch": c.epoch,
                                                       "local_step": c.local_step,
                                                       "global_step": c.global_step}}


# ------------------------------------------------------------------------------ the section

def write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize(("during", "needle"), [
    ({"every": "step", "gpus": [4]}, "evaluate.during_training.every"),
    ({"every": "epoch"}, "say where the evaluation runs"),
    ({"gpus": [4], "host": "other"}, "not both"),
    ({"gpus": [4, 4]}, "lists a GPU twice"),
    ({"gpus": [4], "often": 2}, "evaluate.during_training.often"),
])
def test_a_bad_section_is_refused_naming_the_key(tmp_path: Path, during: dict[str, Any],
                                                 needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_job(write(tmp_path, {**base(), "evaluate": {"during_training": during}}))
    assert info.value.exit_code == 2
    assert needle in str(info.value) and "job.yaml:" in str(info.value)


def test_set_aside_gpus_used_by_a_process_of_the_run_are_a_plan_problem(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, {**base(), "evaluate": {"during_training": {"gpus": [3, 4]}}}))
    plan = make_plan(job, HOST, HostFacts(gpu_count=5, source="test"), "run-1")
    hits = [p for p in plan.problems if "evaluate.during_training.gpus" in p]
    assert len(hits) == 1, plan.problems
    assert "GPU(s) [3] are set aside for evaluating checkpoints but trainer runs on them" \
        in hits[0]


def test_set_aside_gpus_must_exist_and_free_ones_plan_cleanly(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, {**base(), "evaluate": {"during_training": {"gpus": [4]}}}))
    four = make_plan(job, HOST, HostFacts(gpu_count=4, source="test"), "run-1")
    assert any("GPU(s) [4] do not exist on box" in p for p in four.problems), four.problems
    five = make_plan(job, HOST, HostFacts(gpu_count=5, source="test"), "run-1")
    assert not five.problems
    assert sorted(g for p in five.processes.values() for g in p.gpus) == [0, 1, 2, 3]


def test_the_second_box_is_not_the_training_box(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, {**base(), "evaluate": {"during_training": {"host": "box"}}}))
    plan = make_plan(job, HOST, HostFacts(gpu_count=4, source="test"), "run-1")
    assert any("evaluate.during_training.host: box is the box the run trains on" in p
               for p in plan.problems), plan.problems
    other = load_job(write(tmp_path, {**base(),
                                      "evaluate": {"during_training": {"host": "eval-box"}}}))
    assert not make_plan(other, HOST, HostFacts(gpu_count=4, source="test"), "run-1").problems


# ------------------------------------------------------------------------------ the schedule

def test_the_newest_complete_state_not_done_is_next() -> None:
    listing = [ckpt(0, 0, 10), ckpt(1, 3, 13), ckpt(2, 2, 22, complete=False)]
    assert schedule.choose(listing, set(), {}, "checkpoint") == listing[1]
    # the same folder rewritten (epoch 1, step 6): a new state, though the path is the same
    later = [ckpt(0, 0, 10), ckpt(1, 6, 16)]
    done = {schedule.checkpoint_key(listing[1])}
    assert schedule.choose(later, done, {}, "checkpoint") == later[1]
    # nothing newer than what is done: nothing (the past is not filled in)
    assert schedule.choose(listing, done, {}, "checkpoint") is None
    assert schedule.choose([], set(), {}, "checkpoint") is None


def test_every_epoch_takes_only_end_of_epoch_saves() -> None:
    listing = [ckpt(0, 0, 10), ckpt(1, 3, 13)]
    assert schedule.choose(listing, set(), {}, "epoch") == listing[0]
    assert schedule.choose(listing, {schedule.checkpoint_key(listing[0])}, {}, "epoch") is None


def test_a_checkpoint_is_tried_twice_at_most() -> None:
    listing = [ckpt(0, 0, 10)]
    key = schedule.checkpoint_key(listing[0])
    assert schedule.choose(listing, set(), {key: 1}, "checkpoint") == listing[0]
    assert schedule.choose(listing, set(), {key: 2}, "checkpoint") is None


def test_done_comes_from_evaluation_documents() -> None:
    docs = [doc_of(ckpt(1, 3, 13)), {"checkpoint": {"path": "/exported"}}, {"checkpoint": None}]
    assert schedule.done_keys(docs) == {"1:3:13"}


# ------------------------------------------------------------------------------ the evaluator

class FakeBox:
    """The box's checkpoints, the journal's evaluations and the evaluation itself."""

    def __init__(self, spec: DuringTrainingSpec | None = None) -> None:
        self.section = spec if spec is not None else DuringTrainingSpec(gpus=[2])
        self.listing: list[Checkpoint] = []
        self.journal: list[dict[str, Any]] = []
        self.fail: list[str] = []  # keys whose evaluation raises
        self.rewritten: list[str] = []  # keys the trainer rewrites while they are evaluated
        self.evaluated: list[str] = []
        self.spec_reads = 0
        self.stopped = 0

    def spec(self) -> DuringTrainingSpec | None:
        self.spec_reads += 1
        return self.section

    def checkpoints(self) -> list[Checkpoint]:
        return list(self.listing)

    def done(self) -> set[str]:
        return schedule.done_keys(self.journal)

    def where(self, spec: DuringTrainingSpec) -> str:
        return f"GPU(s) {spec.gpus} of box, set aside"

    def stop_servers(self) -> None:
        self.stopped += 1

    def evaluate(self, c: Checkpoint) -> dict[str, Any]:
        key = schedule.checkpoint_key(c)
        self.evaluated.append(key)
        if key in self.fail:
            raise ConfigError("the server did not come up")
        if key in self.rewritten:
            raise CheckpointRewritten("rewritten")
        doc = doc_of(c, 1.0 + c.global_step / 10 if c.global_step else 1.0)
        self.journal.append(doc)
        return doc


class FakeRecord(dict[str, Any]):
    def __getitem__(self, key: str) -> Any:
        return self.get(key)

    def update(self, *args: Any, **fields: Any) -> None:
        super().update(*args, **fields)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Deferred:
    """A spawn that keeps the worker until ``run`` (an evaluation in flight)."""

    def __init__(self) -> None:
        self.pending: list[Callable[[], None]] = []

    def __call__(self, work: Callable[[], None]) -> None:
        self.pending.append(work)

    def run(self) -> None:
        work, self.pending = self.pending, []
        for w in work:
            w()


def evaluator(box: FakeBox, record: FakeRecord | None = None, spawn: Any = None,
              clock: Clock | None = None) -> tuple[CheckpointEvaluator, list[tuple[str, str]]]:
    said: list[tuple[str, str]] = []
    ev = CheckpointEvaluator(box, record if record is not None else FakeRecord(run_id="r1"),
                             lambda event, **f: said.append((event, str(f.get("why")))),
                             spawn=spawn or (lambda work: work()), clock=clock or Clock(),
                             look_every=30.0)
    return ev, said


def test_each_new_checkpoint_once_with_a_line_each() -> None:
    box, clock = FakeBox(), Clock()
    ev, said = evaluator(box, clock=clock)
    box.listing = [ckpt(0, 3, 3)]
    ev.poll()
    ev.drain()
    assert box.evaluated == ["0:3:3"]
    assert [e for e, _ in said] == ["evaluating", "evaluated"]
    assert said[0][1] == ("checkpoint /d/ckpt/0 (epoch 0, step 3, global step 3) on GPU(s) [2] "
                          "of box, set aside")
    assert said[1][1].startswith("checkpoint /d/ckpt/0 (epoch 0, step 3, global step 3): "
                                 "served acceptance length 1.30, per position 0.40 0.10")
    ev.poll()  # before look_every: no look at all
    clock.now += 30
    ev.poll()  # a look: nothing new, nothing evaluated
    assert box.evaluated == ["0:3:3"]
    box.listing = [ckpt(0, 6, 6)]  # the same folder, rewritten
    clock.now += 30
    ev.poll()
    ev.drain()
    assert box.evaluated == ["0:3:3", "0:6:6"]
    assert [e for e, _ in said].count("evaluated") == 2


def test_one_evaluation_at_a_time() -> None:
    box, clock, spawn = FakeBox(), Clock(), Deferred()
    ev, said = evaluator(box, spawn=spawn, clock=clock)
    box.listing = [ckpt(0, 3, 3)]
    ev.poll()
    assert len(spawn.pending) == 1 and ev.busy.is_set()
    box.listing = [ckpt(0, 3, 3), ckpt(1, 0, 10)]
    for _ in range(5):  # the first is still in flight: no second worker, however long
        clock.now += 100
        ev.poll()
    assert len(spawn.pending) == 1
    spawn.run()  # it evaluates the newest at the time it lists: epoch 1
    assert not ev.busy.is_set()
    ev.poll()
    assert box.evaluated == ["1:0:10"]
    assert [e for e, _ in said] == ["evaluating", "evaluated"]


def test_a_failure_is_said_and_tried_once_more_then_given_up() -> None:
    box, clock = FakeBox(), Clock()
    record = FakeRecord(run_id="r1")
    ev, said = evaluator(box, record, clock=clock)
    box.listing = [ckpt(0, 3, 3)]
    box.fail = ["0:3:3"]
    for _ in range(4):
        ev.poll()
        ev.drain()
        clock.now += 30
    assert box.evaluated == ["0:3:3", "0:3:3"]
    failed = [why for e, why in said if e == "evaluation_failed"]
    assert len(failed) == 2
    assert failed[0].endswith("the server did not come up; trying it once more")
    assert failed[1].endswith("the server did not come up; not trying it again")
    assert record["eval_failures"] == {"0:3:3": 2}
    box.listing = [ckpt(0, 3, 3), ckpt(0, 6, 6)]  # a newer one is tried as usual
    ev.poll()
    ev.drain()
    assert box.evaluated[-1] == "0:6:6" and said[-1][0] == "evaluated"


def test_a_watch_started_again_goes_on_without_repeating() -> None:
    box, record = FakeBox(), FakeRecord(run_id="r1")
    first, _ = evaluator(box, record)
    box.listing = [ckpt(0, 3, 3)]
    first.poll()
    # the watch ends (Ctrl-C, the workstation rebooted); a new one, same journal and record
    second, said = evaluator(box, record)
    second.poll()
    assert box.evaluated == ["0:3:3"] and said == []
    box.listing = [ckpt(0, 3, 3), ckpt(0, 6, 6)]
    third, _ = evaluator(box, record)
    third.poll()
    assert box.evaluated == ["0:3:3", "0:6:6"]


def test_after_a_restart_or_a_move_the_section_is_read_again_and_done_stays_done() -> None:
    box, clock = FakeBox(), Clock()
    record = FakeRecord(run_id="r1", host="a")
    ev, _ = evaluator(box, record, clock=clock)
    box.listing = [ckpt(0, 3, 3)]
    ev.poll()
    reads = box.spec_reads
    clock.now += 30
    ev.poll()
    assert box.spec_reads == reads  # one read per run
    # moved to another box as a new run; its checkpoints were copied there (same states)
    record.update(run_id="r2", host="b")
    box.section = DuringTrainingSpec(gpus=[3])
    clock.now += 30
    ev.poll()
    assert box.spec_reads == reads + 1 and box.evaluated == ["0:3:3"]
    box.listing = [ckpt(0, 3, 3), ckpt(1, 0, 10)]
    clock.now += 30
    ev.poll()
    assert box.evaluated == ["0:3:3", "1:0:10"]


def test_no_section_no_worker() -> None:
    box = FakeBox()
    box.section = None  # type: ignore[assignment]
    spawn = Deferred()
    ev, said = evaluator(box, spawn=spawn)
    box.listing = [ckpt(0, 3, 3)]
    ev.poll()
    ev.finish()
    assert spawn.pending == [] and box.evaluated == [] and said == []


def test_at_the_end_the_one_in_flight_ends_then_the_final_checkpoint() -> None:
    box, spawn = FakeBox(), Deferred()
    ev, said = evaluator(box, spawn=spawn)
    box.listing = [ckpt(0, 3, 3)]
    ev.poll()

    def in_flight_ends(busy: Any) -> None:
        spawn.run()  # it evaluates epoch 0, step 3; meanwhile the trainer saved its last
        box.listing = [ckpt(0, 3, 3), ckpt(1, 0, 10)]
    ev.finish(wait=in_flight_ends)
    assert box.evaluated == ["0:3:3", "1:0:10"]
    assert [e for e, _ in said] == ["evaluating", "evaluated"] * 2


def test_at_the_end_a_failed_final_checkpoint_is_tried_once_more() -> None:
    box = FakeBox()
    ev, said = evaluator(box)
    box.listing = [ckpt(1, 0, 10)]
    box.fail = ["1:0:10"]
    ev.finish()
    assert box.evaluated == ["1:0:10", "1:0:10"]
    assert [e for e, _ in said] == ["evaluating", "evaluation_failed"] * 2


def test_a_listing_that_fails_is_said_and_looked_at_again() -> None:
    box, clock = FakeBox(), Clock()
    ev, said = evaluator(box, clock=clock)

    def away() -> list[Checkpoint]:
        raise ConfigError("box away")
    box.checkpoints = away  # type: ignore[method-assign]
    ev.poll()
    ev.drain()
    assert said == [("evaluation_failed", "could not list the checkpoints to evaluate: box away")]
    box.checkpoints = lambda: [ckpt(0, 3, 3)]  # type: ignore[method-assign]
    clock.now += 30
    ev.poll()
    assert box.evaluated == ["0:3:3"]


def test_a_watch_that_ends_mid_evaluation_stops_its_server() -> None:
    box, spawn = FakeBox(), Deferred()
    ev, said = evaluator(box, spawn=spawn)
    ev.abandon()  # nothing in flight: nothing stopped
    assert box.stopped == 0 and said == []
    box.listing = [ckpt(0, 3, 3)]
    ev.poll()
    ev.abandon()
    assert box.stopped == 1
    assert said == [("evaluation_failed", "the watch ends during an evaluation: its server is "
                     "stopped; the checkpoint is evaluated when a watch runs again")]


def test_a_checkpoint_rewritten_while_evaluated_is_not_counted_and_the_newer_is_next() -> None:
    box, clock = FakeBox(), Clock()
    record = FakeRecord(run_id="r1")
    ev, said = evaluator(box, record, clock=clock)
    box.listing = [ckpt(1, 3, 13)]
    box.rewritten = ["1:3:13"]
    ev.poll()
    ev.drain()
    assert said[-1][0] == "evaluation_failed" and said[-1][1].endswith(
        "nothing recorded; the newer state is next")
    assert not record["eval_failures"] and box.journal == []
    box.listing = [ckpt(1, 6, 16)]  # what the trainer rewrote it with
    clock.now += 30
    ev.poll()
    ev.drain()
    assert box.evaluated == ["1:3:13", "1:6:16"] and said[-1][0] == "evaluated"


class ListingSession:
    """A session whose ``checkpoints`` op answers the agent's listing of one folder."""

    def __init__(self, state: dict[str, Any] | None, complete: bool = True) -> None:
        self.entry = {"epoch": 1, "path": "/d/ckpt/1", "complete": complete,
                      "why": "complete" if complete else "model.safetensors newer than "
                      "training_state.json", "files": {}, "training_state": state}
        self.calls: list[dict[str, Any]] = []

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        self.calls.append({"op": op, **fields})
        return {"checkpoints": [self.entry] if self.entry["training_state"] else []}


@pytest.mark.parametrize(("state", "complete", "now"), [
    ({"epoch": 1, "local_step": 6, "global_step": 16}, True, "now epoch 1, step 6, global step 16"),
    ({"epoch": 1, "local_step": 0, "global_step": 20}, True,
     "now end of epoch 1, global step 20"),
    ({"epoch": 1, "local_step": 3, "global_step": 13}, False, "now being written"),
    (None, True, "now gone"),
])
def test_a_measurement_of_a_rewritten_checkpoint_is_refused(
        state: dict[str, Any] | None, complete: bool, now: str) -> None:
    chosen = {"path": "/d/ckpt/1", "epoch": 1, "local_step": 3, "global_step": 13,
              "order_text": "epoch 1, step 3"}
    settings = type("S", (), {"scheduler": True})()
    session = ListingSession(state, complete)
    with pytest.raises(CheckpointRewritten) as info:
        unchanged(session, settings, chosen)  # type: ignore[arg-type]
    assert f"it held epoch 1, step 3 (global step 13) when the server started, and {now}" \
        in str(info.value)
    assert session.calls[0]["save_path"] == "/d/ckpt"
    same = ListingSession({"epoch": 1, "local_step": 3, "global_step": 13})
    unchanged(same, settings, chosen)  # type: ignore[arg-type]
    unchanged(same, settings, {"path": "/exported/drafter"})  # type: ignore[arg-type]
    assert len(same.calls) == 1  # an exported folder is not a trainer's: nothing to compare
