"""Real CPU vLLM servers that cannot serve, deployed by outrig on the sandbox box: each deploy
fails through the dflash recipe's ``fatal`` patterns on vLLM's own lines, with the log
excerpt, and leaves nothing running (tests/realvllm/README.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from outrig.errors import RemoteError
from outrig.ops.deploy import deploy_on
from outrig.playbook import find_playbook, load_job
from outrig.session import host_session
from tests.realvllm.serving import (
    PROJECT,
    journal_in,
    make_verifier,
    quiet,
    run_json,
    server_playbook,
    workdir_of,
)
from tests.support.processes import alive

pytestmark = pytest.mark.integration
# Small on purpose: both fail long before this (a bound on a stuck start, not a measurement).
FAILING_TIMEOUT_S = 600


def failed_deploy(host: Path, playbook: Path, folder: Path
                  ) -> tuple[RemoteError, list[dict[str, Any]], dict[str, Any]]:
    """Deploy, expect the agent's failure; (error, events, run.json)."""
    with host_session(PROJECT, str(host), quiet(), journal_in(folder)) as session:
        job = load_job(find_playbook(str(playbook), PROJECT.playbooks_dir))
        with pytest.raises(RemoteError) as caught:
            deploy_on(session, job)
        events = list(session.last_events)
    assert [e for e in events if e["event"] == "launched"], events
    name = job.name
    runs = [r for r in (workdir_of(host) / "runs").glob("*/run.json")
            if json.loads(r.read_text()).get("playbook") == name]
    assert len(runs) == 1, runs
    run = run_json(host, runs[0].parent.name)
    return caught.value, events, run


def assert_nothing_left(run: dict[str, Any]) -> None:
    """The failed run is recorded as failed and none of its processes lives on."""
    assert run["status"] == "failed"
    for rec in run["processes"]:
        assert not alive(rec["pid"])
        group = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    rest = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()
                except (OSError, IndexError):
                    continue
                if int(rest[2]) == rec["pid"] and rest[0] not in (b"Z", b"X"):
                    group.append(int(entry.name))
        assert group == [], f"left in the run's group: {group}"


def test_max_model_len_above_the_models_positions_fails_fast_with_vllms_line(
        real_host: Path, vllm_python: str, verifier: Path, tmp_path: Path) -> None:
    playbook = server_playbook(tmp_path, "toolong", vllm_python, verifier, max_model_len=8192,
                               timeout=FAILING_TIMEOUT_S)
    error, events, run = failed_deploy(real_host, playbook, tmp_path)
    assert error.kind == "fatal_log", error
    assert "ready" not in [e["event"] for e in events]
    excerpt = "\n".join(error.excerpt)
    # vllm config/model.py: max_position_embeddings of the verifier is 4096
    assert re.search(r"User-specified max_model_len \(8192\) is greater than the derived "
                     r"max_model_len \(max_position_embeddings=4096", excerpt), excerpt
    assert run["error"]["kind"] == "fatal_log"
    assert_nothing_left(run)


def test_server_that_dies_at_its_first_request_is_not_called_ready(
        real_host: Path, vllm_python: str, tmp_path: Path) -> None:
    """head_dim 16: /health answers 200, then the engine dies at the first request. Only
    ``ready.generate`` (one real request) tells; /health alone would have said ready."""
    model = make_verifier(vllm_python, tmp_path / "hd16", {"head_dim": 16})
    playbook = server_playbook(tmp_path, "hd16", vllm_python, model, timeout=FAILING_TIMEOUT_S)
    error, events, run = failed_deploy(real_host, playbook, tmp_path)
    assert error.kind in ("fatal_log", "not_serving"), error
    assert "ready" not in [e["event"] for e in events]
    log = Path(run["processes"][0]["log"]).read_text(errors="replace")
    health_ok = re.search(r'"GET /health HTTP/1.1" 200', log)
    fatal = re.search(r"EngineCore encountered a fatal error", log)
    assert health_ok and fatal, log[-3000:]
    assert health_ok.start() < fatal.start(), "the engine died after /health had answered 200"
    assert "Unsupported CPU attention configuration: head_dim=16" in log
    excerpt = "\n".join(error.excerpt)
    assert "Unsupported CPU attention configuration" in excerpt or \
        "EngineCore encountered" in excerpt or "EngineDeadError" in excerpt, excerpt
    assert_nothing_left(run)
