"""Is the box alive? A pure judge of timestamped observations (no I/O here).

Why several signals: each one alone lies sometimes. A slow or stalled link delays the agent's
answer while the box works on; a hung sshd refuses logins while the trainer still trains; a
provider's gateway may accept TCP for a box that is long gone. ``watch`` (outrig/ops/watch.py)
records what it sees, one :class:`Observation` per signal and probe, and asks :func:`judge`
what that means:

* ``tcp``: a TCP connect to the SSH port was accepted and not reset (a silent port still
  counts: the link or the box's kernel answers);
* ``banner``: the SSH server sent its ``SSH-`` banner on that connection;
* ``heartbeat``: the agent answered a ``status`` call over the open session;
* ``processes``: what that answer says of the run's processes (``run_state``: running,
  finished or failed; see :func:`run_state`);
* ``log``: the run's log grew since the answer before;
* ``confirm``: a fresh connection (TCP and a whole SSH login) made only to confirm a death.

The rules, in order:

1. The newest ``processes`` observation came from an agent that answered, so the box is
   healthy: ``finished`` or ``failed`` there is the job's own end (``finished``, or
   ``crashed``: a crash on a healthy box, never a death).
2. ``dead`` needs every signal failing: nothing succeeded for the whole (RTT-scaled)
   threshold, the TCP probe and the heartbeat were tried and failed in that window, AND a
   fresh confirming probe made after the threshold was reached failed too. Without that
   confirmation the verdict is ``suspect`` with ``needs_confirm``.
3. ``dead`` too when only the port has answered (TCP, perhaps a banner) but no login and no
   agent for ``unreachable_after`` (default ``UNREACHABLE_FACTOR`` × the threshold), the
   heartbeat was tried and failed in that window, and a fresh login made after it failed:
   a provider's gateway in front of a box that is gone keeps accepting, so rule 2 alone
   would leave such a box ``suspect`` for ever and the run unattended. The longer limit
   keeps a box whose sshd merely hangs for a while from being moved; if it was alive after
   all, fencing stops its run when it answers again.
4. ``suspect``: the agent or the SSH banner has not answered for ``suspect_after``.
5. Otherwise ``alive``. A slow link is not a dead box: delays shorter than the threshold
   never count against it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from outrig.console import one_line

SIGNALS = ("tcp", "banner", "heartbeat", "processes", "log", "confirm")
DEFAULT_THRESHOLD = 60.0  # seconds with every signal failing before a box may be called dead
RTT_THRESHOLD_FACTOR = 50  # the threshold grows by this many RTTs (240 ms: +12 s)
PERIOD_FLOOR = 1.0  # seconds: never probe more often than this
PERIOD_RTT_FACTOR = 10  # probe period: 10 RTTs (240 ms: 2.4 s) ...
PERIOD_SHARE = 6  # ... but at least 6 probes fit in the threshold
UNREACHABLE_FACTOR = 5  # no login for this many thresholds while the port answers: dead


@dataclass(frozen=True)
class Observation:
    """One signal seen once: when (monotonic seconds), whether it said "alive", and what it
    saw. ``run_state`` is set on ``processes`` observations only."""

    t: float
    signal: str
    ok: bool
    detail: str = ""
    run_state: str | None = None

    def __post_init__(self) -> None:
        if self.signal not in SIGNALS:
            raise ValueError(f"unknown signal {self.signal!r}; one of {', '.join(SIGNALS)}")


@dataclass(frozen=True)
class Limits:
    """The judge's time limits for one link: ``threshold`` (every signal failing this long may
    be a death), ``suspect_after`` (no answer this long is worth a notice) and ``period``
    (how often the watch probes)."""

    threshold: float
    suspect_after: float
    period: float
    unreachable_after: float = 0.0  # 0: UNREACHABLE_FACTOR × threshold

    @property
    def login_limit(self) -> float:
        """How long only the port may answer (no login, no agent) before a death."""
        return self.unreachable_after or UNREACHABLE_FACTOR * self.threshold


def limits_for(threshold: float = DEFAULT_THRESHOLD, rtt: float | None = None) -> Limits:
    """Limits scaled by the measured RTT: a slow link gets a longer threshold (its answers
    are late, not missing) and a slower probe period (each probe costs round trips)."""
    if threshold <= 0:
        raise ValueError("the threshold must be > 0 seconds")
    rtt = max(0.0, rtt or 0.0)
    scaled = threshold + RTT_THRESHOLD_FACTOR * rtt
    period = min(max(PERIOD_FLOOR, PERIOD_RTT_FACTOR * rtt), scaled / PERIOD_SHARE)
    return Limits(threshold=scaled, suspect_after=max(3 * period, scaled / 4), period=period)


@dataclass(frozen=True)
class Verdict:
    """What the observations say: ``state`` (alive, suspect, dead, crashed, finished), why,
    how long nothing has answered (``quiet``), and whether a confirming probe is wanted."""

    state: str
    why: str
    quiet: float = 0.0
    needs_confirm: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "why": self.why, "quiet": round(self.quiet, 1),
                "needs_confirm": self.needs_confirm}


def run_state(processes: Iterable[dict[str, Any]]) -> tuple[str, str]:
    """(running | finished | failed, why) of a run from its processes as ``status`` reports
    them (``name``, ``state``, ``exit_code``, ``signal``).

    A run is finished when its trainer (or, without one, every process) exited 0: a server
    kept running for the trainer is not the job. It failed when a process exited non-zero,
    was killed or is gone without an exit code (its box answered, so this is a crash)."""
    procs = [p for p in processes if isinstance(p, dict)]
    if not procs:
        return "failed", "the run has no processes on the box"

    def clean(p: dict[str, Any]) -> bool:
        return p.get("state") == "exited" and p.get("exit_code") == 0

    trainer = next((p for p in procs if p.get("name") == "trainer"), None)
    if (trainer is not None and clean(trainer)) or all(clean(p) for p in procs):
        return "finished", "the trainer exited 0" if trainer else "every process exited 0"
    broken = [p for p in procs if p.get("state") in ("exited", "killed", "gone")
              and not clean(p)]
    if broken:
        return "failed", "; ".join(_ended(p) for p in broken)
    return "running", "running"


def _ended(proc: dict[str, Any]) -> str:
    """How one process ended, in words. Every value is the box's (its run.json, which
    anything on the box can rewrite): shown with :func:`~outrig.console.one_line`, so a
    newline in it cannot start a line of its own in watch's messages."""
    name = one_line(proc.get("name") or "?")
    if proc.get("state") == "killed":
        return f"{name} was killed by signal {one_line(proc.get('signal'))}"
    if proc.get("state") == "gone":
        return f"{name} is gone (no exit code recorded)"
    return f"{name} exited {one_line(proc.get('exit_code'))}"


def judge(observations: Sequence[Observation], now: float, limits: Limits,
          since: float) -> Verdict:
    """The verdict at ``now`` on everything observed since the watch began at ``since``
    (rules in the module docstring). Pure: the same observations give the same verdict."""
    seen = sorted((o for o in observations if o.t <= now), key=lambda o: o.t)
    ended = _job_ended(seen)
    if ended is not None:
        return ended
    last_alive = max([since, *(o.t for o in seen if o.ok)])
    quiet = now - last_alive
    if quiet >= limits.threshold:
        failing = {o.signal for o in seen if not o.ok and o.t > last_alive}
        if {"tcp", "heartbeat"} <= failing:
            reached = last_alive + limits.threshold
            confirm = [o for o in seen if o.signal == "confirm" and o.t >= reached]
            if confirm and not confirm[-1].ok:
                return Verdict("dead", f"nothing answered for {quiet:.0f}s (threshold "
                               f"{limits.threshold:.0f}s) and a fresh connection failed: "
                               f"{confirm[-1].detail or 'no answer'}", quiet)
            return Verdict("suspect", f"nothing answered for {quiet:.0f}s; confirming with "
                           "a fresh connection", quiet, needs_confirm=True)
    logged_in = max([since, *(o.t for o in seen if o.ok
                              and o.signal in ("heartbeat", "confirm"))])
    unreachable = now - logged_in
    if unreachable >= limits.login_limit and any(
            o.signal == "heartbeat" and not o.ok and o.t > logged_in for o in seen):
        reached = logged_in + limits.login_limit
        confirm = [o for o in seen if o.signal == "confirm" and o.t >= reached]
        port = "only the port answered" if quiet < limits.threshold else "nothing answered"
        if confirm and not confirm[-1].ok:
            return Verdict("dead", f"no login and no agent answer for {unreachable:.0f}s "
                           f"({port}: a gateway in front of a box that is gone, or an sshd "
                           f"hung that long; limit {limits.login_limit:.0f}s) and a fresh "
                           f"connection failed: {confirm[-1].detail or 'no answer'}",
                           unreachable)
        return Verdict("suspect", f"no login and no agent answer for {unreachable:.0f}s "
                       f"({port}); confirming with a fresh connection", unreachable,
                       needs_confirm=True)
    answered = max([since, *(o.t for o in seen if o.ok
                             and o.signal in ("heartbeat", "banner", "confirm"))])
    if now - answered >= limits.suspect_after:
        what = _last_failure(seen, answered)
        return Verdict("suspect", f"no answer from the agent or sshd for "
                       f"{now - answered:.0f}s" + (f" ({what})" if what else ""), quiet)
    return Verdict("alive", "answering", quiet)


def _job_ended(seen: Sequence[Observation]) -> Verdict | None:
    """The job's own end, from the newest processes observation (an answering box's)."""
    procs = [o for o in seen if o.signal == "processes"]
    if not procs:
        return None
    newest = procs[-1]
    if newest.run_state == "finished":
        return Verdict("finished", newest.detail or "the run finished")
    if newest.run_state == "failed":
        return Verdict("crashed", newest.detail or "the run's processes are gone")
    return None


def _last_failure(seen: Sequence[Observation], after: float) -> str:
    failed = [o for o in seen if not o.ok and o.t > after and o.detail
              and o.signal in ("heartbeat", "banner", "tcp")]
    return f"{failed[-1].signal}: {failed[-1].detail}" if failed else ""


def prune(observations: list[Observation], now: float, keep: float) -> list[Observation]:
    """The observations worth keeping: everything from the last ``keep`` seconds plus the
    newest, and the newest successful, of each signal (the judge needs no more: when
    everything last answered is what a death is measured from; and a long watch must not
    grow)."""
    newest: dict[tuple[str, bool], Observation] = {}
    for o in observations:
        newest[(o.signal, o.ok)] = o
    recent = [o for o in observations if now - o.t <= keep]
    return sorted({*recent, *newest.values()}, key=lambda o: o.t)
