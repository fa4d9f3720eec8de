"""``outrig evaluate`` end to end: the sandbox box (a real sshd), the real CPU vLLM, the
real counters.

The first test evaluates vLLM's ``ngram`` method with a baseline and checks the numbers
against what the server itself logged: vLLM's ``SpecDecodingLogging.log``
(vllm/v1/spec_decode/metrics.py) prints, per interval, ``Accepted: A tokens, Drafted: D
tokens`` and ``Mean acceptance length: 1 + A/drafts``; the sums of A and D over the server's
life must equal the counter deltas outrig read around its requests (nothing else drafts on
that server: /health, /v1/models and the one-token readiness request do not). The second
serves a verifier the CPU build starts but cannot run (head_dim 16): its readiness request
fails, the command fails with vLLM's fatal line, the server is stopped and nothing is
recorded. The third presses Ctrl-C while the server starts: exit 130, nothing of it left.

A DFlash checkpoint is evaluated in tests/rehearsal/test_evaluate_trained.py: the drafter the
rehearsal's real training trained, served with method ``dflash`` through the dflash defaults.

Needs ``OUTRIG_VLLM_PYTHON`` (an interpreter with vLLM's CPU build); without it the tests
skip.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.realvllm.evaluating import check_stopped, logged, outrig, server_settings
from tests.support.processes import marked

REPO = Path(__file__).resolve().parents[2]


# (``vllm_python`` is the tier's, tests/realvllm/conftest.py; this module's verifier
# also needs the conversations file, so it is its own)
@pytest.fixture(scope="module")
def verifier(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tiny random Qwen3 the CPU vLLM serves, and its conversations file."""
    out = tmp_path_factory.mktemp("verifier")
    made = subprocess.run([vllm_python, str(REPO / "tests/rehearsal/make_verifier.py"),
                           str(out), "--preset", "vllm-cpu", "--conversations", "24"],
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-2000:]
    return {"model": str(out / "model"), "conversations": str(out / "conversations.jsonl")}


def test_ngram_evaluation_matches_vllms_own_log(box_project: Path, box_host: Path,
                                               vllm_python: str, verifier: dict[str, str]
                                               ) -> None:
    prompts = box_project / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"step {i} the fox the fox the fox the "
                                                     "fox the fox"}) + "\n" for i in range(6)))
    playbook = {"name": "ngram", "processes": {"server": {"command": [
        vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model",
        verifier["model"]]}},
        "evaluate": {"model": verifier["model"], "prompts": "prompts.jsonl",
                     "speculative": {"method": "ngram", "num_speculative_tokens": 3,
                                     "prompt_lookup_max": 3, "prompt_lookup_min": 1},
                     "requests": 6, "concurrency": 2, "max_tokens": 24, "settle": 3,
                     "server": server_settings(vllm_python)}}
    (box_project / "playbooks" / "ngram.yaml").write_text(yaml.safe_dump(playbook))

    done = outrig(["evaluate", "--host", box_host.stem, "--playbook", "ngram", "--json"],
                  box_project)
    assert done.returncode == 0, done.stderr[-4000:]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    check_stopped(doc, Path(yaml.safe_load(box_host.read_text())["workdir"]))
    assert doc["requests"] == 6 and doc["completion_tokens"] > 0
    assert doc["drafts"] > 0, "ngram drafted nothing"
    assert doc["acceptance_length"] == pytest.approx(1 + doc["accepted_tokens"] / doc["drafts"])
    assert len(doc["per_position"]) == 3
    accepted, drafted, lengths = logged(Path(yaml.safe_load(box_host.read_text())["workdir"]),
                                        doc["server_runs"][0])
    assert (accepted, drafted) == (doc["accepted_tokens"], doc["draft_tokens"])
    assert lengths and all(1.0 <= m <= 4.0 for m in lengths)
    assert doc["baseline_tokens_per_s"] and doc["tokens_per_s"]
    assert doc["speedup"] == pytest.approx(doc["tokens_per_s"] / doc["baseline_tokens_per_s"])
    assert doc["checkpoint"] is None and doc["method"] == "ngram"

    listed = outrig(["evaluate", "--host", box_host.stem, "--playbook", "ngram", "--compare",
                     "--json"], box_project)
    assert listed.returncode == 0, listed.stderr
    assert [e["eval_id"] for e in json.loads(listed.stdout)["evaluations"]] == [doc["eval_id"]]


def test_a_server_that_dies_at_the_first_request_fails_and_is_stopped(
        box_project: Path, box_host: Path, vllm_python: str,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """head_dim 16: the CPU build starts, answers /health, then its engine dies at the first
    request ("Unsupported CPU attention configuration"). The server's readiness sends one real
    completion (``ready.generate``), so evaluate fails there, before measuring anything: exit 1
    with vLLM's fatal line, the server stopped, nothing recorded."""
    out = tmp_path_factory.mktemp("head16")
    made = subprocess.run([vllm_python, str(REPO / "tests/rehearsal/make_verifier.py"),
                           str(out), "--preset", "vllm-cpu", "--config", '{"head_dim": 16}',
                           "--conversations", "2"], capture_output=True, text=True,
                          timeout=600)
    assert made.returncode == 0, made.stderr[-2000:]
    (box_project / "p.jsonl").write_text('{"prompt": "hello there"}\n')
    playbook = {"name": "dies", "processes": {"x": {"command": "true"}},
                "evaluate": {"model": str(out / "model"), "prompts": "p.jsonl",
                             "speculative": {"method": "ngram", "num_speculative_tokens": 2,
                                             "prompt_lookup_max": 2},
                             "requests": 1, "baseline": False,
                             "server": server_settings(vllm_python)}}
    (box_project / "playbooks" / "dies.yaml").write_text(yaml.safe_dump(playbook))
    done = outrig(["evaluate", "--host", box_host.stem, "--playbook", "dies"], box_project)
    assert done.returncode == 1, done.stderr[-4000:]
    assert "EngineCore encountered a fatal error" in done.stderr, done.stderr[-4000:]
    runs = sorted((Path(yaml.safe_load(box_host.read_text())["workdir"]) / "runs").iterdir())
    assert [r.name.split("-")[0] for r in runs] == ["dies.evaluate"]
    assert marked(runs[0].name) == []
    assert json.loads((runs[0] / "run.json").read_text())["status"] == "stopped"
    listed = outrig(["evaluate", "--host", box_host.stem, "--playbook", "dies", "--compare",
                     "--json"], box_project)
    assert json.loads(listed.stdout)["evaluations"] == []


def test_ctrl_c_while_the_server_starts_stops_it(box_project: Path, box_host: Path,
                                                 vllm_python: str, verifier: dict[str, str]
                                                 ) -> None:
    """Ctrl-C (SIGINT to the command) once the server is launched and not yet ready: exit
    130, and nothing of the server's run is left on the box."""
    (box_project / "p.jsonl").write_text('{"prompt": "hello"}\n')
    playbook = {"name": "intr", "processes": {"x": {"command": "true"}},
                "evaluate": {"model": verifier["model"], "prompts": "p.jsonl",
                             "speculative": {"method": "ngram", "num_speculative_tokens": 2,
                                             "prompt_lookup_max": 2},
                             "server": server_settings(vllm_python)}}
    (box_project / "playbooks" / "intr.yaml").write_text(yaml.safe_dump(playbook))
    binary = Path(sys.executable).parent / "outrig"
    command = subprocess.Popen([str(binary), "evaluate", "--host", box_host.stem,
                                "--playbook", "intr"], cwd=box_project, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    runs = Path(yaml.safe_load(box_host.read_text())["workdir"]) / "runs"
    try:
        deadline = time.monotonic() + 300
        launched: list[int] = []
        while not launched and time.monotonic() < deadline and command.poll() is None:
            for record in runs.glob("intr.evaluate-*/run.json"):
                with contextlib.suppress(OSError, ValueError):
                    launched = [p["pid"] for p in json.loads(record.read_text())["processes"]
                                if p.get("pid")]
            time.sleep(0.2)
        assert launched, "the server was never launched"
        command.send_signal(signal.SIGINT)
        _, err = command.communicate(timeout=300)
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
    assert command.returncode == 130, err[-3000:]
    assert "interrupted" in err
    run_id = next(runs.glob("intr.evaluate-*")).name
    deadline = time.monotonic() + 120
    while marked(run_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert marked(run_id) == []
