"""A moved job's new boxes made ready, each node as a one-box ``migrate`` makes its new box:
the playbook's environments installed (``provision``'s core) and its data staged (``stage``'s
core: the model, the data and every ``stage:`` item other than checkpoints), before the old
nodes are fenced and the job is deployed again (:mod:`outrig.ops.job_move`).

Why every node: each node runs the job's processes from its own disk. A bare box given only
the checkpoint would start its ranks without their interpreter or their data, fail at the
deploy, and leave the job stopped on its old nodes (fenced) and not running on the new ones.

The nodes are made ready at once, one thread and one session per new box
(:func:`outrig.fanout.run_fanout`), each with a deadline long enough for an install or a copy.
Each node's data is copied from the old node of the same rank when that one still answers
and holds it (box to box, as ``migrate`` copies from OLD), else from the item's own source
(the hub, or a folder on this workstation). A node that cannot be made ready ends the move
before anything old is stopped: the error names every node and why, and the old job trains
on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from outrig.console import Reporter
from outrig.errors import OutrigError
from outrig.fanout import HostOutcome, run_fanout
from outrig.journal import Journal
from outrig.ops.provision import provision_on
from outrig.ops.stage import stage_items, stage_on
from outrig.playbook import Job
from outrig.session import HostSession, Project

PREPARE_WORK = 3600.0  # seconds an install or a copy on one node may take (as a sweep's)


def needs_preparing(job: Job, session: HostSession) -> tuple[bool, bool]:
    """(environments to install, data to stage) of ``job`` on a new box."""
    data = any(i.kind != "checkpoints" for i in stage_items(job, session.host))
    return bool(job.spec.environments), data


def prepare_nodes(project: Project, hosts: Sequence[str], job: Job, reporter: Reporter, *,
                  journal: Journal, sources: Sequence[HostSession | None] = ()
                  ) -> list[dict[str, Any]]:
    """Install ``job``'s environments and stage its data on every box of ``hosts`` (node 0
    first) at once; ``sources[rank]`` is the old node of that rank when it answers (its data
    is copied box to box). Returns each node's report (rank, host, environments, staged
    items); raises :class:`~outrig.errors.OutrigError` naming every node that failed."""
    by_host = {host: rank for rank, host in enumerate(hosts)}

    def core(session: HostSession) -> dict[str, Any]:
        rank = by_host[session.host_spec]
        src = sources[rank] if rank < len(sources) else None
        return prepare_node(session, job, rank, src)

    def shown(outcome: HostOutcome) -> None:
        rank = by_host[outcome.host]
        if outcome.ok and outcome.result is not None:
            reporter.info(f"• node {rank} ({outcome.host}) ready: "
                          + describe_prepared(outcome.result))
        for warning in outcome.warnings:
            reporter.warn(f"node {rank} ({outcome.host}): {warning}")

    reporter.info(f"• making {len(hosts)} new box(es) ready for {job.name}: "
                  + ", ".join(f"node {r} ({h})" for h, r in by_host.items()))
    outcomes = run_fanout(project, list(hosts), core, journal=journal, work=PREPARE_WORK,
                          on_outcome=shown)
    failed = [(by_host[o.host], o) for o in outcomes if not o.ok]
    if failed:
        raise OutrigError(
            "the new boxes could not be made ready for " + job.name + ": " + "; ".join(
                f"node {rank} ({o.host}): {o.error}" for rank, o in failed)
            + ". Nothing of the old job was stopped. Fix that box (or name another one) and "
            "move the job again.")
    return [{"rank": by_host[o.host], "host": o.host, **(o.result or {})} for o in outcomes]


def prepare_node(session: HostSession, job: Job, rank: int,
                 src: HostSession | None) -> dict[str, Any]:
    """One new node: its environments (``provision``), then its data (``stage``, from
    ``src`` when it holds it). Nothing to do is an empty report, not an error."""
    environments, data = needs_preparing(job, session)
    report: dict[str, Any] = {"environments": [], "staged": []}
    if environments:
        provisioned = provision_on(session, job)
        report["environments"] = [{"name": e.get("name"), "status": e.get("status")}
                                  for e in provisioned.environments]
    if data:
        staged = stage_on(session, job, src=src, source_playbook=job, parts=("data",))
        report["staged"] = [{"name": i.get("name"), "route": i.get("route"),
                             "bytes": i.get("bytes")} for i in staged.get("items") or []]
    return report


def describe_prepared(report: dict[str, Any]) -> str:
    """``environments demo (created); data: data (workstation), model (peer)``."""
    parts = []
    if report.get("environments"):
        parts.append("environments " + ", ".join(f"{e['name']} ({e['status']})"
                                                 for e in report["environments"]))
    if report.get("staged"):
        parts.append("staged " + ", ".join(f"{i['name']} ({i['route']})"
                                           for i in report["staged"]))
    return "; ".join(parts) or "nothing to install or stage"
