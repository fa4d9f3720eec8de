"""A multi-node job as one run where the commands take a run id, and the bad input of a
job's move (pure: the journal only, no box)."""

from __future__ import annotations

from pathlib import Path

import pytest

from outrig.errors import ConfigError
from outrig.journal import Journal
from outrig.ops.job_move import check_targets, split_hosts, success_line
from outrig.ops.metrics import select_chains
from outrig.ops.nodes import NodeRun
from outrig.ops.runs import head_run_id
from outrig.session import Project


def _job(journal: Journal, job_id: str, hosts: list[str],
         migrated_from: str | None = None) -> None:
    journal.record_job(job_id, {"job_id": job_id, "playbook": "pair", "nodes": [
        {"rank": r, "host": h, "run_id": f"{job_id}-node{r}"} for r, h in enumerate(hosts)]})
    for rank, host in enumerate(hosts):
        record = {"run_id": f"{job_id}-node{rank}", "host": host, "playbook": "pair",
                  "job_id": job_id, "node_rank": rank}
        if migrated_from:
            record["migrated_from"] = {"run_id": f"{migrated_from}-node{rank}"}
        journal.record_run(f"{job_id}-node{rank}", record)


def test_a_job_id_names_its_node_0_run_and_a_moved_job_draws_one_chain(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "state")
    _job(journal, "pair-1", ["a", "b"])
    _job(journal, "pair-2", ["c", "d"], migrated_from="pair-1")
    journal.record_run("solo-1", {"run_id": "solo-1", "host": "a", "playbook": "solo"})

    assert head_run_id(journal, "pair-2") == "pair-2-node0"
    assert head_run_id(journal, "pair-2-node1") == "pair-2-node1"  # a node's own run
    assert head_run_id(journal, "solo-1") == "solo-1"
    # metrics, plot and report: node 0's curve, across the move
    assert select_chains(journal, ["pair-2"]) == [["pair-1-node0", "pair-2-node0"]]
    with pytest.raises(ConfigError, match="no such run"):
        select_chains(journal, ["pair-9"])


def test_new_boxes_are_checked_before_anything_is_sent(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.mkdir()
    for name in ("a", "b", "c", "d"):
        (hosts / f"{name}.yaml").write_text(f"hostname: 127.0.0.1\nport: 22\n"
                                            f"workdir: /w/{name}\n")
    (hosts / "c2.yaml").write_text("hostname: 127.0.0.1\nport: 22\nworkdir: /w/c\n")
    project = Project(tmp_path)
    nodes = [NodeRun(0, "a", "J-node0"), NodeRun(1, "b", "J-node1")]

    assert split_hosts(["c,d"]) == split_hosts(["c", " d"]) == ["c", "d"]
    assert check_targets(project, "J", nodes, ["c", "d"], "--to") == ["c", "d"]
    with pytest.raises(ConfigError) as few:
        check_targets(project, "J", nodes, ["c"], "--to")
    assert "--to names 1 box(es) (c), but job J runs on 2 nodes (a, b)" in str(few.value)
    assert "Nothing was stopped or started" in str(few.value)
    with pytest.raises(ConfigError, match="c and c2 are the same box"):
        check_targets(project, "J", nodes, ["c", "c2"], "--spare")
    with pytest.raises(ConfigError, match="b is a node of job J already"):
        check_targets(project, "J", nodes, ["c", "b"], "--to")


def test_the_success_line_says_what_moved_with_what() -> None:
    report = {"from_job": "J", "to_job": "K", "from": ["a", "b"], "to": ["c", "d"],
              "checkpoint": {"epoch": 2, "route": "mirror"}, "params": {"lr": "0.25"},
              "differences": [], "seconds": 17.2,
              "old_nodes": [{"rank": 0, "fenced": True}, {"rank": 1, "fenced": False}]}
    assert success_line(report, "pair") == (
        "moved job J (pair, 2 nodes) from a,b to c,d as job K in 17s, resuming from "
        "checkpoint 2 (mirror), with lr=0.25; fenced node 0; as deployed (same playbook, "
        "params and test mode). Next: outrig status --run K")


def test_a_job_moved_already_is_not_moved_again(tmp_path: Path) -> None:
    """Its nodes are fenced or dead and its successor trains: moving it again would start a
    second copy. Refused before any host is looked at (these have no host files)."""
    from outrig.console import Reporter
    from outrig.ops.job_move import check_spares, move_job

    journal = Journal(tmp_path / "state")
    _job(journal, "pair-1", ["a", "b"])
    journal.record_job("pair-1", {"moved_to": {"job_id": "pair-2", "hosts": ["c", "d"]}})
    for call in (lambda: move_job(Project(tmp_path), "pair-1-node1", ["e", "f"],
                                  Reporter(quiet=True), journal=journal),
                 lambda: check_spares(Project(tmp_path), "pair-1", ["e", "f"], journal)):
        with pytest.raises(ConfigError) as refused:
            call()
        assert "job pair-1 was moved to c,d as job pair-2" in str(refused.value)
        assert "(--run pair-2)" in str(refused.value)


def test_a_watch_takes_a_pool_of_spares_and_keeps_the_unused_ones(tmp_path: Path) -> None:
    """``--spare`` may name more boxes than the job has nodes: each move takes the first N
    not used yet; fewer than N left is none (the job is then watched without spares);
    ``auto`` rents again at every move. ``--to`` stays exact."""
    from outrig.ops.job_move import left_after

    hosts = tmp_path / "hosts"
    hosts.mkdir()
    for name in ("a", "b", "c", "d", "e", "f", "g"):
        (hosts / f"{name}.yaml").write_text(f"hostname: 127.0.0.1\nport: 22\n"
                                            f"workdir: /w/{name}\n")
    project = Project(tmp_path)
    nodes = [NodeRun(0, "a", "J-node0"), NodeRun(1, "b", "J-node1")]
    pool = check_targets(project, "J", nodes, ["c", "d", "e", "f", "g"], "--spare", pool=True)
    assert pool == ["c", "d", "e", "f", "g"]
    with pytest.raises(ConfigError, match="name at least 2 boxes"):
        check_targets(project, "J", nodes, ["c"], "--spare", pool=True)
    with pytest.raises(ConfigError, match="name exactly 2 boxes"):
        check_targets(project, "J", nodes, ["c", "d", "e"], "--to")
    assert left_after(pool, ["c", "d"], 2) == ["e", "f", "g"]
    assert left_after(["e", "f", "g"], ["e", "f"], 2) == []  # one box cannot hold 2 nodes
    assert left_after(["auto"], ["rented-1", "rented-2"], 2) == ["auto"]
