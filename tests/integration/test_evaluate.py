"""``outrig evaluate`` refuses bad input before anything starts, on the sandbox box (a real
sshd): no checkpoint, a torn one, a prompts file that is missing or not JSONL (on the box or
here), GPUs a running run holds. Each is exit 2 with the key or flag and the fix, and no
server run is ever created. (The evaluations themselves, with the real vLLM, are in
tests/realvllm/test_evaluate.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml


def workdir(box_host: Path) -> Path:
    return Path(yaml.safe_load(box_host.read_text())["workdir"])


def outrig(box_project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = Path(sys.executable).parent / "outrig"
    return subprocess.run([str(binary), *args], cwd=box_project, capture_output=True, text=True,
                          timeout=180)


def write(box_project: Path, name: str, raw: dict[str, Any]) -> None:
    (box_project / "playbooks" / f"{name}.yaml").write_text(yaml.safe_dump(raw))


def generic(evaluate: dict[str, Any]) -> dict[str, Any]:
    return {"processes": {"hold": {"command": [sys.executable, "-c",
                                               "import time; time.sleep(300)"],
                                   "gpus": [0]}},
            "evaluate": {"model": "/models/m", "speculative": {"method": "ngram"},
                         "server": {"gpus": [0], "python": sys.executable}, **evaluate}}


def refused(done: subprocess.CompletedProcess[str], box_host: Path, *needles: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    said = " ".join(done.stderr.split())  # wherever the terminal width wrapped it
    for needle in needles:
        assert needle in said, (needle, done.stderr)
    runs = workdir(box_host) / "runs"
    started = [p.name for p in runs.iterdir()] if runs.is_dir() else []
    assert not [r for r in started if ".evaluate-" in r], started


def dflash(save: Path, conversations: Path) -> dict[str, Any]:
    return {"recipe": "dflash", "dflash": {
        "model": "/models/q", "data_path": "data", "save_path": str(save), "block_size": 4,
        "prepare": {"data": [str(conversations)]}, "server": {"gpus": [0]},
        "trainer": {"gpus": [1]}}, "evaluate": {"server": {"gpus": []}}}


def test_no_checkpoint_and_a_torn_one_are_refused(box_project: Path, box_host: Path,
                                                  tmp_path: Path) -> None:
    save = tmp_path / "save"
    conversations = tmp_path / "chat.jsonl"
    conversations.write_text(json.dumps({"conversations": [{"role": "user",
                                                             "content": "hi"}]}) + "\n")
    write(box_project, "d", dflash(save, conversations))
    done = outrig(box_project, "evaluate", "--host", box_host.stem, "--playbook", "d")
    refused(done, box_host, f"no complete checkpoint under {save}", "--checkpoint PATH")

    torn = save / "0"
    torn.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "optimizer_state_dict.pt",
                 "scheduler_state_dict.pt"):
        (torn / name).write_text("{}")
    done = outrig(box_project, "evaluate", "--host", box_host.stem, "--playbook", "d")
    refused(done, box_host, "missing training_state.json", "train first")
    done = outrig(box_project, "evaluate", "--host", box_host.stem, "--playbook", "d",
                  "--checkpoint", str(torn))
    refused(done, box_host, f"--checkpoint {torn} is torn (missing training_state.json)")
    done = outrig(box_project, "evaluate", "--host", box_host.stem, "--playbook", "d",
                  "--checkpoint", str(tmp_path / "nowhere"))
    refused(done, box_host, "not found on")


def test_prompts_missing_or_not_jsonl_are_refused(box_project: Path, box_host: Path) -> None:
    write(box_project, "p", generic({"prompts": "box:eval.jsonl"}))
    done = outrig(box_project, "evaluate", "--host", box_host.stem, "--playbook", "p")
    refused(done, box_host, "evaluate.prompts", f"{workdir(box_host)}/eval.jsonl",
            "No such file")
    (workdir(box_host) / "eval.jsonl").write_text('{"prompt": "ok"}\n{"text": "no"}\n')
    done = outrig(box_project, "evaluate", "--host", box_host.stem, "--playbook", "p")
    refused(done, box_host, "eval.jsonl:2", "not JSONL of prompts")

    write(box_project, "q", generic({"prompts": "local.jsonl"}))
    done = outrig(box_project, "evaluate", "--host", box_host.stem, "--playbook", "q")
    refused(done, box_host, "evaluate.prompts", "local.jsonl does not exist")
    (box_project / "local.jsonl").write_text("not json\n")
    done = outrig(box_project, "evaluate", "--host", box_host.stem, "--playbook", "q")
    refused(done, box_host, "local.jsonl:1: not JSON")


def test_gpus_a_running_run_holds_are_refused_naming_it(box_project: Path,
                                                        box_host: Path) -> None:
    (box_project / "ok.jsonl").write_text('{"prompt": "hi"}\n')
    write(box_project, "g", generic({"prompts": "ok.jsonl"}))
    deployed = outrig(box_project, "deploy", "--host", box_host.stem, "--playbook", "g", "--json")
    assert deployed.returncode == 0, deployed.stderr
    run_id = next(json.loads(line) for line in deployed.stdout.splitlines()
              if '"deployed"' in line)["run_id"]
    done = outrig(box_project, "evaluate", "--host", box_host.stem, "--playbook", "g")
    refused(done, box_host, f"run {run_id} holds GPU(s) [0]",
            f"outrig cleanup --host {box_host.stem} --run RUN", "evaluate.server.gpus")
    status = outrig(box_project, "status", "--host", box_host.stem, "--run", run_id, "--json")
    assert json.loads(status.stdout)["runs"][0]["status"] == "running"  # untouched


def test_a_generic_playbook_without_the_keys_is_refused(box_project: Path, box_host: Path) -> None:
    write(box_project, "n", {"processes": {"a": {"command": "true"}}})
    done = outrig(box_project, "evaluate", "--host", box_host.stem, "--playbook", "n")
    refused(done, box_host, "evaluate.model", "evaluate.speculative")
    write(box_project, "m", generic({"prompts": "box:eval.jsonl"}))
    done = outrig(box_project, "evaluate", "--host", box_host.stem, "--playbook", "m",
                  "--checkpoint", "/ckpt/3")
    refused(done, box_host, "--checkpoint /ckpt/3: method ngram drafts without a checkpoint")


def test_a_playbook_named_unlike_its_file_is_found_by_either_spelling(
        box_project: Path, box_host: Path, tmp_path: Path) -> None:
    """``dd.yaml`` (name: dee): evaluate --playbook dd and --playbook dee are the one
    playbook, whose checkpoints (none yet) are looked for; a name no file has is refused."""
    save = tmp_path / "save"
    conversations = tmp_path / "chat.jsonl"
    conversations.write_text(json.dumps({"conversations": [{"role": "user",
                                                             "content": "hi"}]}) + "\n")
    write(box_project, "dd", {"name": "dee", **dflash(save, conversations)})
    for spelling in ("dd", "dee", "playbooks/dd.yaml"):
        done = outrig(box_project, "evaluate", "--host", box_host.stem, "--playbook", spelling)
        refused(done, box_host, f"no complete checkpoint under {save}", "--checkpoint PATH")
    done = outrig(box_project, "evaluate", "--host", box_host.stem, "--playbook", "nosuch")
    assert done.returncode == 2 and "nosuch" in done.stderr, done.stderr
    assert "no complete checkpoint" not in " ".join(done.stderr.split()), done.stderr


def test_the_flags_make_an_evaluation_and_bad_ones_are_refused(box_project: Path,
                                                              box_host: Path) -> None:
    """Without a playbook: --model and --speculative (bad JSON, a missing prompts file) and
    the command's own flags (--k, --baseline) are refused before anything starts."""
    host = ["evaluate", "--host", box_host.stem]
    ngram = '{"method": "ngram", "num_speculative_tokens": 3}'
    for args, needle in (
            (["--model", "/models/m", "--speculative", "{method"], "--speculative: not JSON"),
            (["--model", "/models/m"], "--model needs --speculative JSON"),
            (["--speculative", ngram], "go with --model M"),
            (["--model", "/models/m", "--speculative", ngram, "--prompts", "nope.jsonl"],
             "evaluate.prompts: prompts file"),
            (["--model", "/models/m", "--speculative", ngram, "--sweep-k", "3,3"], "--sweep-k 3,3"),
            (["--model", "/models/m", "--speculative", ngram, "--baseline", "stale"],
             "--baseline stale")):
        refused(outrig(box_project, *host, *args), box_host, needle)


def test_an_evaluate_only_playbook_is_refused_by_deploy(box_project: Path,
                                                        box_host: Path) -> None:
    write(box_project, "ev", {"evaluate": {"model": "/models/m",
                                           "speculative": {"method": "ngram"}}})
    done = outrig(box_project, "deploy", "--host", box_host.stem, "--playbook", "ev")
    assert done.returncode == 2, done.stderr
    assert "has only an evaluate: section and deploys nothing" in " ".join(
        done.stderr.split()), done.stderr
    assert not (workdir(box_host) / "runs").is_dir() or not list(
        (workdir(box_host) / "runs").iterdir())
