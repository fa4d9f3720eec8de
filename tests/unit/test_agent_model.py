"""The agent's recipe support: the ``model_facts`` op and ``ready.model`` (served id check).

Runs the agent (remote/agent/) as a subprocess exactly like tests/unit/test_agent_local.py (whose
``Box`` harness and teardown by recorded pid this reuses), against real files and the vLLM
stand-in.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent import PY, Box, error_of
from tests.support.network import free_port
from tests.support.processes import alive
from tests.support.runs import standin_path


def write_model(root: Path, *, layers: int | None = 36, vlm: bool = False,
                index_total: int | None = None, shards: dict[str, int] | None = None) -> Path:
    root.mkdir(parents=True)
    config: dict[str, Any] = {"model_type": "qwen3"}
    if layers is not None:
        config.update({"text_config": {"num_hidden_layers": layers}} if vlm
                      else {"num_hidden_layers": layers})
    (root / "config.json").write_text(json.dumps(config))
    if index_total is not None:
        (root / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": index_total}, "weight_map": {}}))
    for name, size in (shards or {}).items():
        (root / name).write_bytes(b"\0" * size)
    return root


def test_model_facts_reads_layers_and_size(box: Box, tmp_path: Path) -> None:
    plain = write_model(tmp_path / "m1", layers=36, index_total=16_400_000_000)
    vlm = write_model(tmp_path / "m2", layers=64, vlm=True,
                      shards={"a.safetensors": 1000, "b.safetensors": 24, "x.bin": 7})
    bare = write_model(tmp_path / "m3", layers=None)
    missing = str(tmp_path / "nope")
    events, result = box.agent({"op": "model_facts",
                                "models": [str(plain), str(vlm), str(bare), missing]})
    assert result["ok"] is True, result
    assert any(ev["event"] == "facts" for ev in events)  # GPU facts come along for free
    got = {r["model"]: r for r in result["models"]}
    assert got[str(plain)]["exists"] is True
    assert got[str(plain)]["num_hidden_layers"] == 36
    assert got[str(plain)]["weight_bytes"] == 16_400_000_000
    assert got[str(vlm)]["num_hidden_layers"] == 64  # text_config for VLMs
    assert got[str(vlm)]["weight_bytes"] == 1024  # sum of *.safetensors without an index
    assert got[str(bare)]["num_hidden_layers"] is None
    assert "config.json has no num_hidden_layers" in got[str(bare)]["problems"]
    assert got[missing]["exists"] is False and got[missing]["num_hidden_layers"] is None
    assert not (box.workdir / ".outrig").exists(), "model_facts must not write anything"


def test_model_facts_finds_a_hub_id_in_the_hf_cache(box: Box, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "hub"
    snap = cache / "models--Qwen--Qwen3-8B" / "snapshots" / "abc123"
    write_model(snap, layers=36, index_total=16_000)
    (cache / "models--Qwen--Qwen3-8B" / "refs").mkdir()
    (cache / "models--Qwen--Qwen3-8B" / "refs" / "main").write_text("abc123")
    _, result = box.agent({"op": "model_facts", "models": ["Qwen/Qwen3-8B", "Org/absent"],
                           "env": {"HF_HUB_CACHE": str(cache)}})
    got = {r["model"]: r for r in result["models"]}
    assert got["Qwen/Qwen3-8B"]["path"] == str(snap)
    assert got["Qwen/Qwen3-8B"]["num_hidden_layers"] == 36
    assert got["Org/absent"]["exists"] is False


def test_model_facts_needs_models(box: Box) -> None:
    _, result = box.agent({"op": "model_facts", "models": []})
    assert "models" in error_of(result, "bad_request")["message"]


def unique_run() -> str:
    """A run id nobody else uses: the marker sweep of a concurrently running test's cleanup
    (``OUTRIG_RUN=r1`` is the harness default) must never match our processes."""
    return f"model-{uuid.uuid4().hex[:12]}"


def vllm_proc(port: int, expected: str, *extra: str) -> dict[str, Any]:
    return {
        "name": "server",
        "argv": [PY, str(standin_path("fake_vllm")), "serve", "/models/m", "--port", str(port),
                 "--fake-startup-delay", "0.3", *extra],
        "ready": {"http": f"http://127.0.0.1:{port}/health", "model": expected, "timeout": 20},
        "stop_grace": 3,
    }


def test_ready_model_waits_for_the_expected_served_id(box: Box, tmp_path: Path) -> None:
    port = free_port()
    events, result = box.deploy([vllm_proc(port, "/models/m")], run_id=unique_run(),
                                env={"OUTRIG_FAKE_GPU_DIR": str(tmp_path / "nogpu")})
    assert result["ok"] is True, result
    ready = [ev for ev in events if ev["event"] == "ready"]
    assert ready and ready[0]["via"] == "http"
    assert result["processes"][0]["ready"]["model"] == "/models/m"
    assert alive(result["processes"][0]["pid"])


def test_ready_model_mismatch_fails_at_once_and_stops_the_server(box: Box) -> None:
    port = free_port()
    run_id = unique_run()
    events, result = box.deploy([vllm_proc(port, "/models/m", "--served-model-name", "other")],
                                run_id=run_id)
    err = error_of(result, "model_mismatch")
    assert "serves model id 'other'" in err["message"] and "'/models/m' is expected" in err[
        "message"]
    assert "--served-model-name" in err["message"]
    pid = next(ev["pid"] for ev in events if ev["event"] == "launched")
    assert not alive(pid), "a failed deploy stops what it launched"
    assert box.run_json(run_id)["status"] == "failed"


def test_ready_model_without_http_is_a_bad_request(box: Box) -> None:
    proc = {"name": "a", "argv": [PY, "-c", "pass"], "ready": {"model": "x", "exit": True}}
    _, result = box.deploy([proc], run_id=unique_run())
    assert "model: needs http" in error_of(result, "bad_request")["message"]

