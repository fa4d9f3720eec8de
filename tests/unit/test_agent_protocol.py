"""One protocol for both sides (remote/agent/protocol.py): the agent's table of ops is the
protocol's, requests are checked on the workstation before they leave, the doc covers every
op, and the agent package stays standard library only and Python 3.8 syntax."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from outrig._box.agent import protocol
from outrig._box.agent.__main__ import OPS, op_function
from outrig.agent.client import AGENT_DIR
from outrig.errors import RemoteError
from outrig.inventory import Host
from outrig.session import base_request
from tests.support.agent import Box

DOC = Path(__file__).resolve().parents[2] / "docs" / "agent-protocol.md"
HOST = Host(name="box", hostname="box.example", workdir="~/outrig", env={"A": "1"})


def test_the_agent_runs_exactly_the_protocols_ops() -> None:
    assert tuple(OPS) == protocol.OPS
    assert all(callable(op_function(op)) for op in OPS)
    assert all(op_function(op).__name__ == f"op_{op}" for op in OPS)


def test_a_wrong_field_is_refused_on_the_workstation() -> None:
    with pytest.raises(RemoteError) as misspelt:
        base_request(HOST, "status", log_line=5)
    assert misspelt.value.kind == protocol.BAD_REQUEST
    assert "log_line: not a field of op status" in str(misspelt.value)
    with pytest.raises(RemoteError) as mistyped:
        base_request(HOST, "cleanup", all="yes")
    assert "all: must be bool, not str" in str(mistyped.value)
    with pytest.raises(RemoteError) as missing:
        base_request(HOST, "checkpoints")
    assert "save_path: required by op checkpoints" in str(missing.value)
    with pytest.raises(RemoteError, match="op: must be one of deploy, cleanup"):
        base_request(HOST, "explode")


def test_a_right_request_passes_with_the_common_fields() -> None:
    request = base_request(HOST, "follow", run_id="r1", playbook=None, processes=["a"],
                           cursors={}, lines=None, heartbeat=2, compress=True,
                           host_label="box")
    assert request["v"] == protocol.PROTOCOL_VERSION
    assert (request["op"], request["workdir"], request["env"]) == ("follow", "~/outrig",
                                                                   {"A": "1"})
    assert protocol.request_problems(request) == []


def test_every_op_has_a_section_in_the_doc_and_the_doc_names_no_other() -> None:
    text = DOC.read_text()
    headed = {op for line in text.splitlines() if line.startswith("#")
              for op in re.findall(r'`op: "([a-z_]+)"`', line)}
    named = set(re.findall(r'op: "([a-z_]+)"', text))
    assert headed == set(protocol.OPS), sorted(set(protocol.OPS) ^ headed)
    assert named <= set(protocol.OPS), sorted(named - set(protocol.OPS))


def test_the_doc_lists_every_error_kind() -> None:
    text = DOC.read_text()
    assert [k for k in protocol.ERROR_KINDS if f"`{k}`" not in text] == []


@pytest.mark.parametrize("path", sorted(AGENT_DIR.glob("*.py")), ids=lambda p: p.name)
def test_the_agent_is_stdlib_only_and_python_3_8(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path), feature_version=(3, 8))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    assert roots - allowed == set(), f"{path.name} imports {sorted(roots - allowed)}"


def test_simple_results_have_the_fields_the_protocol_names(box: Box, tmp_path: Path) -> None:
    box.workdir.mkdir()
    requests: dict[str, dict[str, Any]] = {
        "check": {},
        "model_facts": {"models": [str(tmp_path)], "pythons": []},
        "checkpoints": {"save_path": str(tmp_path / "none")},
        "manifest": {"items": [{"name": "wd", "path": str(box.workdir)}]},
        "mark_staged": {"root": str(tmp_path), "expect": {}},
    }
    assert set(requests) <= set(protocol.RESULTS)
    for op, fields in requests.items():
        _, result = box.agent({"op": op, **fields})
        assert result["ok"] is True, (op, result)
        missing = [name for name in protocol.RESULTS[op] if name not in result]
        assert missing == [], (op, missing, result)
