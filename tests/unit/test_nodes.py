"""Multi-node jobs before anything is sent: the ``nodes:`` key, the per-node template names,
the node selection's errors, and a deploy that stops at the first node's bad plan without
contacting any box."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from outrig.console import Reporter
from outrig.errors import ConfigError, PlanError
from outrig.fanout import HostOutcome
from outrig.inventory import Host, resolve_host
from outrig.journal import Journal
from outrig.ops.node_control import node_state
from outrig.ops.nodes import NodeRun, deploy_nodes, find_job, node_run_id, select_nodes
from outrig.ops.nodes_watch import NodeSeen, judge_node
from outrig.plan import HostFacts, NodePlace, builtin_params, make_plan
from outrig.playbook import load_job
from outrig.session import Project
from tests.support.hosts import write_host_file

TORCHRUN = ("torchrun --nnodes ${nnodes} --node-rank ${node_rank} --rdzv-backend c10d "
            "--rdzv-endpoint ${head_host}:${rdzv_port} --rdzv-id ${job_id} -m train")


def playbook(tmp_path: Path, head: str, gpus: list[int] | None = None) -> Path:
    path = tmp_path / "playbooks" / "multi.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"name: multi\n{head}processes:\n  trainer:\n    command: {TORCHRUN}\n"
                    f"    gpus: {gpus or [0, 1]}\n")
    return path


def host_file(root: Path, name: str, **fields: object) -> None:
    write_host_file(root, name, **{"hostname": "127.0.0.1", "workdir": f"/w/{name}", **fields})


# ------------------------------------------------------------------------------ the key


def test_nodes_is_a_count_or_a_list_of_hosts(tmp_path: Path) -> None:
    job = load_job(playbook(tmp_path, "nodes: 3\n"))
    assert (job.spec.nodes, job.spec.node_hosts, job.spec.rdzv_port) == (3, None, 29400)
    job = load_job(playbook(tmp_path, "nodes: [gpu-a, gpu-b]\nrdzv_port: 29500\n"))
    assert (job.spec.nodes, job.spec.node_hosts, job.spec.rdzv_port) == (
        2, ("gpu-a", "gpu-b"), 29500)
    job = load_job(playbook(tmp_path, ""))
    assert (job.spec.nodes, job.spec.node_hosts) == (1, None)


@pytest.mark.parametrize(("head", "message"), [
    ("nodes: 0\n", "nodes: 0 is neither a count"),
    ("nodes: true\n", "neither a count"),
    ("nodes: [a, b, a]\n", "nodes: a is listed twice"),
    ("nodes: []\n", "lists no host"),
    ("rdzv_port: 70000\n", "rdzv_port"),
])
def test_bad_nodes_name_the_file_the_line_and_the_fix(tmp_path: Path, head: str,
                                                     message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_job(playbook(tmp_path, head))
    assert "multi.yaml:2" in str(info.value)


# ------------------------------------------------------------------------------ the plan


def test_each_node_renders_its_rank_the_count_and_the_head(tmp_path: Path) -> None:
    job = load_job(playbook(tmp_path, "nodes: 2\n"))
    host = Host(name="b", hostname="203.0.113.9", workdir="/w", node_address="10.0.0.2")
    place = NodePlace(rank=1, nnodes=2, head_host="10.0.0.1", job_id="multi-job")
    plan = make_plan(job, host, HostFacts(gpu_count=2), node_run_id("multi-job", 1), place)
    assert plan.ok, plan.problems
    assert plan.processes["trainer"].argv[1:] == [
        "--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "10.0.0.1:29400", "--rdzv-id", "multi-job", "-m", "train"]
    assert (plan.node_rank, plan.nnodes, plan.job_id, plan.run_id) == (
        1, 2, "multi-job", "multi-job-node1")
    head = NodePlace(rank=0, nnodes=2, head_host="10.0.0.1", job_id="multi-job")
    assert [builtin_params(host, job, "r", p)["is_head"] for p in (head, place)] == [
        True, False]


def test_a_single_node_job_is_rank_0_of_1_with_its_own_box_as_head(tmp_path: Path) -> None:
    job = load_job(playbook(tmp_path, ""))
    plan = make_plan(job, Host(name="a", hostname="gpu.example", workdir="/w"),
                     HostFacts(gpu_count=2), "run-1")
    assert plan.processes["trainer"].argv[1:9] == [
        "--nnodes", "1", "--node-rank", "0", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "gpu.example:29400"]
    assert plan.processes["trainer"].argv[10] == "run-1"
    assert not plan.notes


def test_a_multi_node_playbook_planned_alone_says_so(tmp_path: Path) -> None:
    job = load_job(playbook(tmp_path, "nodes: 2\n"))
    plan = make_plan(job, Host(name="a", hostname="h", workdir="/w"), HostFacts(gpu_count=2),
                     "run-1")
    assert plan.ok
    assert any("spans 2 nodes" in note and "multi.yaml:2" in note for note in plan.notes)


def test_a_param_may_not_take_a_node_name(tmp_path: Path) -> None:
    job = load_job(playbook(tmp_path, "params: {nnodes: 4}\n"))
    plan = make_plan(job, Host(name="a", hostname="h", workdir="/w"), HostFacts(gpu_count=2),
                     "run-1")
    assert any("'nnodes' is a built-in name" in p for p in plan.problems)


def test_head_address_is_node_address_else_hostname_else_loopback() -> None:
    assert Host(name="a", hostname="h", workdir="/w", node_address="10.1.1.1"
                ).peer_address() == "10.1.1.1"
    assert Host(name="a", hostname="[fd00::1]", workdir="/w").peer_address() == "fd00::1"
    assert Host(name="a", hostname="local", workdir="/w", is_local=True
                ).peer_address() == "127.0.0.1"


def test_node_address_is_read_from_the_host_file(tmp_path: Path) -> None:
    host_file(tmp_path, "a", node_address="10.0.0.7")
    assert resolve_host("a", hosts_dir=tmp_path / "hosts").peer_address() == "10.0.0.7"


# ------------------------------------------------------------------------------ the selection


@pytest.fixture
def project(tmp_path: Path) -> Project:
    for name in ("a", "b", "c"):
        host_file(tmp_path, name)
    (tmp_path / "hosts" / "a-again.yaml").write_text(
        (tmp_path / "hosts" / "a.yaml").read_text())
    return Project(tmp_path)


def test_the_selection_must_hold_exactly_n_different_boxes(project: Project) -> None:
    job = load_job(playbook(project.root, "nodes: 2\n"))
    assert select_nodes(project, job, ["b", "a"]) == ["b", "a"]
    with pytest.raises(ConfigError, match=r"multi.yaml:2: .*nodes: 2, but --host selected 3 "
                                          r"host\(s\) \(a, b, c\); select exactly 2 hosts"):
        select_nodes(project, job, ["a", "b", "c"])
    with pytest.raises(ConfigError, match="--host names a twice"):
        select_nodes(project, job, ["a", "a"])
    with pytest.raises(ConfigError, match="a and a-again are the same box"):
        select_nodes(project, job, ["a", "a-again"])


def test_a_listed_playbook_picks_its_nodes_and_refuses_another_selection(
        project: Project) -> None:
    job = load_job(playbook(project.root, "nodes: [c, a]\n"))
    assert select_nodes(project, job, []) == ["c", "a"]
    assert select_nodes(project, job, ["a", "c"]) == ["c", "a"]  # the playbook's order
    with pytest.raises(ConfigError, match="the playbook's nodes are c, a but --host selected "
                                          "a, b"):
        select_nodes(project, job, ["a", "b"])


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A port the host files point at: any connection attempt would be accepted here."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()


def test_a_bad_plan_on_one_node_sends_nothing_to_any(tmp_path: Path,
                                                     listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    host_file(tmp_path, "big", port=port, gpus=8)
    host_file(tmp_path, "small", port=port, gpus=1)
    job = load_job(playbook(tmp_path, "nodes: 2\n", gpus=[0, 1]))
    journal = Journal(tmp_path / "state")
    with pytest.raises(PlanError) as info:
        deploy_nodes(Project(tmp_path), ["big", "small"], job, Reporter(quiet=True),
                     journal=journal)
    text = str(info.value)
    assert "node 1 (small):" in text and "GPU 1 does not exist on small" in text
    assert "node 0" not in text
    with pytest.raises(BlockingIOError):
        listener.accept()  # no node was contacted
    assert journal.jobs() == [] and journal.runs() == []


def test_find_job_by_its_id_or_a_node_run_id(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    nodes = [{"rank": 1, "host": "b", "run_id": "j-node1"},
             {"rank": 0, "host": "a", "run_id": "j-node0"}]
    journal.record_job("j", {"job_id": "j", "playbook": "multi", "nodes": nodes})
    journal.record_run("j-node1", {"run_id": "j-node1", "host": "b", "job_id": "j"})
    journal.record_run("solo", {"run_id": "solo", "host": "a"})
    for ident in ("j", "j-node1"):
        found = find_job(journal, ident)
        assert found is not None
        assert [(n.rank, n.host, n.run_id) for n in found[1]] == [
            (0, "a", "j-node0"), (1, "b", "j-node1")]
    assert find_job(journal, "solo") is None and find_job(journal, "nosuch") is None


# ------------------------------------------------------------------------------ the guard


def outcome(result: dict[str, Any] | None, error: str | None = None) -> HostOutcome:
    return HostOutcome("b", "ok" if error is None else "failed", 0.1, result=result,
                       error=error)


def status_of(run_id: str, *procs: dict[str, Any]) -> dict[str, Any]:
    return {"runs": [{"run_id": run_id, "status": "running", "processes": list(procs)}]}


def test_the_guard_judges_a_node_by_its_runs_processes() -> None:
    running = {"name": "trainer", "state": "running"}
    failed = {"name": "trainer", "state": "exited", "exit_code": 1}
    assert node_state(status_of("j-node1", running), "j-node1") == ("running", "running")
    assert node_state(status_of("j-node1", failed), "j-node1") == ("failed",
                                                                   "trainer exited 1")
    assert node_state(status_of("other", running), "j-node1")[0] == "missing"


def test_a_node_silent_for_the_threshold_is_lost() -> None:
    node, seen, quiet = NodeRun(1, "b", "j-node1"), NodeSeen(), Reporter(quiet=True)
    judge_node(seen, node, outcome(status_of("j-node1", {"name": "t", "state": "running"})),
                100.0, 60.0, quiet)
    assert seen.state == "running"
    judge_node(seen, node, outcome(None, "connection refused"), 110.0, 60.0, quiet)
    assert seen.state == "silent"
    judge_node(seen, node, outcome(None, "connection refused"), 169.0, 60.0, quiet)
    assert seen.state == "silent"
    judge_node(seen, node, outcome(None, "connection refused"), 170.0, 60.0, quiet)
    assert seen.state == "lost" and seen.why == "no answer for 60 s: connection refused"


def test_a_dry_run_plans_every_node_and_contacts_none(tmp_path: Path,
                                                      listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    host_file(tmp_path, "head", port=port, gpus=2, node_address="10.0.0.1")
    host_file(tmp_path, "peer", port=port, gpus=2)
    job = load_job(playbook(tmp_path, "nodes: [head, peer]\n"))
    result = deploy_nodes(Project(tmp_path), [], job, Reporter(quiet=True), dry_run=True,
                          journal=Journal(tmp_path / "state"))
    assert not result.launched
    assert [(p.host, p.node_rank, p.nnodes, p.run_id) for p in result.plans] == [
        ("head", 0, 2, f"{result.job_id}-node0"), ("peer", 1, 2, f"{result.job_id}-node1")]
    for plan in result.plans:
        argv = plan.processes["trainer"].argv
        assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"
        assert argv[argv.index("--rdzv-id") + 1] == result.job_id
    with pytest.raises(BlockingIOError):
        listener.accept()


def test_a_nodes_state_is_not_repeated_as_its_reason() -> None:
    from outrig.ops.node_control import state_words

    assert state_words("running", "running") == "running"
    assert state_words("failed", "worker was killed by signal 15") == (
        "failed — worker was killed by signal 15")
