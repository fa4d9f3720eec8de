"""What a sweep prints: one row per host (or one JSON line), shown the moment that host
finishes, then the failed hosts with their reasons; and each command's one-line summary of a
host's result (``status_summary``, ``cleanup_summary``, ...), the text of its row.

The fan-out itself (threads, deadlines, :class:`~outrig.fanout.HostOutcome`) is
:mod:`outrig.fanout`; the layout of a row for the terminal's width is :mod:`outrig.text.layout`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from outrig.console import Reporter
from outrig.fanout import FanOutFailed, HostOutcome
from outrig.text.layout import audit_gpus, fanout_failures, fanout_header, fanout_row
from outrig.transfer import human_bytes

Summary = Callable[[dict[str, Any]], str]


def status_summary(result: dict[str, Any]) -> str:
    """``2 runs: smoke running, job failed · GPUs 6/8 free`` (one host's status)."""
    runs = result.get("runs") or []
    if runs:
        states = ", ".join(f"{r.get('playbook')} {r.get('status')}" for r in runs)
        text = f"{len(runs)} run{'s' if len(runs) != 1 else ''}: {states}"
    else:
        text = "no runs"
    return f"{text} · {gpus_free(result.get('gpus') or [], result.get('gpu_error'))}"


def gpus_free(gpus: Sequence[dict[str, Any]], error: Any = None) -> str:
    """``GPUs 6/8 free`` (a GPU is free when nothing holds it)."""
    if not gpus:
        return f"GPUs: none ({error})" if error else "GPUs: none"
    free = sum(1 for g in gpus if not g.get("holders"))
    return f"GPUs {free}/{len(gpus)} free"


def cleanup_summary(result: dict[str, Any]) -> str:
    """What cleanup stopped (or would stop, with ``--dry-run``) on one host."""
    runs = result.get("runs") or []
    procs = sum(len(r.get("processes") or []) for r in runs)
    if result.get("dry_run"):
        text = f"would stop {len(runs)} run(s), {procs} process(es)"
    elif runs:
        text = f"stopped {', '.join(str(r.get('run_id')) for r in runs)} ({procs} process(es))"
    else:
        text = "nothing of ours was running"
    audit = result.get("gpus_after") or result.get("gpus_before") or {}
    foreign = [h for h in audit.get("holders") or [] if not h.get("owner")]
    if foreign:
        text += f" · {len(foreign)} foreign GPU holder(s) left alone"
    if audit.get("gpus"):
        text += f" · {gpus_free(audit_gpus(audit))}"
    return text


def check_summary(result: dict[str, Any]) -> str:
    """``python 3.12.3 · 8 GPUs · RTT 240 ms · 12.3 GB free`` (one host's check), with
    ``GPU health: 0-6 ok, 7 bad`` when a GPU is not ok."""
    from outrig.hosts.gpu_health import OK, health_head

    facts = result.get("facts") or {}
    gpus = facts.get("gpus")
    parts = [f"python {result.get('python')}",
             f"{len(gpus)} GPUs" if isinstance(gpus, list) else "GPUs unknown"]
    rtt = result.get("rtt")
    if isinstance(rtt, float):
        parts.append(f"RTT {rtt * 1000:.0f} ms")
    free = result.get("disk_free_bytes")
    if isinstance(free, int):
        parts.append(f"{free / 1e9:.1f} GB free")
    if not result.get("workdir_writable", True):
        parts.append("workdir NOT writable")
    health = [v for v in result.get("gpu_health") or [] if isinstance(v, dict)]
    if any(v.get("verdict") != OK for v in health):
        parts.append(str(health_head(health)))
    return " · ".join(parts)


def deploy_summary(result: dict[str, Any]) -> str:
    """``run smoke-20260101-000000-ab12 running · server, trainer`` (one host's deploy)."""
    names = ", ".join(str(p.get("process") or p.get("name")) for p in
                      result.get("processes") or [])
    return f"run {result.get('run_id')} {result.get('status')}" + (f" · {names}" if names
                                                                    else "")


def provision_summary(result: dict[str, Any]) -> str:
    """What provision set up (or would, with ``--dry-run``) on one host."""
    envs = result.get("environments") or []
    by_status: dict[str, list[str]] = {}
    for env in envs:
        by_status.setdefault(str(env.get("status")), []).append(str(env.get("name")))
    if not envs:
        return "checks passed; no environments"
    return " · ".join(f"{status}: {', '.join(names)}" for status, names in by_status.items())


def stage_summary(result: dict[str, Any]) -> str:
    """``model present · data pushed 1.2 GB`` (one host's stage)."""
    parts = []
    for item in result.get("items") or []:
        route = str(item.get("route"))
        moved = int(item.get("bytes") or 0)
        parts.append(f"{item.get('name')} {route}" + (f" {human_bytes(moved)}" if moved else ""))
    checkpoint = result.get("checkpoint")
    if isinstance(checkpoint, dict):
        parts.append(f"checkpoint {checkpoint.get('route', 'placed')}")
    return " · ".join(parts) or "nothing to stage"


def sync_summary(result: dict[str, Any]) -> str:
    """``2 new checkpoint(s) · 1 not complete`` (one host's sync-checkpoints)."""
    text = f"{len(result.get('pulled') or [])} new checkpoint(s)"
    if result.get("not_complete"):
        text += f" · {len(result['not_complete'])} not complete"
    if result.get("refused"):
        text += f" · {len(result['refused'])} refused (moved run)"
    return text


class Rows:
    """The output of a fan-out, printed as it comes: the header first (the host column's
    width is known from the selection), then each host's row (with its warnings under it)
    or JSON line the moment that host finishes, then the failed hosts with their reasons."""

    def __init__(self, reporter: Reporter, hosts: Sequence[str],
                 summarize: Summary, *, what: str) -> None:
        self.reporter = reporter
        self.hosts = list(dict.fromkeys(hosts))
        self.summarize = summarize
        self.what = what
        self.header, self.host_width = fanout_header(self.hosts)
        self.started = False

    def start(self) -> None:
        """The header (nothing in --json mode: each line is a whole object)."""
        if not self.started and not self.reporter.json_mode:
            self.reporter.lines([self.header])
        self.started = True

    def show(self, outcome: HostOutcome) -> None:
        """One host's row (or JSON line), now."""
        self.start()
        if self.reporter.json_mode:
            self.reporter.emit_json(outcome.to_json())
            return
        summary = self.summarize(outcome.result) if outcome.result is not None else "-"
        self.reporter.lines(fanout_row(outcome.host, outcome.state, summary, outcome.warnings,
                                       self.host_width, self.reporter.width))

    def finish(self, outcomes: Sequence[HostOutcome]) -> None:
        """The failed hosts with their reasons, then :class:`FanOutFailed` naming them, so
        the exit status is 0 only when every host succeeded."""
        self.start()
        failures = [(o.host, o.error or o.state) for o in outcomes if not o.ok]
        if not self.reporter.json_mode:
            self.reporter.lines(fanout_failures(failures, len(outcomes), self.reporter.width))
        if failures:
            raise FanOutFailed(
                f"{self.what} failed on {len(failures)} of {len(outcomes)} hosts: "
                f"{', '.join(h for h, _ in failures)} (the reasons are listed above); the "
                "other hosts' results are shown")


def report(reporter: Reporter, outcomes: Sequence[HostOutcome],
           summarize: Summary, *, what: str) -> None:
    """Show every host's outcome at once (a table, or one JSON line per host) in the order
    given, then raise :class:`FanOutFailed` if any failed (see :class:`Rows`)."""
    rows = Rows(reporter, [o.host for o in outcomes], summarize, what=what)
    for outcome in outcomes:
        rows.show(outcome)
    rows.finish(outcomes)
