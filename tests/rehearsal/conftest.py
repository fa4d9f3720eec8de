"""Fixtures of the CPU rehearsal: the trainer's interpreter (the real vLLM's is
``vllm_python`` in tests/conftest.py), the verifier, the harness,
and one real training on the real CPU vLLM that several tests (and an evaluator) share.

``real_training`` is session-scoped because each real-vLLM deploy costs a server start of
70-150 s on a loaded 2-core machine (tests/rehearsal/README.md has the numbers): it deploys
once, interrupts, redeploys and lets the trainer finish, and the tests read what happened.
Under ``pytest -n`` each worker has its own session: the first worker that needs it trains
and the others read its record (``real_training``'s docstring), so the training happens once
per test run whichever workers the tests land on.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from outrig.journal import Journal
from tests.rehearsal.during_training import evaluate_during_training, watch_in_thread
from tests.rehearsal.harness import (
    GPU_ENV,
    HERE,
    KEEP_ENV,
    MAKE_VERIFIER,
    PYTHON_ENV,
    REAL_EPOCHS,
    REAL_GPU,
    RESUMED,
    VLLM_PYTHON_ENV,
    WAIT_S,
    RealTraining,
    Rehearsal,
    TrainedDrafter,
    Verifier,
    keep_evidence,
    mid_epoch_link,
)
from tests.support.processes import marked, wait_gone

PROBE = HERE / "hidden_states_probe.py"


@pytest.fixture(scope="session")
def rehearsal_python() -> str:
    """The interpreter with speculators 0.9 + torch; skips the module when not configured."""
    python = os.environ.get(PYTHON_ENV)
    if not python:
        pytest.skip(f"CPU rehearsal is opt-in: set {PYTHON_ENV} to a Python with "
                    "speculators 0.9 and torch (tests/rehearsal/README.md)")
    probe = subprocess.run(
        [python, "-c", "import importlib.metadata as m, json, torch; print(json.dumps("
         "{**{d: m.version(d) for d in ('speculators', 'torch', 'transformers')}, "
         "'gpus': torch.cuda.device_count()}))"],
        capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:  # opted in with a broken interpreter: say so, do not skip
        pytest.fail(f"{PYTHON_ENV}={python} cannot report speculators/torch/transformers: "
                    f"{probe.stderr.strip()[-500:]}")
    versions = json.loads(probe.stdout)
    assert versions["speculators"].startswith("0.9"), versions
    if REAL_GPU and versions["gpus"] < 2:
        pytest.fail(f"{GPU_ENV}=1 needs 2 GPUs (server and trainer); torch sees "
                    f"{versions['gpus']}")
    return python


@pytest.fixture(scope="session")
def verifier(rehearsal_python: str, tmp_path_factory: pytest.TempPathFactory) -> Verifier:
    """The tiny random Qwen3 verifier and its conversations, generated once per session.

    Made with ``--preset vllm-cpu`` (head_dim 64: what the real CPU vLLM's attention takes)
    by ``$OUTRIG_VLLM_PYTHON`` when set, else by the rehearsal interpreter (both have torch,
    transformers and tokenizers), so the stand-in and the real vLLM serve the same model.
    """
    out = tmp_path_factory.mktemp("verifier")
    python = os.environ.get(VLLM_PYTHON_ENV) or rehearsal_python
    # 24 conversations -> 32 rows -> ~13 steps of 256 tokens an epoch: a checkpoint every
    # ~3 steps with checkpoint_freq 0.25, the first within seconds of the trainer's start.
    done = subprocess.run([python, str(MAKE_VERIFIER), str(out), "--conversations", "24",
                           "--preset", "vllm-cpu"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    paths = json.loads(done.stdout.strip().splitlines()[-1])
    return Verifier(model=Path(paths["model"]), conversations=Path(paths["conversations"]))


def _stop_everything(r: Rehearsal) -> None:
    """outrig's own cleanup of every run on every box, then the run markers must be gone."""
    for box in r.boxes:
        runs = r.workdir(box) / "runs"
        try:
            r.cleanup(box, all_runs=True)
        except Exception as exc:  # the test's own failure matters more; say what was left
            print(f"teardown cleanup on {box} failed: {exc}", file=sys.stderr)
        if runs.is_dir():
            left = [pid for run in runs.iterdir() for pid in marked(run.name)]
            assert not wait_gone(left, 30), f"processes of the rehearsal outlived cleanup: {left}"


@pytest.fixture
def rehearsal(rehearsal_python: str, verifier: Verifier, tmp_path: Path,
              request: pytest.FixtureRequest) -> Iterator[Rehearsal]:
    """A fresh project with one box; everything launched on any of its boxes is stopped by
    outrig's own cleanup at teardown, then checked gone by the run marker."""
    r = Rehearsal(root=tmp_path / "project", python=rehearsal_python, verifier=verifier,
                  journal=Journal(tmp_path / "state"),
                  vllm_python=os.environ.get(VLLM_PYTHON_ENV))
    r.root.mkdir()
    r.add_box("cpu-box")
    yield r
    keep = os.environ.get(KEEP_ENV)
    if keep:
        keep_evidence(r, Path(keep) / request.node.name)
    _stop_everything(r)


# --------------------------------------------------------------------- the real training


def _logs(r: Rehearsal, box: str, run_id: str) -> dict[str, str]:
    return {name: r.log(box, run_id, name) for name in ("server", "prepare", "trainer")}


def _train_for_real(r: Rehearsal) -> RealTraining:
    box = "cpu-box"
    playbook = r.playbook("real", real_vllm=True, epochs=REAL_EPOCHS)
    evaluate_during_training(playbook, r.vllm_python)
    first = r.deploy(box, playbook)
    run_id = first.plan.run_id
    # the probe first (the server is up once deploy returns), so the stop below comes soon
    # after the first mid-epoch save, while epoch 0 still runs
    server = first.plan.processes["server"]
    endpoint = server.ready.http.rsplit("/", 1)[0] if server.ready and server.ready.http else ""
    text = json.loads(r.verifier.conversations.read_text().splitlines()[0])
    probe = subprocess.run(
        [r.python, str(PROBE), endpoint, str(r.verifier.model), json.dumps([1, 2, 3, 4]),
         text["conversations"][0]["content"]],
        capture_output=True, text=True, timeout=WAIT_S)
    assert probe.returncode == 0, probe.stderr[-3000:]
    link = r.wait_checkpoint(mid_epoch_link, "mid-epoch checkpoint link")
    mid_epoch = r.training_state(os.readlink(link)) or {}
    before_stop = r.log(box, run_id, "trainer")
    stop = r.cleanup(box, playbook=str(playbook))
    first_logs = _logs(r, box, run_id)
    first_exit = r.exit_code(box, run_id, "trainer")
    # what the trainer resumes from: the highest numbered folder (speculators' checkpointer
    # picks it): 0 mid-way, or, where the stop came later than the first mid-epoch save (a
    # loaded machine), 0 at its end or 1 mid-way
    numbered = [int(p.name) for p in r.save_path.iterdir() if p.name.isdigit()]
    resume_folder = str(max(numbered, default=0))
    resume_from = r.training_state(resume_folder) or {}
    second = r.deploy(box, playbook)
    second_id = second.plan.run_id
    # outrig watch follows the resumed run and evaluates its checkpoints as they come (on
    # GPU 2, set aside: the CPU build ignores it), then the final one once the trainer ends
    watching = watch_in_thread(r, box, second_id)
    # Either resume line: which one the trainer logs, and that it matches the checkpoint
    # read above, is test_rehearsal_cpu's to check (with the log in its message), not a wait
    # that times out. The second start (a real vLLM and trainer again) is slow on a loaded
    # machine: it gets the time the trainer's exit gets.
    r.wait_log(box, second_id, "trainer", RESUMED, timeout=WAIT_S * 3)
    second_exit = r.wait_exit(box, second_id, "trainer", timeout=WAIT_S * 3)
    second_logs = _logs(r, box, second_id)
    during = watching.evidence()  # the watch's events, the evaluations, status, the report
    r.cleanup(box, playbook=str(playbook))  # the server too: nothing of it outlives the fixture
    return RealTraining(
        box=box, model=str(r.verifier.model), conversations=str(r.verifier.conversations),
        data_path=str(r.data_path), save_path=str(r.save_path),
        processes=[p["name"] for p in first.processes], server_argv=list(server.argv),
        mid_epoch=mid_epoch, probe=json.loads(probe.stdout.strip().splitlines()[-1]),
        trainer_before_stop=before_stop, resume_folder=resume_folder, resume_from=resume_from,
        first_stop=json.loads(json.dumps(stop, default=str)), first_logs=first_logs,
        first_trainer_exit=first_exit, second_logs=second_logs,
        second_trainer_exit=second_exit, checkpoint=str(r.save_path / str(REAL_EPOCHS - 1)),
        during_training=during)


def _train_once(rehearsal_python: str, vllm_python: str, verifier: Verifier,
                tmp_path_factory: pytest.TempPathFactory) -> RealTraining:
    """Train, keep the evidence, stop everything; raise what went wrong."""
    root = tmp_path_factory.mktemp("real-training")
    r = Rehearsal(root=root / "project", python=rehearsal_python, verifier=verifier,
                  journal=Journal(root / "state"), vllm_python=vllm_python)
    r.root.mkdir()
    r.add_box("cpu-box", gpus=3)  # GPU 2 set aside for the evaluation during training
    try:
        return _train_for_real(r)
    finally:
        keep = os.environ.get(KEEP_ENV)
        if keep:
            keep_evidence(r, Path(keep) / "real_training")
        _stop_everything(r)


@pytest.fixture(scope="session")
def real_training(rehearsal_python: str, vllm_python: str, verifier: Verifier,
                  tmp_path_factory: pytest.TempPathFactory) -> RealTraining:
    """One real training, real on both sides: the real CPU vLLM (``$OUTRIG_VLLM_PYTHON``,
    hidden states through ExampleHiddenStatesConnector with vllm_cpu_shim/) and the real
    speculators trainer. Two server starts in all; everything it started is stopped before
    the tests read the record.

    Under pytest-xdist each worker has a session of its own, so the first worker to ask
    trains, under a lock in the run's shared temporary folder, and writes the record (or its
    failure) there; the others wait on the lock and read it. (``--dist loadgroup`` would not
    do: xdist 3.8's group suffix is lost under pytest 9.2, whose Node.nodeid reads ``_id``.)
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return _train_once(rehearsal_python, vllm_python, verifier, tmp_path_factory)
    shared = tmp_path_factory.getbasetemp().parent  # pytest-N/, one per test run
    record = shared / "real-training.json"
    with (shared / "real-training.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not record.exists():
            try:
                done = _train_once(rehearsal_python, vllm_python, verifier, tmp_path_factory)
            except BaseException as exc:
                record.write_text(json.dumps({"error": f"{type(exc).__name__}: {exc}"[-4000:],
                                              "worker": worker}))
                raise
            record.write_text(json.dumps(dataclasses.asdict(done)))
    data = json.loads(record.read_text())
    if "error" in data:
        pytest.fail(f"the shared real training failed in {data['worker']}: {data['error']}")
    return RealTraining(**data)


@pytest.fixture(scope="session")
def trained_drafter(real_training: RealTraining) -> TrainedDrafter:
    """The drafter ``real_training`` trained (no training of its own), for an evaluator:
    serve ``verifier`` with ``--speculative-config '{"method": "dflash", "model":
    checkpoint, "num_speculative_tokens": num_speculative_tokens}'``."""
    checkpoint = Path(real_training.checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    methods = config["speculators_config"]["proposal_methods"]
    return TrainedDrafter(
        checkpoint=checkpoint, verifier=Path(real_training.model),
        conversations=Path(real_training.conversations),
        block_size=int(config["block_size"]),
        num_speculative_tokens=int(methods[0]["speculative_tokens"]))
