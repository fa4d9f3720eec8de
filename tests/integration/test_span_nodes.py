"""A verifier across nodes on two sandbox boxes (two sshd on loopback, fake GPUs): one vLLM
stand-in server spanning both (node 0 the head, node 1 ``--headless``), the Mooncake master
stand-in on node 0, prepare and the trainer (torchrun stand-in, c10d) on both. Checks the
processes started per node, readiness on the head only, an exact stop, and the refusals
(mixed GPU counts, a taken store port) with exit 2 and nothing started."""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.errors import PlanError
from outrig.journal import Journal
from outrig.ops.node_control import node_log_targets, stop_nodes
from outrig.ops.nodes import NodesFailed, deploy_nodes
from outrig.playbook import load_job
from outrig.sandbox.box import SandboxBox
from outrig.sandbox.nvidia_smi import load_inventory, write_inventory
from outrig.session import Project
from tests.integration.test_dflash import make_model, make_shims
from tests.support.network import free_port
from tests.support.processes import alive, marked
from tests.support.runs import standin_path, stop_every_run

pytestmark = pytest.mark.integration

# node 0 is reached at 127.0.0.2, declared in its host file (the nodes share this machine):
# a loopback head is refused unless declared, and 127.0.0.2 is no local port claim on node 1
HEAD = "127.0.0.2"

MASTER_SHIM = """\
#!{python}
# test shim: mooncake_master FLAGS -> the Mooncake master stand-in (same pid)
import os, sys
os.execv(sys.executable, [sys.executable, {fake!r}, *sys.argv[1:]])
"""


def journal() -> Journal:
    return Journal(Path(os.environ["XDG_STATE_HOME"]) / "outrig")


@pytest.fixture
def project(box_a: SandboxBox, sandbox: SandboxBox, tmp_path: Path) -> Iterator[Project]:
    """Hosts ``a`` (node 0, node_address 127.0.0.2) and ``b``, both with box a's four GPUs
    (``b-wide`` is b with eight: the mixed case)."""
    if not sandbox.is_running():
        sandbox.start()
    gpus = load_inventory(box_a.gpu_dir)
    for name, box, extra in (("a", box_a, {"node_address": HEAD}), ("b", sandbox, {}),
                             ("b-wide", sandbox, {})):
        workdir = tmp_path / f"work-{name}"
        workdir.mkdir()
        host = box.write_host_file(tmp_path / "hosts" / f"{name}.yaml", workdir=workdir,
                                   known_hosts=tmp_path / f"known_hosts_{name}",
                                   gpu_dir=tmp_path / f"gpu-{name}")
        if extra:
            doc = yaml.safe_load(host.read_text())
            host.write_text(yaml.safe_dump({**doc, **extra}, sort_keys=False))
        write_inventory(tmp_path / f"gpu-{name}",
                        load_inventory(sandbox.gpu_dir) if name == "b-wide" else gpus)
    project = Project(tmp_path)
    yield project
    state = Path(os.environ["XDG_STATE_HOME"]) / "outrig"
    for host in ("a", "b", "b-wide"):
        stop_every_run(project, host, state)


def span_playbook(tmp_path: Path, *, store_port: int | None = None) -> Path:
    """server.nodes 2 (tensor 4 over GPUs 0-1 of each node), the trainer on GPUs 2-3 of both,
    hidden states through the Mooncake master on node 0."""
    pythonpath, torchrun = make_shims(tmp_path / "shims", standin_path)
    master = tmp_path / "shims" / "bin" / "mooncake_master"
    master.write_text(MASTER_SHIM.format(python=sys.executable,
                                         fake=str(standin_path("fake_mooncake_master"))))
    master.chmod(0o755)
    model = make_model(tmp_path / "models" / "Qwen-fake", layers=8)
    data = tmp_path / "box-data-${node_rank}"
    body = {
        "name": "span", "recipe": "dflash", "nodes": 2, "rdzv_port": free_port(),
        "dflash": {
            "model": str(model), "data_path": str(data / "tokenized"),
            "save_path": str(data / "checkpoints"), "seq_length": 512, "max_samples": 32,
            "epochs": 4, "lr": 6e-4, "target_layer_ids": [1, 3, 6],
            "hidden_states_backend": "mooncake",
            "mooncake": {"command": str(master), "port": store_port or free_port(),
                         "metrics_port": free_port(), "ready_timeout": 60},
            "server": {"nodes": 2, "gpus": [0, 1], "tensor": 4, "data": 1,
                       "port": free_port(), "master_port": free_port(),
                       "python": sys.executable, "env": {"PYTHONPATH": str(pythonpath)},
                       "ready_timeout": 90, "stop_grace": 10},
            "trainer": {"gpus": [2, 3], "python": sys.executable, "torchrun": str(torchrun),
                        "rendezvous": "c10d", "ready_timeout": 90,
                        "extra_args": ["--fake-steps-per-epoch", "3",
                                       "--fake-step-seconds", "0.2"]},
            "prepare": {"data": [str(tmp_path / "conversations.jsonl")], "timeout": 60,
                        "env": {"PYTHONPATH": str(pythonpath)}},
        },
    }
    path = tmp_path / "playbooks" / "span.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def log(tmp_path: Path, host: str, run_id: str, name: str) -> str:
    return (tmp_path / f"work-{host}" / "runs" / run_id / "logs" / f"{name}.log").read_text()


def test_a_server_across_two_nodes_starts_per_node_is_ready_on_the_head_and_stops_exactly(
        project: Project, tmp_path: Path, procs: Any) -> None:
    job = load_job(span_playbook(tmp_path))
    result = deploy_nodes(project, ["a", "b"], job, Reporter(quiet=True), journal=journal())
    assert result.status == "running"
    head, other = node_log_targets(journal(), result.job_id)
    # the processes started per node: node 0 the master and the head, node 1 the headless part
    started = {rank: [p["name"] for p in result.processes[rank]] for rank in (0, 1)}
    assert started == {0: ["mooncake", "server", "prepare", "trainer"],
                       1: ["server", "prepare", "trainer"]}
    plans = {p.node_rank: p for p in result.plans}
    assert "--headless" in plans[1].processes["server"].argv
    assert "--headless" not in plans[0].processes["server"].argv
    # readiness exists only on the head: its API answered after node 1 joined; node 1's part
    # has no API of its own and was ready when the head answered
    head_log = log(tmp_path, "a", head.run_id, "server")
    assert "node rank 1 joined" in head_log and "Application startup complete." in head_log
    assert head_log.index("node rank 1 joined") < head_log.index("Application startup")
    part_log = log(tmp_path, "b", other.run_id, "server")
    assert "headless multiproc executor" in part_log and "Starting vLLM server" not in part_log
    port = job.spec.recipe_section().server.port
    assert plans[1].processes["server"].ready.http == f"http://{HEAD}:{port}/health"
    assert "Master service started on port" in log(tmp_path, "a", head.run_id, "mooncake")
    # both nodes prepared through the head's API and trained as one job of four ranks
    for host, node in (("a", head), ("b", other)):
        assert f"via http://{HEAD}:{port}" in log(tmp_path, host, node.run_id, "prepare")
        assert "group_world_size=2" in log(tmp_path, host, node.run_id, "trainer")

    pids = {node.run_id: marked(node.run_id) for node in (head, other)}
    assert all(pids.values()), pids
    foreign = procs.spawn([sys.executable, "-c", "import time; time.sleep(600)"])
    stopped = stop_nodes(project, result.job_id, Reporter(quiet=True), journal=journal())
    assert [(r["host"], r["ok"]) for r in stopped["nodes"]] == [("a", True), ("b", True)]
    assert marked(head.run_id) == [] and marked(other.run_id) == []
    assert not any(alive(pid) for run in pids.values() for pid in run)
    assert alive(foreign.pid)
    assert "Shutdown signal received" in log(tmp_path, "a", head.run_id, "mooncake")


def test_mixed_gpu_counts_are_refused_before_anything_starts(
        project: Project, tmp_path: Path) -> None:
    with pytest.raises(PlanError) as info:
        deploy_nodes(project, ["a", "b-wide"], load_job(span_playbook(tmp_path)),
                     Reporter(quiet=True), journal=journal())
    assert info.value.exit_code == 2
    text = str(info.value)
    assert "different GPU counts (node 0 (a): 4, node 1 (b-wide): 8)" in text
    assert "span.yaml:" in text and ": nodes" in text
    assert not (tmp_path / "work-a" / "runs").exists()
    assert not (tmp_path / "work-b-wide" / "runs").exists()


def test_a_taken_store_port_is_refused_on_node_0_before_anything_starts(
        project: Project, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(NodesFailed) as info:
            deploy_nodes(project, ["a", "b"], load_job(span_playbook(tmp_path, store_port=port)),
                         Reporter(quiet=True), journal=journal())
    assert info.value.exit_code == 2
    text = str(info.value)
    assert f"port {port}, where mooncake is to answer, is already taken" in text
    assert "node 0 (a)" in text
    runs = [json.loads(p.read_text()) for p in tmp_path.glob("work-*/runs/*/run.json")]
    assert not any(r.get("processes") for r in runs), runs
    assert not (tmp_path / "work-b" / "runs").exists()  # node 1 was never sent
