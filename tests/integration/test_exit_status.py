"""The exit statuses of docs/cli.md ("Exit status"), one test per row, through the real sshd:
2 for every bad input (nothing started or stopped), 130 for Ctrl-C in every task (a follow
too), 0 and 1 as the commands' own tests show them. 141 (a closed pipe) and a flag without
its value need no box: tests/unit/test_cli.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import deployed, outrig
from tests.support.network import free_port
from tests.support.processes import alive

pytestmark = pytest.mark.integration
OUTRIG = Path(sys.executable).parent / "outrig"
BEATS = ("import time\nfor i in range(3000):\n    print('beat', i, flush=True)\n"
         "    time.sleep(0.2)\n")


@pytest.fixture
def project(box_project: Path, box_host: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The sandbox as ``--host sandbox``, with two playbooks of one beating process each;
    the current folder is the project."""
    for name in ("beats", "other"):
        (box_project / "playbooks" / f"{name}.yaml").write_text(yaml.safe_dump({
            "name": name, "processes": {"beat": {
                "command": [sys.executable, "-u", "-c", BEATS], "gpus": [],
                "ready": {"log": "beat 0", "timeout": 60}}}}))
    monkeypatch.chdir(box_project)
    for var in ("OUTRIG_HOST", "OUTRIG_PLAYBOOK", "OUTRIG_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    assert box_host.stem == "sandbox"
    return box_project


def test_every_bad_input_exits_2_and_stops_nothing(project: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Today's offenders (1 before): a run id the box does not have, a process the run does
    not have, two current runs where one was meant; and cleanup's, which was 2 already."""
    first = deployed("beats", capsys)
    pids = [p["pid"] for p in first["processes"]]
    refused = {
        ("status", "--host", "sandbox", "--run", "nosuch"): "no run nosuch",
        ("tail-logs", "--host", "sandbox", "--process", "nosuch", "--no-follow"):
            "has no process nosuch (it has beat)",
        ("cleanup", "--host", "sandbox", "--run", "nosuch"): "no run nosuch on sandbox",
    }
    for args, words in refused.items():
        code, out, err = outrig(list(args), capsys)
        assert code == 2, (args, out, err)
        assert words in err and "Traceback" not in err, (args, err)
    deployed("other", capsys)  # now two playbooks have a current run on the box
    code, _, err = outrig(["tail-logs", "--host", "sandbox", "--no-follow"], capsys)
    assert code == 2, err
    assert "beats" in err and "other" in err and "several" in err, err
    assert all(alive(pid) for pid in pids), "a refused command stopped something"


def interrupted(procs: Any, project: Path, args: list[str]) -> tuple[int, str, str]:
    """``outrig ARGS`` in the background until its first line on stdout, then Ctrl-C."""
    proc = procs.spawn([str(OUTRIG), *args], cwd=project, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first, proc.communicate(timeout=60)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, first + out, err


def test_ctrl_c_exits_130_in_the_tasks_that_run_until_it(project: Path, procs: Any,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """tail-logs (a follow) exited 0 on Ctrl-C, forward too; now 130 as every task, with a
    note of what stopped (not an error) and what goes on."""
    pid = deployed("beats", capsys)["processes"][0]["pid"]
    code, out, err = interrupted(procs, project, ["tail-logs", "--host", "sandbox"])
    assert code == 130, err
    assert out.startswith("beat | beat ") and "Traceback" not in err
    assert "tail-logs stopped (Ctrl-C)" in err and "error:" not in err
    code, out, err = interrupted(procs, project, ["forward", "--host", "sandbox",
                                                  "--remote-port", str(free_port()),
                                                  "--json"])
    assert code == 130, err
    assert json.loads(out.splitlines()[0])["event"] == "forwarding"
    assert "forward stopped (Ctrl-C)" in err and "Traceback" not in err
    assert alive(pid), "the run on the box goes on"


def test_ctrl_c_ends_a_follow_of_several_hosts_with_130(
        project: Path, host_b: Path, procs: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The first Ctrl-C ends every host's follow (their rows then come); it exited 0."""
    code, _, err = outrig(["deploy", "--host", "sandbox,b", "--playbook", "beats"], capsys)
    try:
        assert code == 0, err
        code, out, err = interrupted(procs, project, ["tail-logs", "--host", "sandbox,b"])
        assert code == 130, err
        assert " | beat | beat " in out and "tail-logs stopped (Ctrl-C)" in err
        assert "Traceback" not in err
    finally:
        outrig(["cleanup", "--host", "b", "--all"], capsys)
