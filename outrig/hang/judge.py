"""Is a live process hung? A pure judge of what the agent sampled on the box (no I/O here).

A box that answers can still hold a job that does nothing: vLLM's ``/health`` answers 200
while a wedged engine serves no request (only a crashed engine gives 503), and a trainer
stuck in a collective prints nothing while its process lives. :mod:`outrig.watching.health` judges
the box and its link; this module judges each live process of a run, from samples the agent
took on the box (``status`` with ``hang: true``, remote/agent/hangs.py), one per answer:

* ``log``: the process wrote nothing to its log for longer than both ``floor`` and
  ``factor`` × the longest gap it showed between two writes (its own cadence, learned from
  the log's modification times; not judged before ``learn`` gaps were seen, so a process
  that never logs is never hung by its log);
* ``gpu``: every GPU given to a worker (a process without ``ready.http``) stayed under
  ``floor`` % utilisation, and the process wrote no log line, for ``window`` seconds (idle
  GPUs alone are no hang: a healthy small trainer reads ~0 % on a real H200);
* ``counters``: an HTTP server's progress counters (``/metrics``: vLLM's engine steps and
  generated tokens) did not move between two confirmations while its busy gauges (requests
  running or waiting) said it had work, at both;
* ``canary``: one tiny completion did not come back within its deadline;
* ``stopped``: every live process of its tree is stopped (state ``T``: SIGSTOP).

Each signal counts *confirmations*: samples at least ``interval`` seconds apart on the box's
clock at which the signal held. The count restarts at the first sample where it does not
hold, and a process is ``hung`` once one signal reached ``confirmations`` in a row
(hysteresis: one odd sample calls nothing). Every time here is the box's own clock and every
fact the box's, so a slow, stalled or cut link cannot make a hang: it delays or drops
samples, and a missing sample confirms nothing (the link's own liveness is
:mod:`outrig.watching.health`'s).

The state between samples is plain JSON (:func:`judge_run` takes and returns it), kept in
the journal by :mod:`outrig.hang.store` so ``watch`` and ``status`` count the same
confirmations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

SIGNALS = ("stopped", "counters", "canary", "log", "gpu")  # the most direct evidence first
SKIP = "(no new sample for this signal)"  # keeps its count as it is
GAPS_KEPT = 20  # the newest gaps between log writes that the cadence is learned from

# The defaults (docs/playbooks.md#hang); outrig/hang/spec.py's schema takes them from here.
CONFIRMATIONS = 3
INTERVAL = 10.0
LOG_FLOOR = 300.0
LOG_FACTOR = 5.0
LOG_LEARN = 3
GPU_FLOOR = 5
GPU_WINDOW = 600.0
CANARY_DEADLINE = 30.0
METRICS_PATH = "/metrics"
PROGRESS_COUNTERS = ("vllm:iteration_tokens_total_count", "vllm:generation_tokens_total")
BUSY_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def defaults() -> dict[str, Any]:
    """Every setting of the ``hang:`` section with its default, as plain JSON."""
    return {
        "enabled": True, "confirmations": CONFIRMATIONS, "interval": INTERVAL,
        "log": {"enabled": True, "floor": LOG_FLOOR, "factor": LOG_FACTOR,
                "learn": LOG_LEARN},
        "gpu": {"enabled": True, "floor": GPU_FLOOR, "window": GPU_WINDOW},
        "counters": {"enabled": True, "path": METRICS_PATH,
                     "progress": list(PROGRESS_COUNTERS), "busy": list(BUSY_GAUGES)},
        "canary": {"enabled": False, "deadline": CANARY_DEADLINE},
        "stopped": {"enabled": True},
    }


def sample_request(settings: dict[str, Any]) -> dict[str, Any]:
    """What the agent must sample for these settings (the ``hang`` field of ``status``):
    the metric names to read from a server's page, and the canary's deadline."""
    counters = settings.get("counters") or {}
    canary = settings.get("canary") or {}
    names = ([*counters.get("progress", []), *counters.get("busy", [])]
             if counters.get("enabled") else [])
    return {"metrics_path": str(counters.get("path") or METRICS_PATH), "metrics": names,
            "canary": float(canary.get("deadline") or 0) if canary.get("enabled") else 0.0}


@dataclass(frozen=True)
class ProcessVerdict:
    """One process: ``hung`` or not, the signal that confirmed it, and the evidence of every
    signal that holds now (``confirmations`` seen in a row, of ``needed``)."""

    process: str
    hung: bool
    signal: str | None = None
    evidence: list[dict[str, Any]] = field(default_factory=list)

    def why(self) -> str:
        """The confirmed signal's evidence in words (empty when not hung)."""
        first = next((e for e in self.evidence if e["signal"] == self.signal), None)
        return f"{self.process}: {first['detail']}" if first else ""

    def to_json(self) -> dict[str, Any]:
        return {"process": self.process, "hung": self.hung, "signal": self.signal,
                "evidence": self.evidence}


def judge_run(state: dict[str, Any], run: dict[str, Any], facts: dict[str, Any],
              settings: dict[str, Any]) -> tuple[dict[str, Any], list[ProcessVerdict]]:
    """The new state and a verdict per live process of ``run`` (one run of a ``status``
    answer whose processes carry the agent's ``hang`` samples; ``facts`` the answer's box
    facts, for GPU utilisation). Pure: the same inputs give the same outputs."""
    if not settings.get("enabled", True):
        return {}, []
    util = {g.get("index"): g.get("utilization_pct") for g in facts.get("gpus") or []
            if isinstance(g, dict)}
    new_state: dict[str, Any] = {}
    verdicts: list[ProcessVerdict] = []
    for proc in run.get("processes") or []:
        sample = proc.get("hang") if isinstance(proc, dict) else None
        if proc.get("state") != "running" or not isinstance(sample, dict):
            continue
        name = str(proc.get("name"))
        gpus = [util.get(i) for i in proc.get("gpus") or [] if isinstance(i, int)]
        kept = state.get(name)
        before: dict[str, Any] = kept if isinstance(kept, dict) else {}
        after, verdict = judge_process(before, name, sample, gpus, settings)
        new_state[name] = after
        verdicts.append(verdict)
    return new_state, verdicts


def judge_process(before: dict[str, Any], name: str, sample: dict[str, Any],
                  gpu_util: Sequence[Any], settings: dict[str, Any]
                  ) -> tuple[dict[str, Any], ProcessVerdict]:
    """One process's new state and verdict from its previous state and a new sample."""
    t = _num(sample.get("t"))
    if t is None:
        return before, ProcessVerdict(name, False)
    state = {k: dict(v) for k, v in before.items() if isinstance(v, dict)}
    log = _learn_log(state.get("log_cadence") or {}, sample)
    state["log_cadence"] = log
    needed = int(settings.get("confirmations") or CONFIRMATIONS)
    interval = float(settings.get("interval") or INTERVAL)
    counters = settings.get("counters") or {}
    last = state.get("counters_last") or {}
    due = _counters_due(sample, counters, last, interval, t)
    holds: dict[str, str | None] = {
        "log": _log_silence(log, t, settings.get("log") or {}),
        "gpu": _gpu_idle(state.get("gpu_idle") or {}, sample, gpu_util, t,
                         settings.get("gpu") or {}, _num(log.get("mtime"))),
        "counters": _counters_stalled(last, sample, counters) if due else SKIP,
        "canary": _canary_failed(sample, settings.get("canary") or {}),
        "stopped": _stopped(sample, settings.get("stopped") or {}),
    }
    state["gpu_idle"] = _gpu_track(state.get("gpu_idle") or {}, sample, gpu_util, t,
                                   settings.get("gpu") or {})
    if due:
        state["counters_last"] = {"t": t, "progress": _sum(sample, counters.get("progress")),
                                  "busy": _sum(sample, counters.get("busy"))}
    evidence: list[dict[str, Any]] = []
    confirmed: str | None = None
    for signal in SIGNALS:
        count = state.get(signal) or {}
        detail = holds[signal]
        if detail is None:
            state[signal] = {}
            continue
        if detail is not SKIP:
            at = _num(count.get("t"))
            if at is None or t - at >= interval:  # a new confirmation
                count = {"n": int(count.get("n") or 0) + 1, "t": t, "detail": detail}
            state[signal] = count
        if not count.get("n"):
            continue
        evidence.append({"signal": signal, "detail": count.get("detail") or "",
                         "confirmations": count["n"], "needed": needed})
        if count["n"] >= needed and confirmed is None:
            confirmed = signal
    return state, ProcessVerdict(name, confirmed is not None, confirmed, evidence)


# --- the signals: each returns the evidence in words when it holds now, else None ------


def _learn_log(cadence: dict[str, Any], sample: dict[str, Any]) -> dict[str, Any]:
    """The log's cadence: the newest modification time, the newest gaps between two."""
    mtime = _num(sample.get("log_mtime"))
    if mtime is None:
        return cadence
    last = _num(cadence.get("mtime"))
    gaps = [float(g) for g in cadence.get("gaps") or [] if isinstance(g, (int, float))]
    if last is not None and mtime > last:
        gaps = [*gaps, mtime - last][-GAPS_KEPT:]
    return {"mtime": mtime if last is None else max(mtime, last), "gaps": gaps}


def _log_silence(cadence: dict[str, Any], t: float, spec: dict[str, Any]) -> str | None:
    gaps = cadence.get("gaps") or []
    mtime = _num(cadence.get("mtime"))
    if not spec.get("enabled") or mtime is None or len(gaps) < int(spec.get("learn") or 1):
        return None
    floor = float(spec.get("floor") or LOG_FLOOR)
    bound = max(floor, float(spec.get("factor") or LOG_FACTOR) * max(gaps))
    silent = t - mtime
    if silent <= bound:
        return None
    return (f"no log line for {silent:.0f}s (bound {bound:.0f}s: {spec.get('factor')}× its "
            f"longest gap {max(gaps):.0f}s, at least {floor:.0f}s)")


def _gpu_low(sample: dict[str, Any], gpu_util: Sequence[Any], spec: dict[str, Any]) -> bool:
    values = [v for v in gpu_util if isinstance(v, (int, float))]
    return (bool(spec.get("enabled")) and sample.get("kind") != "server" and bool(values)
            and len(values) == len(gpu_util) and max(values) < int(spec.get("floor") or 0))


def _gpu_track(idle: dict[str, Any], sample: dict[str, Any], gpu_util: Sequence[Any],
               t: float, spec: dict[str, Any]) -> dict[str, Any]:
    """Since when every GPU of the process has been idle (box clock), or nothing."""
    if not _gpu_low(sample, gpu_util, spec):
        return {}
    since = _num(idle.get("since"))
    return {"since": t if since is None else since}


def _gpu_idle(idle: dict[str, Any], sample: dict[str, Any], gpu_util: Sequence[Any],
              t: float, spec: dict[str, Any], log_mtime: float | None) -> str | None:
    """Idle GPUs *and* no log line, both for the whole window. Utilisation alone is no
    hang: the real speculators trainer on an H200, healthy and logging a step every 0.2 s,
    read 0-12 % (mostly 0) in nvidia-smi's instant samples, since a small drafter's step is
    mostly data fetch (docs/real-gpu.md, "What a hang looks like")."""
    if not _gpu_low(sample, gpu_util, spec):
        return None
    since = _num(idle.get("since"))
    if since is not None and log_mtime is not None:
        since = max(since, log_mtime)  # a log line is work done: the window starts again
    window = float(spec.get("window") or GPU_WINDOW)
    if since is None or t - since < window:
        return None
    return (f"its GPUs under {spec.get('floor')}% utilisation and no log line for "
            f"{t - since:.0f}s (window {window:.0f}s; now "
            f"{', '.join(f'{v}%' for v in gpu_util)})")


def _counters_stalled(last: dict[str, Any], sample: dict[str, Any],
                      spec: dict[str, Any]) -> str | None:
    if not spec.get("enabled") or sample.get("kind") != "server":
        return None
    progress = _sum(sample, spec.get("progress"))
    busy = _sum(sample, spec.get("busy"))
    before, busy_before = _num(last.get("progress")), _num(last.get("busy"))
    if None in (progress, busy, before, busy_before):
        return None
    assert progress is not None and busy is not None and busy_before is not None
    if progress > (before or 0) or busy <= 0 or busy_before <= 0:
        return None
    span = (_num(sample.get("t")) or 0) - (_num(last.get("t")) or 0)
    names = ", ".join(spec.get("progress") or [])
    return (f"its progress counters ({names}) stood at {progress:.0f} for {span:.0f}s while "
            f"{busy:.0f} request(s) were running or waiting")


def _counters_due(sample: dict[str, Any], spec: dict[str, Any], last: dict[str, Any],
                  interval: float, t: float) -> bool:
    """Whether this sample is compared with the counters' reference and becomes the next
    one: one sample per ``interval`` (a stall is measured between two confirmations, never
    between two quick probes, where a long engine step would look like one)."""
    if not spec.get("enabled") or _sum(sample, spec.get("progress")) is None:
        return False
    at = _num(last.get("t"))
    return at is None or t - at >= interval


def _canary_failed(sample: dict[str, Any], spec: dict[str, Any]) -> str | None:
    canary = sample.get("canary")
    if not spec.get("enabled") or not isinstance(canary, dict) or canary.get("ok"):
        return None
    return (f"a one-token completion did not come back within {spec.get('deadline')}s "
            f"({canary.get('why') or 'no answer'})")


def _stopped(sample: dict[str, Any], spec: dict[str, Any]) -> str | None:
    if not spec.get("enabled") or not sample.get("stopped"):
        return None
    return "every process of its tree is stopped (state T: SIGSTOP or a debugger)"


def _sum(sample: dict[str, Any], names: Any) -> float | None:
    """The sum of the named metrics the agent read (summed over engines already), or None
    when the page gave none of them."""
    metrics = sample.get("metrics")
    if not isinstance(metrics, dict) or not isinstance(names, list):
        return None
    values = [_num(metrics.get(n)) for n in names]
    found = [v for v in values if v is not None]
    return sum(found) if found else None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def hung_line(verdicts: Sequence[ProcessVerdict]) -> str:
    """The hung processes' evidence in one line (empty when none is hung)."""
    return "; ".join(v.why() for v in verdicts if v.hung)
