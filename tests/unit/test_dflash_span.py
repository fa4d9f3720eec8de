"""A verifier across nodes (``server.nodes``, ``trainer.nodes``, the Mooncake backend): each
node's rendered processes, and every check that refuses a layout before anything starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.errors import PlanError
from outrig.inventory import Host
from outrig.ops.node_checks import check_gpu_counts
from outrig.ops.nodes import NodeRun
from outrig.plan import HostFacts, Plan, make_plan
from outrig.playbook import load_job
from tests.support.span import ADDRESSES, FACTS, colocated_doc, node_plans, split_doc


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def problem(plans: list[Plan], needle: str) -> str:
    hits = [p for plan in plans for p in plan.problems if needle in p]
    assert hits, [plan.problems for plan in plans]
    return hits[0]


# ------------------------------------------------------------------------------ rendering


def test_split_layout_renders_each_node_its_part(tmp_path: Path) -> None:
    head, headless, trainer = node_plans(tmp_path, split_doc())
    assert all(p.ok for p in (head, headless, trainer)), [p.problems for p in
                                                         (head, headless, trainer)]
    assert head.order == ["mooncake", "server"]
    assert headless.order == ["server"]
    assert trainer.order == ["prepare", "trainer"]
    # the Mooncake master: node 0 only, ready on its RPC port, started before vLLM
    master = head.processes["mooncake"]
    assert master.argv[1:] == ["--rpc_port", "50051", "--metrics_port", "9003"]
    assert master.ready is not None and master.ready.port == 50051
    assert head.processes["server"].after == ["mooncake"]
    # vLLM without Ray: the same command on both nodes but for the rank and --headless
    one, two = head.processes["server"].argv, headless.processes["server"].argv
    for argv, rank in ((one, "0"), (two, "1")):
        assert (flag(argv, "--nnodes"), flag(argv, "--node-rank")) == ("2", rank)
        assert flag(argv, "--master-addr") == "10.0.0.1"
        assert flag(argv, "--master-port") == "29501"
        assert flag(argv, "--data-parallel-backend") == "mp"
        assert (flag(argv, "--tensor-parallel-size"), flag(argv, "--data-parallel-size")) == (
            "8", "2")
    assert "--headless" not in one and "--headless" in two
    assert flag(one, "--host") == "0.0.0.0"  # the trainer node asks the head's API
    # readiness: the head's own API; the headless part waits for the head, not for itself
    ready_head, ready_part = head.processes["server"].ready, headless.processes["server"].ready
    assert ready_head is not None and ready_head.http == "http://127.0.0.1:8000/health"
    assert ready_head.generate and ready_head.model
    assert ready_part is not None and ready_part.http == "http://10.0.0.1:8000/health"
    assert not ready_part.generate and ready_part.model is None
    # each node's store client registers its own address, the master is the head's
    for plan, own in ((head, "10.0.0.1"), (headless, "10.0.0.2")):
        kv = yaml.safe_load(flag(plan.processes["server"].argv, "--kv_transfer_config"))
        assert kv["kv_connector"] == "MooncakeHiddenStatesConnector"
        assert kv["kv_connector_module_path"] == "hs_connectors.mooncake_hidden_states_connector"
        store = kv["kv_connector_extra_config"]["mooncake"]
        assert store["local_hostname"] == own
        assert store["master_server_address"] == "10.0.0.1:50051"
    # the trainer node: its own rendezvous (it is trainer rank 0 of 1), the head's endpoint
    argv = trainer.processes["trainer"].argv
    assert (flag(argv, "--nnodes"), flag(argv, "--node-rank")) == ("1", "0")
    assert flag(argv, "--rdzv-endpoint").startswith("10.0.0.3:")
    assert flag(argv, "--vllm-endpoint") == "http://10.0.0.1:8000/v1"
    assert flag(argv, "--hidden-states-backend") == "mooncake"
    assert flag(argv, "--mooncake-master") == "10.0.0.1:50051"
    assert trainer.processes["trainer"].env["MOONCAKE_LOCAL_HOSTNAME"] == "10.0.0.3"
    prepare = trainer.processes["prepare"]
    assert flag(prepare.argv, "--render-endpoint") == "http://10.0.0.1:8000"
    assert prepare.after == []  # the node starts once node 0 is ready (ops.nodes waves)
    # launch: the headless part starts with node 0; GPU counts compared per group
    assert [p.launch_with_head for p in (head, headless, trainer)] == [False, True, False]
    assert [p.node_group for p in (head, headless, trainer)] == ["server", "server", "trainer"]


def test_the_recipes_own_commands_get_no_pasted_command_note(tmp_path: Path) -> None:
    """The recipe checked the spanning server's sizes itself: the pasted-command check
    (outrig/launchers) leaves its processes out instead of noting that it checked nothing."""
    for doc in (split_doc(), colocated_doc()):
        for plan in node_plans(tmp_path, doc):
            assert not [n for n in plan.notes if "did not check" in n or "nothing was checked"
                        in n], plan.notes


def test_colocated_layout_runs_the_trainer_on_the_server_nodes(tmp_path: Path) -> None:
    head, other = node_plans(tmp_path, colocated_doc())
    assert head.ok and other.ok, (head.problems, other.problems)
    assert other.order == ["server", "prepare", "trainer"]
    assert "--headless" in other.processes["server"].argv
    assert other.processes["prepare"].after == ["server"]  # ready once the head answers
    argv = other.processes["trainer"].argv
    assert (flag(argv, "--nnodes"), flag(argv, "--node-rank")) == ("2", "1")
    assert flag(argv, "--rdzv-endpoint").startswith("10.0.0.1:")
    assert other.processes["trainer"].gpus == [4, 5, 6, 7]
    assert other.launch_with_head and {head.node_group, other.node_group} == {"server"}


def test_shared_path_instead_of_mooncake(tmp_path: Path) -> None:
    """The file backend across nodes is fine with a path the user names: no master, the
    file connector as on one box, no backend flags."""
    doc = colocated_doc(dflash={"hidden_states_backend": "file",
                                "hidden_states_path": "/shared/hidden_states"})
    head, other = node_plans(tmp_path, doc)
    assert head.ok and other.ok, (head.problems, other.problems)
    assert "mooncake" not in head.processes
    kv = yaml.safe_load(flag(other.processes["server"].argv, "--kv_transfer_config"))
    assert kv["kv_connector_extra_config"] == {"shared_storage_path": "/shared/hidden_states"}
    assert "--hidden-states-backend" not in other.processes["trainer"].argv


def test_one_server_per_node_is_unchanged(tmp_path: Path) -> None:
    """Without server.nodes / trainer.nodes, nodes: 2 keeps a server per node on loopback."""
    doc = split_doc(nodes=2, dflash={"hidden_states_backend": "file", "server": {
        "nodes": 1, "gpus": [0, 1, 2, 3], "tensor": 4, "data": 1},
        "trainer": {"nodes": None, "gpus": [4, 5, 6, 7]}})
    doc["dflash"].pop("mooncake")
    plans = node_plans(tmp_path, doc)
    assert all(p.ok for p in plans), [p.problems for p in plans]
    for plan in plans:
        argv = plan.processes["server"].argv
        assert "--nnodes" not in argv and flag(argv, "--host") == "127.0.0.1"
        assert plan.processes["server"].parallel == (4, 1)
        assert not plan.launch_with_head


# ------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(("overrides", "key", "fix"), [
    ({"nodes": 2}, "nodes", "Set nodes: 3"),
    ({"dflash": {"server": {"nodes": 3}}, "nodes": 4}, "server.nodes", "Set server.nodes: 2"),
    ({"dflash": {"server": {"pipeline": 2, "data": 1}}}, "pipeline", "Set pipeline: 1"),
    ({"dflash": {"mooncake": {"port": 8000}}}, "mooncake.port", "port 8000 is also"),
    ({"dflash": {"mooncake": {"metrics_port": 29501}}}, "mooncake.metrics_port",
     "port 29501 is also"),
    ({"rdzv_port": 50051}, "rdzv_port", "port 50051 is also"),
    ({"dflash": {"hidden_states_backend": "file"}}, "hidden_states_path",
     "hidden_states_backend: mooncake"),
    ({"dflash": {"server": {"extra_args": ["--headless"]}}}, "extra_args",
     "set dflash.server.nodes"),
    ({"dflash": {"trainer": {"extra_args": ["--mooncake-master", "h:1"]}}}, "extra_args",
     "set dflash.mooncake.port"),
])
def test_bad_layouts_are_refused_naming_the_key(tmp_path: Path, overrides: dict[str, Any],
                                                key: str, fix: str) -> None:
    plans = node_plans(tmp_path, split_doc(**overrides), addresses=(*ADDRESSES, "10.0.0.4"))
    text = problem(plans, fix)
    assert key.split(".")[-1] in text and "span.yaml:" in text


def test_pipeline_with_extraction_is_refused(tmp_path: Path) -> None:
    plans = node_plans(tmp_path, split_doc(dflash={"server": {"pipeline": 2, "data": 1}}))
    assert "refuses pipeline parallelism with extract_hidden_states" in problem(
        plans, "pipeline")


def test_loopback_head_is_refused_unless_declared(tmp_path: Path) -> None:
    """A head at 127.0.0.1 is this machine to every other node (boxes reached through
    forwarded ports look like that); node_address: on the head says the nodes share it."""
    loop = ("127.0.0.1", "127.0.0.1", "127.0.0.1")
    text = problem(node_plans(tmp_path, split_doc(), addresses=loop), "loopback")
    assert "127.0.0.1:50051" in text and "node_address:" in text
    plans = node_plans(tmp_path, split_doc(), addresses=loop, declared=True)
    assert all(p.ok for p in plans), [p.problems for p in plans]


def test_mooncake_without_a_layout_across_nodes_is_refused(tmp_path: Path) -> None:
    doc = split_doc(nodes=1, dflash={"server": {"nodes": 1, "gpus": [0, 1, 2, 3], "tensor": 4,
                                                "data": 1},
                                     "trainer": {"nodes": None, "gpus": [4, 5, 6, 7]}})
    plans = node_plans(tmp_path, doc)
    assert "Set hidden_states_backend: file" in problem(plans, "hidden_states_backend")


def test_plan_shown_alone_does_not_judge_addresses(tmp_path: Path) -> None:
    """``outrig plan`` of node 0 alone knows no other node: no address verdict, names kept."""
    path = tmp_path / "span.yaml"
    path.write_text(yaml.safe_dump(split_doc(), sort_keys=False))
    plan = make_plan(load_job(path), Host(name="n0", hostname="127.0.0.1", workdir="/w"),
                     FACTS, "run-1")
    assert not any("loopback" in p for p in plan.problems), plan.problems


def test_mixed_gpu_counts_in_a_group_are_refused(tmp_path: Path) -> None:
    plans = node_plans(tmp_path, split_doc())
    nodes = [NodeRun(rank, f"n{rank}", f"job-1-node{rank}") for rank in range(3)]
    job = load_job(tmp_path / "span.yaml")
    check_gpu_counts(job, nodes, plans)  # all eight: fine
    plans[2].facts = HostFacts(gpu_count=4)  # the trainer node may differ from the servers
    check_gpu_counts(job, nodes, plans)
    plans[1].facts = HostFacts(gpu_count=4)  # but the server's two nodes may not
    with pytest.raises(PlanError) as info:
        check_gpu_counts(job, nodes, plans)
    text = str(info.value)
    assert "node 0 (n0): 8, node 1 (n1): 4" in text and "span.yaml:" in text
    assert info.value.exit_code == 2


def test_checkpoints_are_compared_among_the_trainer_nodes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With trainer nodes of their own, node 0 runs no trainer: the nodes that do must still
    hold the same newest checkpoint (each rank resumes from its own node's copy)."""
    from types import SimpleNamespace

    from outrig.ops import node_checks as nodes_module

    doc = split_doc(nodes=4, dflash={"trainer": {"nodes": 2}})
    plans = node_plans(tmp_path, doc, addresses=(*ADDRESSES, "10.0.0.4"))
    assert all(p.ok for p in plans), [p.problems for p in plans]
    held = {0: None, 1: None, 2: (1, 40, 0), 3: None}
    asked: list[int] = []

    def session(rank: int) -> Any:
        def call(op: str, **fields: Any) -> dict[str, Any]:
            asked.append(rank)
            return {"order": held[rank]}
        return SimpleNamespace(call=call)

    monkeypatch.setattr(nodes_module, "newest_complete", lambda listing: SimpleNamespace(
        order=listing["order"]) if listing["order"] else None)
    monkeypatch.setattr(nodes_module, "order_text", lambda order: f"step {order[1]}")
    runs = [NodeRun(rank, f"n{rank}", f"job-1-node{rank}") for rank in range(4)]
    with pytest.raises(PlanError) as info:
        nodes_module.check_checkpoints_agree([session(r) for r in range(4)], runs, plans)
    assert "node 2 (n2): step 40; node 3 (n3): none" in str(info.value)
    assert sorted(asked) == [2, 3]  # the server nodes were not asked
