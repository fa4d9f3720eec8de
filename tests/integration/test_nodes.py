"""A 2-node job on two sandbox boxes (two sshd on loopback, each behind a latency proxy),
with the rendezvous stand-in (tests/standins/fake_torchrun.py) and, opt-in, real ``torchrun``
(gloo on CPU; set OUTRIG_TORCH_PYTHON to a Python with torch): both nodes join, status covers
both, a node failing stops the other (at deploy time and under the guard), and cleanup of the
job stops both nodes' runs and nothing else."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.errors import Interrupted, PlanError
from outrig.journal import Journal
from outrig.ops.node_control import node_log_targets, nodes_status, stop_nodes
from outrig.ops.nodes import NodesFailed, deploy_nodes
from outrig.ops.nodes_watch import watch_nodes
from outrig.playbook import load_job
from outrig.sandbox.box import SandboxBox
from outrig.sandbox.nvidia_smi import load_inventory, write_inventory
from outrig.sandbox.proxy import LatencyProxy
from outrig.session import Project
from tests.support.network import free_port
from tests.support.processes import alive, marked
from tests.support.runs import standin_path, stop_every_run

pytestmark = pytest.mark.integration

WORKER = """\
import os, sys, time
if os.path.exists(sys.argv[1]):
    print("failing at start on purpose", flush=True)
    sys.exit(3)
print("rank-ready", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "group",
      os.environ["GROUP_RANK"], flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("failing on purpose", flush=True)
sys.exit(3)
"""

# Real torch: a rendezvous, one all_reduce across the nodes over gloo, then wait (running)
# until the fail switch appears.
TORCH_WORKER = """\
import os, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
value = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(value)
print("all_reduce", int(value.item()), "world", dist.get_world_size(), flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
sys.exit(3)
"""


@pytest.fixture
def project(box_a: SandboxBox, sandbox: SandboxBox, tmp_path: Path,
            make_proxy: Callable[..., LatencyProxy]) -> Iterator[Project]:
    """Hosts ``a`` (its own sshd) and ``b`` (the session's sshd), each through a proxy
    (20 ms each way) with its own workdir; every run left on them is stopped at the end."""
    if not sandbox.is_running():
        sandbox.start()
    for name, box in (("a", box_a), ("b", sandbox)):
        proxy = make_proxy(box.port, one_way_delay=0.02)
        workdir = tmp_path / f"work-{name}"
        workdir.mkdir()
        box.write_host_file(tmp_path / "hosts" / f"{name}.yaml", port=proxy.port,
                            workdir=workdir, known_hosts=tmp_path / f"known_hosts_{name}",
                            gpu_dir=tmp_path / f"gpu-{name}")
        write_inventory(tmp_path / f"gpu-{name}", load_inventory(box.gpu_dir))
    project = Project(tmp_path)
    yield project
    state = Path(os.environ["XDG_STATE_HOME"]) / "outrig"
    for host in ("a", "b"):
        stop_every_run(project, host, state)


def trainer_playbook(tmp_path: Path, command: list[str], ready: str,
                     env: dict[str, str] | None = None) -> Path:
    path = tmp_path / "playbooks" / "pair.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump({
        "name": "pair", "nodes": 2, "rdzv_port": free_port(),
        "processes": {"trainer": {
            "command": command, "env": env or {},
            "ready": {"log": ready, "timeout": 120},
            "stop": {"grace": 10, "children_first": True}}}}, sort_keys=False))
    return path


def launcher(python: str, module: list[str]) -> list[str]:
    """``torchrun`` (real or stand-in) with the node's rendezvous flags from the template."""
    return [python, *module, "--nnodes", "${nnodes}", "--node-rank", "${node_rank}",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "${head_host}:${rdzv_port}",
            "--rdzv-id", "${job_id}"]


@pytest.fixture
def fake_job(tmp_path: Path) -> Path:
    """Two ranks per node under the stand-in; node N's ranks fail once ``fail-N`` exists."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    command = [*launcher(sys.executable, [str(standin_path("fake_torchrun"))]),
               "--nproc-per-node", "2", "--shutdown-timeout", "5", "-m", "work",
               str(tmp_path / "fail-${node_rank}")]
    return trainer_playbook(tmp_path, command, r"rank-ready \d+ of 4",
                            {"FAKE_TORCHRUN_MODULES": json.dumps({"work": str(script)}),
                             "LOGLEVEL": "INFO"})


def node_log(tmp_path: Path, host: str, run_id: str) -> str:
    return (tmp_path / f"work-{host}" / "runs" / run_id / "logs" / "trainer.log").read_text()


def group_rank(log: str) -> int:
    """The group rank torch's agent logged for the node ("Rendezvous complete ... Result:")."""
    (line,) = [line for line in log.splitlines() if line.rstrip().endswith(
        tuple(f"group_rank={i}" for i in range(8)))]
    return int(line.rsplit("=", 1)[1])


def journal() -> Journal:
    return Journal(Path(os.environ["XDG_STATE_HOME"]) / "outrig")


def test_both_nodes_join_status_covers_both_and_cleanup_stops_exactly_the_job(
        project: Project, fake_job: Path, tmp_path: Path, procs: Any) -> None:
    result = deploy_nodes(project, ["a", "b"], load_job(fake_job), Reporter(quiet=True),
                          journal=journal())
    assert result.status == "running"
    nodes = node_log_targets(journal(), result.job_id)
    assert [(n.rank, n.host) for n in nodes] == [(0, "a"), (1, "b")]
    texts = [node_log(tmp_path, n.host, n.run_id) for n in nodes]
    assert sorted(group_rank(text) for text in texts) == [0, 1]
    for text in texts:  # two ranks on each node, one world of 4
        ready = [line.split() for line in text.splitlines() if line.startswith("rank-ready")]
        assert [(words[3], words[5]) for words in ready] == [("4", str(group_rank(text)))] * 2

    document = nodes_status(project, result.job_id, Reporter(quiet=True, json_mode=True),
                            journal=journal())
    assert [(r["rank"], r["host"], r["state"]) for r in document["nodes"]] == [
        (0, "a", "running"), (1, "b", "running")]
    pids = [int(p["pid"]) for r in document["nodes"]
            for run in r["result"]["runs"] for p in run["processes"]]
    assert len(pids) == 2 and all(alive(p) for p in pids)
    foreign = procs.spawn([sys.executable, "-c", "import time; time.sleep(600)"])

    stopped = stop_nodes(project, nodes[1].run_id, Reporter(quiet=True), journal=journal())

    assert [(r["host"], r["ok"], r["stopped"]) for r in stopped["nodes"]] == [
        ("a", True, 1), ("b", True, 1)]
    assert marked(nodes[0].run_id) == [] and marked(nodes[1].run_id) == []
    assert alive(foreign.pid)
    record = journal().job(result.job_id)
    assert record is not None and record["status"] == "stopped"


def test_node_1_failing_under_the_guard_stops_node_0(
        project: Project, fake_job: Path, tmp_path: Path) -> None:
    result = deploy_nodes(project, ["a", "b"], load_job(fake_job), Reporter(quiet=True),
                          journal=journal())
    head, other = node_log_targets(journal(), result.job_id)
    stop = threading.Event()
    timer = threading.Timer(240, stop.set)  # a bound on the test, not a synchronisation
    timer.start()
    (tmp_path / "fail-1").touch()
    try:
        with pytest.raises(NodesFailed, match=r"job .*: node 1 \(b\) failed: trainer "
                                              r"exited 1; every node was stopped"):
            watch_nodes(project, result.job_id, Reporter(quiet=True), period=0.5,
                        journal=journal(), stop=stop)
    finally:
        timer.cancel()
    assert not stop.is_set()
    assert "failing on purpose" in node_log(tmp_path, "b", other.run_id)
    assert "failing on purpose" not in node_log(tmp_path, "a", head.run_id)
    assert marked(head.run_id) == [] and marked(other.run_id) == []
    record = journal().job(result.job_id)
    assert record is not None and (record["status"], record["failed_node"]) == ("failed", 1)


def test_node_0_disappearing_is_named_and_node_1_is_stopped(
        project: Project, fake_job: Path, box_a: SandboxBox) -> None:
    result = deploy_nodes(project, ["a", "b"], load_job(fake_job), Reporter(quiet=True),
                          journal=journal())
    head, other = node_log_targets(journal(), result.job_id)
    box_a.stop()  # node 0's box stops answering; its processes keep running there
    try:
        with pytest.raises(NodesFailed) as info:
            watch_nodes(project, result.job_id, Reporter(quiet=True), period=0.5,
                        threshold=2.0, journal=journal())
        message = str(info.value)
        assert re.search(r"job .*: node 0 \(a\) failed: no answer for \d+ s", message)
        assert "could not stop node 0 (a)" in message
        assert marked(other.run_id) == []  # node 1 was stopped
        assert marked(head.run_id) != []  # what could not be reached is still running
    finally:
        box_a.start()
    stop_nodes(project, result.job_id, Reporter(quiet=True), journal=journal())
    assert marked(head.run_id) == []


@pytest.mark.parametrize(("bad", "good"), [(1, "node 0 (a)"), (0, "node 1 (b)")])
def test_a_node_failing_at_deploy_stops_the_other_and_names_it(
        project: Project, fake_job: Path, tmp_path: Path, bad: int, good: str) -> None:
    (tmp_path / f"fail-{bad}").touch()  # that node's ranks fail as soon as they start
    name = f"node {bad} ({'ab'[bad]})"

    with pytest.raises(NodesFailed) as info:
        deploy_nodes(project, ["a", "b"], load_job(fake_job), Reporter(quiet=True),
                     journal=journal())

    message = str(info.value)
    assert f"deploy on {name}: " in message and f"{good} stopped" in message
    (record,) = journal().jobs(playbook="pair")
    assert record["status"] == "failed"
    if bad == 1:  # node 1's failure leaves node 0 running: it is the one named
        assert message.startswith(f"{name} failed: ") and record["failed_node"] == 1
    for node in node_log_targets(journal(), str(record["job_id"])):
        assert marked(node.run_id) == []


@pytest.mark.skipif(not os.environ.get("OUTRIG_TORCH_PYTHON"),
                    reason="set OUTRIG_TORCH_PYTHON to a Python with torch to run real torchrun")
def test_real_torchrun_joins_two_nodes_over_gloo_and_the_guard_stops_node_0(
        project: Project, tmp_path: Path) -> None:
    script = tmp_path / "allreduce.py"
    script.write_text(TORCH_WORKER)
    python = os.environ["OUTRIG_TORCH_PYTHON"]
    command = [*launcher(python, ["-m", "torch.distributed.run"]), "--nproc-per-node", "1",
               "--rdzv-conf", "join_timeout=120,is_host=${is_head}", str(script),
               str(tmp_path / "fail-${node_rank}")]
    playbook = trainer_playbook(tmp_path, command, r"all_reduce 3 world 2",
                                {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
                                 "LOGLEVEL": "INFO"})
    result = deploy_nodes(project, ["a", "b"], load_job(playbook), Reporter(quiet=True),
                          journal=journal())
    head, other = node_log_targets(journal(), result.job_id)
    texts = [node_log(tmp_path, n.host, n.run_id) for n in (head, other)]
    assert all("all_reduce 3 world 2" in text for text in texts)
    assert sorted(group_rank(text) for text in texts) == [0, 1]
    document = nodes_status(project, result.job_id, Reporter(quiet=True, json_mode=True),
                            journal=journal())
    assert [r["state"] for r in document["nodes"]] == ["running", "running"]

    (tmp_path / "fail-1").touch()
    # node 0 hosts the store (is_host): node 1's end does not end it, the guard does
    with pytest.raises(NodesFailed, match=r"job .*: node 1 \(b\) failed: trainer exited 1; "
                                          r"every node was stopped"):
        watch_nodes(project, result.job_id, Reporter(quiet=True), period=0.5,
                    journal=journal())
    assert marked(head.run_id) == [] and marked(other.run_id) == []


class _SigintOnceBothLaunched(Reporter):
    """A quiet reporter that sends this process SIGINT (Ctrl-C) once every node launched."""

    def __init__(self, nodes: int) -> None:
        super().__init__(quiet=True)
        self.launched = 0
        self.nodes = nodes
        self.lock = threading.Lock()

    def info(self, message: str) -> None:  # each node's events come as its lines
        with self.lock:
            if ": • launched trainer" in message:
                self.launched += 1
                if self.launched == self.nodes:
                    os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_during_a_job_deploy_stops_every_node_and_exits_130(
        project: Project, tmp_path: Path) -> None:
    """Ctrl-C while the nodes wait to be ready: every node's run is stopped, and the
    command ends as every command ends on Ctrl-C (130), not as a node failure (1)."""
    playbook = trainer_playbook(
        tmp_path, [sys.executable, "-c", "import time; print('up', flush=True); "
                   "time.sleep(600)"], "never printed")
    with pytest.raises(Interrupted) as info:
        deploy_nodes(project, ["a", "b"], load_job(playbook), _SigintOnceBothLaunched(2),
                     journal=journal())
    assert info.value.exit_code == 130
    assert "interrupted (Ctrl-C)" in str(info.value), info.value
    (record,) = journal().jobs(playbook="pair")
    for node in node_log_targets(journal(), str(record["job_id"])):
        assert marked(node.run_id) == []


def test_no_wait_launches_node_0_then_node_1_and_returns(
        project: Project, fake_job: Path) -> None:
    result = deploy_nodes(project, ["a", "b"], load_job(fake_job), Reporter(quiet=True),
                          wait=False, journal=journal())
    assert result.status == "launched"
    assert [len(result.processes[rank]) for rank in (0, 1)] == [1, 1]
    record = journal().job(result.job_id)
    assert record is not None and record["status"] == "launched"
    for node in node_log_targets(journal(), result.job_id):
        assert (journal().run(node.run_id) or {}).get("status") == "launched"
        assert marked(node.run_id) != []
    stop_nodes(project, result.job_id, Reporter(quiet=True), journal=journal())
    for node in node_log_targets(journal(), result.job_id):
        assert marked(node.run_id) == []


def _cli(task: Any, root: Path, **flags: Any) -> tuple[int, list[dict[str, Any]], str]:
    """A task as the installed CLI runs it, with --json: exit status, JSON lines, stderr."""
    import contextlib
    import io

    from invoke.context import Context
    from invoke.exceptions import Exit

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            task(Context(), project=str(root), json=True, **flags)
        except Exit as exc:
            code = exc.code
    lines = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    return code, lines, err.getvalue()


def test_the_cli_treats_a_multi_node_playbook_as_one_job_across_the_selection(
        project: Project, fake_job: Path, tmp_path: Path) -> None:
    """``deploy --host a,b`` of a ``nodes: 2`` playbook is one job (not a sweep of two), and
    ``status``/``tail-logs``/``cleanup``/``watch`` with its ``--run`` id cover both nodes."""
    from outrig import cli

    root = project.root
    code, events, err = _cli(cli.plan, root, host=["a,b"], playbook="pair")
    assert code == 0, err
    (planned,) = [e for e in events if e.get("event") == "plan"]
    assert [p["host"] for p in planned["plans"]] == ["a", "b"]
    assert marked(planned["job_id"]) == []  # a plan starts nothing

    code, events, err = _cli(cli.deploy, root, host=["a,b"], playbook="pair")
    assert code == 0, err
    (deployed,) = [e for e in events if e.get("event") == "deployed"]
    job_id = deployed["job_id"]
    assert [(n["rank"], n["host"]) for n in deployed["nodes"]] == [(0, "a"), (1, "b")]

    # a node's own run id names the job as well; no --host needed
    code, documents, err = _cli(cli.status, root, run=f"{job_id}-node1")
    assert code == 0, err
    assert [(r["rank"], r["host"], r["state"]) for r in documents[-1]["nodes"]] == [
        (0, "a", "running"), (1, "b", "running")]

    code, lines, err = _cli(cli.tail_logs, root, run=job_id, no_follow=True)
    assert code == 0, err
    ranks = {(line["node_rank"], line["host"]) for line in lines
             if "rank-ready" in str(line.get("line"))}
    assert ranks == {(0, "a"), (1, "b")}

    # a job moves as a whole: spares or new boxes for every node, else nothing is touched
    code, _, err = _cli(cli.watch, root, run=job_id, spare=["a"])
    said = " ".join(err.split())
    assert code == 2 and "--spare names 1 box(es) (a), but job" in said, err
    assert "runs on 2 nodes" in said and "Nothing was stopped or started" in said
    code, _, err = _cli(cli.migrate, root, run=job_id, to="a,b,a")
    said = " ".join(err.split())
    assert code == 2 and "--to names 3 box(es) (a, b, a)" in said, err
    code, _, err = _cli(cli.migrate, root, run=job_id, to="b,a")
    assert code == 2 and "is a node of job" in " ".join(err.split()), err

    code, _, err = _cli(cli.cleanup, root, run=job_id, dry_run=True)
    assert code == 2 and "Nothing was stopped" in err
    assert all(marked(n.run_id) != [] for n in node_log_targets(journal(), job_id))

    code, documents, err = _cli(cli.cleanup, root, run=job_id)
    assert code == 0, err
    assert [(n["host"], n["ok"]) for n in documents[-1]["nodes"]] == [("a", True), ("b", True)]
    assert all(marked(n.run_id) == [] for n in node_log_targets(journal(), job_id))


def write_checkpoint(save: Path, epoch: int, step: int) -> None:
    """A complete speculators save folder ``<save>/<epoch>/`` (the agent's rule:
    training_state.json, written last, names the epoch and is as new as every file)."""
    import time

    folder = save / str(epoch)
    folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "optimizer_state_dict.pt"):
        (folder / name).write_text("{}")
    (folder / "training_state.json").write_text(json.dumps(
        {"epoch": epoch, "local_step": step, "global_step": 10 * epoch + step}))
    stamp = time.time()
    for path in folder.iterdir():
        os.utime(path, (stamp, stamp))


def test_nodes_holding_different_checkpoints_are_refused_before_anything_starts(
        project: Project, fake_job: Path, tmp_path: Path) -> None:
    """Every rank resumes from its own node's save path: node 0 holding a checkpoint that
    node 1 lacks would resume one side and start the other fresh. Nothing is started; with
    the same checkpoint on both the job deploys."""
    doc = yaml.safe_load(fake_job.read_text())
    doc["processes"]["trainer"]["checkpoints"] = {"path": "${workdir}/ckpt", "scheduler": False}
    fake_job.write_text(yaml.safe_dump(doc, sort_keys=False))
    write_checkpoint(tmp_path / "work-a" / "ckpt", 1, 40)

    with pytest.raises(PlanError) as caught:
        deploy_nodes(project, ["a", "b"], load_job(fake_job), Reporter(quiet=True),
                     journal=journal())

    message = str(caught.value)
    assert "node 0 (a): epoch 1, step 40" in message and "node 1 (b): none" in message
    assert "--from a --resume" in message and "nothing was sent" in message
    assert journal().jobs(playbook="pair") == []  # no job recorded, nothing launched

    write_checkpoint(tmp_path / "work-b" / "ckpt", 1, 40)
    result = deploy_nodes(project, ["a", "b"], load_job(fake_job), Reporter(quiet=True),
                          journal=journal())
    assert result.status == "running"
    stop_nodes(project, result.job_id, Reporter(quiet=True), journal=journal())


def test_one_node_of_a_job_is_neither_watched_nor_migrated_alone(
        project: Project, fake_job: Path) -> None:
    """``watch --host a --playbook pair`` and ``migrate --from a`` would restart or move node
    0 by itself while node 1 waits in a collective: both are refused, pointing at the job,
    and nothing is moved or stopped."""
    from outrig.errors import ConfigError
    from outrig.ops.migrate import migrate
    from outrig.ops.watch import watch
    from outrig.ops.watch_record import WatchOptions

    result = deploy_nodes(project, ["a", "b"], load_job(fake_job), Reporter(quiet=True),
                          journal=journal())
    try:
        with pytest.raises(ConfigError) as watched:
            watch(project, "a", "pair", Reporter(quiet=True),
                  options=WatchOptions(spares=["b"]), journal=journal())
        assert f"outrig watch --run {result.job_id}" in str(watched.value)
        with pytest.raises(ConfigError) as moved:
            migrate(project, "b", "a", Reporter(quiet=True), journal=journal())
        assert "node 1 of the multi-node job" in str(moved.value)
        assert "Nothing was started" in str(moved.value)
        for node in node_log_targets(journal(), result.job_id):  # both still running
            assert marked(node.run_id) != []
    finally:
        stop_nodes(project, result.job_id, Reporter(quiet=True), journal=journal())
