"""A 2-node job moved as one job, with real ``torchrun`` (gloo on CPU) on sandbox boxes.

Node 0 on ``b`` (the session's sshd), node 1 on ``a`` (a box with its own sshd), spares
``c`` and ``d`` (the session's sshd, workdirs of their own), each behind a latency proxy.
Global rank 0 writes speculators-layout checkpoints; node 1's box then dies (its sshd and
proxy gone, its run's processes killed from the box's records: ``faults.kill_runs``), and
``watch --run JOB --spare c,d`` moves the job: node 0 fenced, the rendezvous re-made on
``c``, rank 0's newest complete checkpoint mirrored and pushed to both new nodes, the job
resumed with its own ``--param``. Bad input (``--to`` with a count other than the job's
nodes) is exit 2, and nothing is stopped or started.

The Python with torch: ``OUTRIG_TORCH_PYTHON``, else the CI's trainer environment
(``OUTRIG_REHEARSAL_PYTHON``: speculators 0.9 with torch)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.ops.job_move import sync_job_checkpoints, watch_job
from outrig.ops.node_control import node_log_targets, stop_nodes
from outrig.ops.nodes import deploy_nodes
from outrig.playbook import load_job
from outrig.sandbox.box import SandboxBox
from outrig.sandbox.faults import kill_runs
from outrig.sandbox.nvidia_smi import load_inventory, write_inventory
from outrig.sandbox.proxy import LatencyProxy
from outrig.session import Project
from tests.support.network import free_port
from tests.support.processes import marked
from tests.support.runs import stop_every_run

pytestmark = pytest.mark.integration

TORCH = os.environ.get("OUTRIG_TORCH_PYTHON") or os.environ.get("OUTRIG_REHEARSAL_PYTHON")

# A trainer as speculators lays out its saves: global rank 0 writes <save>/<epoch>/ (the
# weights, optimizer and scheduler files, then training_state.json last); every rank resumes
# from the newest complete one in its own node's save path. One all_reduce per epoch; after
# epoch 2 the ranks wait in collectives while the hold file exists.
TRAINER = """\
import json, os, sys, time
import torch
import torch.distributed as dist
save, epochs, lr, hold = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo")
rank = dist.get_rank()
start = 0
held = sorted((int(p) for p in os.listdir(save) if p.isdigit()), reverse=True) \\
    if os.path.isdir(save) else []
for epoch in held:
    try:
        with open(os.path.join(save, str(epoch), "training_state.json")) as f:
            start = int(json.load(f)["epoch"])
        break
    except (OSError, ValueError, KeyError):
        continue
print(f"rank {rank}:", f"resumed from epoch {start}" if start else "starting fresh",
      f"lr={lr} epochs={epochs} world={dist.get_world_size()}", flush=True)
for epoch in range(start + 1, epochs + 1):
    value = torch.tensor([1.0])
    dist.all_reduce(value)
    if rank == 0:
        folder = os.path.join(save, str(epoch))
        os.makedirs(folder, exist_ok=True)
        for name in ("config.json", "model.safetensors", "optimizer_state_dict.pt",
                     "scheduler_state_dict.pt"):
            with open(os.path.join(folder, name), "w") as f:
                f.write("{}")
        with open(os.path.join(folder, "training_state.json"), "w") as f:
            json.dump({"epoch": epoch, "local_step": 0, "global_step": 10 * epoch}, f)
        print(f"Checkpoint saved to {folder}", flush=True)
    dist.barrier()
    while epoch == 2 and os.path.exists(hold):
        dist.all_reduce(torch.tensor([0.0]))
        time.sleep(0.2)
print(f"rank {rank}: finished epoch {epochs} (sum {int(value.item())})", flush=True)
dist.destroy_process_group()
"""


@pytest.fixture
def boxes(box_a: SandboxBox, sandbox: SandboxBox, tmp_path: Path,
          make_proxy: Callable[..., LatencyProxy]) -> Iterator[dict[str, Any]]:
    """Hosts b (node 0), a (node 1, its own sshd: the box that dies), c to f (spares),
    each through a proxy (10 ms each way); every run left on them is stopped at the end."""
    if not sandbox.is_running():
        sandbox.start()
    proxies = {}
    for name, box in (("a", box_a), ("b", sandbox), ("c", sandbox), ("d", sandbox),
                      ("e", sandbox), ("f", sandbox)):
        proxies[name] = make_proxy(box.port, one_way_delay=0.01)
        workdir = tmp_path / f"work-{name}"
        workdir.mkdir()
        box.write_host_file(tmp_path / "hosts" / f"{name}.yaml", port=proxies[name].port,
                            workdir=workdir, known_hosts=tmp_path / f"known_hosts_{name}",
                            gpu_dir=tmp_path / f"gpu-{name}")
        write_inventory(tmp_path / f"gpu-{name}", load_inventory(box.gpu_dir))
    project = Project(tmp_path)
    yield {"project": project, "proxies": proxies, "box_a": box_a}
    for host in ("b", "c", "d", "e", "f"):
        stop_every_run(project, host, Path(os.environ["XDG_STATE_HOME"]) / "outrig")
    kill_runs(tmp_path / "work-a")


def journal() -> Journal:
    return Journal(Path(os.environ["XDG_STATE_HOME"]) / "outrig")


def playbook(tmp_path: Path, python: str) -> Path:
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    command = [python, "-m", "torch.distributed.run", "--nnodes", "${nnodes}",
               "--node-rank", "${node_rank}", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", "${head_host}:${rdzv_port}", "--rdzv-id", "${job_id}",
               "--rdzv-conf", "join_timeout=120,is_host=${is_head}",
               "--nproc-per-node", "1", str(script), "${workdir}/ckpt", "${epochs}", "${lr}",
               str(tmp_path / "hold")]
    path = tmp_path / "playbooks" / "pair.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump({
        "name": "pair", "nodes": 2, "rdzv_port": free_port(),
        "params": {"epochs": 4, "lr": 0.5},
        "stage": {"ckpt": {"path": "${workdir}/ckpt", "kind": "checkpoints"}},
        "processes": {"trainer": {
            "command": command,
            "env": {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "LOGLEVEL": "INFO"},
            "checkpoints": {"path": "${workdir}/ckpt"},
            "ready": {"log": r"rank \d+: (starting fresh|resumed from)", "timeout": 180},
            "stop": {"grace": 10, "children_first": True}}}}, sort_keys=False))
    return path


def log_of(tmp_path: Path, host: str, run_id: str) -> str:
    return (tmp_path / f"work-{host}" / "runs" / run_id / "logs" / "trainer.log").read_text()


def wait_for(check: Callable[[], bool], what: str, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, f"waited {limit:.0f}s for {what}"
        time.sleep(0.2)


def _cli(task: Any, root: Path, **flags: Any) -> tuple[int, str, str]:
    """A task as the installed CLI runs it: exit status, stdout, stderr."""
    from invoke.context import Context
    from invoke.exceptions import Exit

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            task(Context(), project=str(root), **flags)
        except Exit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


@pytest.mark.skipif(not TORCH, reason="set OUTRIG_TORCH_PYTHON (or the CI's "
                    "OUTRIG_REHEARSAL_PYTHON) to a Python with torch to run real torchrun")
def test_a_job_whose_node_1_dies_moves_to_two_spares_and_resumes_from_the_mirror(
        boxes: dict[str, Any], tmp_path: Path) -> None:
    from outrig.cli import run_tasks

    project: Project = boxes["project"]
    assert TORCH is not None
    (tmp_path / "hold").touch()
    job = load_job(playbook(tmp_path, TORCH), params={"lr": "0.25"})
    deployed = deploy_nodes(project, ["b", "a"], job, Reporter(quiet=True),
                            journal=journal(), params={"lr": "0.25"})
    old_head, old_other = node_log_targets(journal(), deployed.job_id)
    wait_for(lambda: (tmp_path / "work-b" / "ckpt" / "2" / "training_state.json").exists(),
             "rank 0's checkpoint 2")
    assert not (tmp_path / "work-a" / "ckpt").exists()  # global rank 0 alone writes them

    # sync-checkpoints --run JOB: node 0's complete checkpoints into the mirror
    synced = sync_job_checkpoints(project, deployed.job_id, Reporter(quiet=True),
                                  journal=journal())
    assert [p["epoch"] for p in synced["pulled"]] == [1, 2]

    # bad input: --to with a count other than the job's nodes; nothing stopped or started
    code, _, err = _cli(run_tasks.migrate, tmp_path, run=deployed.job_id, to="c")
    assert code == 2 and "names 1 box(es) (c), but job" in err and "runs on 2 nodes" in err
    assert "Nothing was stopped or started" in " ".join(err.split())
    assert marked(old_head.run_id) != [] and marked(old_other.run_id) != []
    assert not (tmp_path / "work-c" / "runs").exists()

    # node 1's box dies: its processes killed from the box's records, its sshd and its door
    assert kill_runs(tmp_path / "work-a") == [old_other.run_id]
    boxes["proxies"]["a"].close()
    boxes["box_a"].stop()
    (tmp_path / "hold").unlink()

    out = io.StringIO()
    events: list[tuple[str, dict[str, Any]]] = []
    outcome = watch_job(project, deployed.job_id, ["c", "d"], Reporter(out=out),
                        send=lambda event, **fields: events.append((event, fields)),
                        threshold=3.0, period=0.5, journal=journal())
    moved = outcome["moved"]
    assert outcome["status"] == "finished", out.getvalue()
    assert [e for e, _ in events] == ["node_lost", "job_moved", "spares_spent"]
    assert moved["from"] == ["b", "a"] and moved["to"] == ["c", "d"]
    assert moved["checkpoint"]["epoch"] == 2 and moved["checkpoint"]["route"] == "mirror"
    assert moved["params"] == {"lr": "0.25"} and moved["differences"] == []
    assert [(n["rank"], n["alive"], n["fenced"]) for n in moved["old_nodes"]] == [
        (0, True, True), (1, False, False)]
    assert marked(old_head.run_id) == []  # node 0 fenced: its run stopped by its record

    new_head, new_other = node_log_targets(journal(), moved["to_job"])
    assert (new_head.host, new_other.host) == ("c", "d")
    for node in (new_head, new_other):  # the same checkpoint on each node's save path
        text = log_of(tmp_path, node.host, node.run_id)
        assert f"rank {node.rank}: resumed from epoch 2 lr=0.25 epochs=4 world=2" in text, text
        assert f"rank {node.rank}: finished epoch 4 (sum 2)" in text, text
        state = tmp_path / f"work-{node.host}" / "ckpt" / "2" / "training_state.json"
        assert json.loads(state.read_text())["epoch"] == 2
    assert not (tmp_path / "work-d" / "ckpt" / "3").exists()  # rank 0 (on c) writes on
    assert (tmp_path / "work-c" / "ckpt" / "4" / "training_state.json").exists()

    records = journal()
    assert records.job(deployed.job_id)["moved_to"]["job_id"] == moved["to_job"]
    assert records.job(moved["to_job"])["migrated_from"]["job_id"] == deployed.job_id
    assert records.run(new_head.run_id)["migrated_from"]["run_id"] == old_head.run_id
    assert records.run(old_head.run_id)["fenced"]["stopped"] != []
    assert not records.run(old_other.run_id).get("fenced")  # dead: fenced if it comes back
    print(out.getvalue())
    stop_nodes(project, moved["to_job"], Reporter(quiet=True), journal=journal())


# Under the rendezvous stand-in (tests/standins/fake_torchrun.py): each rank says which
# checkpoint of its node's save path it would resume from, then runs until stopped.
STANDIN_WORKER = """\
import os, sys, time
save = sys.argv[1]
held = sorted((int(p) for p in os.listdir(save) if p.isdigit()), reverse=True) \\
    if os.path.isdir(save) else []
data = (f"with {len(open(sys.argv[2]).readlines())} data lines" if len(sys.argv) > 2
        else "")
print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "resumes from",
      held[0] if held else "nothing", data, flush=True)
while True:
    time.sleep(0.2)
"""


def write_checkpoint(save: Path, epoch: int) -> None:
    """A complete speculators save folder ``<save>/<epoch>/`` (training_state.json last)."""
    folder = save / str(epoch)
    folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "optimizer_state_dict.pt",
                 "scheduler_state_dict.pt"):
        (folder / name).write_text("{}")
    (folder / "training_state.json").write_text(json.dumps(
        {"epoch": epoch, "local_step": 0, "global_step": 10 * epoch}))
    stamp = time.time()
    for path in folder.iterdir():
        os.utime(path, (stamp, stamp))


def standin_playbook(tmp_path: Path) -> Path:
    """``pair`` under the rendezvous stand-in, its checkpoints under ``${workdir}/ckpt``."""
    import sys

    from tests.support.runs import standin_path

    script = tmp_path / "worker.py"
    script.write_text(STANDIN_WORKER)
    command = [sys.executable, str(standin_path("fake_torchrun")), "--nnodes", "${nnodes}",
               "--node-rank", "${node_rank}", "--rdzv-backend", "c10d", "--rdzv-endpoint",
               "${head_host}:${rdzv_port}", "--rdzv-id", "${job_id}", "--nproc-per-node", "1",
               "--shutdown-timeout", "5", "-m", "work", "${workdir}/ckpt"]
    path = tmp_path / "playbooks" / "pair.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump({
        "name": "pair", "nodes": 2, "rdzv_port": free_port(),
        "stage": {"ckpt": {"path": "${workdir}/ckpt", "kind": "checkpoints"}},
        "processes": {"trainer": {
            "command": command,
            "env": {"FAKE_TORCHRUN_MODULES": json.dumps({"work": str(script)})},
            "ready": {"log": r"rank \d+ of 2 resumes from", "timeout": 60},
            "stop": {"grace": 10, "children_first": True}}}}, sort_keys=False))
    return path


def test_a_job_whose_node_0_dies_resumes_from_what_the_watch_mirrored(
        boxes: dict[str, Any], tmp_path: Path) -> None:
    """Node 0 holds rank 0's checkpoints and the rendezvous store; its box dies. Nothing is
    read from it: the watch mirrored its checkpoint while it lived, node 1 (failed once the
    store went) is fenced, and both spares get the mirrored checkpoint."""
    from outrig.ops.stage import mirror_held

    project: Project = boxes["project"]
    path = standin_playbook(tmp_path)
    deployed = deploy_nodes(project, ["a", "b"], load_job(path), Reporter(quiet=True),
                            journal=journal())
    _, old_other = node_log_targets(journal(), deployed.job_id)
    write_checkpoint(tmp_path / "work-a" / "ckpt", 3)  # rank 0's save, on node 0's disk

    moved = threading.Event()
    events: list[str] = []

    def send(event: str, **fields: Any) -> None:
        events.append(event)
        if event == "job_moved":
            moved.set()  # the test follows the moved job no further

    outcome: dict[str, Any] = {}
    watcher = threading.Thread(target=lambda: outcome.update(watch_job(
        project, deployed.job_id, ["c", "d"], Reporter(quiet=True), send=send,
        threshold=3.0, period=0.5, journal=journal(), stop=moved)), daemon=True)
    watcher.start()
    mirror = Path(os.environ["XDG_STATE_HOME"]) / "outrig" / "checkpoints" / "pair" / "3"
    wait_for(lambda: mirror_held(mirror) is not None, "the watch's mirror of it (whole)")

    kill_runs(tmp_path / "work-a")  # node 0's box dies, with the store and the checkpoint
    boxes["proxies"]["a"].close()
    boxes["box_a"].stop()
    watcher.join(180)
    assert not watcher.is_alive() and events == ["node_lost", "job_moved", "spares_spent"], outcome
    report = outcome["moved"]
    assert [(n["rank"], n["alive"], n["fenced"]) for n in report["old_nodes"]] == [
        (0, False, False), (1, True, True)]
    assert report["checkpoint"]["epoch"] == 3 and report["checkpoint"]["route"] == "mirror"
    assert marked(old_other.run_id) == []  # node 1 fenced by its record
    for node in node_log_targets(journal(), report["to_job"]):
        text = log_of(tmp_path, node.host, node.run_id)
        assert f"rank {node.rank} of 2 resumes from 3" in text, text
    stop_nodes(project, report["to_job"], Reporter(quiet=True), journal=journal())


def test_spare_auto_rents_a_box_per_node_and_a_rent_refused_moves_nothing(
        boxes: dict[str, Any], tmp_path: Path) -> None:
    """``watch --run JOB --spare auto``: node 1 lost, one box rented per node through the
    provider of ``spares:`` (the sandbox provider: real sshd boxes). With a budget of one
    box the second rent is refused: the first box is released, nothing is stopped, and the
    error says what to do. With room for two the job moves onto the rented pair."""
    from outrig.errors import OutrigError
    from outrig.providers import sandbox as market

    project: Project = boxes["project"]
    market.set_market(offers=[{"id": "sb-h100-1", "gpus": 8, "gpu_name": "NVIDIA H100 80GB "
                               "HBM3", "price": 2.1, "disk_gb": 500}])
    settings = {"providers": {"sandbox": {"ssh_deadline": 4}},
                "spares": {"provider": "sandbox", "gpus": "8xH100"},
                "budget": {"max_boxes": 1}}
    (tmp_path / "outrig.yaml").write_text(yaml.safe_dump(settings))
    deployed = deploy_nodes(project, ["b", "a"], load_job(standin_playbook(tmp_path)),
                            Reporter(quiet=True), journal=journal())
    old_head, old_other = node_log_targets(journal(), deployed.job_id)
    write_checkpoint(tmp_path / "work-b" / "ckpt", 2)
    kill_runs(tmp_path / "work-a")  # node 1's box dies
    boxes["proxies"]["a"].close()
    boxes["box_a"].stop()
    try:
        sent: list[str] = []
        with pytest.raises(OutrigError) as refused:
            watch_job(project, deployed.job_id, ["auto"], Reporter(quiet=True),
                      send=lambda event, **f: sent.append(event), threshold=3.0,
                      period=0.5, journal=journal())
        said = " ".join(str(refused.value).split())
        assert "node 1 (a) lost, and the 2 spares could not be rented" in said, said
        assert "max_boxes 1" in said and "nothing was stopped" in said
        assert f"outrig migrate --run {deployed.job_id} --to A,B" in said
        assert market.SandboxProvider().list() == [], "the first rented box was released"
        assert marked(old_head.run_id) != [], "node 0 was not stopped"
        assert journal().job(deployed.job_id).get("moved_to") is None

        settings["budget"] = {"max_boxes": 2}
        (tmp_path / "outrig.yaml").write_text(yaml.safe_dump(settings))
        done = threading.Event()
        sent.clear()

        def send(event: str, **fields: Any) -> None:
            sent.append(event)
            if event == "job_moved":
                done.set()

        outcome = watch_job(project, deployed.job_id, ["auto"], Reporter(quiet=True),
                            send=send, threshold=3.0, period=0.5, journal=journal(),
                            stop=done)
        report = outcome["moved"]
        rented = {str(r["name"]): r for r in journal().rentals() if r.get("state") == "ready"}
        assert sorted(rented) == sorted(report["to"]) and len(rented) == 2
        assert {r["for_run"] for r in rented.values()} == {old_head.run_id, old_other.run_id}
        assert sent.count("rented") == 2 and sent[-1] == "job_moved", sent
        assert report["checkpoint"]["epoch"] == 2 and marked(old_head.run_id) == []
        for node in node_log_targets(journal(), report["to_job"]):
            workdir = Path(yaml.safe_load(
                (project.hosts_dir / f"{node.host}.yaml").read_text())["workdir"])
            text = (workdir / "runs" / node.run_id / "logs" / "trainer.log").read_text()
            assert f"rank {node.rank} of 2 resumes from 2" in text, text
        stop_nodes(project, report["to_job"], Reporter(quiet=True), journal=journal())
    finally:
        provider = market.SandboxProvider()
        for instance in provider.list():
            provider.terminate(instance.instance_id)


@pytest.fixture
def index(tmp_path: Path) -> Iterator[str]:
    """A PEP 503 index on 127.0.0.1 with outrigdemo 1.0 (the environment's one package)."""
    from tests.support.network import serve
    from tests.support.provisioning import make_wheel

    root = tmp_path / "index"
    page = root / "simple" / "outrigdemo"
    page.mkdir(parents=True)
    wheel = make_wheel(root / "files", "outrigdemo", "1.0")
    (page / "index.html").write_text(f'<a href="/files/{wheel.name}">{wheel.name}</a>')
    with serve(root) as port:
        yield f"http://127.0.0.1:{port}/simple"


def test_a_job_moved_onto_bare_boxes_gets_its_environment_and_data_on_every_node(
        boxes: dict[str, Any], tmp_path: Path, index: str) -> None:
    """The playbook names an environment (``~/venvs/demo``, each box its own home) and a
    data folder staged from this workstation, which every rank reads at start. The job runs
    on b and a (data staged there first); a dies; the move onto c and d, both bare, installs
    the environment and stages the data on each new node (c's data box to box from b, the
    old node of its rank; d's from the workstation: a is dead) before the job resumes."""
    import sys

    from outrig.ops.job_move import JobMoveOptions, move_job
    from outrig.ops.stage import stage

    project: Project = boxes["project"]
    homes = {name: tmp_path / f"home-{name}" for name in "abcd"}
    for name, home in homes.items():  # the sandbox's boxes share a disk: a home per box
        home.mkdir()
        host_file = project.hosts_dir / f"{name}.yaml"
        config = yaml.safe_load(host_file.read_text())
        config["env"]["HOME"] = str(home)
        host_file.write_text(yaml.safe_dump(config))
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"q": 1}\n' * 100)
    path = standin_playbook(tmp_path)
    book = yaml.safe_load(path.read_text())
    book["stage"]["data"] = {"path": "${workdir}/data", "source": str(data), "kind": "data"}
    book["environments"] = {"demo": {"path": "~/venvs/demo", "python": sys.executable,
                                     "packages": ["outrigdemo==1.0"], "index_url": index,
                                     "installer": "pip"}}
    book["processes"]["trainer"]["command"].append("${workdir}/data/train.jsonl")
    path.write_text(yaml.safe_dump(book, sort_keys=False))
    for host in ("b", "a"):
        stage(project, host, "pair", Reporter(quiet=True), journal=journal())
    deployed = deploy_nodes(project, ["b", "a"], load_job(path), Reporter(quiet=True),
                            journal=journal())
    write_checkpoint(tmp_path / "work-b" / "ckpt", 2)
    kill_runs(tmp_path / "work-a")  # node 1's box dies
    boxes["proxies"]["a"].close()
    boxes["box_a"].stop()
    for name in ("c", "d"):  # bare: no environment, no data
        assert not (homes[name] / "venvs").exists()
        assert not (tmp_path / f"work-{name}" / "data").exists()

    out = io.StringIO()
    report = move_job(project, deployed.job_id, ["c", "d"], Reporter(out=out, err=out),
                      journal=journal(), options=JobMoveOptions(dead=frozenset({1})))
    said = out.getvalue()
    prepared = {p["host"]: p for p in report["prepared"]}
    assert sorted(prepared) == ["c", "d"], said
    for name in ("c", "d"):
        assert [e["name"] for e in prepared[name]["environments"]] == ["demo"], said
        assert prepared[name]["environments"][0]["status"] == "created", said
        installed = list((homes[name] / "venvs" / "demo").glob(
            "lib/python*/site-packages/outrigdemo/__init__.py"))
        assert len(installed) == 1, said
        assert (tmp_path / f"work-{name}" / "data" / "train.jsonl").read_text().count(
            "\n") == 100
        recorded = journal().host_facts(name).get("environments") or {}
        assert recorded["demo"]["versions"].get("outrigdemo") == "1.0", recorded
    routes = {h: [i["route"] for i in p["staged"] if i["name"] == "data"]
              for h, p in prepared.items()}
    assert routes["c"] in (["peer"], ["relay"]) and routes["d"] == ["workstation"], routes
    assert "node 0 (c) ready: environments demo (created); staged data" in said, said
    for node in node_log_targets(journal(), report["to_job"]):
        text = log_of(tmp_path, node.host, node.run_id)
        assert f"rank {node.rank} of 2 resumes from 2 with 100 data lines" in text, text
    print(said)
    stop_nodes(project, report["to_job"], Reporter(quiet=True), journal=journal())


def test_a_watch_keeps_its_unused_spares_for_the_next_move_then_says_they_are_spent(
        boxes: dict[str, Any], tmp_path: Path) -> None:
    """``watch --run JOB --spare c,d,e,f``: node 1 dies, the job moves to c,d; then d goes
    silent (its door closed, its run's processes killed) and the same watch moves the job
    again, to e,f, the spares the first move left. With none left it says the spares are
    spent and follows the job without them."""
    project: Project = boxes["project"]
    deployed = deploy_nodes(project, ["b", "a"], load_job(standin_playbook(tmp_path)),
                            Reporter(quiet=True), journal=journal())
    write_checkpoint(tmp_path / "work-b" / "ckpt", 2)
    from outrig.watching.notify import Notifier

    events: list[tuple[str, dict[str, Any]]] = []
    spent = threading.Event()
    notifier = Notifier()  # what the CLI sends through: it refuses an event it does not know

    def send(event: str, **fields: Any) -> None:
        notifier.send(event, **fields)
        events.append((event, fields))
        if event == "spares_spent":
            spent.set()  # the test follows the job no further

    out = io.StringIO()
    outcome: dict[str, Any] = {}

    def watch() -> None:
        try:
            outcome.update(watch_job(project, deployed.job_id, ["c", "d", "e", "f"],
                                     Reporter(out=out, err=out), send=send, threshold=3.0,
                                     period=0.5, journal=journal(), stop=spent))
        except Exception as exc:  # the test's thread: its error is the test's failure
            outcome["error"] = exc

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    kill_runs(tmp_path / "work-a")  # node 1's box dies
    boxes["proxies"]["a"].close()
    boxes["box_a"].stop()
    wait_for(lambda: [e for e, _ in events].count("job_moved") == 1
             or not watcher.is_alive(), "the first move", 240)
    assert "error" not in outcome, outcome
    first = next(f for e, f in events if e == "job_moved")
    assert first["to"] == ["c", "d"], out.getvalue()
    second_head, second_other = node_log_targets(journal(), first["to_job"])
    wait_for(lambda: "resumes from" in log_of(tmp_path, "d", second_other.run_id)
             if (tmp_path / "work-d" / "runs" / second_other.run_id / "logs").exists()
             else False, "the moved job's node 1")
    kill_runs(tmp_path / "work-d")  # then the moved job's node 1 goes silent
    boxes["proxies"]["d"].close()
    watcher.join(240)
    said = out.getvalue()
    assert not watcher.is_alive(), said
    assert [e for e, _ in events] == ["node_lost", "job_moved", "node_lost", "job_moved",
                                      "spares_spent"], said
    moves = outcome["moves"]
    assert [m["to"] for m in moves] == [["c", "d"], ["e", "f"]], said
    assert moves[1]["from_job"] == first["to_job"] and outcome["moved"] == moves[1]
    assert [(n["rank"], n["alive"], n["fenced"]) for n in moves[1]["old_nodes"]] == [
        (0, True, True), (1, False, False)], said
    assert marked(second_head.run_id) == []  # c fenced by its record
    for node in node_log_targets(journal(), moves[1]["to_job"]):
        text = log_of(tmp_path, node.host, node.run_id)
        assert f"rank {node.rank} of 2 resumes from 2" in text, text
    assert f"the spares are spent: job {moves[1]['to_job']} is watched without them" in \
        " ".join(said.split()), said
    print(said)
    stop_nodes(project, moves[1]["to_job"], Reporter(quiet=True), journal=journal())
