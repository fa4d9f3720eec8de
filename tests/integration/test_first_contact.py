"""What a new user sees on the first contacts with a box (through the real sshd): the host
named in messages as they typed it, one `check --json` document, and `ssh -- CMD` printing
the command's output and nothing of OpenSSH's own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from outrig.sandbox.box import SandboxBox
from tests.support.cli import outrig
from tests.support.network import free_port
from tests.support.terminal import on_a_terminal as run_on_a_terminal

pytestmark = pytest.mark.integration
OUTRIG = Path(sys.executable).parent / "outrig"


@pytest.fixture
def project(box_project: Path, box_host: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The sandbox as ``--host sandbox``; the current folder is the project."""
    assert box_host.stem == "sandbox"
    monkeypatch.chdir(box_project)
    monkeypatch.delenv("OUTRIG_PROJECT", raising=False)
    return box_project


def test_errors_name_the_host_as_typed_then_its_address(
        project: Path, sandbox: SandboxBox, capsys: pytest.CaptureFixture[str]) -> None:
    """`status --host sandbox --run nosuch` said `status on root@127.0.0.1:44259: ...`."""
    code, _, err = outrig(["status", "--host", "sandbox", "--run", "nosuch"], capsys)
    assert code == 2, err
    assert "status on sandbox (" in err, err
    assert f"127.0.0.1:{sandbox.port}): no run nosuch" in err, err


def test_check_json_is_one_document_with_the_facts(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It printed the agent's facts event, then the result: two documents for one host."""
    code, out, err = outrig(["check", "--host", "sandbox", "--json"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 1, out
    doc = json.loads(lines[0])
    assert doc["workdir_writable"] is True and doc["rtt"] > 0
    assert len(doc["facts"]["gpus"]) == 8 and doc["facts"]["hostname"]


def on_a_terminal(argv: list[str], cwd: Path) -> tuple[int, str]:
    """``argv`` on a pseudo-terminal: its exit status and everything it wrote, as text."""
    code, output = run_on_a_terminal(argv, cwd=cwd)
    return code, output.decode("utf-8", "replace")


def test_ssh_with_a_command_on_a_terminal_prints_only_the_commands_output(
        project: Path) -> None:
    """On a terminal the client gets -t, and OpenSSH then ends with `Connection to
    127.0.0.1 closed.` after the command's own output, unless told -q."""
    code, text = on_a_terminal([str(OUTRIG), "ssh", "--host", "sandbox", "--", "sh", "-c",
                                "test -t 1 && echo on-a-terminal; exit 3"], project)
    assert code == 3, text
    assert "on-a-terminal" in text, text  # -t: the command had a terminal
    assert "Connection to" not in text and "closed." not in text, text


def test_ssh_with_a_command_still_says_why_it_could_not_connect(
        project: Path, box_host: Path) -> None:
    """Quieting the client must not hide its errors (`-q` would): a refused connection is
    said, with ssh's exit status 255."""
    config = yaml.safe_load(box_host.read_text())
    config["port"] = free_port()  # nothing listens there
    box_host.with_name("far.yaml").write_text(yaml.safe_dump(config))
    code, text = on_a_terminal([str(OUTRIG), "ssh", "--host", "far", "--", "true"], project)
    assert code == 255, text
    assert "Connection refused" in text, text
