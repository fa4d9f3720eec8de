"""The pure hang judge (outrig/hang/judge.py): each signal, its confirmations on the box's
clock, and what never makes a hang (a gap in the samples, an idle server, a process that
never logged); the playbook section's defaults are the judge's; the agent's metrics parser."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig._box.agent.hangs import parse_metrics
from outrig.hang.judge import defaults, judge_run, sample_request
from outrig.hang.spec import HangSpec


def settings(**changes: Any) -> dict[str, Any]:
    base = defaults()
    base.update({"confirmations": 3, "interval": 1.0})
    base["log"].update(floor=5.0, factor=3.0, learn=2)
    base["gpu"].update(window=4.0)
    for key, value in changes.items():
        if isinstance(value, dict):
            base[key].update(value)
        else:
            base[key] = value
    return base


def run_of(*procs: dict[str, Any]) -> dict[str, Any]:
    return {"run_id": "r1", "processes": [{"state": "running", "gpus": [], **p}
                                          for p in procs]}


class Feed:
    """Samples fed one by one through the judge, its state carried as the store does."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.state: dict[str, Any] = {}

    def __call__(self, *procs: dict[str, Any], facts: dict[str, Any] | None = None) -> Any:
        self.state, verdicts = judge_run(self.state, run_of(*procs), facts or {}, self.config)
        return {v.process: v for v in verdicts}


def trainer(t: float, mtime: float, **extra: Any) -> dict[str, Any]:
    return {"name": "trainer", "hang": {"t": t, "kind": "worker", "log_mtime": mtime,
                                        "log_bytes": int(mtime * 10), "stopped": False,
                                        **extra}}


def test_the_section_defaults_are_the_judges() -> None:
    assert HangSpec().settings() == defaults()


def test_a_silent_trainer_is_hung_after_the_confirmations_and_not_before() -> None:
    feed = Feed(settings())
    for t in range(10):  # a line a second: cadence learned, bound max(5, 3 × 1) = 5 s
        assert not feed(trainer(t, t))["trainer"].hung
    results = [feed(trainer(t, 9.0))["trainer"] for t in (13, 15, 16, 17, 18)]
    assert [r.hung for r in results] == [False, False, False, True, True]
    assert results[3].signal == "log"
    assert "no log line for 8s" in results[3].why()
    assert results[2].evidence[0]["confirmations"] == 2


def test_confirmations_are_counted_at_most_one_per_interval() -> None:
    feed = Feed(settings(interval=2.0))
    for t in range(10):
        feed(trainer(t, t))
    seen = [feed(trainer(t, 9.0))["trainer"] for t in (15.0, 15.5, 16.0, 16.5, 17.0, 18.0,
                                                      19.0)]
    counts = [v.evidence[0]["confirmations"] for v in seen]
    assert counts == [1, 1, 1, 1, 2, 2, 3]
    assert [v.hung for v in seen][-1] and not seen[-2].hung


def test_one_line_in_between_restarts_the_count() -> None:
    feed = Feed(settings())
    for t in range(10):
        feed(trainer(t, t))
    feed(trainer(15, 9.0))
    feed(trainer(16, 9.0))
    assert not feed(trainer(17, 16.5))["trainer"].evidence, "it logged again: no evidence"
    # the 7.5 s gap it just showed is now its cadence: bound 3 × 7.5 = 22.5 s
    assert not feed(trainer(38, 16.5))["trainer"].evidence
    again = feed(trainer(40, 16.5))["trainer"]
    assert again.evidence[0]["confirmations"] == 1 and not again.hung


def test_a_gap_in_the_samples_confirms_nothing_by_itself() -> None:
    """A link stalled for 30 s delivers no samples; the first one after it shows the log
    grew on the box meanwhile, so nothing holds (the judge only reads the box's facts)."""
    feed = Feed(settings())
    for t in range(10):
        feed(trainer(t, t))
    assert not feed(trainer(40, 39.5))["trainer"].evidence


def test_the_bound_follows_the_processes_own_cadence() -> None:
    feed = Feed(settings())
    for t in range(0, 100, 10):  # a line every 10 s: bound 3 × 10 = 30 s, over the floor
        feed(trainer(t, t))
    for t in (110, 115, 120):  # 20-30 s of silence: within its cadence
        assert not feed(trainer(t, 90.0))["trainer"].evidence
    assert feed(trainer(125, 90.0))["trainer"].evidence[0]["signal"] == "log"


def test_a_process_that_never_logged_is_not_judged_by_its_log() -> None:
    feed = Feed(settings())
    for t in range(0, 1000, 50):
        assert not feed(trainer(t, 0.0))["trainer"].evidence


def test_a_stopped_tree_is_hung_after_the_confirmations() -> None:
    feed = Feed(settings(log={"enabled": False}))
    verdicts = [feed(trainer(t, t, stopped=True))["trainer"] for t in range(3)]
    assert [v.hung for v in verdicts] == [False, False, True]
    assert verdicts[2].signal == "stopped"
    feed = Feed(settings(log={"enabled": False}, stopped={"enabled": False}))
    assert not any(feed(trainer(t, t, stopped=True))["trainer"].hung for t in range(5))


def test_idle_gpus_over_the_window() -> None:
    """Idle GPUs and a silent log, both for the window: hung after the confirmations."""
    feed = Feed(settings(log={"enabled": False}))
    idle = {"gpus": [{"index": 0, "utilization_pct": 1}, {"index": 1, "utilization_pct": 0}]}
    busy = {"gpus": [{"index": 0, "utilization_pct": 1}, {"index": 1, "utilization_pct": 80}]}
    proc = {"gpus": [0, 1]}

    def at(t: float, facts: dict[str, Any], mtime: float = 0.0) -> Any:
        return feed({**trainer(t, mtime), **proc}, facts=facts)["trainer"]

    assert [at(t, idle).hung for t in range(0, 7)] == [False] * 6 + [True]
    assert "no log line" in at(7, idle).why()
    assert not at(8, busy).evidence, "one busy GPU: not idle"
    assert [bool(at(t, idle).evidence) for t in range(9, 14)] == [False] * 4 + [True], \
        "the window starts again"
    assert [bool(at(t, idle, mtime=14).evidence) for t in range(14, 19)] == \
        [False] * 4 + [True], "a log line starts the window again"
    server = Feed(settings(log={"enabled": False}))
    sample = {"name": "vllm", "gpus": [0, 1],
              "hang": {"t": 0, "kind": "server", "stopped": False}}
    for t in range(20):
        sample["hang"]["t"] = t
        assert not server(sample, facts=idle)["vllm"].evidence, "an idle server is no hang"


def test_a_logging_trainer_on_idle_gpus_is_no_hang() -> None:
    """What the real speculators trainer showed on an H200 (docs/real-gpu.md): healthy, a
    step logged every 0.2 s, and nvidia-smi's instant utilisation 0 % at most samples. Its
    GPUs under the floor for far longer than the window make no hang while it logs."""
    feed = Feed(settings(log={"enabled": False}))
    idle = {"gpus": [{"index": 0, "utilization_pct": 0}]}
    for t in range(40):
        verdict = feed({**trainer(t, t - 0.2), "gpus": [0]}, facts=idle)["trainer"]
        assert not verdict.evidence, f"t={t}: {verdict.why()}"


def vllm(t: float, steps: float, running: float, waiting: float = 0) -> dict[str, Any]:
    return {"name": "vllm", "hang": {
        "t": t, "kind": "server", "stopped": False, "metrics": {
            "vllm:iteration_tokens_total_count": steps,
            "vllm:num_requests_running": running, "vllm:num_requests_waiting": waiting}}}


def test_frozen_counters_with_requests_waiting_are_a_hang() -> None:
    feed = Feed(settings())
    for t in range(5):
        assert not feed(vllm(t, 10 * t, 2))["vllm"].evidence
    seen = [feed(vllm(t, 40, 0, 3))["vllm"] for t in (5, 6, 7)]  # stuck at 40 since t=4
    assert [v.hung for v in seen] == [False, False, True]
    assert seen[2].signal == "counters"
    assert "3 request(s)" in seen[2].why()


def test_frozen_counters_without_requests_are_an_idle_server() -> None:
    feed = Feed(settings())
    for t in range(20):
        assert not feed(vllm(t, 40, 0))["vllm"].evidence


def test_counters_are_compared_one_interval_apart_not_probe_to_probe() -> None:
    """Probes every 0.25 s and a step every 0.6 s: a long engine step is no stall."""
    feed = Feed(settings())
    for i in range(40):
        t = i * 0.25
        assert not feed(vllm(t, int(t / 0.6), 1))["vllm"].evidence


def test_a_failed_canary_needs_its_confirmations() -> None:
    feed = Feed(settings(canary={"enabled": True}))
    bad = {"ok": False, "why": "timed out"}
    seen = [feed({"name": "vllm", "hang": {"t": t, "kind": "server", "canary": bad}})["vllm"]
            for t in range(3)]
    assert [v.hung for v in seen] == [False, False, True]
    assert "timed out" in seen[2].why()
    ok = feed({"name": "vllm", "hang": {"t": 3, "kind": "server", "canary": {"ok": True}}})
    assert not ok["vllm"].evidence


def test_all_off_judges_nothing_and_asks_for_nothing() -> None:
    feed = Feed(settings(enabled=False))
    assert feed(trainer(0, 0, stopped=True)) == {}
    request = sample_request(settings(counters={"enabled": False}))
    assert request["metrics"] == [] and request["canary"] == 0.0
    assert sample_request(defaults())["metrics"][0] == "vllm:iteration_tokens_total_count"


@pytest.mark.parametrize(("line", "value"), [
    ('vllm:num_requests_running{engine="0",model_name="m"} 2.0', 2.0),
    ('vllm:num_requests_running{model_name="a } b"} 3.0 1700000000000', 3.0),
    ("vllm:num_requests_running 4", 4.0),
])
def test_the_agent_reads_prometheus_lines(line: str, value: float) -> None:
    parse = parse_metrics
    assert parse(f"# HELP x\n{line}\n", ["vllm:num_requests_running"]) == {
        "vllm:num_requests_running": value}


def test_the_agent_sums_engines_and_skips_other_names() -> None:
    parse = parse_metrics
    page = ('vllm:generation_tokens_total{engine="0"} 10\n'
            'vllm:generation_tokens_total{engine="1"} 32\n'
            'vllm:generation_tokens_created{engine="0"} 1.7e9\n'
            'vllm:iteration_tokens_total_bucket{le="1.0"} 5\n'
            "vllm:num_requests_waiting NaN\n")
    assert parse(page, ["vllm:generation_tokens_total", "vllm:num_requests_waiting",
                        "vllm:iteration_tokens_total_count"]) == {
        "vllm:generation_tokens_total": 42.0}


def test_the_store_keeps_the_settings_and_count_a_run_began_with(tmp_path: Path) -> None:
    """watch and status count the same confirmations (the journal's), with the settings the
    run was first judged with: the playbook's hang: section then, not as edited since."""
    from functools import partial

    from outrig.hang.store import judge_answer, settings_for
    from outrig.journal import Journal
    from outrig.playbook import hang_settings

    journal = Journal(tmp_path / "state")
    books = tmp_path / "playbooks"
    books.mkdir()
    book = books / "job.yaml"
    book.write_text(yaml.safe_dump({"name": "job", "hang": {"confirmations": 2,
                                                            "interval": 1},
                                    "processes": {"p": {"command": "true"}}}))
    journal.record_run("r1", {"run_id": "r1", "playbook": "job"})
    from_books = partial(hang_settings, books)
    first = settings_for(journal, "r1", from_books)
    assert first["confirmations"] == 2
    verdicts = judge_answer(journal, run_of(trainer(0, 0, stopped=True)), {}, first)
    assert verdicts[0].evidence[0]["confirmations"] == 1 and not verdicts[0].hung
    book.write_text(yaml.safe_dump({"name": "job", "hang": {"enabled": False},
                                    "processes": {"p": {"command": "true"}}}))
    again = settings_for(journal, "r1", from_books)  # another command, later: the same settings
    assert again == first
    verdicts = judge_answer(journal, run_of(trainer(1, 1, stopped=True)), {}, again)
    assert verdicts[0].hung and verdicts[0].signal == "stopped"
    journal.record_run("r2", {"run_id": "r2", "playbook": "job"})
    assert settings_for(journal, "r2", from_books)["enabled"] is False, "a new run: the file now"


def test_when_two_signals_confirm_at_once_the_most_direct_is_named() -> None:
    """A stopped trainer is silent too: named ``stopped``, the surer evidence, not ``log``."""
    feed = Feed(settings())
    for t in range(10):
        feed(trainer(t, t))
    seen = [feed(trainer(t, 9.0, stopped=True))["trainer"] for t in (15, 16, 17)]
    assert [e["signal"] for e in seen[2].evidence] == ["stopped", "log"]
    assert seen[2].hung and seen[2].signal == "stopped"
