"""The dflash recipe on several nodes (``nodes:`` > 1): torchrun's rendezvous flags, the
join wait, and what the plan must say or refuse (docs/scale-out.md has the evidence).

Kept apart from :mod:`outrig.recipes.dflash`, which renders one node; these pieces only add
to that rendering when the playbook spans several nodes."""

from __future__ import annotations

from outrig.recipes.base import Expansion, RecipeContext
from outrig.recipes.dflash_section import DFlashSpec


def rendezvous_flags(spec: DFlashSpec, nodes: int) -> list[str]:
    """torchrun's rendezvous flags: ``--standalone`` on one box, torch's own rendezvous across
    several nodes (outrig only substitutes the names per node and starts the processes).

    ``--rdzv-conf`` lets a node wait for the slowest other node to reach its trainer: each
    node first starts its own server and prepares its data, so the skew between nodes is
    bounded by those two steps' timeouts, not by torch's 600 s join default."""
    if nodes <= 1:
        return ["--standalone"]
    # The rendezvous id is the job's, shared by its nodes (${run_id} is each node's own run):
    # torch keys the rendezvous state by it, so nodes with different ids never meet.
    backend = spec.trainer.rendezvous
    # c10d reads join_timeout (dynamic_rendezvous.py _get_timeout); static reads timeout.
    # c10d hosts its store on the node whose own names match the endpoint, which a NAT'd
    # head address never does; is_host pins it to node 0 (c10d_rendezvous_backend.py:137-145).
    conf = (f"join_timeout={join_wait(spec)},is_host=${{is_head}}" if backend == "c10d"
            else f"timeout={join_wait(spec)}")
    return ["--nnodes", "${nnodes}", "--node-rank", "${node_rank}",
            "--rdzv-backend", backend, "--rdzv-endpoint", "${head_host}:${rdzv_port}",
            "--rdzv-id", "${job_id}", "--rdzv-conf", conf]


def join_wait(spec: DFlashSpec) -> int:
    """Seconds one node may wait for the others at the rendezvous: their server start plus
    their prepare step, each at its own timeout."""
    wait = spec.server.ready_timeout + (spec.prepare.timeout if spec.prepare.enabled else 0)
    return int(wait)


def check_nodes(spec: DFlashSpec, ctx: RecipeContext, out: Expansion) -> None:
    """What changes with ``nodes`` > 1: the layout note, and what cannot run on every node."""
    if ctx.nodes <= 1:
        return
    ranks = len(spec.trainer.gpus)
    out.notes.append(
        f"nodes: {ctx.nodes} × (vLLM on GPUs {spec.server.gpus} serving that node's "
        f"{ranks} trainer rank(s) on 127.0.0.1:{spec.server.port}, hidden states on its local "
        f"{spec.hidden_states_path}) = {ctx.nodes * ranks} ranks joined by torchrun's "
        f"{spec.trainer.rendezvous} rendezvous at ${{head_host}}:${{rdzv_port}} "
        "(docs/scale-out.md)")
    writer = ("node 0" if spec.trainer.rendezvous == "static" else
              "the node whose host name sorts first (c10d ignores --node-rank), not "
              "necessarily node 0")
    out.notes.append(
        f"checkpoints: only global rank 0 writes {spec.save_path}, on {writer}. Every rank "
        "reads its own node's copy when it starts, so before a resume every node must hold "
        "the same latest checkpoint there (or none)")
    if spec.prepare.enabled:
        out.notes.append(
            "prepare runs on every node against that node's server; every rank packs the "
            "whole dataset, so the inputs must be the same files on every node (the prepared "
            f"{spec.data_path} must come out identical)")
    if spec.regenerate.enabled:
        out.problems.append(
            f"{ctx.where(('dflash', 'regenerate', 'enabled'))}: regenerate-responses samples "
            f"new answers from each node's own server, so with nodes: {ctx.nodes} every node "
            "would train on different data (and ranks whose datasets differ hang). Run it in a "
            "one-node job, stage its output to every node and list it under prepare.data, then "
            "set regenerate.enabled: false here")
