"""CPU rehearsal: outrig's own deploy drives the *real* speculators 0.9 trainer (opt-in).

The sandbox tests (tests/integration/test_dflash.py) prove the orchestration against
stand-ins that imitate speculators. This module removes that layer for the trainer: the
recipe's rendered commands run with the real ``speculators prepare-data``, the real
``torchrun`` and the real ``speculators.train`` on a tiny random Qwen3 verifier, on this
machine's CPU. Only vLLM is a stand-in (tests/standins/hs_vllm.py, which computes real hidden
states and writes them in ExampleHiddenStatesConnector's format), and the trainer's CUDA
assumptions are shimmed (tests/rehearsal/cpu_shim/sitecustomize.py).

It needs a Python with speculators 0.9 and torch, named by ``OUTRIG_REHEARSAL_PYTHON``;
without it every test here is skipped (CI has no torch). tests/rehearsal/README.md has the
one command and how to build that venv.

The helpers (:class:`Rehearsal`, the ``rehearsal`` fixture) are meant for more cases: a stop
during a save (``trainer_env={"REHEARSAL_SAVE_DELAY_S": "5"}`` stretches every save),
migrate between two ``hostname: local`` boxes (``Rehearsal.add_box``), ``--test`` runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.ops.base import Project
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import DeployResult, deploy
from outrig.ops.migrate import migrate
from outrig.sandbox import nvidia_smi
from tests.helpers import free_port, marked, wait_gone

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STANDIN = REPO / "tests" / "standins" / "hs_vllm.py"
CPU_SHIM = HERE / "cpu_shim"
MAKE_VERIFIER = HERE / "make_verifier.py"
FIXTURES = REPO / "tests" / "fixtures" / "vllm-0.33-cpu"
PYTHON_ENV = "OUTRIG_REHEARSAL_PYTHON"
# On a GPU machine (two GPUs: the recipe gives the server and the trainer one each) the same
# tests run with the box's real nvidia-smi, real CUDA/NCCL, flex attention and the loss the
# recipe picks for the box's torch; only the save-delay knob of cpu_shim stays (it is inert
# unless a test sets it).
GPU_ENV = "OUTRIG_REHEARSAL_GPU"
REAL_GPU = os.environ.get(GPU_ENV) == "1"
# Where to keep each test's logs and checkpoint listing (for fixtures); unset: nothing kept.
KEEP_ENV = "OUTRIG_REHEARSAL_KEEP"
# Generous: a 2-core machine imports torch + transformers in every process (~10 s each).
WAIT_S = float(os.environ.get("OUTRIG_REHEARSAL_WAIT_S", "300"))

# `python -m vllm.entrypoints.cli.main serve ...` in the rehearsal venv (which has no vLLM)
# finds this package first on PYTHONPATH and becomes hs_vllm.py, same pid, same argv.
VLLM_SHIM = """\
# rehearsal shim: `python -m vllm.entrypoints.cli.main ...` -> tests/standins/hs_vllm.py
import os, sys
os.execv(sys.executable, [sys.executable, {standin!r}, *sys.argv[1:]])
"""

# What the real trainer logs (speculators 0.9.0 train/trainer.py:309, :285, :295).
FRESH = "Starting fresh training run."
RESUMED = ("Resuming mid-epoch from epoch=", "Resuming training on epoch ")

pytestmark = pytest.mark.integration


# ------------------------------------------------------------------------------- fixtures


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


@dataclass
class Verifier:
    model: Path
    conversations: Path


@pytest.fixture(scope="session")
def verifier(rehearsal_python: str, tmp_path_factory: pytest.TempPathFactory) -> Verifier:
    """The tiny random Qwen3 verifier and its conversations, generated once per session."""
    out = tmp_path_factory.mktemp("verifier")
    # 24 conversations -> 32 rows -> ~13 steps of 256 tokens an epoch: a checkpoint every
    # ~3 steps with checkpoint_freq 0.25, the first within seconds of the trainer's start.
    done = subprocess.run([rehearsal_python, str(MAKE_VERIFIER), str(out), "--conversations",
                           "24"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    paths = json.loads(done.stdout.strip().splitlines()[-1])
    return Verifier(model=Path(paths["model"]), conversations=Path(paths["conversations"]))


# ------------------------------------------------------------------------------- the harness


@dataclass
class Rehearsal:
    """A project with ``hostname: local`` boxes and a dflash playbook for the real trainer.

    Each box is a host file with its own workdir and a fake ``nvidia-smi`` (no process holds
    fake GPU memory here; it only lets the planner and the GPU audit see GPUs). Data and
    checkpoints live outside the boxes' workdirs, as ``/workspace/...`` paths do on a rented
    box, so a later migrate case can copy them between boxes.
    """

    root: Path
    python: str
    verifier: Verifier
    journal: Journal
    reporter: Reporter = field(default_factory=lambda: Reporter(quiet=True))
    boxes: list[str] = field(default_factory=list)

    @property
    def project(self) -> Project:
        return Project(self.root)

    @property
    def data_path(self) -> Path:
        return self.root / "data" / "tokenized"

    @property
    def save_path(self) -> Path:
        return self.root / "data" / "checkpoints"

    def add_box(self, name: str, gpus: int = 2) -> str:
        """Write ``hosts/<name>.yaml`` (``hostname: local``) with ``gpus`` fake H200s (the
        machine's real GPUs and nvidia-smi with ``OUTRIG_REHEARSAL_GPU=1``)."""
        box = self.root / "boxes" / name
        hosts = self.root / "hosts"
        hosts.mkdir(exist_ok=True)
        self.boxes.append(name)
        if REAL_GPU:
            (hosts / f"{name}.yaml").write_text(yaml.safe_dump({
                "hostname": "local", "workdir": str(box / "workdir"),
                "python": sys.executable}))
            return name
        bin_dir, gpu_dir = box / "bin", box / "gpu"
        bin_dir.mkdir(parents=True)
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!{sys.executable}\n{Path(nvidia_smi.__file__).read_text()}")
        smi.chmod(0o755)
        nvidia_smi.write_inventory(
            gpu_dir, nvidia_smi.make_inventory(gpus, 143771, "NVIDIA H200", seed=name))
        (hosts / f"{name}.yaml").write_text(yaml.safe_dump({
            "hostname": "local", "workdir": str(box / "workdir"), "python": sys.executable,
            "env": {"PATH": f"{bin_dir}:$PATH", nvidia_smi.STATE_ENV: str(gpu_dir)}}))
        return name

    def shims(self) -> Path:
        """PYTHONPATH folder whose ``vllm`` package execs the hidden-state stand-in."""
        pkg = self.root / "shims"
        cli = pkg / "vllm" / "entrypoints" / "cli"
        if not cli.is_dir():
            cli.mkdir(parents=True)
            for folder in (pkg / "vllm", pkg / "vllm" / "entrypoints", cli):
                (folder / "__init__.py").write_text("")
            (cli / "main.py").write_text(VLLM_SHIM.format(standin=str(STANDIN)))
        return pkg

    def playbook(self, name: str = "rehearsal", *, port: int | None = None,
                 trainer_env: dict[str, str] | None = None, **dflash: Any) -> Path:
        """``playbooks/<name>.yaml`` with ``recipe: dflash``; ``dflash`` keys override.

        Sized for a 2-core CPU: 256-token batches of a few samples, 1 draft layer, 8 anchors
        of 8 tokens, one DataLoader worker, a checkpoint every quarter epoch (~3 steps). On
        real GPUs the attention and the loss are the recipe's own choices.
        """
        trainer_extra = ["--max-anchors", "8", "--num-layers", "1"]
        if not REAL_GPU:
            trainer_extra += ["--draft-attn-impl", "sdpa"]  # flex attention needs a compiler
        body: dict[str, Any] = {
            "name": name,
            "recipe": "dflash",
            "dflash": {
                "model": str(self.verifier.model),
                "data_path": str(self.data_path),
                "save_path": str(self.save_path),
                "seq_length": 256,
                "epochs": 3,
                "lr": 6e-4,
                "block_size": 8,
                "checkpoint_freq": 0.25,
                # the fused loss is a Triton (GPU) kernel; on a GPU the recipe decides
                "loss_implementation": "auto" if REAL_GPU else "eager",
                "target_layer_ids": [1, 2, 3],
                "server": {"gpus": [0], "port": port or free_port(), "python": self.python,
                           "env": {"PYTHONPATH": _path_with(self.shims())},
                           "ready_timeout": WAIT_S, "stop_grace": 30},
                "trainer": {"gpus": [1], "python": self.python, "num_workers": 1,
                            "extra_args": trainer_extra, "ready_timeout": WAIT_S,
                            "env": {"PYTHONPATH": _path_with(CPU_SHIM),
                                    **(trainer_env or {})}},
                "prepare": {"data": [str(self.verifier.conversations)], "timeout": WAIT_S,
                            "workers": 1},
            },
        }
        body["dflash"].update(dflash)
        folder = self.root / "playbooks"
        folder.mkdir(exist_ok=True)
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(body, sort_keys=False))
        return path

    # -- ops
    def deploy(self, box: str, playbook: Path, **kw: Any) -> DeployResult:
        return deploy(self.project, box, str(playbook), self.reporter, journal=self.journal,
                      **kw)

    def cleanup(self, box: str, **kw: Any) -> dict[str, Any]:
        return cleanup(self.project, box, self.reporter, journal=self.journal, **kw)

    # -- what happened on the box
    def workdir(self, box: str) -> Path:
        return Path(yaml.safe_load((self.root / "hosts" / f"{box}.yaml").read_text())["workdir"])

    def log_path(self, box: str, run_id: str, process: str) -> Path:
        return self.workdir(box) / "runs" / run_id / "logs" / f"{process}.log"

    def log(self, box: str, run_id: str, process: str) -> str:
        path = self.log_path(box, run_id, process)
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_log(self, box: str, run_id: str, process: str, needle: str,
                 timeout: float = WAIT_S) -> str:
        """The log once it contains ``needle``; fails with its tail otherwise."""
        text = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log(box, run_id, process)
            if needle in text:
                return text
            time.sleep(0.25)
        pytest.fail(f"{process} never logged {needle!r} in {timeout:g}s; tail:\n{text[-3000:]}")

    def training_state(self, folder: str, save: Path | None = None) -> dict[str, Any] | None:
        path = (save or self.save_path) / folder / "training_state.json"
        try:
            data: dict[str, Any] = json.loads(path.read_text())
            return data
        except (OSError, ValueError):
            return None

    def wait_checkpoint(self, accept: Callable[[Path], bool], what: str,
                        timeout: float = WAIT_S, save: Path | None = None) -> Path:
        """The first entry of the save path (``save`` or the default) that ``accept`` takes."""
        save = save or self.save_path
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if save.is_dir():
                for entry in sorted(save.iterdir()):
                    if accept(entry):
                        return entry
            time.sleep(0.25)
        listing = sorted(p.name for p in save.iterdir()) if save.is_dir() else "no save path"
        pytest.fail(f"no {what} in {timeout:g}s: {listing}")


def _path_with(folder: Path) -> str:
    """``folder`` first, then this process's own PYTHONPATH (where the packages may live,
    e.g. wheels unpacked beside a GPU image's own site-packages)."""
    return os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)


def mid_epoch_link(entry: Path) -> bool:
    """``epoch<E>_step<K> -> E``: speculators links it after a complete mid-epoch save
    (train/trainer.py:694-707), so the folder it names holds every file of that save."""
    return entry.is_symlink() and "_step" in entry.name


@pytest.fixture
def rehearsal(rehearsal_python: str, verifier: Verifier, tmp_path: Path,
              request: pytest.FixtureRequest) -> Iterator[Rehearsal]:
    """A fresh project with one box; everything launched on any of its boxes is stopped by
    outrig's own cleanup at teardown, then checked gone by the run marker."""
    r = Rehearsal(root=tmp_path / "project", python=rehearsal_python, verifier=verifier,
                  journal=Journal(tmp_path / "state"))
    r.root.mkdir()
    r.add_box("cpu-box")
    yield r
    keep = os.environ.get(KEEP_ENV)
    if keep:
        _keep_evidence(r, Path(keep) / request.node.name)
    for box in r.boxes:
        runs = r.workdir(box) / "runs"
        try:
            r.cleanup(box, all_runs=True)
        except Exception as exc:  # the test's own failure matters more; say what was left
            print(f"teardown cleanup on {box} failed: {exc}", file=sys.stderr)
        if runs.is_dir():
            left = [pid for run in runs.iterdir() for pid in marked(run.name)]
            assert not wait_gone(left, 30), f"processes of the rehearsal outlived cleanup: {left}"


def _keep_evidence(r: Rehearsal, dest: Path) -> None:
    """Copy every run's logs and a listing of each save path (with training_state.json)."""
    dest.mkdir(parents=True, exist_ok=True)
    listing: list[str] = []
    for box in r.boxes:
        runs = r.workdir(box) / "runs"
        for run in sorted(runs.iterdir()) if runs.is_dir() else []:
            for log in sorted((run / "logs").glob("*.log")):
                (dest / f"{box}-{run.name}-{log.name}").write_bytes(log.read_bytes())
        for save in (r.save_path, r.workdir(box) / "data" / "checkpoints"):
            if not save.is_dir():
                continue
            listing.append(f"== {box}: {save.name}")
            for entry in sorted(save.rglob("*")):
                rel = entry.relative_to(save)
                link = f" -> {os.readlink(entry)}" if entry.is_symlink() else ""
                listing.append(f"{rel}{link}")
                if entry.name == "training_state.json" and not entry.is_symlink():
                    listing.append(f"  {entry.read_text().strip()}")
    (dest / "checkpoints.txt").write_text("\n".join(listing) + "\n")


# ------------------------------------------------------------------------------- tests


def test_real_trainer_checkpoints_mid_epoch_and_resumes_after_cleanup(
        rehearsal: Rehearsal) -> None:
    r = rehearsal
    box = "cpu-box"
    playbook = r.playbook()

    first = r.deploy(box, playbook)
    run_id = first.plan.run_id
    assert [p["name"] for p in first.processes] == ["server", "prepare", "trainer"]
    server = first.plan.processes["server"].argv
    assert "--enable-scale-out" in server, "prepare-data's render route answers 403 without it"

    # prepare-data rendered every conversation through the stand-in's render route
    prepare = r.log(box, run_id, "prepare")
    assert "No samples remain" not in prepare and "returned 403" not in prepare, prepare[-3000:]
    assert "Per-turn fan-out:" in prepare
    assert sorted(p.name for p in r.data_path.glob("data-*.arrow")), prepare[-3000:]

    # the real trainer started fresh, fetched hidden states, and saved within epoch 0
    trainer = r.log(box, run_id, "trainer")
    assert FRESH in trainer, trainer[-3000:]
    link = r.wait_checkpoint(mid_epoch_link, "mid-epoch checkpoint link")
    state = r.training_state(os.readlink(link))
    assert state is not None and state["local_step"] > 0, state
    trainer = r.log(box, run_id, "trainer")
    assert "POST /v1/completions" in r.log(box, run_id, "server")
    assert "Hidden-state generation circuit breaker" not in trainer
    assert "Traceback" not in trainer, trainer[-3000:]

    # stop mid-run; outrig signals the ranks first, so the interrupt save runs to its end
    report = r.cleanup(box, playbook=str(playbook))
    stopped = {p["process"]: p["how"] for run in report["runs"] for p in run["processes"]}
    assert stopped.get("trainer") == "term", stopped
    trainer = r.log(box, run_id, "trainer")
    assert f"Interrupt checkpoint saved to '{r.save_path}/interrupted'" in trainer, \
        trainer[-3000:]
    assert "killed by signal" not in trainer
    assert {"model.safetensors", "optimizer_state_dict.pt", "scheduler_state_dict.pt"} <= {
        p.name for p in (r.save_path / "interrupted").iterdir()}

    # redeploy: prepare is skipped by speculators itself, the trainer resumes
    second = r.deploy(box, playbook)
    assert "skipping preprocessing" in r.log(box, second.plan.run_id, "prepare")
    resumed = r.log(box, second.plan.run_id, "trainer")
    assert "Found interrupted checkpoint at" in resumed  # never resumed from by speculators
    assert "Found checkpoint at" in resumed and any(line in resumed for line in RESUMED), \
        resumed[-3000:]
    r.wait_log(box, second.plan.run_id, "trainer", "Saving checkpoint to")


def test_a_clean_interrupt_leaves_torchrun_exiting_0(rehearsal: Rehearsal) -> None:
    """After the ranks saved interrupted/ and exited 0, torchrun has nothing left to do and
    exits 0 by itself; a stop should not turn that into a traceback and exit 1."""
    r = rehearsal
    box = "cpu-box"
    playbook = r.playbook()
    run = r.deploy(box, playbook)
    r.wait_checkpoint(mid_epoch_link, "mid-epoch checkpoint link")
    r.cleanup(box, playbook=str(playbook))
    trainer = r.log(box, run.plan.run_id, "trainer")
    assert "Interrupt checkpoint saved to" in trainer, trainer[-3000:]
    record = json.loads((r.workdir(box) / "runs" / run.plan.run_id / "run.json").read_text())
    exit_file = next(p["exit_file"] for p in record["processes"] if p["name"] == "trainer")
    assert json.loads(Path(exit_file).read_text())["code"] == 0, trainer[-2000:]
    assert "SignalException" not in trainer


def test_a_stop_during_a_save_never_resumes_from_the_torn_folder(rehearsal: Rehearsal) -> None:
    """Stop the trainer while it rewrites checkpoint folder 1 in place (a mid-epoch save of
    epoch 1). The real trainer abandons the save: ``1/`` then holds the new model with the old
    optimizer, scheduler and ``training_state.json``, and speculators would resume from it
    unchecked (train/checkpointer.py picks the highest integer folder). outrig judges ``1/``
    incomplete, moves it aside before the next launch, and the trainer resumes from ``0/``,
    the end of epoch 0."""
    r = rehearsal
    box = "cpu-box"
    # every save pauses after model.safetensors (cpu_shim's knob), as a real one takes seconds
    playbook = r.playbook(trainer_env={"REHEARSAL_SAVE_DELAY_S": "8"})
    run = r.deploy(box, playbook)
    run_id = run.plan.run_id
    rewrite = f"Saving checkpoint to {r.save_path}/1"
    deadline = time.monotonic() + WAIT_S * 2
    while r.log(box, run_id, "trainer").count(rewrite) < 2:  # the in-place rewrite began
        assert time.monotonic() < deadline, r.log(box, run_id, "trainer")[-3000:]
        time.sleep(0.2)
    r.cleanup(box, playbook=str(playbook))

    trainer = r.log(box, run_id, "trainer")
    assert "Interrupt checkpoint saved to" in trainer, trainer[-3000:]
    folder = r.save_path / "1"
    state = folder / "training_state.json"
    model = folder / "model.safetensors"
    assert model.stat().st_mtime > state.stat().st_mtime, (
        "the stop landed outside the save; the test needs it inside: "
        f"{sorted(p.name for p in folder.iterdir())}")
    end_of_epoch_0 = r.training_state("0")
    assert end_of_epoch_0 is not None and end_of_epoch_0["epoch"] == 0, end_of_epoch_0
    assert end_of_epoch_0["local_step"] == 0, "folder 0 holds the end of epoch 0"

    second = r.deploy(box, playbook)
    moved = [p.name for p in r.save_path.iterdir() if p.name.startswith("1.incomplete-")]
    assert moved, sorted(p.name for p in r.save_path.iterdir())
    resumed = r.wait_log(box, second.plan.run_id, "trainer", "Resuming training on epoch 1")
    assert f"Found checkpoint at {r.save_path}/0" in resumed, resumed[-3000:]
    assert f"{r.save_path}/1." not in resumed.split("Resuming", 1)[0]


def test_migrate_between_two_boxes_resumes_from_the_newest_complete_checkpoint(
        rehearsal: Rehearsal) -> None:
    """Two ``hostname: local`` boxes with their own data and checkpoint folders
    (``${workdir}/...``). ``migrate`` stops the old run (its ranks save ``interrupted/``),
    copies the newest complete numbered checkpoint to the new box and deploys there; the real
    trainer on the new box resumes mid-epoch from it."""
    r = rehearsal
    old, new = "cpu-box", r.add_box("new-box")
    playbook = r.playbook("movable", data_path="${workdir}/data/tokenized",
                          save_path="${workdir}/data/checkpoints")
    old_save = r.workdir(old) / "data" / "checkpoints"
    new_save = r.workdir(new) / "data" / "checkpoints"
    r.deploy(old, playbook)
    link = r.wait_checkpoint(mid_epoch_link, "mid-epoch checkpoint link", save=old_save)
    assert r.training_state(os.readlink(link), old_save) is not None

    report = migrate(r.project, old, new, r.reporter, playbook=str(playbook),
                     journal=r.journal, probe_attempts=1)
    assert report["old_alive"] is True
    checkpoint = report["checkpoint"]
    assert checkpoint is not None and checkpoint["epoch"] == 0, report
    copied = r.training_state("0", new_save)
    assert copied is not None, report
    # the newest complete one: what the old box held once its run had stopped
    assert copied == r.training_state("0", old_save)
    if copied["local_step"] > 0:
        resumed = r.wait_log(new, report["run_id"], "trainer",
                             "Resuming mid-epoch from epoch=0")
        assert f"local_step={copied['local_step']} " in resumed, resumed[-3000:]
    else:
        # The trainer finished epoch 0 (and rewrote ``0/`` as the end-of-epoch save) before
        # migrate stopped it: a slower workstation loses that race on a loaded machine. The
        # newest complete checkpoint is then the whole epoch, and the resume starts epoch 1.
        resumed = r.wait_log(new, report["run_id"], "trainer", "Resuming training on epoch 1")
    assert f"Found checkpoint at {new_save}/0" in resumed, resumed[-3000:]
    r.wait_log(new, report["run_id"], "trainer", f"Saving checkpoint to {new_save}/")


def test_prepare_fails_with_the_403_when_scale_out_is_off(rehearsal: Rehearsal) -> None:
    """vLLM 0.33 answers the render route 403 without --enable-scale-out; speculators then
    drops every conversation and exits "No samples remain". Run by hand (not through the
    recipe, which always renders the flag) against the stand-in, with the real prepare-data."""
    r = rehearsal
    port = free_port()
    hs = r.root / "hs"
    argv = [r.python, str(STANDIN), "serve", str(r.verifier.model),
            "--speculative_config", json.dumps({
                "method": "extract_hidden_states", "num_speculative_tokens": 1,
                "draft_model_config": {"hf_config": {
                    "eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]}}}),
            "--kv_transfer_config", json.dumps({
                "kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": str(hs)}}),
            "--max-model-len", "257", "--port", str(port), "--host", "127.0.0.1"]
    server_log = r.root / "server.log"
    with server_log.open("w") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + WAIT_S
        while "Application startup complete." not in server_log.read_text():
            assert server.poll() is None, server_log.read_text()[-3000:]
            assert time.monotonic() < deadline, server_log.read_text()[-3000:]
            time.sleep(0.25)
        assert "Scale-out endpoints are disabled" in server_log.read_text()
        env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="300")
        done = subprocess.run(
            [r.python, "-m", "speculators", "prepare-data", "--model", str(r.verifier.model),
             "--data", str(r.verifier.conversations), "--render-endpoint",
             f"http://127.0.0.1:{port}", "--output", str(r.root / "out"),
             "--seq-length", "256", "--num-preprocessing-workers", "1"],
            capture_output=True, text=True, env=env, timeout=WAIT_S)
        text = done.stdout + done.stderr
        assert done.returncode == 1, text[-3000:]
        assert "Render endpoint returned 403" in text and "--enable-scale-out" in text
        assert "No samples remain after preprocessing" in text
        assert not list((r.root / "out").glob("*.arrow"))
        server.terminate()
        assert server.wait(30) == 0, "the stand-in exits 0 on SIGTERM, as vLLM does"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)


def test_stand_in_render_answers_as_real_vllm(rehearsal: Rehearsal) -> None:
    """The stand-in's render answer equals what real vLLM 0.33's render server gave for the
    same model and requests (tests/fixtures/vllm-0.33-cpu/, captured on CPU), request id
    aside; the 403 and /v1/models answers have the same shape."""
    r = rehearsal
    probe = r.root / "probe.py"
    probe.write_text(PROBE.format(standin=str(STANDIN)))
    done = subprocess.run([r.python, str(probe), str(r.verifier.model)],
                          capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("render_gen", "render_full"):
        want = json.loads((FIXTURES / f"{name}.json").read_text())
        assert got[name]["request_id"].startswith("chatcmpl-")
        assert {k: v for k, v in got[name].items() if k != "request_id"} == \
            {k: v for k, v in want.items() if k != "request_id"}, name
    assert got["render_403"] == json.loads((FIXTURES / "render_403.json").read_text())
    # recorded at --max-model-len 8193 by tests/contract (tests/fixtures/vllm-render/)
    over = json.loads((FIXTURES.parent / "vllm-render" /
                       "truncate-over-max-model-len-400.json").read_text())
    text = json.dumps(over["response"]).replace("8194", "258").replace("8193", "257")
    assert got["truncate_400"] == {"status": over["status"], "response": json.loads(text)}
    want_card = json.loads((FIXTURES / "models.json").read_text())["data"][0]
    card = got["models"]["data"][0]
    assert card["id"] == card["root"] == str(r.verifier.model)  # the path as typed
    assert set(card) == set(want_card)
    assert set(card["permission"][0]) == set(want_card["permission"][0])
    assert {k: card[k] for k in ("object", "owned_by", "parent", "max_model_len")} == \
        {k: want_card[k] for k in ("object", "owned_by", "parent", "max_model_len")}


# Builds the stand-in's app in-process (no socket) and asks it what the fixtures recorded.
PROBE = """\
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("hs_vllm", {standin!r})
hs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hs)
model = sys.argv[1]
args = hs.parse_args(["serve", model, "--max-model-len", "257", "--enable-scale-out"])
verifier = hs.Verifier(model, [1, 2, 3, 4], "auto", None, False)
on = hs.App(args, verifier, hs.HiddenStatesWriter({{}}))
msgs = [{{"role": "user", "content": "hello the model?"}}]
full = msgs + [{{"role": "assistant", "content": "one two three."}}]
cut = {{"truncate_prompt_tokens": 256, "truncation_side": "right"}}
out = {{
    "render_gen": on.render_chat(dict(messages=msgs, add_generation_prompt=True, **cut), None),
    "render_full": on.render_chat(dict(messages=full, add_generation_prompt=False, **cut),
                                  None),
    "render_403": hs.error_body(hs.SCALE_OUT_DISABLED, "PermissionDeniedError", 403),
    "models": on.models(),
}}
try:
    on.render_chat(dict(messages=msgs, add_generation_prompt=True,
                        truncate_prompt_tokens=258, truncation_side="right"), None)
except hs.HTTPError as exc:
    out["truncate_400"] = {{"status": exc.code, "response": exc.body}}
print(json.dumps(out))
"""
