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


CATEGORY_PROMPTS = {"repeat": "the fox the fox the fox the fox the fox the fox",
                    "count": "one two three one two three one two three one two"}


def test_an_evaluate_only_playbook_gives_levels_categories_and_a_cached_baseline(
        box_project: Path, box_host: Path, vllm_python: str, verifier: dict[str, str]
        ) -> None:
    """An evaluate-only playbook (no processes) with ngram, prompts in two categories, two
    concurrency levels: each level has tokens/s, TTFT, TPOT and ITL percentiles and the
    baseline's speedup; every figure per category; vLLM 0.32's per-request metrics (the CPU
    build has --per-request-spec-decode-metrics) give a distribution whose sums equal the
    counters'. A second evaluation of another k reuses the cached baseline: one server
    starts, not two. The card is written."""
    prompts = box_project / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"category": cat, "prompt": f"{i} {text}"}) + "\n"
                               for i in range(3) for cat, text in CATEGORY_PROMPTS.items()))
    playbook = {"name": "evonly",
                "evaluate": {"model": verifier["model"], "prompts": "prompts.jsonl",
                             "speculative": {"method": "ngram", "num_speculative_tokens": 3,
                                             "prompt_lookup_max": 3, "prompt_lookup_min": 1},
                             "requests": 6, "concurrency": [1, 3], "max_tokens": 24,
                             "settle": 3, "server": server_settings(vllm_python)}}
    (box_project / "playbooks" / "evonly.yaml").write_text(yaml.safe_dump(playbook))
    workdir = Path(yaml.safe_load(box_host.read_text())["workdir"])

    done = outrig(["evaluate", "--host", box_host.stem, "--playbook", "evonly", "--json"],
                  box_project)
    assert done.returncode == 0, done.stderr[-4000:]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    check_stopped(doc, workdir)
    assert len(doc["server_runs"]) == 2 and doc["baseline_cached"] is False
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 3]
    for level in doc["levels"]:
        assert level["requests"] == 6 and level["completion_tokens"] > 0
        for key in ("ttft_ms", "tpot_ms", "itl_ms"):
            assert set(level[key]) == {"p50", "p95", "p99"} and level[key]["p50"] > 0, key
        assert level["baseline"]["tokens_per_s"] > 0 and level["baseline"]["cached"] is False
        assert level["speedup"] == pytest.approx(
            level["tokens_per_s"] / level["baseline"]["tokens_per_s"], rel=1e-3)
        assert sorted(level["categories"]) == ["count", "repeat"]
        assert all(c["requests"] == 3 for c in level["categories"].values())
    # the per-request metrics against the counters of the same window
    first = doc["levels"][0]
    dist = first["per_request"]
    assert dist is not None, doc.get("per_request_note")
    assert dist["requests"] == 6 and dist["p10"] <= dist["p50"] <= dist["p90"] <= 4.0
    assert sum(b["requests"] for b in dist["histogram"]) == 6
    assert sum(dist["accepted_per_step"]) == first["drafts"]
    assert sum(j * n for j, n in enumerate(dist["accepted_per_step"])) == \
        first["accepted_tokens"]
    assert dist["step_weighted"] == pytest.approx(first["acceptance_length"], abs=1e-3)
    # the headline is the counters over both levels, as the server logged them
    accepted, drafted, _ = logged(workdir, doc["server_runs"][0])
    assert (accepted, drafted) == (doc["accepted_tokens"], doc["draft_tokens"])
    prov = doc["provenance"]
    assert prov["vllm"] == "0.32.0" and prov["gpu"] == "cpu"
    assert prov["num_speculative_tokens"] == 3 and len(prov["prompts_sha256"]) == 64
    argv = doc["commands"]["servers"][0]
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "summary"
    assert "--per-request-spec-decode-metrics" not in doc["commands"]["servers"][1]

    runs = workdir / "runs"
    before = {p.name for p in runs.iterdir() if ".evaluate-" in p.name}
    card = box_project / "card.md"
    again = outrig(["evaluate", "--host", box_host.stem, "--playbook", "evonly", "--sweep-k", "2",
                    "--card", str(card)], box_project)
    assert again.returncode == 0, again.stderr[-4000:]
    print(done.stderr, again.stdout, again.stderr, card.read_text(), sep="\n----\n")
    listed = outrig(["evaluate", "--host", box_host.stem, "--playbook", "evonly", "--compare",
                     "--json"], box_project)
    second = json.loads(listed.stdout)["evaluations"][0]  # newest first
    assert second["eval_id"] != doc["eval_id"]
    assert second["eval_id"] in " ".join(again.stderr.split())
    started = {p.name for p in runs.iterdir() if ".evaluate-" in p.name} - before
    assert len(started) == 1 and started == set(second["server_runs"]), started
    assert second["baseline_cached"] is True and second["num_speculative_tokens"] == 2
    assert [lv["baseline"]["cached"] for lv in second["levels"]] == [True, True]
    assert [lv["baseline"]["tokens_per_s"] for lv in second["levels"]] == [
        lv["baseline"]["tokens_per_s"] for lv in doc["levels"]]
    assert "baseline: reusing the cached one" in again.stderr
    report = " ".join(again.stdout.split())
    assert "(cached)" in report and "per request p10" in report and "per category" in report
    text = card.read_text()
    assert "| 1 |" in text and "| 3 |" in text and "--per-request-spec-decode-metrics" in text
    assert f"Baseline cached from run {doc['server_runs'][1]}" in text
    check_stopped(second, workdir)


def test_the_smoke_set_is_sent_as_streamed_chat(box_project: Path, box_host: Path,
                                                vllm_python: str, verifier: dict[str, str]
                                                ) -> None:
    """The default prompts of a generic playbook, outrig's smoke set, go to the real server's
    /v1/chat/completions, streamed: every request answered with its latency figures, every
    category of the first requests present (requests 6: the set's first six are code and
    math), no baseline when turned off."""
    playbook = {"name": "smoke",
                "evaluate": {"model": verifier["model"],
                             "speculative": {"method": "ngram", "num_speculative_tokens": 2,
                                             "prompt_lookup_max": 2, "prompt_lookup_min": 1},
                             "requests": 6, "concurrency": 2, "max_tokens": 16,
                             "baseline": False, "server": server_settings(vllm_python)}}
    (box_project / "playbooks" / "smoke.yaml").write_text(yaml.safe_dump(playbook))
    done = outrig(["evaluate", "--host", box_host.stem, "--playbook", "smoke", "--json"],
                  box_project)
    assert done.returncode == 0, done.stderr[-4000:]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    check_stopped(doc, Path(yaml.safe_load(box_host.read_text())["workdir"]))
    assert doc["provenance"]["prompts"] == "smoke" and len(doc["server_runs"]) == 1
    level = doc["levels"][0]
    assert level["requests"] == 6 and level["completion_tokens"] > 0
    assert level["ttft_ms"]["p50"] > 0 and level["baseline"] is None
    assert sorted(level["categories"]) == ["code", "math"]
    assert doc["per_request"] is not None and doc["per_request"]["requests"] == 6


def test_vllms_spec_bench_is_read_by_its_class_and_given_per_category(
        box_project: Path, box_host: Path, vllm_python: str, verifier: dict[str, str]
        ) -> None:
    """``--dataset spec_bench``: vLLM 0.32's own SpecBench reads a file in Spec-Bench's schema
    on the box (tests/fixtures/vllm-datasets; pandas is in the venv, .ci/venvs); a category
    the file lacks is refused before any server starts; then one server, every prompt sent
    as chat with its category, every figure per category."""
    question = str(REPO / "tests" / "fixtures" / "vllm-datasets" / "question.jsonl")
    playbook = {"name": "specbench",
                "evaluate": {"model": verifier["model"],
                             "speculative": {"method": "ngram", "num_speculative_tokens": 2,
                                             "prompt_lookup_max": 2, "prompt_lookup_min": 1},
                             "requests": 8, "concurrency": 2, "max_tokens": 16,
                             "baseline": False, "server": server_settings(vllm_python)}}
    (box_project / "playbooks" / "specbench.yaml").write_text(yaml.safe_dump(playbook))
    workdir = Path(yaml.safe_load(box_host.read_text())["workdir"])
    args = ["evaluate", "--host", box_host.stem, "--playbook", "specbench"]
    bad = outrig([*args, "--dataset", "spec_bench:poetry", "--dataset-path", question],
                 box_project)
    assert bad.returncode == 2, bad.stderr[-3000:]
    assert "has no category 'poetry'; its categories: translation, summarization, " \
           "math_reasoning, qa" in " ".join(bad.stderr.split()), bad.stderr[-3000:]
    runs = workdir / "runs"
    assert not runs.is_dir() or not [p for p in runs.iterdir() if "specbench" in p.name]

    done = outrig([*args, "--dataset", "spec_bench", "--dataset-path", question],
                  box_project)
    assert done.returncode == 0, done.stderr[-4000:]
    print(done.stderr, done.stdout, sep="\n----\n")
    said = " ".join(done.stderr.split())
    assert "spec_bench: 8 prompt(s) read by vLLM 0.32.0's " \
           "vllm.benchmarks.datasets.datasets.SpecBench" in said, said
    doc = json.loads(outrig([*args, "--compare", "--json"], box_project).stdout)[
        "evaluations"][0]
    check_stopped(doc, workdir)
    assert len(doc["server_runs"]) == 1
    assert doc["provenance"]["prompts"] == f"dataset spec_bench ({question})"
    level = doc["levels"][0]
    assert level["requests"] == 8 and level["completion_tokens"] > 0
    assert {k: v["requests"] for k, v in level["categories"].items()} == {
        "translation": 2, "summarization": 2, "math_reasoning": 2, "qa": 2}
    assert doc["per_request"] is not None and doc["per_request"]["requests"] == 8
