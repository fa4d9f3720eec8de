"""How the agent gets onto the box and starts there (remote/agent/bundle.py): one bundle, kept
unpacked by digest inside the workdir, exec'd with a short command line; from memory where the
workdir cannot be written. Run as the transports run it (tests/support/agent.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from outrig._box.agent import bundle
from outrig.agent.client import agent_bundle_bytes, agent_digest
from outrig.sandbox.fulldisk import fill, is_full
from tests.support.agent import PY, R1, Box, agent_command_for, sleeper, wait_until
from tests.support.processes import alive

CMDLINE_MAX = 300  # bytes: python -S and the cache folder's path


def cache_dir(box: Box) -> Path:
    """Where this bundle lives unpacked in the box's workdir."""
    return box.workdir / ".outrig" / "agent" / agent_digest()


def run_with_env(box: Box, request: dict[str, Any], env: dict[str, str]) -> list[dict[str, Any]]:
    """The agent as the transports run it, with ``env`` as its whole environment."""
    request = {"v": 1, "workdir": str(box.workdir), "env": {}, **request}
    argv, stdin = agent_command_for(request)
    done = subprocess.run(argv, input=stdin, capture_output=True, timeout=60, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr.decode()
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def test_the_bundle_is_cached_in_the_workdir_and_nothing_under_home(box: Box,
                                                                    tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    box.workdir.mkdir()
    events = run_with_env(box, {"op": "check"}, env)
    assert events[-1]["ok"] is True, events
    assert (cache_dir(box) / "BUNDLE").is_file()
    assert (cache_dir(box) / "outrig_agent" / "wrap.py").is_file()
    events = run_with_env(box, {"op": "check"}, env)  # the second start execs the folder
    assert events[-1]["ok"] is True, events
    assert list(home.iterdir()) == [], list(home.rglob("*"))


def test_the_cache_holds_compiled_code_even_where_python_writes_none(box: Box) -> None:
    """Container images often set PYTHONDONTWRITEBYTECODE; the unpacker compiles the package
    itself so every later start loads compiled code instead of compiling 30 modules."""
    import sys

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1"}
    box.workdir.mkdir()
    events = run_with_env(box, {"op": "check"}, env)
    assert events[-1]["ok"] is True, events
    tag = sys.implementation.cache_tag
    compiled = {p.name for p in (cache_dir(box) / "outrig_agent" / "__pycache__").iterdir()}
    sources = {p.stem for p in (cache_dir(box) / "outrig_agent").glob("*.py")}
    assert {f"{name}.{tag}.pyc" for name in sources} <= compiled, sorted(compiled)
    events = run_with_env(box, {"op": "check"}, env)  # and the cached folder runs from them
    assert events[-1]["ok"] is True, events


def test_no_workdir_yet_runs_from_memory_and_creates_nothing(box: Box) -> None:
    _, result = box.agent({"op": "status", "playbook": "smoke"})
    assert result["ok"] is False and result["error"]["kind"] == "not_found", result
    assert not box.workdir.exists()


def test_ps_shows_a_short_line_and_no_process_inherits_the_request(box: Box) -> None:
    script = "import os,time; print(sorted(os.environ), flush=True); time.sleep(60)"
    _, result = box.deploy([{"name": "env", "argv": [PY, "-c", script],
                             "ready": {"log": "OUTRIG_RUN"}}])
    assert result["ok"] is True, result
    assert "OUTRIG_REQUEST" not in box.log("env")
    launched = result["processes"][0]["pid"]
    environ = Path(f"/proc/{launched}/environ").read_bytes()
    assert b"OUTRIG_REQUEST" not in environ
    # a long-running op: the follower of that run, started the way SSH starts it
    request = {"v": 1, "op": "follow", "workdir": str(box.workdir), "env": {}, "run_id": R1,
               "follow": True, "heartbeat": 0.5, "lines": 1}
    argv, stdin = agent_command_for(request)
    assert not stdin and sum(map(len, argv)) > 20_000  # the bundle did ride in argv
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["event"] == "run", first
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert len(cmdline) < CMDLINE_MAX, cmdline[:200]
        assert cmdline.split(b"\0")[1:3] == [b"-S", str(cache_dir(box)).encode()]
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def test_a_corrupt_or_cut_cache_is_replaced(box: Box) -> None:
    box.workdir.mkdir()
    _, result = box.agent({"op": "check"})
    assert result["ok"] is True, result
    module = cache_dir(box) / "outrig_agent" / "status.py"
    whole = module.read_bytes()
    module.write_bytes(whole[: len(whole) // 2])  # a truncated module
    _, result = box.agent({"op": "check"})
    assert result["ok"] is True, result
    assert module.read_bytes() == whole
    (cache_dir(box) / "BUNDLE").unlink()  # an unpack cut before its mark was written
    (cache_dir(box) / "outrig_agent" / "deploy.py").unlink()
    stale = cache_dir(box).with_name(agent_digest() + ".tmp.99999")
    (stale / "outrig_agent").mkdir(parents=True)
    os.utime(stale, (1, 1))  # left by a killed agent long ago
    _, result = box.agent({"op": "check"})
    assert result["ok"] is True, result
    assert (cache_dir(box) / "BUNDLE").is_file()
    assert (cache_dir(box) / "outrig_agent" / "deploy.py").is_file()
    assert not stale.exists()


def test_a_full_disk_runs_the_agent_from_memory(full_box: Box) -> None:
    box = full_box
    _, result = box.deploy([sleeper("hog", ready={"log": "^up$"})])
    assert result["ok"] is True, result
    pid = result["processes"][0]["pid"]
    fill(box.workdir.parent)
    assert is_full(box.workdir)
    _, result = box.agent({"op": "status", "playbook": "smoke"})
    assert result["ok"] is True, result
    assert not (cache_dir(box) / "BUNDLE").exists()
    assert [p.name for p in cache_dir(box).parent.glob("*.tmp.*")] == []
    _, result = box.agent({"op": "cleanup", "playbook": "smoke", "stop_grace": 0.5})
    assert result["ok"] is True, result
    assert wait_until(lambda: not alive(pid))


def test_the_bundle_is_the_same_bytes_for_the_same_sources() -> None:
    sources = bundle.package_sources()
    assert bundle.build_bundle(sources) == agent_bundle_bytes()
    assert set(sources) >= {"__main__.py", "_bundle_main.py", "wrap.py", "protocol.py"}
    assert sources["wrap.py"] in bundle.build_bundle(sources)  # kept whole: the box shows it


def test_stripping_keeps_every_line_and_statement() -> None:
    import ast

    def shape(source: bytes) -> str:
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str)):
                node.value.value = ""
        return ast.dump(tree)

    for name, source in bundle.package_sources().items():
        stripped = bundle.strip_source(source)
        assert shape(stripped) == shape(source), name
        assert len(stripped.splitlines()) == len(source.splitlines()), name
        assert bundle.strip_source(stripped) == stripped, name
    sources = bundle.package_sources()
    sent = sum(len(bundle.strip_source(s)) for s in sources.values())
    assert sent < 0.9 * sum(len(s) for s in sources.values())


def test_the_workstation_keeps_the_built_bundle_and_never_sends_a_damaged_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from outrig.agent import client as agent_client
    monkeypatch.setattr(agent_client, "BUNDLE_CACHE", tmp_path)
    agent_client.agent_bundle_bytes.cache_clear()
    try:
        built = agent_client.agent_bundle_bytes()
        (kept,) = tmp_path.glob("outrig-bundle-*.zip")
        assert kept.read_bytes() == built
        assert kept.stem.endswith(bundle.digest_of(built))
        kept.write_bytes(built[:-10])  # damaged: the next process builds it again
        agent_client.agent_bundle_bytes.cache_clear()
        assert agent_client.agent_bundle_bytes() == built
        (kept,) = tmp_path.glob("outrig-bundle-*.zip")
        assert kept.read_bytes() == built
    finally:
        agent_client.agent_bundle_bytes.cache_clear()
