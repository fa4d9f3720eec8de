"""The installed ``outrig`` command, end to end: a wheel built from this checkout, installed
into a fresh virtual environment, run from folders that are not the checkout, against the
sandbox box (a real sshd on 127.0.0.1).

The wheel is built offline (``--no-build-isolation --no-index``) and installed without its
dependencies; the fresh environment finds them through one ``.pth`` line naming this test
environment's site-packages (a plain path, so the checkout's editable-install hook there is
not run and ``outrig`` can only come from the wheel).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.journal import Journal
from outrig.session import Project
from tests.support.hosts import write_host_file
from tests.support.network import free_port
from tests.support.processes import alive, wait_gone
from tests.support.runs import stop_every_run

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SKIP = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache", ".mypy_cache",
        ".ruff_cache"}


def _copy_checkout(dest: Path) -> None:
    """The checkout's sources without environments, caches or build output."""
    shutil.copytree(REPO, dest, ignore=lambda _d, names: [
        n for n in names if n in SKIP or n.endswith(".egg-info")])


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``bin/`` of a fresh venv where outrig is installed from a wheel of this checkout."""
    root = tmp_path_factory.mktemp("install")
    _copy_checkout(root / "src")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", str(root / "dist"), str(root / "src")],
        capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = next((root / "dist").glob("outrig-*.whl"))
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    site = subprocess.run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "outrig-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    yield env_dir / "bin"


def run(bin_dir: Path, args: list[str], cwd: Path, timeout: float = 120,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bin_dir / "outrig"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    folder = tmp_path / "empty"
    folder.mkdir()
    return folder


@pytest.fixture
def project(installed: Path, empty: Path, box_host: Path) -> Iterator[Path]:
    """``outrig init`` in an empty folder, its host file then pointed at the sandbox; every
    run started there is stopped afterwards by outrig's own cleanup."""
    done = run(installed, ["init"], empty)
    assert done.returncode == 0, done.stderr
    shutil.copyfile(box_host, empty / "hosts" / "box.yaml")
    yield empty
    stop_every_run(Project(empty), "box", empty / "teardown-state")


def test_wheel_ships_the_agent_and_runs_from_an_empty_folder(installed: Path, empty: Path,
                                                             box_host: Path,
                                                             tmp_path: Path) -> None:
    where = subprocess.run([str(installed / "python"), "-c",
                            "import outrig.agent.client as a; print(a.AGENT_DIR)"],
                           cwd=empty, capture_output=True, text=True, check=True)
    agent = Path(where.stdout.strip())
    assert (agent / "__main__.py").is_file() and (agent / "wrap.py").is_file(), agent
    assert installed.parent in agent.parents, agent
    assert REPO not in agent.parents
    helped = run(installed, ["--help"], empty)
    assert helped.returncode == 0, helped.stderr
    for name in ("deploy", "plan", "check", "exec", "init", "tail-logs", "cleanup"):
        assert name in helped.stdout
    checked = run(installed, ["check", "--host", str(box_host), "--json"], empty)
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["facts"]["gpus"]  # one document, the facts in it
    playbook = tmp_path / "job.yaml"
    playbook.write_text(yaml.safe_dump({"name": "job", "params": {"n": 1}, "processes": {
        "a": {"command": "python3 -c print(${n})", "gpus": [0]}}}))
    planned = run(installed, ["plan", "--host", str(box_host), "--playbook", str(playbook),
                              "--param", "n=7", "--json"], empty)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["processes"][0]["argv"][-1] == "print(7)"


def test_demo_runs_from_the_wheel_in_an_empty_folder(installed: Path, empty: Path,
                                                     tmp_path: Path) -> None:
    """`outrig demo` from a wheel failed with "unknown playbook smoke ... pass --playbook"
    (a flag demo does not take): the smoke playbook and its trainer were only in the
    checkout. The wheel ships them; the demo deploys them, its trainer saves a checkpoint
    status calls complete, and everything it started is stopped again."""
    from tests.support.processes import marked

    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "COLUMNS": "80"}
    done = run(installed, ["demo"], empty, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stderr.replace("\n  ", " ")  # notes are wrapped at 80 columns, two in
    assert "smoke ready on sandbox" in said, done.stderr
    assert "trainer: newest complete checkpoint" in done.stdout, done.stdout
    run_id = said.split("— run ", 1)[1].split(".", 1)[0]
    assert marked(run_id) == []  # the demo's cleanup stopped every process of the run
    # no hint names the demo's host file, which is gone when it ends; the last line says how
    # to try the commands on a box that stays up
    assert "outrig-demo-" not in said.split("— run ", 1)[1], said
    assert said.rstrip().endswith("outrig sandbox-down stops it."), said
    assert list(empty.iterdir()) == []  # the demo writes nothing into the folder


def test_init_writes_a_starter_project_and_refuses_to_overwrite(installed: Path,
                                                                empty: Path) -> None:
    done = run(installed, ["init"], empty)
    assert done.returncode == 0, done.stderr
    files = ["outrig.yaml", "hosts/box.yaml", "playbooks/hello.yaml"]
    for name in files:
        assert (empty / name).read_text().startswith("#"), name  # commented for a new user
    (empty / "hosts" / "box.yaml").write_text("hostname: mine\nworkdir: /srv/x\n")
    again = run(installed, ["init"], empty)
    assert again.returncode == 2
    assert "would overwrite" in again.stderr and "Traceback" not in again.stderr
    assert (empty / "hosts" / "box.yaml").read_text() == "hostname: mine\nworkdir: /srv/x\n"


def test_init_dflash_from_the_wheel_then_plan_on_the_box(installed: Path, empty: Path,
                                                        box_host: Path, tmp_path: Path) -> None:
    """README's walkthrough from a wheel: `outrig init --dflash` in an empty folder writes the
    DFlash playbook the wheel ships (no checkout anywhere), and `outrig plan` plans it on a
    real box (the sandbox's sshd) without a problem: the three processes from the two venvs
    its environments: name, and the box's GPUs that it leaves idle noted."""
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "COLUMNS": "80"}
    done = run(installed, ["init", "--dflash"], empty, env=env)
    assert done.returncode == 0, done.stderr
    assert "wrote " in done.stdout and "playbooks/dflash.yaml" in done.stdout, done.stdout
    playbook = yaml.safe_load((empty / "playbooks" / "dflash.yaml").read_text())
    assert set(playbook["environments"]) == {"vllm", "speculators"}
    shutil.copyfile(box_host, empty / "hosts" / "box.yaml")
    checked = run(installed, ["check"], empty, env=env)  # the box's GPUs, for the fit checks
    assert checked.returncode == 0, checked.stderr
    planned = run(installed, ["plan", "--json"], empty, env=env)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["playbook"] == "dflash" and plan["problems"] == []
    argv = {p["name"]: p["argv"] for p in plan["processes"]}
    assert list(argv) == ["server", "prepare", "trainer"]
    assert argv["server"][0] == "/workspace/venvs/vllm/bin/python"
    assert argv["trainer"][0] == "/workspace/venvs/speculators/bin/torchrun"
    shown = run(installed, ["plan"], empty, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "stay idle" in shown.stdout.replace("\n    ", " "), shown.stdout
    again = run(installed, ["init", "--template", "dflash"], empty, env=env)
    assert again.returncode == 2 and "would overwrite" in again.stderr


def test_project_is_found_upward_or_named(installed: Path, project: Path,
                                          tmp_path: Path) -> None:
    deeper = project / "notes" / "today"
    deeper.mkdir(parents=True)
    found = run(installed, ["plan", "--json"], deeper)  # host and playbook from outrig.yaml
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["playbook"] == "hello"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    lost = run(installed, ["plan", "--json"], elsewhere)
    assert lost.returncode == 2 and "no host given" in lost.stderr, lost.stderr
    named = run(installed, ["plan", "--json", "--project", str(project)], elsewhere)
    assert named.returncode == 0, named.stderr
    by_env = run(installed, ["plan", "--json"], elsewhere, env={"OUTRIG_PROJECT": str(project)})
    assert by_env.returncode == 0, by_env.stderr
    assert json.loads(by_env.stdout)["host"] == "box"


def test_deploy_from_config_with_a_param_then_exec_on_the_box(installed: Path,
                                                              project: Path) -> None:
    port = free_port()
    state = project / "state"
    env = {"XDG_STATE_HOME": str(state)}
    done = run(installed, ["deploy", "--param", f"port={port}", "--json"], project, env=env)
    assert done.returncode == 0, done.stderr
    last = json.loads(done.stdout.splitlines()[-1])
    assert last["event"] == "deployed" and last["status"] == "running", last
    record = Journal(state / "outrig").run(last["run_id"])
    assert record is not None and record["param_overrides"] == {"port": port}
    assert record["playbook"] == "hello" and record["host"] == "box"

    smi = run(installed, ["exec", "--", "nvidia-smi", "-L"], project, env=env)
    assert smi.returncode == 0, smi.stderr
    assert "GPU 0:" in smi.stdout
    where = run(installed, ["exec", "--", "sh", "-c", "pwd; echo to-stderr >&2; exit 7"],
                project, env=env)
    assert where.returncode == 7
    workdir = yaml.safe_load((project / "hosts" / "box.yaml").read_text())["workdir"]
    assert where.stdout.strip() == str(Path(workdir).resolve())
    assert "to-stderr" in where.stderr
    quoted = run(installed, ["exec", "--", "printf", "%s|", "a b", "$HOME", ";true"], project,
                 env=env)
    assert quoted.stdout == "a b|$HOME|;true|"  # words arrive as typed: no shell on the box

    # no playbook anywhere: the host's current run names it
    text = (project / "outrig.yaml").read_text().replace("playbook: hello", "")
    (project / "outrig.yaml").write_text(text)
    again = run(installed, ["deploy", "--dry-run"], project, env=env)
    assert again.returncode == 0, again.stderr
    assert f"playbook hello (the current run on box, {last['run_id']})" in again.stderr


def test_cleanup_of_an_unknown_run_fails_and_stops_nothing(installed: Path,
                                                           project: Path) -> None:
    port = free_port()
    env = {"XDG_STATE_HOME": str(project / "state")}
    done = run(installed, ["deploy", "--param", f"port={port}", "--json"], project, env=env)
    assert done.returncode == 0, done.stderr
    pids = [p["pid"] for p in json.loads(done.stdout.splitlines()[-1])["processes"]]
    for args in (["cleanup", "--run", "nosuch"], ["cleanup", "--run", "nosuch", "--dry-run"]):
        refused = run(installed, args, project, env=env)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "no run nosuch on box" in refused.stderr
        assert "stopped run" not in refused.stdout + refused.stderr
    assert all(alive(pid) for pid in pids)


def test_ssh_uses_the_resolved_host_port_user_and_key(installed: Path, project: Path) -> None:
    host = yaml.safe_load((project / "hosts" / "box.yaml").read_text())
    host["env"]["GREETING"] = "hello from $USER"
    write_host_file(project, "box", **host)
    done = run(installed, ["ssh", "--", "sh", "-c", 'echo "$GREETING"; pwd', "x"], project,
               env={"XDG_STATE_HOME": str(project / "state")})
    assert done.returncode == 0, done.stderr
    user = host.get("user") or os.environ.get("USER", "")
    assert done.stdout.splitlines() == [f"hello from {user}",
                                        str(Path(host["workdir"]).resolve())]
    failed = run(installed, ["ssh", "--", "sh", "-c", "exit 5"], project)
    assert failed.returncode == 5


def _get(url: str) -> int:
    import urllib.request

    with urllib.request.urlopen(url, timeout=60) as answer:
        return int(answer.status)


def test_forward_reaches_the_server_and_survives_a_cut_link(
        installed: Path, project: Path, sandbox: Any, make_proxy: Any, procs: Any) -> None:
    # "far" reaches the box through a proxy that can cut the link; "box" (direct) stays for
    # the teardown's cleanup, which runs after the proxy is closed
    host = yaml.safe_load((project / "hosts" / "box.yaml").read_text())
    proxy = make_proxy(sandbox.port, one_way_delay=0.0)
    host["port"] = proxy.port
    write_host_file(project, "far", **host)
    env = {"XDG_STATE_HOME": str(project / "state"), "OUTRIG_HOST": "far"}
    done = run(installed, ["deploy", "--param", f"port={free_port()}"], project, env=env)
    assert done.returncode == 0, done.stderr
    forwarding = procs.spawn([str(installed / "outrig"), "forward", "--process", "server",
                              "--json"], cwd=project, env=env, stdout=subprocess.PIPE,
                             text=True)
    assert forwarding.stdout is not None
    event = json.loads(forwarding.stdout.readline())
    assert event["event"] == "forwarding" and "process server of run hello-" in event["what"]
    # the server listens on this machine (the sandbox is here), so its port is taken here:
    # the forward says it moved (it gave another URL without a word)
    remote_port = int(event["remote"].rsplit(":", 1)[1])
    assert event["local_port"] != remote_port
    assert event["local_port_moved_from"] == remote_port, event
    assert _get(event["url"]) == 200
    assert proxy.cut_all() >= 1  # the SSH connection under the forward is gone
    assert _get(event["url"]) == 200  # the next connection reconnected first
    assert proxy.connections >= 1
    forwarding.send_signal(signal.SIGINT)
    assert forwarding.wait(timeout=30) == 130  # Ctrl-C, as in every task
    plain = procs.spawn([str(installed / "outrig"), "forward", "--process", "server"],
                        cwd=project, env={**env, "COLUMNS": "200"}, stdout=subprocess.PIPE,
                        text=True)
    assert plain.stdout is not None
    said = plain.stdout.readline()
    assert f"(port {remote_port} is taken on this machine, so the local port is " in said, said
    plain.send_signal(signal.SIGINT)
    assert plain.wait(timeout=30) == 130


SLOW = """\
name: slow
processes:
  first:
    command: python3 -c "{body}"
    gpus: []
    ready: {{log: "never printed", timeout: 600}}
    stop: {{grace: {grace}}}
  second:
    after: first
    command: python3 -c "import time; time.sleep(600)"
    gpus: []
"""
SLEEPER = "import time; print('up', flush=True); time.sleep(600)"
STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('up', flush=True); time.sleep(600)")


def _deploy_until_launched(installed: Path, project: Path, procs: Any, body: str,
                           grace: int) -> tuple[subprocess.Popen[str], int]:
    """``outrig deploy --playbook slow`` in the background, once ``first`` is launched (and
    ``second`` waits for it to be ready, which it never is)."""
    (project / "playbooks" / "slow.yaml").write_text(SLOW.format(body=body, grace=grace))
    deploying = procs.spawn([str(installed / "outrig"), "deploy", "--playbook", "slow",
                             "--json"], cwd=project, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={"XDG_STATE_HOME": str(project / "state")})
    assert deploying.stdout is not None
    for line in deploying.stdout:
        event = json.loads(line)
        assert event.get("process") != "second", event
        if event.get("event") == "launched":
            assert event["process"] == "first"
            return deploying, int(event["pid"])
    raise AssertionError(f"deploy ended before launching: {deploying.communicate()}")


def test_ctrl_c_during_deploy_stops_what_it_launched_and_frees_the_lock(
        installed: Path, project: Path, procs: Any) -> None:
    deploying, pid = _deploy_until_launched(installed, project, procs, SLEEPER, 5)
    deploying.send_signal(signal.SIGINT)
    out, err = deploying.communicate(timeout=120)
    assert deploying.returncode == 130, err
    assert f"had launched (first (pid {pid}))" in err and "workdir is unlocked" in err
    assert '"process": "second"' not in out  # the after: process was never launched
    assert wait_gone([pid]) == []
    # nothing holds the workdir lock: an immediate cleanup runs (and finds nothing left)
    env = {"XDG_STATE_HOME": str(project / "state")}
    done = run(installed, ["cleanup", "--playbook", "slow"], project, env=env)
    assert done.returncode == 0, done.stderr


def test_second_ctrl_c_leaves_and_says_what_keeps_running(installed: Path, project: Path,
                                                          procs: Any) -> None:
    deploying, pid = _deploy_until_launched(installed, project, procs, STUBBORN, 30)
    deploying.send_signal(signal.SIGINT)
    assert deploying.stderr is not None
    # a bound on the read: a deploy that never reacts to Ctrl-C fails the test, not the run
    watchdog = threading.Timer(300, deploying.kill)
    watchdog.start()
    try:
        for line in deploying.stderr:
            if "the box is stopping what this deploy launched" in line:
                break
    finally:
        watchdog.cancel()
    assert deploying.poll() is None, "deploy ended (or was killed) before the first notice"
    deploying.send_signal(signal.SIGINT)
    _, err = deploying.communicate(timeout=120)
    assert deploying.returncode == 130, err
    assert "interrupted twice" in err and f"first (pid {pid})" in err
    assert "outrig cleanup --host box --run slow-" in err
    assert wait_gone([pid], timeout=120) == []  # the box finished stopping it on its own
