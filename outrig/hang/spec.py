"""The playbook's ``hang:`` section: which hang signals ``watch`` and ``status`` judge, with
what bounds, and how many consecutive confirmations each needs before a process is ``hung``.

Every key has a default, so a playbook without the section gets them all (docs/playbooks.md
lists them). Each signal is turned off with ``enabled: false``; ``hang: {enabled: false}``
turns every one off. The defaults are chosen to never call a healthy job hung: a trainer's
silence must outlast both a floor and several times the longest gap it showed between two
log lines, and a server's counters only count while it has requests to serve.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from outrig.hang import judge


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LogSilenceSpec(_Strict):
    """A process that writes no log line for longer than its own cadence allows."""

    enabled: bool = True
    floor: float = Field(judge.LOG_FLOOR, gt=0,
                         description="seconds of silence never called a hang")
    factor: float = Field(judge.LOG_FACTOR, ge=1,
                          description="times the longest gap seen between two log writes "
                          "(its own cadence) that silence must also exceed")
    learn: int = Field(judge.LOG_LEARN, ge=1,
                       description="gaps seen before the cadence is trusted: a process that "
                       "has not logged that often is never judged by its log")


class GpuIdleSpec(_Strict):
    """Every GPU a live, non-server process was given stays under a utilisation floor."""

    enabled: bool = True
    floor: int = Field(judge.GPU_FLOOR, ge=0, le=100,
                       description="utilisation in percent under which a GPU counts as idle")
    window: float = Field(judge.GPU_WINDOW, gt=0,
                          description="seconds every GPU of the process must stay idle before "
                          "a confirmation counts")


class CountersSpec(_Strict):
    """An HTTP server (a process with ``ready.http``) whose progress counters stand still
    while requests are running or waiting (vLLM's ``/metrics``)."""

    enabled: bool = True
    path: str = Field(judge.METRICS_PATH, pattern=r"^/",
                      description="the metrics page on the server's origin")
    progress: list[str] = Field(default_factory=lambda: list(judge.PROGRESS_COUNTERS),
                                min_length=1, description="counters that grow with work")
    busy: list[str] = Field(default_factory=lambda: list(judge.BUSY_GAUGES), min_length=1,
                            description="gauges of requests running or waiting")


class CanarySpec(_Strict):
    """One tiny completion sent to a server with a ``ready.model``, which must answer
    within its deadline (off by default: it puts a request on the server)."""

    enabled: bool = False
    deadline: float = Field(judge.CANARY_DEADLINE, gt=0, le=600,
                            description="seconds the answer may take")


class StoppedSpec(_Strict):
    """Every live process of the tree stopped (state T: SIGSTOP, a debugger's stop)."""

    enabled: bool = True


class HangSpec(_Strict):
    """The ``hang:`` section (defaults in docs/playbooks.md#hang)."""

    enabled: bool = True
    confirmations: int = Field(judge.CONFIRMATIONS, ge=1, le=100,
                               description="consecutive confirmations a signal needs before "
                               "the process is hung")
    interval: float = Field(judge.INTERVAL, gt=0,
                            description="seconds (on the box's clock) at least between two "
                            "confirmations")
    log: LogSilenceSpec = Field(default_factory=lambda: LogSilenceSpec())
    gpu: GpuIdleSpec = Field(default_factory=lambda: GpuIdleSpec())
    counters: CountersSpec = Field(default_factory=lambda: CountersSpec())
    canary: CanarySpec = Field(default_factory=lambda: CanarySpec())
    stopped: StoppedSpec = Field(default_factory=lambda: StoppedSpec())

    def settings(self) -> dict[str, Any]:
        """The section as plain JSON, what the judge and the journal hold."""
        return self.model_dump()
