"""outrig.watching.health judges synthetic timelines: a slow, jittery or stalled link is never
a dead box; a death is called only after the threshold and a failed confirmation; a crash on an
answering box is a crash."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from outrig.watching.health import (
    DEFAULT_THRESHOLD,
    Limits,
    Observation,
    judge,
    limits_for,
    prune,
    run_state,
)

RUNNING = [{"name": "server", "state": "running"}, {"name": "trainer", "state": "running"}]


def probe_round(t: float, answers: bool, *, rtt: float = 0.24, jitter: float = 0.0,
                rng: random.Random | None = None, grew: bool = True) -> list[Observation]:
    """What one probe period of the watch loop records at ``t``: the TCP connect, the SSH
    banner, and the heartbeat with the processes and log signals when the box answers (each
    answer arrives an RTT plus jitter later); failures when it does not."""
    rng = rng or random.Random(0)
    late = rtt + (rng.uniform(-jitter, jitter) if jitter else 0.0)
    late = max(0.0, late)
    if not answers:
        return [Observation(t, "tcp", False, "timed out"),
                Observation(t + late, "banner", False, "no banner"),
                Observation(t + late, "heartbeat", False, "no answer within the limit")]
    return [Observation(t + late / 2, "tcp", True),
            Observation(t + late, "banner", True),
            Observation(t + 2 * late, "heartbeat", True),
            Observation(t + 2 * late, "processes", True, run_state="running"),
            Observation(t + 2 * late, "log", grew)]


def run_timeline(limits: Limits, seconds: float, answers: Callable[[float], bool], *,
                 rtt: float = 0.24, jitter: float = 0.0, seed: int = 0,
                 confirm: Callable[[float], bool] | None = None) -> list[tuple[float, str]]:
    """Drive the judge as the watch loop does: a probe round every period, a verdict after
    each, and a confirming probe (answering per ``confirm``, default ``answers``) whenever
    the verdict asks for one. Returns (time, state) of every verdict."""
    rng = random.Random(seed)
    confirm = confirm or answers
    seen: list[Observation] = []
    states: list[tuple[float, str]] = []
    t = 0.0
    while t < seconds:
        seen += probe_round(t, answers(t), rtt=rtt, jitter=jitter, rng=rng)
        now = t + 2 * rtt + jitter
        verdict = judge(seen, now, limits, since=0.0)
        if verdict.needs_confirm:
            seen.append(Observation(now, "confirm", confirm(now), "refused"))
            verdict = judge(seen, now, limits, since=0.0)
        states.append((now, verdict.state))
        seen = prune(seen, now, 2 * limits.threshold)
        t += limits.period * rng.uniform(0.9, 1.3)  # the loop's own lateness on a busy box
    return states


def test_limits_scale_with_the_rtt() -> None:
    lan = limits_for(60, 0.001)
    far = limits_for(60, 0.24)
    assert far.threshold > lan.threshold >= 60
    assert far.period > lan.period >= 1.0
    assert far.period <= far.threshold / 6
    assert far.suspect_after < far.threshold
    assert limits_for(60, None).threshold == DEFAULT_THRESHOLD
    with pytest.raises(ValueError):
        limits_for(0, 0.1)


def test_a_steady_slow_link_is_alive() -> None:
    limits = limits_for(10, 0.24)
    states = run_timeline(limits, 120, lambda t: True, rtt=0.24)
    assert {s for _, s in states} == {"alive"}


@pytest.mark.parametrize("seed", range(12))
def test_jitter_and_stalls_up_to_80_percent_of_the_threshold_never_yield_dead(
        seed: int) -> None:
    """240 ms RTT, ±100 ms jitter, and stalls (nothing answers at all, not even TCP) of up to
    80 % of the threshold at random times: suspect is allowed, dead and a death's
    confirmation never."""
    limits = limits_for(20, 0.24)
    rng = random.Random(seed)
    stalls: list[tuple[float, float]] = []
    t = rng.uniform(5, 20)
    while t < 600:
        length = rng.uniform(0.1, 0.8) * limits.threshold
        stalls.append((t, t + length))
        t += length + rng.uniform(limits.threshold * 0.3, 60)

    def answers(now: float) -> bool:
        return not any(a <= now < b for a, b in stalls)

    states = run_timeline(limits, 600, answers, rtt=0.24, jitter=0.1, seed=seed,
                          confirm=lambda now: False)
    kinds = {s for _, s in states}
    assert "dead" not in kinds
    assert "suspect" in kinds, "the stalls were long enough to be noticed"
    assert states[-1][1] == "alive" or not answers(states[-1][0])


def test_the_same_stall_past_the_threshold_is_a_death() -> None:
    """The counterpart of the test above: the judge is not simply blind to stalls."""
    limits = limits_for(20, 0.24)
    stall = (30.0, 30.0 + 1.5 * limits.threshold)
    states = run_timeline(limits, 120, lambda t: not stall[0] <= t < stall[1], rtt=0.24,
                          jitter=0.1, confirm=lambda now: False)
    assert "dead" in {s for _, s in states}


def test_a_stall_is_suspect_then_alive_again() -> None:
    limits = limits_for(20, 0.05)
    stall = (30.0, 30.0 + 0.8 * limits.threshold)
    states = run_timeline(limits, 80, lambda t: not stall[0] <= t < stall[1], rtt=0.05,
                          confirm=lambda now: False)
    kinds = [s for _, s in states]
    assert "suspect" in kinds and "dead" not in kinds
    assert kinds[-1] == "alive"


def test_a_death_is_dead_only_after_the_threshold_and_a_failed_confirmation() -> None:
    limits = limits_for(20, 0.24)
    death = 40.0
    states = run_timeline(limits, 120, lambda t: t < death, rtt=0.24)
    first_dead = next(t for t, s in states if s == "dead")
    assert first_dead >= death + limits.threshold - 2 * limits.period
    assert first_dead <= death + limits.threshold + 2 * limits.period
    assert all(s != "dead" for t, s in states if t < first_dead)
    assert "suspect" in [s for t, s in states if death < t < first_dead]


def test_a_successful_confirmation_keeps_the_box_alive() -> None:
    """The heartbeat and the probes fail for long, but a fresh SSH login works (e.g. the warm
    connection is wedged): that is a live box, never dead."""
    limits = limits_for(10, 0.05)
    states = run_timeline(limits, 100, lambda t: t < 20, rtt=0.05, confirm=lambda now: True)
    assert "dead" not in {s for _, s in states}


def test_no_verdict_of_death_without_both_tcp_and_heartbeat_tried() -> None:
    limits = Limits(threshold=10, suspect_after=3, period=1)
    seen = [Observation(0.5, "heartbeat", True),
            Observation(20, "heartbeat", False, "timed out"),
            Observation(21, "confirm", False, "refused")]
    verdict = judge(seen, 25, limits, since=0)
    assert verdict.state == "suspect" and not verdict.needs_confirm
    seen.append(Observation(22, "tcp", False, "refused"))
    assert judge(seen, 25, limits, since=0).state == "dead"


def test_a_confirmation_made_before_the_threshold_does_not_count() -> None:
    limits = Limits(threshold=10, suspect_after=3, period=1)
    seen = [Observation(1, "heartbeat", True), Observation(5, "confirm", False),
            Observation(6, "tcp", False), Observation(6, "heartbeat", False)]
    verdict = judge(seen, 12, limits, since=0)
    assert verdict.state == "suspect" and verdict.needs_confirm
    assert "no answer" not in verdict.why or verdict.state != "dead"


def test_a_tcp_answer_alone_keeps_it_from_dead() -> None:
    """A port that still accepts TCP is not every signal failing."""
    limits = Limits(threshold=10, suspect_after=3, period=1)
    seen = [Observation(1, "heartbeat", True)]
    for t in range(2, 40):
        seen += [Observation(t, "tcp", True), Observation(t, "banner", False),
                 Observation(t, "heartbeat", False)]
    verdict = judge(seen, 40, limits, since=0)
    assert verdict.state == "suspect" and not verdict.needs_confirm


def gateway_rounds(start: int, end: int, *, banner: bool) -> list[Observation]:
    """A port that keeps accepting (a gateway in front of a gone box): TCP answers, perhaps
    a banner too, but no login and no agent."""
    seen: list[Observation] = []
    for t in range(start, end):
        seen += [Observation(t, "tcp", True), Observation(t, "banner", banner),
                 Observation(t, "heartbeat", False, "no answer within the limit")]
    return seen


@pytest.mark.parametrize("banner", [False, True])
def test_only_the_port_answering_for_the_login_limit_is_a_death(banner: bool) -> None:
    """A gateway keeps TCP (even banners) answering for a box that is gone: past the login
    limit (5 × threshold) a failed fresh login makes it dead; before it, suspect."""
    limits = Limits(threshold=10, suspect_after=3, period=1)
    assert limits.login_limit == 50
    seen = [Observation(1, "heartbeat", True), *gateway_rounds(2, 52, banner=banner)]
    early = judge(seen, 50, limits, since=0)
    assert early.state != "dead" and not early.needs_confirm
    assert early.state == ("alive" if banner else "suspect"), "sshd's banner counts as an answer"
    asks = judge(seen, 52, limits, since=0)
    assert asks.state == "suspect" and asks.needs_confirm
    seen.append(Observation(52, "confirm", False, "no SSH banner within 7.5s"))
    dead = judge(seen, 52, limits, since=0)
    assert dead.state == "dead"
    assert "only the port answered" in dead.why and "no SSH banner" in dead.why


def test_a_login_that_works_keeps_a_port_only_box_from_dead() -> None:
    """The fresh login works (the agent alone hangs): the box is not gone."""
    limits = Limits(threshold=10, suspect_after=3, period=1)
    seen = [Observation(1, "heartbeat", True), *gateway_rounds(2, 52, banner=True)]
    seen.append(Observation(52, "confirm", True, "a fresh SSH login worked"))
    seen += gateway_rounds(53, 70, banner=True)
    verdict = judge(seen, 70, limits, since=0)
    assert verdict.state != "dead" and not verdict.needs_confirm


def test_the_login_limit_can_be_set() -> None:
    limits = Limits(threshold=10, suspect_after=3, period=1, unreachable_after=20)
    seen = [Observation(1, "heartbeat", True), *gateway_rounds(2, 22, banner=False)]
    seen.append(Observation(22, "confirm", False, "refused"))
    assert judge(seen, 22, limits, since=0).state == "dead"


def test_port_only_stalls_below_the_login_limit_never_yield_dead() -> None:
    """Long stretches with only TCP answering (4 thresholds each), then the agent again:
    never dead, however often."""
    limits = Limits(threshold=10, suspect_after=3, period=1)
    seen: list[Observation] = []
    t = 0
    for _ in range(20):
        seen += gateway_rounds(t, t + 40, banner=False)
        t += 40
        seen.append(Observation(t, "heartbeat", True))
        for now in range(t - 40, t + 1):
            verdict = judge(seen, now, limits, since=0)
            assert verdict.state != "dead", (now, verdict)
            if verdict.needs_confirm:
                seen.append(Observation(now, "confirm", False, "refused"))
                assert judge(seen, now, limits, since=0).state != "dead"
        seen = prune(seen, t, 2 * limits.login_limit)
        t += 1


def test_processes_gone_on_an_answering_box_is_a_crash_not_a_death() -> None:
    limits = Limits(threshold=10, suspect_after=3, period=1)
    seen = [Observation(1, "tcp", True), Observation(1, "banner", True),
            Observation(1, "heartbeat", True),
            Observation(1, "processes", False, "trainer exited 1", run_state="failed")]
    verdict = judge(seen, 2, limits, since=0)
    assert verdict.state == "crashed" and "trainer exited 1" in verdict.why


def test_the_newest_processes_answer_decides() -> None:
    limits = Limits(threshold=10, suspect_after=3, period=1)
    seen = [Observation(1, "processes", False, "gone", run_state="failed"),
            Observation(2, "heartbeat", True),
            Observation(2, "processes", True, run_state="running")]
    assert judge(seen, 3, limits, since=0).state == "alive"
    seen.append(Observation(4, "processes", True, "the trainer exited 0",
                            run_state="finished"))
    assert judge(seen, 5, limits, since=0).state == "finished"


def test_observations_from_the_future_are_ignored() -> None:
    limits = Limits(threshold=10, suspect_after=3, period=1)
    seen = [Observation(1, "heartbeat", True),
            Observation(50, "processes", False, run_state="failed")]
    assert judge(seen, 2, limits, since=0).state == "alive"


def test_prune_keeps_the_newest_success_of_each_signal() -> None:
    seen = [Observation(1, "heartbeat", True), Observation(2, "tcp", True)]
    seen += [Observation(t, "heartbeat", False) for t in range(3, 100)]
    kept = prune(seen, 100, 10)
    assert Observation(1, "heartbeat", True) in kept
    assert Observation(2, "tcp", True) in kept
    assert len(kept) < 20
    limits = Limits(threshold=50, suspect_after=3, period=1)
    assert judge(kept, 100, limits, since=0).quiet == judge(seen, 100, limits, since=0).quiet


def test_an_unknown_signal_is_refused() -> None:
    with pytest.raises(ValueError):
        Observation(0, "ping", True)


@pytest.mark.parametrize(("procs", "state"), [
    (RUNNING, "running"),
    ([{"name": "server", "state": "running"},
      {"name": "trainer", "state": "exited", "exit_code": 0}], "finished"),
    ([{"name": "a", "state": "exited", "exit_code": 0},
      {"name": "b", "state": "exited", "exit_code": 0}], "finished"),
    ([{"name": "server", "state": "running"},
      {"name": "trainer", "state": "exited", "exit_code": 1}], "failed"),
    ([{"name": "server", "state": "gone"}, {"name": "trainer", "state": "running"}],
     "failed"),
    ([{"name": "trainer", "state": "killed", "signal": 9}], "failed"),
    ([], "failed"),
])
def test_run_state(procs: list[dict[str, object]], state: str) -> None:
    assert run_state(procs)[0] == state


def test_box_values_in_a_crash_verdict_cannot_start_a_line() -> None:
    """Names, signals and exit codes come from the box's run.json, which anything on the box
    may rewrite: a newline or carriage return in them is shown as an escape."""
    state, why = run_state([
        {"name": "trainer\nerror: forged", "state": "killed", "signal": "9\r\x1b[2K"},
        {"name": "server", "state": "exited", "exit_code": "1\nok: fine"}])
    assert state == "failed"
    assert "\n" not in why and "\r" not in why
    assert why == ("trainer\\nerror: forged was killed by signal 9\\r\x1b[2K; "
                   "server exited 1\\nok: fine")


def test_an_agent_error_cannot_start_a_line_of_its_own() -> None:
    from outrig.agent.client import raise_for_result
    from outrig.errors import RemoteError

    with pytest.raises(RemoteError) as caught:
        raise_for_result({"ok": False, "error": {
            "kind": "exited", "message": "x exited 1\nerror: forged", "process": "x\ny",
            "excerpt": ["line one\rline two", "plain"]}}, where="deploy on box")
    lines = str(caught.value).splitlines()
    assert lines == ["deploy on box: x exited 1\\nerror: forged",
                     "  last log lines of x\\ny:", "    | line one\\rline two", "    | plain"]
    assert caught.value.process == "x\\ny"
