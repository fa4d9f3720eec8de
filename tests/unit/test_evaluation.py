"""The pure part of ``outrig evaluate``: settings and their defaults, the server's argv and
playbook, the counters' parsing (against prometheus_client's own parser on a real capture),
the arithmetic, the report; and the prompt rules the bench op shares with the workstation."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig._box.agent.bench import conversation_prompt, parse_prompt_lines
from outrig.errors import ConfigError
from outrig.evaluation.section import EvaluateSpec
from outrig.evaluation.spec import (
    SERVER_FATAL,
    acceptance,
    bench_fields,
    compare_rows,
    measured,
    parse_counters,
    report_lines,
    server_argv,
    server_playbook,
    settings_for,
    speculative_config,
)
from outrig.playbook import load_job, playbook_spec
from outrig.recipes import eval_defaults

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu"
PARAMS = {"workdir": "/w", "run_dir": "/w/runs/r1", "run_id": "r1"}


def _defaults(job: Any) -> Any:
    """What the playbook's recipe gives the evaluation (the op asks the same way)."""
    return eval_defaults(job.spec.recipe, job.spec.recipe_section())


def dflash_job(tmp_path: Path, evaluate: dict[str, Any] | None = None) -> Any:
    raw: dict[str, Any] = {"name": "d", "recipe": "dflash", "dflash": {
        "model": "/models/q", "data_path": "${run_dir}/data",
        "save_path": "${run_dir}/checkpoints", "block_size": 16,
        "prepare": {"data": ["/data/chat.jsonl", "HuggingFaceH4/ultrachat_200k"]},
        "server": {"gpus": [0, 1], "python": "/venv/vllm/bin/python", "max_model_len": 4096},
        "trainer": {"gpus": [2], "extra_args": ["--scheduler-type", "none"]}}}
    if evaluate is not None:
        raw["evaluate"] = evaluate
    path = tmp_path / "playbooks" / "d.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw))
    return load_job(path)


def test_dflash_defaults_come_from_the_dflash_section(tmp_path: Path) -> None:
    job = dflash_job(tmp_path)
    settings, problems = settings_for(job.spec.evaluate, _defaults(job), PARAMS, "d.yaml")
    assert problems == [] and settings is not None
    assert settings.model == "/models/q"
    assert settings.speculative == {"method": "dflash", "num_speculative_tokens": 15}
    assert settings.needs_checkpoint and settings.save_path == "/w/runs/r1/checkpoints"
    assert settings.prompts.kind == "conversations"
    assert settings.prompts.paths == ("/data/chat.jsonl",)  # the hub dataset is not a file
    assert settings.gpus == [0, 1] and settings.python == "/venv/vllm/bin/python"
    assert settings.max_model_len == 4096 and settings.scheduler is False
    config = speculative_config(settings, "/w/runs/r1/checkpoints/3")
    assert config == {"method": "dflash", "model": "/w/runs/r1/checkpoints/3",
                      "num_speculative_tokens": 15}
    argv = server_argv(settings, config)
    assert argv[:9] == ["/venv/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server",
                        "--model", "/models/q", "--host", "127.0.0.1", "--port", "8100"]
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == config
    assert argv[-2:] == ["--max-model-len", "4096"]
    assert bench_fields(settings, None, check_only=True) == {
        "requests": 32, "check_only": True, "conversations": ["/data/chat.jsonl"]}


def test_evaluate_keys_override_the_dflash_defaults(tmp_path: Path) -> None:
    job = dflash_job(tmp_path, {"model": "/models/other", "prompts": "box:eval.jsonl",
                                "speculative": {"method": "ngram", "num_speculative_tokens": 3,
                                                "prompt_lookup_max": 3},
                                "server": {"gpus": [], "port": 9000, "entrypoint": "m.x",
                                           "extra_args": ["--dtype", "bfloat16"]}})
    settings, problems = settings_for(job.spec.evaluate, _defaults(job), PARAMS, "d.yaml")
    assert problems == [] and settings is not None
    assert not settings.needs_checkpoint and settings.gpus == []
    assert settings.prompts.kind == "box" and settings.prompts.paths == ("eval.jsonl",)
    argv = server_argv(settings, speculative_config(settings, None))
    assert argv[1:3] == ["-m", "m.x"] and argv[-2:] == ["--dtype", "bfloat16"]
    assert "--port" in argv and argv[argv.index("--port") + 1] == "9000"
    assert server_argv(settings, None).count("--speculative-config") == 0  # the baseline


def test_a_refusal_names_the_recipe_env_only_when_a_recipe_gives_it(tmp_path: Path) -> None:
    """A launch refusal names where the server's env came from: the recipe's section's env
    too for a recipe playbook, evaluate.server.env alone for any other (no recipe key)."""
    job = dflash_job(tmp_path)
    settings, _ = settings_for(job.spec.evaluate, _defaults(job), PARAMS, "d.yaml")
    assert settings is not None
    assert settings.env_key == "evaluate.server.env (with dflash.env)"
    plain, problems = settings_for(EvaluateSpec(model="/m/q", speculative={"method": "ngram"}),
                                   None, {}, "p.yaml")
    assert problems == [] and plain is not None
    assert plain.env_key == "evaluate.server.env"


def test_a_generic_playbook_names_every_missing_key() -> None:
    settings, problems = settings_for(EvaluateSpec(), None, {}, "p.yaml")
    assert settings is None
    assert [p.split(":")[1].strip() for p in problems] == [
        "evaluate.model", "evaluate.speculative"]


def test_run_dir_without_a_run_is_refused_with_the_fix(tmp_path: Path) -> None:
    job = dflash_job(tmp_path)
    settings, problems = settings_for(job.spec.evaluate, _defaults(job), {"workdir": "/w"},
                                      "d.yaml")
    assert settings is None
    assert any("dflash.save_path" in p and "--run" in p for p in problems)


def test_the_server_playbook_is_a_valid_one_process_playbook(tmp_path: Path) -> None:
    job = dflash_job(tmp_path, {"server": {"gpus": [3]}})
    settings, _ = settings_for(job.spec.evaluate, _defaults(job), PARAMS, "d.yaml")
    assert settings is not None
    raw = server_playbook("d", settings, None)
    spec = playbook_spec().model_validate(raw)
    assert raw["name"] == "d.evaluate" and list(spec.processes) == ["server"]
    server = spec.processes["server"]
    assert server.gpus == [3] and server.fatal == SERVER_FATAL
    assert server.ready is not None and server.ready.model == "/models/q"
    assert server.ready.http == "http://127.0.0.1:8100/health"


def test_bad_evaluate_keys_are_refused_naming_the_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        dflash_job(tmp_path, {"requets": 3, "speculative": {"num_speculative_tokens": 3}})
    text = str(caught.value)
    assert "evaluate.requets" in text and "evaluate.speculative" in text
    assert "name the method" in text


def test_counters_sum_over_engines_and_skip_created_samples() -> None:
    text = "\n".join([
        "# TYPE vllm:spec_decode_num_drafts counter",
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0',
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0',
        'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 45.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 9.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",position="0"} 3.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",position="1"} 8.0'])
    counts = parse_counters(text)
    assert (counts.drafts, counts.draft_tokens, counts.accepted_tokens) == (15.0, 45.0, 20.0)
    assert counts.per_position == {0: 12.0, 1: 8.0}
    numbers = acceptance(counts)
    assert numbers["acceptance_length"] == pytest.approx(1 + 20 / 15)
    assert numbers["per_position"] == pytest.approx([12 / 15, 8 / 15])


def test_no_drafts_is_no_acceptance_length_not_one() -> None:
    numbers = acceptance(parse_counters("vllm:num_requests_running 0\n"))
    assert numbers["acceptance_length"] is None and numbers["per_position"] == []
    assert not parse_counters("").seen


def test_a_real_capture_gives_what_the_server_logged() -> None:
    """The capture of a CPU vLLM 0.32 with ngram around three requests, and the one
    SpecDecoding line the server logged for them (tests/fixtures/vllm-0.32-cpu)."""
    counts = measured((FIXTURES / "metrics-ngram-before.txt").read_text(),
                      (FIXTURES / "metrics-ngram-after.txt").read_text())
    line = (FIXTURES / "specdecoding-ngram.log").read_text()
    numbers = acceptance(counts)
    assert f"Accepted: {numbers['accepted_tokens']} tokens" in line
    assert f"Drafted: {numbers['draft_tokens']} tokens" in line
    assert f"Mean acceptance length: {numbers['acceptance_length']:.2f}" in line
    rates = ", ".join(f"{p:.3f}" for p in numbers["per_position"])
    assert f"Per-position acceptance rate: {rates}" in line


PROM_SCRIPT = """
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for family in text_string_to_metric_families(open(sys.argv[1]).read()):
    for s in family.samples:
        if s.name.startswith("vllm:spec_decode") and s.name.endswith("_total"):
            key = s.name + (":" + s.labels["position"] if "position" in s.labels else "")
            out[key] = out.get(key, 0.0) + s.value
print(json.dumps(out))
"""


def test_the_parser_agrees_with_prometheus_client_on_a_real_capture() -> None:
    python = os.environ.get("OUTRIG_VLLM_PYTHON")
    if not python:
        pytest.skip("OUTRIG_VLLM_PYTHON is not set: an interpreter with vLLM (and so "
                    "prometheus_client) compares the parsers")
    path = FIXTURES / "metrics-ngram-after.txt"
    done = subprocess.run([python, "-c", PROM_SCRIPT, str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    theirs = json.loads(done.stdout)
    ours = parse_counters(path.read_text())
    assert theirs["vllm:spec_decode_num_drafts_total"] == ours.drafts
    assert theirs["vllm:spec_decode_num_draft_tokens_total"] == ours.draft_tokens
    assert theirs["vllm:spec_decode_num_accepted_tokens_total"] == ours.accepted_tokens
    assert {int(k.rsplit(":", 1)[1]): v for k, v in theirs.items()
            if "per_pos" in k} == ours.per_position


def test_prompt_lines_name_each_bad_line() -> None:
    text = "\n".join(['{"prompt": "hi"}', "", '{"messages": [{"role": "user", '
                      '"content": "q"}]}', "not json", '{"prompt": ""}', '{"text": "x"}'])
    items, problems = parse_prompt_lines(text, "p.jsonl")
    assert items == [{"prompt": "hi"}, {"messages": [{"role": "user", "content": "q"}]}]
    assert [p.split(":")[1] for p in problems] == ["4", "5", "6"]
    assert "neither" in problems[2]


def test_a_conversation_becomes_its_messages_up_to_the_last_user_turn() -> None:
    record = {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"},
                                {"from": "human", "value": "c"}, {"from": "gpt", "value": "d"}]}
    assert conversation_prompt(record) == {"messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"}]}
    assert conversation_prompt({"messages": [{"role": "assistant", "content": "x"}]}) is None


def test_the_report_and_the_comparison_show_the_numbers() -> None:
    doc = {"checkpoint": {"path": "/c/3", "order_text": "end of epoch 3"}, "method": "dflash",
           "num_speculative_tokens": 15, "requests": 8, "completion_tokens": 512,
           "seconds": 4.0, "acceptance_length": 3.5, "per_position": [0.9, 0.5],
           "drafts": 10, "draft_tokens": 150, "accepted_tokens": 25, "tokens_per_s": 128.0,
           "baseline_tokens_per_s": 64.0, "speedup": 2.0, "at": 0}
    text = "\n".join(report_lines(doc))
    assert "/c/3 (end of epoch 3)" in text and "acceptance length 3.50" in text
    assert "at most 16" in text and "0.900 0.500" in text and "speedup 2.00×" in text
    assert compare_rows([doc]) == [["/c/3", "3.50", "0.90 0.50", "128.0", "2.00",
                                    "1970-01-01 00:00:00 UTC"]]


def test_status_shows_a_runs_newest_evaluation(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from outrig.journal import Journal
    from outrig.ops.status import evaluation_lines, mark_evaluations

    journal = Journal(tmp_path)
    for eval_id, at, length in (("e1", 10.0, 1.5), ("e2", 20.0, 2.25)):
        journal.record_evaluation(eval_id, {"eval_id": eval_id, "run_id": "r1", "at": at,
                                            "checkpoint": {"path": "/c/1"},
                                            "acceptance_length": length,
                                            "per_position": [0.5], "speedup": 1.5})
    journal.record_evaluation("e3", {"eval_id": "e3", "run_id": "other", "at": 30.0})
    result: dict[str, Any] = {"runs": [{"run_id": "r1"}, {"run_id": "r2"}]}
    mark_evaluations(result, SimpleNamespace(journal=journal))  # type: ignore[arg-type]
    assert result["runs"][0]["evaluation"]["eval_id"] == "e2"
    assert "evaluation" not in result["runs"][1]
    assert evaluation_lines(result) == [
        "run r1: /c/1 evaluated on vLLM 1970-01-01 00:00:20 UTC: acceptance length 2.25, "
        "per position 0.50, speedup 1.50× (outrig evaluate --compare)"]


def test_an_evaluation_is_recorded_and_printed_without_the_playbooks_secrets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A value of ``secrets:`` that reached the document (a checkpoint path, a server's
    text) is ``***`` in the journal's record, the ``--json`` document and the report."""
    import io
    from types import SimpleNamespace

    from outrig.console import Reporter
    from outrig.journal import Journal
    from outrig.ops.evaluate import publish

    secret = "hf_EVALsecret42"
    monkeypatch.setenv("HF_TOKEN", secret)
    book = tmp_path / "leaky.yaml"
    book.write_text(yaml.safe_dump({"name": "leaky", "secrets": ["HF_TOKEN"],
                                    "processes": {"p": {"command": "true"}}}))
    job = load_job(book)
    doc = {"eval_id": "leaky-1", "playbook": "leaky", "host": "h", "at": 1.0,
           "checkpoint": {"path": f"/ckpt/{secret}/epoch_1", "order_text": "epoch 1"},
           "model": "m", "method": "ngram", "server_note": f"token {secret} refused"}
    for json_mode in (True, False):
        out, err = io.StringIO(), io.StringIO()
        journal = Journal(tmp_path / f"state-{json_mode}")
        session = SimpleNamespace(journal=journal, host_spec="h",
                                  reporter=Reporter(json_mode=json_mode, out=out, err=err))
        recorded = publish(session, job, doc)  # type: ignore[arg-type]
        assert recorded["checkpoint"]["path"] == "/ckpt/***/epoch_1"
        assert secret not in out.getvalue() + err.getvalue()
        assert "/ckpt/***/epoch_1" in out.getvalue() + err.getvalue()
        stored = [p.read_text() for p in journal.root.rglob("*.json")]
        assert stored and all(secret not in text for text in stored)
    assert secret in doc["checkpoint"]["path"], "the caller's document is left as it was"


def capture(name: str) -> str:
    return (FIXTURES / f"metrics-ngram-{name}.txt").read_text()


def test_counters_that_went_backwards_are_refused_naming_the_counter() -> None:
    """The reads swapped: what a server restart between them looks like (every counter
    lower after the requests). Before: drafts -80, acceptance length 3.0, recorded."""
    from outrig.evaluation.spec import CountersUnusable

    with pytest.raises(CountersUnusable) as refused:
        measured(capture("after"), capture("before"))
    text = str(refused.value)
    assert "vllm:spec_decode_num_drafts_total went backwards" in text, text
    assert "restarted" in text and "Nothing was recorded" in text
    restarted = capture("after").replace("spec_decode_num_accepted_tokens_per_pos_total"
                                         "{engine=\"0\",model_name=\"",
                                         "spec_decode_ignored{model_name=\"")
    with pytest.raises(CountersUnusable, match="went backwards"):
        measured(capture("after"), restarted)  # only the per-position counters were reset


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
def test_counters_that_are_not_finite_are_refused(value: str) -> None:
    from outrig.evaluation.spec import CountersUnusable

    after = re.sub(r"^(vllm:spec_decode_num_drafts_total\{[^}]*\}) \S+", rf"\1 {value}",
                   capture("after"), count=1, flags=re.M)
    assert after != capture("after")
    with pytest.raises(CountersUnusable) as refused:
        measured(capture("before"), after)
    assert f"vllm:spec_decode_num_drafts_total = {value}" in str(refused.value)
    assert "not finite" in str(refused.value)


def test_a_junk_metrics_page_is_refused_not_called_speculation_off(
        tmp_path: Path) -> None:
    """An answer with no vllm: sample at all is not vLLM's metrics: refused with what it
    began with, never the "speculative decoding was not in effect" diagnosis."""
    import io
    from types import SimpleNamespace

    from outrig.console import Reporter
    from outrig.evaluation.spec import CountersUnusable
    from outrig.ops.evaluate_document import document

    junk = "<html><body>502 Bad Gateway</body></html>\n"
    with pytest.raises(CountersUnusable, match="not vLLM's metrics.*502 Bad Gateway"):
        measured(capture("before"), junk)
    with pytest.raises(CountersUnusable, match="read before the requests"):
        measured("", capture("after"))
    err = io.StringIO()
    session = SimpleNamespace(host=SimpleNamespace(name="h"),
                              reporter=Reporter(out=io.StringIO(), err=err))
    bench = {"metrics_before": capture("before"), "metrics_after": junk,
             "completion_tokens": 10, "seconds": 1.0, "sent": 1}
    side = {"benches": [(1, bench)], "start_seconds": 1.0, "run_id": "r",
            "speculative": {"method": "ngram", "num_speculative_tokens": 3}}
    with pytest.raises(CountersUnusable):
        document(session, SimpleNamespace(name="p"), None,  # type: ignore[arg-type]
                 SimpleNamespace(model="m", max_tokens=8, concurrency=1,  # type: ignore[arg-type]
                                 temperature=0.0),
                 None, [side], {}, None, facts={}, command=[])
    assert "not in effect" not in err.getvalue()
    # a vLLM server without speculation is still told apart: its counters are just absent
    assert measured("vllm:num_requests_running 0\n", "vllm:num_requests_running 0\n").drafts == 0
