"""``recipe: dflash`` end to end on the sandbox box (a real sshd on 127.0.0.1, fake GPUs).

The recipe's rendered commands run unchanged; only the interpreters are pointed at test shims:
``<python> -m vllm.entrypoints.cli.main`` and ``<python> -m speculators`` find shim packages
through ``PYTHONPATH`` (set with the recipe's own env keys), and ``torchrun`` is a shim script.
The vLLM shim and the torchrun shim exec the stand-ins (tests/standins/fake_vllm.py and
fake_trainer.py); the prepare-data shim is a small fake that honours speculators' skip rule
(exit 0 when the output already holds ``*.arrow``). The model directory is real (config.json +
safetensors index), so deploy's ``model_facts`` probe reads its layer count on the "box".
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.errors import PlanError
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import deploy
from outrig.session import Project
from tests.support.network import free_port
from tests.support.runs import box_workdir

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)

VLLM_SHIM = """\
# test shim: `python -m vllm.entrypoints.cli.main serve ...` -> the vLLM stand-in (same pid)
import os, sys
os.execv(sys.executable, [sys.executable, {fake!r}, *sys.argv[1:]])
"""

PREPARE_SHIM = """\
# test shim: `python -m speculators prepare-data ...`, with speculators' skip rule
import argparse, glob, json, os, sys, urllib.error, urllib.request
args = sys.argv[1:]
assert args[0] == "prepare-data", args
p = argparse.ArgumentParser()
for name in ("--model", "--render-endpoint", "--output", "--seq-length", "--max-samples"):
    p.add_argument(name)
p.add_argument("--data", action="append")
ns = p.parse_args(args[1:])
if glob.glob(os.path.join(ns.output, "*.arrow")):
    print("Dataset files already exist in output directory, skipping preprocessing.",
          flush=True)
    sys.exit(0)
req = urllib.request.Request(ns.render_endpoint + "/v1/chat/completions/render",
                             data=json.dumps({{"model": ns.model, "messages": []}}).encode(),
                             headers={{"Content-Type": "application/json"}})
try:
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200
except urllib.error.HTTPError as exc:  # speculators treats a 4xx render answer as final
    print("Render failed with %d: %s" % (exc.code, exc.read().decode()), flush=True)
    print("ValueError: No samples remain after preprocessing", flush=True)
    sys.exit(1)
os.makedirs(ns.output, exist_ok=True)
with open(os.path.join(ns.output, "data-00000-of-00001.arrow"), "wb") as f:
    f.write(b"fake arrow")
print("rendered %s samples from %s via %s" % (ns.max_samples, ns.data, ns.render_endpoint),
      flush=True)
"""

TORCHRUN_SHIM = """\
#!{python}
# test shim: torchrun [launcher args] -m speculators.train ARGS -> the torchrun stand-in, which
# starts the trainer stand-in as its ranks (each in a session of its own, as torchrun does)
import json, os, sys
os.environ["FAKE_TORCHRUN_MODULES"] = json.dumps({{"speculators.train": {fake!r}}})
os.execv(sys.executable, [sys.executable, {torchrun!r}, *sys.argv[1:]])
"""


def make_shims(root: Path, standin: Any) -> tuple[Path, Path]:
    """(PYTHONPATH dir with the vllm and speculators shim packages, torchrun script)."""
    pkg = root / "pythonpath"
    cli = pkg / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for folder in (pkg / "vllm", pkg / "vllm" / "entrypoints", cli):
        (folder / "__init__.py").write_text("")
    (cli / "main.py").write_text(VLLM_SHIM.format(fake=str(standin("fake_vllm"))))
    spec = pkg / "speculators"
    spec.mkdir()
    (spec / "__init__.py").write_text("")
    (spec / "__main__.py").write_text(PREPARE_SHIM.format())
    torchrun = root / "bin" / "torchrun"
    torchrun.parent.mkdir()
    torchrun.write_text(TORCHRUN_SHIM.format(python=sys.executable,
                                             fake=str(standin("fake_trainer")),
                                             torchrun=str(standin("fake_torchrun"))))
    torchrun.chmod(0o755)
    return pkg, torchrun


def make_model(path: Path, layers: int) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(
        {"architectures": ["Qwen3_5ForConditionalGeneration"],
         "text_config": {"num_hidden_layers": layers}}))
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 16_000_000_000}, "weight_map": {}}))
    return path


def dflash_playbook(tmp_path: Path, standin: Any, *, model: Path, port: int,
                    trainer_args: tuple[str, ...] = ("--fake-steps-per-epoch", "3",
                                                     "--fake-step-seconds", "0.2"),
                    **section: Any) -> Path:
    pythonpath, torchrun = make_shims(tmp_path / "shims", standin)
    data = tmp_path / "box-data"
    body = {
        "name": "dflash-sandbox",
        "recipe": "dflash",
        "dflash": {
            "model": str(model),
            "data_path": str(data / "tokenized"),
            "save_path": str(data / "checkpoints"),
            "seq_length": 512,
            "max_samples": 32,
            "epochs": 4,
            "lr": 6e-4,
            "target_layer_ids": [1, 3, 6],
            "server": {"gpus": [0, 1], "tensor": 2, "data": 1, "port": port,
                       "python": sys.executable, "env": {"PYTHONPATH": str(pythonpath)},
                       "ready_timeout": 60, "stop_grace": 10},
            "trainer": {"gpus": [2, 3], "python": sys.executable, "torchrun": str(torchrun),
                        "extra_args": list(trainer_args), "ready_timeout": 60},
            "prepare": {"data": [str(data / "conversations.jsonl")], "timeout": 60,
                        "env": {"PYTHONPATH": str(pythonpath)}},
        },
    }
    body["dflash"].update(section)
    path = tmp_path / "dflash-sandbox.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def log_of(host_file: Path, run_id: str, name: str) -> str:
    return (box_workdir(host_file) / "runs" / run_id / "logs" / f"{name}.log").read_text()


def wait_for(path: Path, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.1)
    return path.exists()


def test_dflash_recipe_deploys_prepares_trains_and_resumes(
        box_host: Path, tmp_path: Path, standin: Any, teardown_runs: None) -> None:
    journal = Journal(tmp_path / "state")
    reporter = Reporter(quiet=True)
    model = make_model(tmp_path / "models" / "Qwen-fake", layers=8)
    port = free_port()
    playbook = dflash_playbook(tmp_path, standin, model=model, port=port)

    first = deploy(PROJECT, str(box_host), str(playbook), reporter, journal=journal)

    # the probe read the model on the box: layer ids from its config, fit from its index
    plan = first.plan
    server = plan.processes["server"]
    spec = json.loads(server.argv[server.argv.index("--speculative_config") + 1])
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [
        1, 3, 6, 8]
    assert any("num_hidden_layers 8 (read on the box just now)" in n for n in plan.notes)
    assert any("7.5 GiB of weights per GPU leaves" in n for n in plan.notes)  # 48 GiB L40S
    cached = journal.model_facts(box_host.stem)
    assert cached[str(model)]["num_hidden_layers"] == 8
    assert [p["name"] for p in first.processes] == ["server", "prepare", "trainer"]

    # server became ready serving exactly the verifier string; prepare ran; trainer started
    server_log = log_of(box_host, plan.run_id, "server")
    assert "Application startup complete." in server_log
    prepare_log = log_of(box_host, plan.run_id, "prepare")
    assert f"via http://127.0.0.1:{port}" in prepare_log and "rendered 32 samples" in prepare_log
    data = tmp_path / "box-data"
    assert (data / "tokenized" / "data-00000-of-00001.arrow").is_file()
    trainer_log = log_of(box_host, plan.run_id, "trainer")
    assert "Starting fresh training run" in trainer_log
    assert wait_for(data / "checkpoints" / "0" / "training_state.json"), trainer_log
    assert "doesn't match found model_id" not in trainer_log

    # redeploy: the old run is stopped, prepare is skipped, training resumes from the checkpoint
    second = deploy(PROJECT, str(box_host), str(playbook), reporter, journal=journal)
    assert second.plan.run_id != plan.run_id
    assert "skipping preprocessing" in log_of(box_host, second.plan.run_id, "prepare")
    resumed = log_of(box_host, second.plan.run_id, "trainer")
    assert "Found checkpoint at" in resumed
    assert "Resuming training on epoch" in resumed or "Resuming mid-epoch from" in resumed
    old = json.loads((box_workdir(box_host) / "runs" / plan.run_id / "run.json").read_text())
    assert old["status"] == "stopped"


def test_missing_model_refuses_before_anything_starts(
        box_host: Path, tmp_path: Path, standin: Any, teardown_runs: None) -> None:
    journal = Journal(tmp_path / "state")
    playbook = dflash_playbook(tmp_path, standin, model=tmp_path / "models" / "not-staged",
                               port=free_port())
    with pytest.raises(PlanError) as info:
        deploy(PROJECT, str(box_host), str(playbook), Reporter(quiet=True), journal=journal)
    text = str(info.value)
    assert "not-staged does not exist on" in text and "outrig stage --host" in text
    assert not (box_workdir(box_host) / "runs").exists(), "nothing was launched"


def test_cleanup_stops_the_ranks_first_so_the_interrupt_save_completes(
        box_host: Path, tmp_path: Path, standin: Any, teardown_runs: None) -> None:
    """torchrun would TERM each rank's group (killing its DataLoader workers mid-save); the
    recipe's children-first stop signals the ranks themselves and waits for their save."""
    journal = Journal(tmp_path / "state")
    model = make_model(tmp_path / "models" / "Qwen-fake", layers=8)
    playbook = dflash_playbook(
        tmp_path, standin, model=model, port=free_port(),
        trainer_args=("--fake-steps-per-epoch", "200", "--fake-step-seconds", "0.05",
                      "--fake-dataloader-workers", "1", "--fake-save-seconds", "2"))
    run = deploy(PROJECT, str(box_host), str(playbook), Reporter(quiet=True), journal=journal)
    save = tmp_path / "box-data" / "checkpoints"
    assert wait_for(save / "0" / "training_state.json", 120)
    result = cleanup(PROJECT, str(box_host), Reporter(quiet=True),
                     playbook=run.plan.playbook, journal=journal)
    text = log_of(box_host, run.plan.run_id, "trainer")
    assert f"Interrupt checkpoint saved to '{save}/interrupted'" in text, text[-2000:]
    assert "Failed to save" not in text and "killed by signal" not in text
    assert sorted(os.listdir(save / "interrupted")) == [
        "config.json", "config.py", "model.safetensors", "optimizer_state_dict.pt",
        "scheduler_state_dict.pt", "train_command.txt"]
    trainer = next(p for r in result["runs"] for p in r["processes"]
                   if p["process"] == "trainer")
    assert trainer["how"] == "term"  # ended by itself: nothing had to be SIGKILLed


def test_a_stop_during_a_save_never_lets_the_half_written_folder_be_resumed(
        box_host: Path, tmp_path: Path, standin: Any, teardown_runs: None) -> None:
    """--checkpoint-freq < 1 rewrites folder N in place; speculators resumes from the highest
    folder unchecked. A stop in the middle of the rewrite must not leave N to be loaded."""
    journal = Journal(tmp_path / "state")
    model = make_model(tmp_path / "models" / "Qwen-fake", layers=8)
    playbook = dflash_playbook(
        tmp_path, standin, model=model, port=free_port(), checkpoint_freq=0.5, epochs=20,
        trainer_args=("--fake-steps-per-epoch", "4", "--fake-step-seconds", "0.1",
                      "--fake-save-seconds", "8"))
    run = deploy(PROJECT, str(box_host), str(playbook), Reporter(quiet=True), journal=journal)
    save = tmp_path / "box-data" / "checkpoints"
    log = box_workdir(box_host) / "runs" / run.plan.run_id / "logs" / "trainer.log"
    # folder 1 complete once (mid-epoch), then being rewritten (its end-of-epoch save)
    assert _wait_text(log, f"Saving checkpoint to {save}/1", count=2), log.read_text()
    assert _wait_file_newer(save / "1" / "model.safetensors", save / "1" / "training_state.json")
    cleanup(PROJECT, str(box_host), Reporter(quiet=True), playbook=run.plan.playbook,
            journal=journal)
    state = json.loads((save / "1" / "training_state.json").read_text())
    assert state["local_step"] == 2, "the rewrite was cut before training_state.json"

    second = deploy(PROJECT, str(box_host), str(playbook), Reporter(quiet=True),
                    journal=journal)
    resumed = log_of(box_host, second.plan.run_id, "trainer")
    assert f"Found checkpoint at {save}/0." in resumed, resumed
    assert "Resuming training on epoch 1." in resumed
    aside = [p for p in save.iterdir() if p.name.startswith("1.incomplete-")]
    assert len(aside) == 1, sorted(p.name for p in save.iterdir())
    kept = json.loads((aside[0] / "training_state.json").read_text())
    assert kept["local_step"] == 2  # the half-rewritten folder, kept for inspection


def _wait_text(path: Path, needle: str, *, count: int = 1, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count(needle) >= count:
            return True
        time.sleep(0.05)
    return False


def _wait_file_newer(newer: Path, than: Path, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if newer.stat().st_mtime > than.stat().st_mtime:
                return True
        except OSError:
            pass
        time.sleep(0.02)
    return False
