"""``watch --run JOB``: the workstation-side guard of a multi-node job once it is up.

It asks every node's box for its run's state each period (one status call per node at once,
through the fan-out), stops every node when one fails, and, with ``--spare``, hands the lost
nodes to a :class:`NodeMover` (:mod:`outrig.ops.job_move`). Split from
:mod:`outrig.ops.nodes`, which deploys a job, and :mod:`outrig.ops.node_control`, which shows
and stops it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from outrig.console import Reporter
from outrig.fanout import HostOutcome, run_fanout
from outrig.journal import Journal
from outrig.ops.node_control import node_core, node_state, state_words, stop_nodes
from outrig.ops.nodes import NodeRun, NodesFailed, job_nodes
from outrig.session import HostSession, Project
from outrig.watching.health import DEFAULT_THRESHOLD


class NodeMover(Protocol):
    """What ``watch --run JOB --spare`` adds to the guard (:mod:`outrig.ops.job_move`):
    ``look`` after every look at the nodes, ``move`` once nodes are lost."""

    def look(self) -> None: ...

    def move(self, lost: list[NodeRun]) -> dict[str, Any]: ...


@dataclass
class NodeSeen:
    """What the guard knows of one node: its last state and since when it has not answered."""

    state: str = "starting"
    why: str = ""
    silent_since: float | None = None


def watch_nodes(project: Project, ident: str, reporter: Reporter, *, period: float = 5.0,
                threshold: float = DEFAULT_THRESHOLD, journal: Journal | None = None,
                stop: threading.Event | None = None, mover: NodeMover | None = None
                ) -> dict[str, Any]:
    """``watch`` of a multi-node job: every ``period`` seconds, ask every node (at once, each
    under its own deadline) for its run's state, judged as ``watch`` judges one run
    (:func:`outrig.watching.health.run_state`). When a node's run failed, is gone from its
    box, or the node has not answered for ``threshold`` seconds, the other nodes are stopped and
    :class:`NodesFailed` names that node and why. Returns once every node finished (or when
    ``stop`` is set).

    ``mover`` (``watch --spare``): after each look, ``mover.look()`` (it mirrors rank 0's new
    checkpoints); a node lost (no answer for ``threshold``) is ``mover.move(lost)``'s, whose
    answer this returns: the job moves to spares instead of stopping. While a node is silent
    but not yet lost, a failed peer waits for it (a dead box takes its peers' collectives
    down with it): the move fences them."""
    journal = journal or Journal()
    record, nodes = job_nodes(journal, ident)
    job_id = str(record.get("job_id"))
    seen = {n.rank: NodeSeen() for n in nodes}
    stop = stop or threading.Event()
    reporter.info(f"• watching job {job_id} on {len(nodes)} nodes: "
                  + ", ".join(n.label() for n in nodes))

    def one(session: HostSession, node: NodeRun) -> dict[str, Any]:
        return session.call("status", stream=False, log_lines=0, run_id=node.run_id,
                            playbook=None)

    while not stop.is_set():
        outcomes = run_fanout(project, [n.host for n in nodes], node_core(nodes, one),
                              journal=journal)
        now = time.monotonic()
        for node, outcome in zip(nodes, outcomes, strict=True):
            judge_node(seen[node.rank], node, outcome, now, threshold, reporter)
        if mover is not None:
            mover.look()
            lost = [n for n in nodes if seen[n.rank].state == "lost"]
            if lost:
                return mover.move(lost)
        bad = [n for n in nodes if seen[n.rank].state in ("failed", "missing", "lost")]
        waiting = mover is not None and any(s.state == "silent" for s in seen.values())
        if bad and not waiting:
            _stop_after_failure(project, job_id, bad, seen, reporter, journal)
        if all(s.state == "finished" for s in seen.values()):
            journal.record_job(job_id, {"status": "finished"})
            reporter.success(f"job {job_id} finished on every node")
            return {"job_id": job_id, "status": "finished"}
        stop.wait(period)
    return {"job_id": job_id, "status": "watching"}


def judge_node(seen: NodeSeen, node: NodeRun, outcome: HostOutcome, now: float,
                threshold: float, reporter: Reporter) -> None:
    """Update ``seen`` from one status answer; say so when the node's state changes."""
    before = seen.state
    if outcome.ok:
        seen.silent_since = None
        seen.state, seen.why = node_state(outcome.result, node.run_id)
    else:
        seen.silent_since = seen.silent_since if seen.silent_since is not None else now
        silent = now - seen.silent_since
        seen.state = "lost" if silent >= threshold else "silent"
        seen.why = f"no answer for {silent:.0f} s: {outcome.error}"
    if seen.state != before:
        reporter.emit_json({"event": "node", "node_rank": node.rank, "host": node.host,
                            "state": seen.state, "why": seen.why})
        if not reporter.json_mode:
            reporter.info(f"{node.label()}: {state_words(seen.state, seen.why)}")


def _stop_after_failure(project: Project, job_id: str, bad: Sequence[NodeRun],
                        seen: dict[int, NodeSeen], reporter: Reporter,
                        journal: Journal) -> NoReturn:
    """Stop every other node of the job (and the failed ones' leftovers), then raise.

    Every node found failed in the same look is named: one look cannot tell which failed
    first (a node hosting torch's rendezvous store takes the others down with it)."""
    why = "; ".join(f"{n.label()} failed: {seen[n.rank].why}" for n in bad)
    reporter.warn(f"{why}. Stopping the job on every node.")
    journal.record_job(job_id, {"status": "failed", "failed_node": bad[0].rank,
                                "failed_nodes": [n.rank for n in bad], "error": why})
    try:
        stop_nodes(project, job_id, reporter, journal=journal)
        stopped = "every node was stopped"
    except NodesFailed as exc:
        stopped = str(exc)
    journal.record_job(job_id, {"status": "failed"})
    raise NodesFailed(f"job {job_id}: {why}; {stopped}.")
