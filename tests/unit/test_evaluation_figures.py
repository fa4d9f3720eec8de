"""``outrig evaluate``'s figures beyond the counters (outrig/evaluation/): percentiles,
latency, the per-request distribution, categories, the cached baseline's key, the flags on
constructed cases (counters replayed from a real vLLM capture), the report and the card; the
flags of the command; the smoke prompt set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from outrig._box.agent.bench import parse_prompt_lines, prompts_digest
from outrig.cli.evaluate import flag_playbook, parse_ks
from outrig.errors import ConfigError
from outrig.evaluation.baseline import baseline_key
from outrig.evaluation.card import card_markdown
from outrig.evaluation.causes import cliff_position, fastest, flags
from outrig.evaluation.document import level_figures, side_summary, with_baseline
from outrig.evaluation.figures import by_category, histogram, latency, per_request, percentile
from outrig.evaluation.report import full_report
from outrig.evaluation.section import EvaluateSpec
from outrig.evaluation.spec import measured, settings_for, thinking_of
from outrig.playbook import flag_job, load_job
from tests.standins.metrics_replay import replay, zero

SMOKE = Path(__file__).resolve().parents[2] / "outrig" / "evaluation" / "prompts" / "smoke.jsonl"


def spec(accepted_hist: list[int], drafted: int) -> dict[str, Any]:
    """vLLM's per-request payload (RequestSpecDecodeMetrics.to_dict) for a histogram."""
    steps = sum(accepted_hist)
    accepted = sum(j * n for j, n in enumerate(accepted_hist))
    return {"mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
            "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
            "acceptance_histogram": accepted_hist, "num_spec_steps": steps,
            "num_accepted_draft_tokens": accepted, "num_draft_tokens": drafted,
            "num_spec_tokens": len(accepted_hist) - 1}


def record(category: str | None, tokens: int, ttft: float, latency_ms: float,
           itl: list[float], hist: list[int] | None = None) -> dict[str, Any]:
    return {"category": category, "tokens": tokens, "ttft_ms": ttft, "latency_ms": latency_ms,
            "itl_ms": itl, "spec": spec(hist, 3 * sum(hist)) if hist else None}


def test_percentiles_interpolate_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    # numpy.percentile(values, [50, 95, 99]) = 3.0, 8.8, 9.76
    assert percentile(values, 50) == 3.0
    assert percentile(values, 95) == pytest.approx(8.8)
    assert percentile(values, 99) == pytest.approx(9.76)
    assert percentile([], 50) is None and percentile([5.0], 99) == 5.0


def test_latency_gives_tpot_and_itl_as_vllm_bench_serve_does() -> None:
    rows = [record("code", 5, 100.0, 500.0, [100.0, 100.0, 100.0, 100.0]),
            record("math", 3, 50.0, 250.0, [80.0, 120.0]),
            record("math", 1, 40.0, 40.0, [])]
    figures = latency(rows, 2.0)
    assert figures["completion_tokens"] == 9 and figures["tokens_per_s"] == 4.5
    # TPOT: (500-100)/4 = 100 and (250-50)/2 = 100; the one-token request has none
    assert figures["tpot_ms"] == {"p50": 100.0, "p95": 100.0, "p99": 100.0}
    assert figures["ttft_ms"]["p50"] == 50.0
    # ITL: [80, 100, 100, 100, 100, 120]; p99 at rank 4.95
    assert figures["itl_ms"]["p50"] == 100.0 and figures["itl_ms"]["p99"] == 119.0


def test_per_request_distribution_is_not_weighted_by_length() -> None:
    """A long answer that accepts nothing and three short ones that accept everything: the
    step-weighted figure (what the counters give) is pulled down by the long one, the
    median request is not (vllm#42690)."""
    rows = [record(None, 100, 1, 2, [], [90, 0, 0, 0]),
            *(record(None, 8, 1, 2, [], [0, 0, 0, 2]) for _ in range(3))]
    dist = per_request(rows)
    assert dist is not None
    assert dist["requests"] == 4 and dist["p50"] == 4.0 and dist["p10"] == pytest.approx(1.9)
    assert dist["step_weighted"] == pytest.approx(1 + 18 / 96, abs=1e-3)
    assert dist["accepted_per_step"] == [90, 0, 0, 6]
    assert [b["requests"] for b in dist["histogram"]] == [1, 0, 0, 0, 0, 0, 3]
    assert per_request([record(None, 5, 1, 2, [])]) is None  # no per-request metrics


def test_histogram_keeps_empty_bins_between() -> None:
    assert histogram([1.0, 2.2]) == [{"from": 1.0, "to": 1.5, "requests": 1},
                                     {"from": 1.5, "to": 2.0, "requests": 0},
                                     {"from": 2.0, "to": 2.5, "requests": 1}]


def test_every_figure_is_given_per_category() -> None:
    rows = [record("code", 5, 100.0, 500.0, [100.0] * 4, [0, 0, 0, 4]),
            record("chat", 5, 200.0, 1000.0, [200.0] * 4, [4, 0, 0, 0]),
            record("chat", 3, 300.0, 500.0, [100.0] * 2, [2, 0, 0, 0])]
    cats = by_category(rows)
    assert list(cats) == ["chat", "code"]
    assert cats["code"]["acceptance"]["step_weighted"] == 4.0
    assert cats["chat"]["acceptance"]["step_weighted"] == 1.0
    assert cats["chat"]["requests"] == 2 and cats["chat"]["ttft_ms"]["p50"] == 250.0
    assert by_category([record(None, 1, 1, 1, [])]) == {}


def test_a_level_and_the_side_summary_sum_the_real_capture_counters() -> None:
    """Two levels' windows, each from the real capture's before/after: the headline sums
    them (twice the logged 51 accepted over 21 drafts), each level keeps its own."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu"
    before = (fixtures / "metrics-ngram-before.txt").read_text()
    after = (fixtures / "metrics-ngram-after.txt").read_text()
    bench = {"metrics_before": before, "metrics_after": after, "sent": 1,
             "completion_tokens": 10, "seconds": 2.0,
             "per_request": [record("code", 10, 10.0, 100.0, [10.0] * 9, [0, 0, 0, 3])]}
    level = level_figures(1, bench)
    assert level["drafts"] == 21 and level["accepted_tokens"] == 51
    assert level["tokens_per_s"] == 5.0 and level["per_request"]["p50"] == 4.0
    numbers, counts = side_summary([(1, bench), (4, bench)])
    assert counts.drafts == 42 and numbers["acceptance_length"] == pytest.approx(1 + 102 / 42)
    levels = with_baseline([level], {1: {"tokens_per_s": 2.5}})
    assert levels[0]["speedup"] == 2.0 and levels[0]["baseline"] == {"tokens_per_s": 2.5}
    assert with_baseline([level], {})[0]["speedup"] is None


def test_the_baseline_key_is_the_same_for_another_checkpoint_only() -> None:
    args: dict[str, Any] = {"model": "/m", "vllm": "0.32.0", "gpu": "cpu",
                            "prompts_sha256": "ab", "concurrency": 1, "max_tokens": 32,
                            "temperature": 0.0, "max_model_len": 512,
                            "extra_args": ["--dtype", "bfloat16"], "env": {"A": "1"}}
    key = baseline_key(**args)
    assert baseline_key(**{**args, "env": {"A": "1"}}) == key  # the checkpoint is no input
    for change in ({"vllm": "0.33.0"}, {"gpu": "1× NVIDIA H200"}, {"prompts_sha256": "cd"},
                   {"concurrency": 16}, {"max_tokens": 64}, {"model": "/other"}):
        assert baseline_key(**{**args, **change}) != key, change


def doc_from(before: str, after: str, **extra: Any) -> dict[str, Any]:
    """An evaluation document whose counters come from two replayed /metrics texts."""
    from outrig.evaluation.spec import acceptance

    return {**acceptance(measured(before, after)), "provenance": {}, **extra}


def names(doc: dict[str, Any]) -> list[str]:
    return [f["flag"] for f in flags(doc)]


def test_acceptance_about_one_with_drafts_counted_is_a_broken_serving_path() -> None:
    doc = doc_from(zero(3), replay(248, 744, 0, [0, 0, 0]))
    assert doc["acceptance_length"] == 1.0 and names(doc) == ["broken_serving"]
    assert "serving path is broken, not the drafter" in flags(doc)[0]["cause"]
    assert names(doc_from(zero(3), zero(3))) == []  # nothing drafted: no flag, a warning


def test_per_position_exactly_zero_from_some_position_is_a_cliff() -> None:
    doc = doc_from(zero(7), replay(100, 700, 260, [95, 80, 60, 25, 0, 0, 0]))
    assert names(doc) == ["position_cliff"]
    assert flags(doc)[0]["seen"] == "per-position acceptance exactly 0 from position 5 on"
    assert "num_speculative_tokens 4 or fewer" in flags(doc)[0]["fix"]
    assert cliff_position([0.9, 0.5, 0.1]) is None and cliff_position([0.0, 0.0]) is None


def test_max_model_len_thinking_and_train_eal_are_flagged_from_the_provenance() -> None:
    good = replay(100, 300, 200, [90, 70, 40])
    doc = doc_from(zero(3), good, provenance={
        "served_max_model_len": 32768, "training_seq_length": 8192,
        "enable_thinking_training": False, "enable_thinking_serving": True, "train_eal": 4.2})
    assert doc["acceptance_length"] == 3.0
    assert names(doc) == ["max_model_len_above_training", "thinking_differs",
                          "far_below_training"]
    assert "--max-model-len 8192" in flags(doc)[0]["fix"]
    fine = doc_from(zero(3), good, provenance={
        "served_max_model_len": 8192, "training_seq_length": 8192,
        "enable_thinking_training": False, "enable_thinking_serving": None, "train_eal": 3.5})
    assert names(fine) == []


def test_the_fastest_k_is_named() -> None:
    sweep = [{"k": 3, "tokens_per_s": 90.0}, {"k": 7, "tokens_per_s": 120.0},
             {"k": 15, "tokens_per_s": 80.0}]
    assert fastest(sweep) == sweep[1] and fastest([{"k": 3}]) is None


def test_thinking_is_read_from_the_servers_default_chat_template_kwargs() -> None:
    assert thinking_of(["--default-chat-template-kwargs", '{"enable_thinking": false}']) \
        is False
    assert thinking_of(['--default-chat-template-kwargs={"enable_thinking": true}']) is True
    assert thinking_of(["--dtype", "bfloat16"]) is None


def full_doc() -> dict[str, Any]:
    level = {"concurrency": 1, "tokens_per_s": 120.0, "ttft_ms": {"p50": 20.0, "p95": 30.0,
                                                                  "p99": 31.0},
             "tpot_ms": {"p50": 8.0, "p95": 9.0, "p99": 9.5},
             "itl_ms": {"p50": 16.0, "p95": 20.0, "p99": 22.0},
             "baseline": {"tokens_per_s": 60.0, "cached": True, "run_id": "m.evaluate-1"},
             "speedup": 2.0,
             "categories": {"code": {"requests": 2, "ttft_ms": {"p50": 20.0},
                                     "tpot_ms": {"p50": 7.0},
                                     "acceptance": {"step_weighted": 3.2, "p50": 3.4}}}}
    return {"checkpoint": {"path": "/c/3", "order_text": "end of epoch 3"},
            "model": "/m", "method": "dflash", "num_speculative_tokens": 3, "requests": 4,
            "completion_tokens": 64, "seconds": 1.0, "acceptance_length": 1.0,
            "per_position": [0.0, 0.0, 0.0], "drafts": 10, "draft_tokens": 30,
            "accepted_tokens": 0, "tokens_per_s": 120.0, "baseline_tokens_per_s": 60.0,
            "speedup": 2.0, "levels": [level], "per_request": None,
            "per_request_note": "vLLM 0.20 on the box has no --per-request-spec-decode-metrics",
            "provenance": {"vllm": "0.32.0", "gpu": "cpu", "num_speculative_tokens": 3,
                           "prompts_sha256": "abcdef0123456789"},
            "flags": flags({"acceptance_length": 1.0, "drafts": 10}),
            "commands": {"outrig": ["outrig", "evaluate", "--host", "h"],
                         "servers": [["python", "-m", "vllm", "--speculative-config",
                                      '{"method": "dflash"}']]}}


def test_the_report_shows_levels_categories_provenance_and_flags() -> None:
    text = "\n".join(full_report(full_doc()))
    assert "per request       - (vLLM 0.20 on the box has no" in text
    assert "20.0/30.0/31.0" in text and "60.0 (cached)" in text and "2.00×" in text
    assert "code" in text and "3.20" in text
    assert "provenance        vLLM 0.32.0, GPU cpu, k 3" in text
    assert "! broken_serving: acceptance length 1.00 with 10 drafts counted" in text


def test_the_card_has_the_table_the_numbers_and_the_commands() -> None:
    card = card_markdown(full_doc())
    assert card.startswith("## Speculative decoding: dflash on /m")
    assert "| 1 | 120.0 | 60.0 | 2.00× | 20.0 | 8.0 | 16.0 | 9.5 |" in card
    assert "**Acceptance length** 1.00 of at most 4" in card
    assert "| code | 2 | 3.20 | 3.40 | 20.0 | 7.0 |" in card
    assert "> **broken_serving**" in card
    assert "outrig evaluate --host h" in card
    assert "Baseline cached from run m.evaluate-1 (the same server" in card
    assert "--speculative-config '{\"method\": \"dflash\"}'" in card


def test_the_smoke_set_has_each_category_and_is_valid_jsonl() -> None:
    items, problems = parse_prompt_lines(SMOKE.read_text(), str(SMOKE))
    assert problems == []
    counts: dict[str, int] = {}
    for item in items:
        counts[item["category"]] = counts.get(item["category"], 0) + 1
    assert counts == {"code": 4, "math": 4, "chat": 4, "summarisation": 4, "reasoning": 4}
    assert prompts_digest(items) == prompts_digest(json.loads(json.dumps(items)))
    assert prompts_digest(items[:3]) != prompts_digest(items)


def test_a_category_must_be_a_string() -> None:
    _, problems = parse_prompt_lines('{"prompt": "x", "category": 3}\n', "p.jsonl")
    assert problems == ['p.jsonl:1: "category" must be a non-empty string']


def test_a_generic_evaluation_defaults_to_the_smoke_set() -> None:
    settings, problems = settings_for(EvaluateSpec(model="/m", speculative={
        "method": "ngram"}, concurrency=[16, 1]), None, {}, "p.yaml")
    assert problems == [] and settings is not None
    assert settings.prompts.kind == "smoke" and settings.levels == (1, 16)


def test_concurrency_levels_are_checked() -> None:
    for bad in ([], [0], [1, 1], 2000):
        with pytest.raises(ValueError):
            EvaluateSpec(concurrency=bad)


def test_an_evaluate_only_playbook_is_valid_and_a_deployable_one_is_not_required(
        tmp_path: Path) -> None:
    path = tmp_path / "ev.yaml"
    path.write_text(json.dumps({"evaluate": {"model": "/m", "speculative": {
        "method": "ngram", "num_speculative_tokens": 3}}}))
    job = load_job(path)
    assert job.spec.processes == {} and job.spec.evaluate is not None
    empty = tmp_path / "none.yaml"
    empty.write_text(json.dumps({"params": {"a": 1}}))
    with pytest.raises(ConfigError, match="processes: required key is missing"):
        load_job(empty)
    empty.write_text(json.dumps({"processes": {}}))
    with pytest.raises(ConfigError, match="or give only an evaluate: section"):
        load_job(empty)


def test_flags_make_a_playbook_and_bad_ones_are_refused(tmp_path: Path) -> None:
    raw = flag_playbook("/models/Qwen3-8B", '{"method": "ngram", "num_speculative_tokens": 3}',
                        None)
    job = flag_job(raw, tmp_path)
    assert job.name == "evaluate-Qwen3-8B" and job.spec.evaluate is not None
    assert job.spec.evaluate.speculative == {"method": "ngram", "num_speculative_tokens": 3}
    with pytest.raises(ConfigError, match="--speculative: not JSON"):
        flag_playbook("/m", "{method: ngram", None)
    with pytest.raises(ConfigError, match="--model needs --speculative"):
        flag_playbook("/m", None, None)
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        flag_job(flag_playbook("/m", '{"method": "ngram", "num_speculative_tokens": 0}',
                               None), tmp_path)
    assert parse_ks("3,7,15") == (3, 7, 15)
    for bad in ("3,,7", "0", "3,3", "x"):
        with pytest.raises(ConfigError, match="--sweep-k"):
            parse_ks(bad)


def test_a_cached_baseline_is_reused_measured_when_missing_and_fresh_measures_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal side of the cached baseline: the first call measures both levels on one
    server; the second (same key: another checkpoint) measures nothing; a third level is
    measured alone; ``fresh`` measures every level again and replaces the kept ones. (The
    servers are counted here; on the real vLLM, tests/realvllm/test_evaluate.py counts the
    runs on the box.)"""
    from types import SimpleNamespace

    from outrig.console import Reporter
    from outrig.journal import Journal
    from outrig.ops import evaluate_serving

    started: list[tuple[int, ...]] = []

    def serve(session: Any, job: Any, settings: Any, speculative: Any, inline: Any,
              reporter: Any, label: str, per_request: Any = None) -> dict[str, Any]:
        assert speculative is None and per_request is None
        started.append(settings.levels)
        tps = 10.0 * len(started)
        return {"run_id": f"base-{len(started)}", "start_seconds": 1.0, "argv": ["vllm"],
                "benches": [(c, {"sent": 1, "completion_tokens": int(tps), "seconds": 1.0,
                                 "per_request": []}) for c in settings.levels]}

    monkeypatch.setattr(evaluate_serving, "serve_and_send", serve)
    settings, _ = settings_for(EvaluateSpec(model="/m", speculative={"method": "ngram"},
                                            concurrency=[1, 4]), None, {}, "p.yaml")
    assert settings is not None
    session = SimpleNamespace(journal=Journal(tmp_path))
    quiet = Reporter(json_mode=False)
    facts = {"vllm": "0.32.0", "gpu": "cpu"}

    def run(levels: list[int], fresh: bool = False) -> dict[int, dict[str, Any]]:
        import dataclasses

        here = dataclasses.replace(settings, levels=tuple(levels))
        found, _ = evaluate_serving.baselines(session, None, here, [], quiet,  # type: ignore
                                              facts, "sha", fresh)
        return found

    first = run([1, 4])
    assert started == [(1, 4)] and [first[c]["cached"] for c in (1, 4)] == [False, False]
    second = run([1, 4])
    assert started == [(1, 4)], "a cached baseline started a server"
    assert second[1]["tokens_per_s"] == 10.0 and second[4]["cached"] is True
    third = run([1, 4, 16])
    assert started[-1] == (16,) and third[16]["cached"] is False and third[1]["cached"] is True
    fresh = run([1, 4], fresh=True)
    assert started[-1] == (1, 4) and fresh[1]["tokens_per_s"] == 30.0
    assert run([1])[1]["tokens_per_s"] == 30.0  # the fresh one replaced the kept one


def test_train_eal_at_the_checkpoint_comes_from_the_runs_metric_series(tmp_path: Path) -> None:
    """The trainer's own log (a real CPU rehearsal trainer's, tests/fixtures) read into the
    run's series the way status does: train/eal at or before the checkpoint's step is the
    one the provenance records and far_below_training compares with."""
    from types import SimpleNamespace

    from outrig.journal import Journal
    from outrig.metrics.store import MetricStore
    from outrig.ops.evaluate_document import train_eal

    log = (Path(__file__).resolve().parents[1] / "fixtures" / "h200x2-rehearsal" / "migrate"
           / "cpu-box-movable-trainer.log").read_text()
    journal = Journal(tmp_path)
    assert MetricStore(journal, "r1").add_tail({"trainer": log}, 1.0) > 0
    steps = sorted(p.step for p in MetricStore(journal, "r1").points()
                   if "train/eal" in p.values)
    assert steps
    session = SimpleNamespace(journal=journal)
    run = {"run_id": "r1"}
    assert train_eal(session, run, {"global_step": steps[-1]}) == 1.0  # type: ignore[arg-type]
    assert train_eal(session, run, {"global_step": steps[0] - 1}) is None  # type: ignore
    assert train_eal(session, None, {"global_step": 5}) is None  # type: ignore[arg-type]


def test_status_shows_the_served_acceptance_length_by_checkpoint(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from outrig.journal import Journal
    from outrig.ops.status import evaluation_lines, mark_evaluations

    journal = Journal(tmp_path)
    for eval_id, at, step, length in (("e1", 1.0, 10, 1.0), ("e2", 2.0, 20, 1.75)):
        journal.record_evaluation(eval_id, {"eval_id": eval_id, "run_id": "r1", "at": at,
                                            "checkpoint": {"path": f"/c/{step}",
                                                           "global_step": step},
                                            "acceptance_length": length})
    result: dict[str, Any] = {"runs": [{"run_id": "r1"}]}
    mark_evaluations(result, SimpleNamespace(journal=journal))  # type: ignore[arg-type]
    assert result["runs"][0]["served"] == [[10, 1.0], [20, 1.75]]
    assert evaluation_lines(result)[-1] == (
        "run r1: served acceptance length by checkpoint step: 10 1.00, 20 1.75")


def test_a_stream_cut_mid_chunk_is_a_failed_request_not_a_dead_sender() -> None:
    """A server that dies in the middle of a streamed answer (a chunk shorter than its
    header says, then the connection closed): the request counts as failed with the reason,
    it does not raise out of the sender's thread (http.client's IncompleteRead is not an
    OSError). A loopback HTTP server plays it."""
    import socket
    import threading

    from outrig._box.agent.bench import Sender

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            # the whole request first: a close with unread bytes is a reset (RST) on Linux,
            # which the client would see instead of the cut chunk
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            head, _, body = request.partition(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += conn.recv(65536)
            first = b'data: {"choices": [{"text": "hi"}]}\n\n'
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n"
                         + f"{len(first):x}\r\n".encode() + first + b"\r\n"
                         + b"64\r\ndata: {\"cho")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    sender = Sender(f"http://127.0.0.1:{port}", "m", [{"prompt": "x"}], 8, 0.0, 30.0)
    sender.one({"prompt": "x"})
    thread.join(10)
    listener.close()
    assert (sender.done, sender.failed, sender.tokens) == (1, 1, 0)
    assert "IncompleteRead" in sender.errors[0], sender.errors
