"""``outrig`` run in the test's own process, the way the installed command runs: the same
Program over a fresh collection, its exit status, stdout and stderr (captured by pytest)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from outrig.cli import make_collection
from outrig.cli.invoke_program import OutrigConfig, OutrigProgram


def outrig(args: list[str], capsys: pytest.CaptureFixture[str],
           version: str = "test") -> tuple[int, str, str]:
    """``outrig ARGS`` in this process, parsed by Invoke's program (not answered by the
    launcher): exit status, stdout, stderr."""
    program = OutrigProgram(name="outrig", binary="outrig", binary_names=["outrig"],
                            namespace=make_collection(), version=version,
                            config_class=OutrigConfig)
    code = 0
    try:
        program.run(["outrig", *args])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def deployed(playbook: str, capsys: pytest.CaptureFixture[str],
             host: str = "sandbox") -> dict[str, Any]:
    """``outrig deploy --host HOST --playbook PLAYBOOK --json``, which must succeed: its
    closing document (run id, processes with their pids)."""
    code, out, err = outrig(["deploy", "--host", host, "--playbook", playbook, "--json"],
                            capsys)
    assert code == 0, err
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result
