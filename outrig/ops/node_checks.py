"""What a multi-node job's nodes must agree on before anything starts: the newest checkpoint
of every process that declares ``checkpoints:``, and the GPU count of nodes that share one
server. Called by :func:`outrig.ops.nodes.deploy_nodes` after every node was planned; each
raises :class:`~outrig.errors.PlanError` (exit 2) naming the nodes and the fix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from outrig.checkpoints import listing_request, newest_complete, order_text
from outrig.errors import PlanError
from outrig.plan import Plan
from outrig.playbook import Job
from outrig.session import HostSession


class Node(Protocol):
    """A node of the job as these checks name it (:class:`outrig.ops.nodes.NodeRun`)."""

    @property
    def host(self) -> str: ...

    def label(self) -> str: ...


def check_checkpoints_agree(sessions: Sequence[HostSession], nodes: Sequence[Node],
                            plans: Sequence[Plan]) -> None:
    """Refuse to start when the nodes' newest complete checkpoints differ.

    Why: every rank resumes from its *own* node's ``save_path`` (speculators reads it on
    each rank at start; docs/scale-out.md, "Checkpoints"), while only global rank 0 writes
    one. A node without rank 0's newest checkpoint starts its ranks fresh while the others
    resume, and the job then hangs in a collective or trains from mismatched states. One
    ``checkpoints`` call per node and process that declares ``checkpoints:``; nothing is
    started when they disagree (the same newest on all, or none anywhere, passes)."""
    # Compared among the nodes that run the process (a dflash trainer on nodes of its own).
    for name in dict.fromkeys(n for p in plans for n, q in p.processes.items() if q.checkpoints):
        where = [i for i, plan in enumerate(plans) if name in plan.processes]
        first, newest = plans[where[0]].processes[name], []
        for i in where:
            proc = plans[i].processes[name]
            session = sessions[i]
            fields = {**listing_request(proc.argv),
                      "scheduler": bool((proc.checkpoints or {}).get("scheduler", True))}
            listing = session.call("checkpoints", stream=False,
                                   save_path=str((proc.checkpoints or {})["path"]), **fields)
            best = newest_complete(listing)
            newest.append(None if best is None else best.order)
        if len(set(newest)) <= 1:
            continue
        held = "; ".join(f"{nodes[i].label()}: {order_text(o) if o else 'none'}"
                         for i, o in zip(where, newest, strict=True))
        source = where[max(range(len(where)), key=lambda k: newest[k] or (-1, 0, 0))]
        raise PlanError([
            f"{name}: the nodes hold different newest checkpoints in "
            f"{(first.checkpoints or {}).get('path')} ({held}). Every rank resumes from its "
            "own node's copy, so they would start from different states and hang. Put the "
            f"same one on every node (e.g. outrig stage --host OTHER --playbook "
            f"{plans[0].playbook} --from {nodes[source].host} --resume, for a recipe that "
            "stages checkpoints), or remove them on every node to start fresh"],
            context=f"{plans[0].playbook} on {len(nodes)} nodes")


def check_gpu_counts(job: Job, nodes: Sequence[Node], plans: Sequence[Plan]) -> None:
    """Refuse nodes of one group (``Plan.node_group``, set by a recipe whose nodes share one
    server) whose known GPU counts differ: vLLM gives every node of a server world ÷ nnodes
    ranks, so a mixed set is a wrong box, found here before anything starts. Nodes of no
    group (a playbook's own processes name their GPUs per node) are not compared."""
    groups: dict[str, list[tuple[Node, int]]] = {}
    for node, plan in zip(nodes, plans, strict=True):
        if plan.node_group and plan.facts.gpu_count is not None:
            groups.setdefault(plan.node_group, []).append((node, plan.facts.gpu_count))
    for group, counts in groups.items():
        if len({count for _, count in counts}) <= 1:
            continue
        which = f"the {group} nodes"
        held = ", ".join(f"{node.label()}: {count}" for node, count in counts)
        raise PlanError([
            f"{job.where(('nodes',))}: {which} have different GPU counts ({held}); each node "
            "gets the same share of the job's ranks. Use boxes with the same GPU count (the "
            "same offer), or leave the odd one out. Nothing was started"],
            context=f"{job.name} on {len(nodes)} nodes")
