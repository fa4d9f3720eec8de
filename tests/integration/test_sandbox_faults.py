"""``sandbox-hang`` and ``sandbox-down --crash`` through the installed ``outrig``: the runs'
processes stop (state T) and go on again; a crash kills the sshd, the server and every process
of the box's runs at once and keeps the host file, so the box looks dead, not gone; bad input
is exit 2 with nothing touched."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.processes import alive, marked, wait_gone

pytestmark = pytest.mark.integration


def outrig_cli(args: list[str], cwd: Path,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The installed ``outrig`` of this environment, as a separate process."""
    binary = Path(sys.executable).parent / "outrig"
    return subprocess.run([str(binary), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """A project with a two-process playbook (one forks a child in its group); whatever
    sandbox-up recorded is stopped afterwards."""
    from outrig.console import Reporter
    from outrig.errors import ConfigError
    from outrig.ops.sandbox import sandbox_down
    from outrig.sandbox.faults import hang
    from outrig.session import Project

    root = tmp_path / "proj"
    (root / "hosts").mkdir(parents=True)
    (root / "playbooks").mkdir()
    ticker = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
              "while True:\n    print('tick', flush=True)\n    time.sleep(0.2)\n")
    (root / "playbooks" / "tick.yaml").write_text(yaml.safe_dump({
        "name": "tick", "hang": {"confirmations": 2, "interval": 0.5},
        "processes": {"ticker": {"command": [sys.executable, "-c", ticker], "gpus": [],
                                 "stop": {"grace": 30}},
                      "sleeper": {"command": [sys.executable, "-c",
                                              "import time; time.sleep(600)"],
                                  "gpus": [], "stop": {"grace": 30}}}}))
    yield root
    with contextlib.suppress(ConfigError):  # not up: crashed, or never started
        hang("sandbox", resume=True)  # a stopped run ends on SIGTERM only once it goes on
    sandbox_down(Project(root), "sandbox", Reporter(quiet=True))


def proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0].decode()


def deploy_tick(project: Path) -> tuple[str, list[int]]:
    deployed = outrig_cli(["deploy", "--host", "sandbox", "--playbook", "tick", "--json"],
                          project)
    assert deployed.returncode == 0, deployed.stderr
    run_id = json.loads(deployed.stdout.splitlines()[-1])["run_id"]
    pids = marked(run_id)
    assert len(pids) >= 4, pids  # two wrappers, two programs, the ticker's child
    return run_id, pids


def test_sandbox_hang_stops_the_runs_and_status_calls_it_hung(project: Path) -> None:
    up = outrig_cli(["sandbox-up", "--json"], project)
    assert up.returncode == 0, up.stderr
    run_id, pids = deploy_tick(project)

    stopped = outrig_cli(["sandbox-hang"], project)
    assert stopped.returncode == 0, stopped.stderr
    assert f"runs {run_id}" in " ".join(stopped.stderr.split())
    assert {proc_state(pid) for pid in pids} == {"T"}, "every process of the run is stopped"
    seen = []
    for _ in range(20):
        answer = outrig_cli(["status", "--host", "sandbox", "--playbook", "tick", "--json"],
                            project)
        assert answer.returncode == 0, answer.stderr
        ticker = next(p for p in json.loads(answer.stdout)["runs"][0]["processes"]
                      if p["name"] == "ticker")
        seen.append(ticker["hung"]["evidence"][0]["confirmations"])
        if ticker["hung"]["hung"]:
            break
    assert ticker["hung"]["hung"] and ticker["hung"]["signal"] == "stopped", ticker["hung"]
    assert seen[0] == 1 and seen[-1] == 2, seen
    shown = outrig_cli(["status", "--host", "sandbox", "--playbook", "tick"], project)
    said = " ".join(shown.stdout.split())
    assert "hung" in said and "every process of its tree is stopped" in said, shown.stdout

    resumed = outrig_cli(["sandbox-hang", "--resume"], project)
    assert resumed.returncode == 0, resumed.stderr
    assert "T" not in {proc_state(pid) for pid in pids}
    answer = outrig_cli(["status", "--host", "sandbox", "--playbook", "tick", "--json"],
                        project)
    ticker = next(p for p in json.loads(answer.stdout)["runs"][0]["processes"]
                  if p["name"] == "ticker")
    assert "hung" not in ticker, "going on again: no signal holds"


def test_sandbox_down_crash_kills_everything_at_once_and_keeps_the_host_file(
        project: Path) -> None:
    up = outrig_cli(["sandbox-up", "--delay", "20", "--json"], project)
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout)
    server, sshd = state["server"]["pid"], state["sshd"]["pid"]
    run_id, pids = deploy_tick(project)
    host_file = project / "hosts" / "sandbox.yaml"

    refused = outrig_cli(["sandbox-down", "--crash", "--keep-runs"], project)
    assert refused.returncode == 2 and "--keep-runs" in refused.stderr
    assert alive(server) and all(alive(pid) for pid in pids), "nothing touched"

    crashed = outrig_cli(["sandbox-down", "--crash", "--json"], project)
    assert crashed.returncode == 0, crashed.stderr
    report = json.loads(crashed.stdout)
    assert report["runs"] == [run_id] and server in report["killed"]
    assert wait_gone([server, sshd, *pids]) == []
    assert marked(run_id) == [], "the ticker's child went with its group"
    assert host_file.exists(), "a dead box's host file stays"
    looked = outrig_cli(["status", "--host", "sandbox"], project, timeout=180)
    assert looked.returncode == 1, (looked.stdout, looked.stderr)

    again = outrig_cli(["sandbox-hang"], project)
    assert again.returncode == 2 and "sandbox-up" in again.stderr, again.stderr
    down = outrig_cli(["sandbox-down"], project)
    assert down.returncode == 0, down.stderr
    assert not host_file.exists()


def test_a_stopped_run_ends_on_sigterm_within_its_grace_not_killed_after_it(
        project: Path) -> None:
    """cleanup (and the redeploy of a watch's restart) sends SIGCONT after SIGTERM: a run
    stopped by SIGSTOP acts on the TERM (a trainer saves) instead of waiting out its grace to
    be SIGKILLed."""
    up = outrig_cli(["sandbox-up", "--json"], project)
    assert up.returncode == 0, up.stderr
    _, pids = deploy_tick(project)
    assert outrig_cli(["sandbox-hang"], project).returncode == 0
    assert {proc_state(pid) for pid in pids} == {"T"}
    stopped = outrig_cli(["cleanup", "--host", "sandbox", "--playbook", "tick", "--json"],
                         project)
    assert stopped.returncode == 0, stopped.stderr
    ended = [json.loads(line) for line in stopped.stdout.splitlines()
             if line.startswith("{") and '"event": "stopped"' in line]
    hows = {e["process"]: e["how"] for e in ended}
    assert hows["sleeper"] == "term", ended  # the ticker's orphaned child is killed after
    assert all(e["seconds"] < 30 for e in ended), ended
    assert wait_gone(pids) == []


def test_sandbox_up_after_its_server_died_keeps_the_runs_that_still_live(
        project: Path) -> None:
    """`sandbox-up` after the sandbox's server and sshd died (killed, not stopped) wiped the
    box's workdir, run records included, under the runs' processes, which went on with
    nothing that named them. Live runs now keep their box: it is served again, and the runs
    are found and stopped as before."""
    import os
    import signal

    up = outrig_cli(["sandbox-up", "--json"], project)
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout)
    run_id, pids = deploy_tick(project)
    for entry in (state["server"], state["sshd"]):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(entry["pgid"], signal.SIGKILL)
    assert wait_gone([state["server"]["pid"], state["sshd"]["pid"]]) == []
    assert all(alive(pid) for pid in pids)

    again = outrig_cli(["sandbox-up", "--json"], project)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["server"]["pid"] != state["server"]["pid"]
    found = outrig_cli(["status", "--host", "sandbox", "--json"], project)
    assert found.returncode == 0, found.stderr
    (run,) = json.loads(found.stdout)["runs"]
    assert run["run_id"] == run_id
    assert {p["state"] for p in run["processes"]} == {"running"}
    down = outrig_cli(["sandbox-down"], project)
    assert down.returncode == 0, down.stderr
    assert wait_gone(pids) == [] and marked(run_id) == []
