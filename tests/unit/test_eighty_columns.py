"""80 columns everywhere (COLUMNS=80): the planner's problem bullets, the ``connections``
table, the process tree of ``status``, a ``python -c`` program in the plan, and Ctrl-C while
a spinner is drawn. Each was wider than 80, cut a word or left something drawn (issue 41)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.cli.starter import PLAYBOOK_YAML
from outrig.text.layout import command_lines, status_lines
from tests.support.cli import outrig
from tests.support.hosts import write_host_file
from tests.support.terminal import on_a_terminal as run_on_a_terminal

WIDTH = 80


def too_wide(lines: list[str]) -> list[str]:
    """Lines past 80 columns that could have been broken (a single long word may run on)."""
    return [line for line in lines if len(line) > WIDTH and " " in line.strip()]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with a local host; the current folder; COLUMNS=80."""
    root = tmp_path / "proj"
    (root / "hosts").mkdir(parents=True)
    write_host_file(root, "one", hostname="local", workdir=str(tmp_path / "w"), gpus=8)
    (root / "playbooks").mkdir()
    monkeypatch.chdir(root)
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    for var in ("OUTRIG_HOST", "OUTRIG_PLAYBOOK", "OUTRIG_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    return root


def test_plan_problems_wrap_at_words_under_their_bullet(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "playbooks" / "serve.yaml").write_text(textwrap.dedent("""\
        processes:
          server:
            command: vllm serve Qwen/Qwen3-8B --tensor-parallel-size 2 --data-parallel-size 2
            gpus: [0, 1]
          other:
            command: echo
            gpus: [1]
        """))
    code, out, err = outrig(["plan", "--host", "one", "--playbook", "serve"], capsys)
    assert code == 2 and out == "", err
    lines = err.splitlines()
    assert too_wide(lines) == [], err
    assert lines[0] == "error: the plan for serve on one has 2 problems; nothing was sent:"
    bullets = [i for i, line in enumerate(lines) if line.startswith("  - ")]
    assert len(bullets) == 2, err
    for line in lines[1:]:  # a bullet, or its continuation under the bullet's first word
        assert line.startswith(("  - ", "    ")) and not line.startswith("     "), line
    said = " ".join(lines[bullets[1]:]).split()  # after the shared GPU
    assert " ".join(said) == (
        "- playbooks/serve.yaml:3: processes.server.command: vLLM's --tensor-parallel-size 2 "
        "× --data-parallel-size 2 = 4 GPU(s), but server has 2 GPU(s) [0, 1]; vLLM would die "
        "minutes in with 'DP adjusted local rank N is out of bounds' or 'invalid device "
        "ordinal'. Give it 4 GPU(s) in gpus:, or change the flags so that tensor × pipeline "
        "× data = 2")


def keeper(name: str, live: dict[str, Any] | None) -> dict[str, Any]:
    return {"host": f"ubuntu@gpu-{name}.example.net:22", "name": name, "pid": 4194301,
            "age": 3725.0, "idle_left": 599.0, "live": live}


def test_connections_fit_80_columns(project: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    import outrig.connectors.keeper.connections as kept

    found = [keeper("uk-node-h200", {"state": "ready", "pid": 31337, "served": 12}),
             keeper("b", {"state": "failed", "why": "the box refused it a session channel "
                          "(its sshd may limit sessions per connection: MaxSessions)"}),
             keeper("c", None)]
    monkeypatch.setattr(kept, "keepers", lambda: found)
    code, out, err = outrig(["connections"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert too_wide(lines) == [], out
    assert lines[0].split() == ["NAME", "HOST", "PID", "AGE", "IDLE", "LEFT"]
    assert lines[1].split() == ["uk-node-h200", "ubuntu@gpu-uk-node-h200.example.net:22",
                                "4194301", "3725s", "599s"]
    text = " ".join(out.split())
    assert "live agent: ready, box pid 31337, 12 calls served" in text
    assert ("live agent: off: the box refused it a session channel (its sshd may limit "
            "sessions per connection: MaxSessions) (calls take the exec path)") in text
    assert "live agent: none yet (starts with the first agent call)" in text


def test_connections_keep_one_row_each_when_there_is_room(
        project: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import outrig.connectors.keeper.connections as kept

    monkeypatch.setattr(kept, "keepers", lambda: [
        {"host": "root@10.0.0.2:22", "name": "a", "pid": 7, "age": 3.0, "idle_left": 597.0,
         "live": {"state": "starting"}}])
    code, out, err = outrig(["connections"], capsys)
    assert code == 0, err
    assert out.splitlines() == ["NAME  HOST              PID  AGE  IDLE LEFT  LIVE AGENT",
                                "a     root@10.0.0.2:22  7    3s   597s       starting"]


def test_status_tree_shortens_the_command_and_keeps_its_proof() -> None:
    """`status --lines 0` of a vLLM server: its long command line cut `(group)` off."""
    command = ("/workspace/venvs/vllm/bin/python -m vllm.entrypoints.cli.main serve "
               "/workspace/dflash/models/Qwen3.6-27B --speculative_config " + "x" * 200)
    result = {"runs": [{"run_id": "r-1", "playbook": "p", "status": "running", "processes": [
        {"name": "server", "state": "running", "pid": 10, "uptime": 5.0, "ready": True,
         "gpus_held": [0, 1], "tree": [
             {"pid": 11, "cmdline": command, "proof": "group"},
             {"pid": 12, "cmdline": "VLLM::EngineCore", "proof": "marker"}]}]}]}
    lines = status_lines(result, WIDTH)
    assert too_wide(lines) == []
    tree = " ".join(line.strip() for line in lines if "└" in line or line.startswith(" " * 8))
    assert "└ 11 /workspace/venvs/vllm/bin/python -m vllm.entrypoints.cli.main serve" in tree
    assert "… (group)" in tree and "└ 12 VLLM::EngineCore (marker)" in tree


def test_a_python_c_program_reads_as_typed() -> None:
    """The starter's worker: one word a line with '"'"' for each quote, wider than 80."""
    worker = yaml.safe_load(PLAYBOOK_YAML)["processes"]["worker"]["command"]
    argv = worker.replace("${beats}", "600").split(" ", 3)
    assert argv[:3] == ["python3", "-u", "-c"]
    argv[3] = argv[3].strip('"')
    lines = command_lines(argv, WIDTH)
    assert too_wide(lines) == [] and not any("'\"'\"'" in line for line in lines)
    assert lines[0] == "    python3 -u -c"
    assert lines[1].startswith('        "import time; [print(\'beat\', i, flush=True)')
    assert all(line.startswith("         ") for line in lines[2:])
    assert " ".join(line.strip() for line in lines[1:]) == f'"{argv[3]}"'


def test_a_short_c_program_stays_on_the_commands_line() -> None:
    assert command_lines(["python3", "-c", "print('hi')"], WIDTH) == \
        ["    python3 -c \"print('hi')\""]
    assert command_lines(["sh", "-c", "echo $HOME 'x'"], WIDTH) == \
        ["    sh -c 'echo $HOME '\"'\"'x'\"'\"''"]  # $ expands in "": shlex's quoting


SPINNER_CHILD = """\
import sys, time
from outrig.cli.flags import friendly
from outrig.console import Reporter

@friendly
def task():
    reporter = Reporter()
    reporter.live("fha run-1: running · the box answered 1s ago")
    time.sleep(1.0)  # frames drawn
    raise KeyboardInterrupt

try:
    task()
except BaseException as exc:  # invoke's Exit
    sys.exit(getattr(exc, "code", 1))
"""


def on_a_terminal(code: str) -> tuple[int, bytes]:
    """``python -c code`` with a pseudo-terminal of 80 columns: its status and output."""
    return run_on_a_terminal([sys.executable, "-c", code], env={"COLUMNS": str(WIDTH)})


def test_ctrl_c_erases_the_spinner_before_its_message() -> None:
    code, output = on_a_terminal(SPINNER_CHILD)
    assert code == 130, output
    said = output.index(b"interrupted: anything already launched")
    before, after = output[:said], output[said:]
    assert "⠋".encode() in before, output  # a frame was drawn
    assert b"\x1b[?25h" in before, output  # the spinner stopped: the cursor shown again
    stopped = before.rindex(b"\x1b[?25h")
    assert b"\x1b[2K" in before[stopped:], output  # and its line erased, then the message
    assert b"fha run-1" not in after, output  # no frame drawn after (or over) the message
    assert b"\x1b[?25l" not in after, output
