"""The dflash recipe with a verifier larger than a node: one vLLM server spanning
``server.nodes`` nodes, the trainer on the same nodes or on nodes of its own, and the hidden
states carried by a Mooncake store (or a shared path the user names).

Each node gets its own processes (docs/scale-out.md, "A verifier across nodes"):

* node 0, the head: the Mooncake master (``hidden_states_backend: mooncake``), the vLLM server
  with its API (``--nnodes S --node-rank 0 --master-addr ${head_host}``), the only place
  readiness exists;
* nodes 1 .. S-1: the same vLLM command with ``--node-rank r --headless`` (no API server:
  vLLM 0.32 ``entrypoints/cli/serve.py:69-76``, ``run_headless`` ``:181-240``); ready once
  the head answers, since the server is one and only the head serves;
* trainer nodes (the server's own with ``trainer.nodes`` unset, else nodes S .. S+T-1):
  prepare and torchrun, asking the head's API for hidden states and reading them from the
  store (speculators ``--hidden-states-backend mooncake --mooncake-master HOST:PORT``,
  ``hs_connectors/transfer.py:342-463``) or from the shared path.

Kept apart from :mod:`outrig.recipes.dflash`, which renders one node's server; this module
decides each node's role, checks what only a layout across nodes can get wrong (world size,
ports, addresses, pipeline parallelism, the shared path) and adds the flags. Pure: no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from outrig.recipes.base import Expansion, RecipeContext
from outrig.recipes.dflash_nodes import check_nodes, join_wait
from outrig.recipes.dflash_section import DFlashSpec

# speculators 0.9 hs_connectors/transfer.py:454-463 (MooncakeBackend.build_kv_transfer_config)
MOONCAKE_CONNECTOR = "MooncakeHiddenStatesConnector"
MOONCAKE_MODULE = "hs_connectors.mooncake_hidden_states_connector"
# hs_connectors/mooncake_store.py:115-125 (MooncakeStoreConfig defaults; launch_vllm's flags
# --mooncake-global-segment-gib 4, --mooncake-local-buffer-gib 2, transfer.py:386-401)
MOONCAKE_STORE = {"metadata_server": "P2PHANDSHAKE", "global_segment_size": 4 << 30,
                  "local_buffer_size": 2 << 30, "protocol": "tcp", "device_name": "",
                  "num_writer_threads": 4}
LOOPBACK_PREFIXES = ("127.", "localhost", "::1", "[::1]")
# The head's API answers the other nodes' trainer ranks and prepare steps.
SPAN_LISTEN = "0.0.0.0"
MASTER_NAME = "mooncake"


@dataclass(frozen=True)
class Role:
    """What one node runs. ``trainer_rank``/``trainer_nodes``/``trainer_head`` place its
    torchrun among the trainer nodes (node ``trainer_head`` hosts their rendezvous)."""

    server: bool
    head: bool
    trainer: bool
    trainer_rank: int
    trainer_nodes: int
    trainer_head: int


def spans(spec: DFlashSpec) -> bool:
    """A layout across nodes: a server larger than a node, or trainer nodes of their own."""
    return spec.server.nodes > 1 or spec.trainer.nodes is not None


def role(spec: DFlashSpec, ctx: RecipeContext) -> Role:
    """This node's role. Without :func:`spans` every node runs all three processes."""
    rank = ctx.node_rank
    if not spans(spec):
        return Role(True, rank == 0, True, rank, max(ctx.nodes, 1), 0)
    servers = spec.server.nodes
    if spec.trainer.nodes is None:  # co-located: the trainer on the server's nodes
        return Role(rank < servers, rank == 0, True, rank, servers, 0)
    return Role(rank < servers, rank == 0, rank >= servers, max(rank - servers, 0),
                spec.trainer.nodes, servers)


def launch_group(spec: DFlashSpec, node: Role) -> tuple[bool, str]:
    """(start with node 0, GPU-count group): a headless part of the server starts with the
    head, which is ready only once every part joined; trainer nodes of their own start once
    the head is ready, and may have another GPU count than the server's nodes."""
    if not spans(spec):
        return False, ""
    return node.server and not node.head, "server" if node.server else "trainer"


def expected_nodes(spec: DFlashSpec) -> int:
    return spec.server.nodes + (spec.trainer.nodes or 0)


# ------------------------------------------------------------------------------ checks


def check_span(spec: DFlashSpec, ctx: RecipeContext, out: Expansion) -> None:
    """Everything a layout across nodes can get wrong before anything starts, each problem
    naming the key and the fix; with a server per node, :func:`check_nodes`'s checks."""
    if not spans(spec):
        check_nodes(spec, ctx, out)
        if spec.hidden_states_backend == "mooncake":
            out.problems.append(
                f"{ctx.where(('dflash', 'hidden_states_backend'))}: mooncake carries hidden "
                "states between nodes, but every node here runs its own server and reads its "
                "own local files. Set hidden_states_backend: file, or span the server "
                "(server.nodes > 1) or give the trainer nodes of its own (trainer.nodes)")
        return
    _check_world(spec, ctx, out)
    _check_ports(spec, ctx, out)
    _check_addresses(spec, ctx, out)
    _check_transport(spec, ctx, out)
    _notes(spec, ctx, out)


def _check_world(spec: DFlashSpec, ctx: RecipeContext, out: Expansion) -> None:
    """Node count, the server's world size against the GPUs of all its nodes, and no PP."""
    server, at = spec.server, ctx.where
    want = expected_nodes(spec)
    if ctx.nodes != want:
        split = (f" + trainer.nodes {spec.trainer.nodes}" if spec.trainer.nodes is not None
                 else " (the trainer shares them)")
        out.problems.append(
            f"{at(('nodes',))}: the job spans nodes: {ctx.nodes}, but dflash.server.nodes "
            f"{server.nodes}{split} = {want}. Set nodes: {want}, or change server.nodes / "
            "trainer.nodes to add up to it")
    if server.pipeline > 1:
        out.problems.append(
            f"{at(('dflash', 'server', 'pipeline'))}: {server.pipeline}: vLLM refuses "
            "pipeline parallelism with extract_hidden_states (vLLM PR #53015). Set pipeline: "
            "1 and spread the model with tensor (across nodes) and data")
    world = server.tensor * server.pipeline * server.data
    gpus = len(server.gpus) * server.nodes
    if world != gpus:
        out.problems.append(
            f"{at(('dflash', 'server', 'nodes'))}: tensor {server.tensor} × pipeline "
            f"{server.pipeline} × data {server.data} = {world} ranks, but {server.nodes} "
            f"node(s) × {len(server.gpus)} GPU(s) each (server.gpus {server.gpus}) = {gpus}. "
            "vLLM gives every node world ÷ nnodes ranks (engine/arg_utils.py, 'must evenly "
            f"divide the total world size'). Set server.nodes: {max(world // len(server.gpus), 1)}"
            f" or tensor × data = {gpus}")
    if spec.regenerate.enabled:
        out.problems.append(
            f"{at(('dflash', 'regenerate', 'enabled'))}: regenerate-responses is not run with "
            "a server across nodes; run it in a one-node job and list its output under "
            "prepare.data, then set regenerate.enabled: false")


def _check_ports(spec: DFlashSpec, ctx: RecipeContext, out: Expansion) -> None:
    """Node 0 holds the API port, vLLM's master port, the Mooncake ports and (co-located) the
    trainer's rendezvous: each must be its own."""
    ports: list[tuple[tuple[object, ...], int]] = [
        (("dflash", "server", "port"), spec.server.port)]
    if spec.server.nodes > 1:
        ports.append((("dflash", "server", "master_port"), spec.server.master_port))
    if spec.hidden_states_backend == "mooncake":
        ports += [(("dflash", "mooncake", "port"), spec.mooncake.port),
                  (("dflash", "mooncake", "metrics_port"), spec.mooncake.metrics_port)]
    if ctx.rdzv_port is not None:
        ports.append((("rdzv_port",), ctx.rdzv_port))
    seen: dict[int, tuple[object, ...]] = {}
    for key, port in ports:
        if port in seen:
            out.problems.append(
                f"{ctx.where(key)}: port {port} is also {'.'.join(map(str, seen[port]))}; "
                "node 0 listens on both, so the second would find it taken. Give it a port of "
                "its own")
        else:
            seen[port] = key


def _check_addresses(spec: DFlashSpec, ctx: RecipeContext, out: Expansion) -> None:
    """The head (API, vLLM's master, Mooncake master) and the trainer's rendezvous node are
    reached by the other nodes at their addresses: a loopback one reaches only itself."""
    if len(ctx.node_hosts) < ctx.nodes or ctx.nodes <= 1:
        return  # a plan shown alone: the other nodes are not known
    head = ctx.node_hosts[0]
    if _loopback(head) and not ctx.head_declared:
        what = ("the Mooncake master at " f"{head}:{spec.mooncake.port}, "
                if spec.hidden_states_backend == "mooncake" else "")
        out.problems.append(
            f"{ctx.where(('nodes',))}: node 0 is reached at {head}, a loopback address: "
            f"{what}vLLM's head at {head}:{spec.server.master_port} and its API at "
            f"{head}:{spec.server.port} would be this machine to every other node. Set "
            "node_address: in node 0's host file to an address the other nodes reach (a "
            "cluster-internal IP); if every node is on this one machine, set node_address: "
            f"{head} there to say so")


def _check_transport(spec: DFlashSpec, ctx: RecipeContext, out: Expansion) -> None:
    """The file backend across nodes needs one filesystem: a path the user names."""
    if spec.hidden_states_backend != "file":
        return
    path = spec.hidden_states_path
    if "${run_dir}" in path or "${run_id}" in path or not path.startswith("/"):
        out.problems.append(
            f"{ctx.where(('dflash', 'hidden_states_path'))}: {path} is each node's own folder, "
            "but the head's vLLM writes the hidden states and trainer ranks on other nodes "
            "read them (speculators' file backend opens the path the server returns). Name "
            "an absolute path on a filesystem every node mounts, or set "
            "hidden_states_backend: mooncake")


def _notes(spec: DFlashSpec, ctx: RecipeContext, out: Expansion) -> None:
    place = ("on the server's nodes" if spec.trainer.nodes is None else
             f"on nodes {spec.server.nodes}..{expected_nodes(spec) - 1}")
    carrier = (f"a Mooncake master on node 0 (port {spec.mooncake.port})"
               if spec.hidden_states_backend == "mooncake"
               else f"the shared {spec.hidden_states_path}")
    out.notes.append(
        f"verifier across nodes: one vLLM server on nodes 0..{spec.server.nodes - 1} "
        f"(tensor {spec.server.tensor} × data {spec.server.data}; node 0 serves the API on "
        f"{SPAN_LISTEN}:{spec.server.port}, the others run --headless), the trainer {place}, "
        f"hidden states through {carrier} (docs/scale-out.md)")
    out.notes.append(
        f"the head's API listens on every interface (port {spec.server.port}) so the trainer "
        "nodes reach it: keep the port closed to anything outside the cluster")


# ------------------------------------------------------------------------------ rendering


def server_flags(spec: DFlashSpec, node: Role, rank: int) -> list[str]:
    """vLLM's multi-node flags without Ray for node ``rank`` (arg_utils.py ``--nnodes``,
    ``--node-rank``, ``--master-addr``, ``--master-port``; ``--nnodes`` > 1 requires
    ``--data-parallel-backend mp``; ranks > 0 are ``--headless``)."""
    if spec.server.nodes <= 1:
        return []
    return ["--nnodes", str(spec.server.nodes), "--node-rank", str(rank),
            "--master-addr", "${head_host}", "--master-port", str(spec.server.master_port),
            "--data-parallel-backend", "mp", *([] if node.head else ["--headless"])]


def kv_transfer(spec: DFlashSpec, file_config: dict[str, Any]) -> dict[str, Any]:
    """The KV-transfer config: the file connector as on one box, or what speculators'
    ``launch_vllm.py --hidden-states-backend mooncake`` builds, with this node's own address
    (``${node_host}``: the store's peers reach the writer there) and the head's master."""
    if spec.hidden_states_backend != "mooncake":
        return file_config
    store = {"local_hostname": "${node_host}", **MOONCAKE_STORE,
             "master_server_address": f"${{head_host}}:{spec.mooncake.port}"}
    return {"kv_connector": MOONCAKE_CONNECTOR, "kv_role": "kv_producer",
            "kv_connector_module_path": MOONCAKE_MODULE,
            "kv_connector_extra_config": {"mooncake": store}}


def server_ready(spec: DFlashSpec, node: Role, own: dict[str, Any]) -> dict[str, Any]:
    """The head keeps its own readiness; a headless rank has no API, so it is ready when the
    one server answers at the head."""
    if node.head or not spans(spec):
        return own
    return {"http": f"http://${{head_host}}:{spec.server.port}/health",
            "timeout": spec.server.ready_timeout}


def endpoint(spec: DFlashSpec) -> str:
    """Where prepare and the trainer reach the server: loopback on their own node, else the
    head."""
    host = "${head_host}" if spans(spec) else "127.0.0.1"
    return f"http://{host}:{spec.server.port}"


def render_master(spec: DFlashSpec, out: Expansion) -> str | None:
    """``mooncake_master --rpc_port P --metrics_port M`` on node 0; returns its name."""
    if spec.hidden_states_backend != "mooncake":
        return None
    moon = spec.mooncake
    out.processes[MASTER_NAME] = {
        "command": [moon.command, "--rpc_port", str(moon.port),
                    "--metrics_port", str(moon.metrics_port), *moon.extra_args],
        "env": dict(spec.env), "gpus": [],
        "ready": {"port": moon.port, "timeout": moon.ready_timeout},
        # A taken port: the master prints its start line and exits 1 with no line of its
        # own (0.3.13), so the box's check before launch (port_busy) is what names it.
        "fatal": [],
        "stop": {"grace": moon.stop_grace},
    }
    out.origins[("processes", MASTER_NAME)] = ("dflash", "mooncake")
    return MASTER_NAME


def trainer_backend(spec: DFlashSpec) -> tuple[list[str], dict[str, str]]:
    """speculators' backend flags and environment (``MOONCAKE_LOCAL_HOSTNAME``: the address
    the trainer's store client registers, transfer.py ``from_train_args``)."""
    if spec.hidden_states_backend != "mooncake":
        return [], {}
    return (["--hidden-states-backend", "mooncake",
             "--mooncake-master", f"${{head_host}}:{spec.mooncake.port}"],
            {"MOONCAKE_LOCAL_HOSTNAME": "${node_host}"})


def rendezvous(spec: DFlashSpec, node: Role) -> list[str]:
    """torchrun's flags among the trainer nodes when they are not all the job's nodes."""
    backend = spec.trainer.rendezvous
    is_head = "true" if node.trainer_rank == 0 else "false"
    conf = (f"join_timeout={join_wait(spec)},is_host={is_head}" if backend == "c10d"
            else f"timeout={join_wait(spec)}")
    return ["--nnodes", str(node.trainer_nodes), "--node-rank", str(node.trainer_rank),
            "--rdzv-backend", backend,
            "--rdzv-endpoint", f"${{node_host_{node.trainer_head}}}:${{rdzv_port}}",
            "--rdzv-id", "${job_id}", "--rdzv-conf", conf]


def _loopback(address: str) -> bool:
    return address.startswith(LOOPBACK_PREFIXES)


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
