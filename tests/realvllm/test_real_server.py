"""One real CPU vLLM server, deployed by outrig on the sandbox box (a real sshd on 127.0.0.1)
and shared by this module's tests, in order: the deploy's wait, the real process tree in
``status``, and last, its orphans after ``kill -9`` of the API server and a cleanup that stops
exactly them (tests/realvllm/README.md)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from outrig._box.agent.hangs import parse_metrics
from outrig.hang.judge import BUSY_GAUGES, PROGRESS_COUNTERS
from outrig.ops.cleanup import cleanup_on
from outrig.ops.deploy import DeployResult, deploy_on
from outrig.ops.status import status_on
from outrig.playbook import find_playbook, load_job
from outrig.session import host_session
from outrig.text.layout import status_lines
from tests.realvllm.serving import (
    PROJECT,
    cmdline_of,
    environ_of,
    group_of,
    http,
    journal_in,
    playbook_port,
    quiet,
    run_json,
    server_playbook,
)
from tests.support.network import free_port
from tests.support.processes import ProcessTracker, alive, wait_gone
from tests.support.runs import standin_path

pytestmark = pytest.mark.integration


@dataclass
class Served:
    host: Path
    playbook: Path
    model: Path
    port: int
    result: DeployResult
    events: list[dict[str, Any]]
    folder: Path
    seen_at_deploy: dict[str, Any]

    @property
    def run_id(self) -> str:
        return self.result.plan.run_id

    def record(self) -> dict[str, Any]:
        rec: dict[str, Any] = run_json(self.host, self.run_id)["processes"][0]
        return rec

    def status(self) -> dict[str, Any]:
        with host_session(PROJECT, str(self.host), quiet(), journal_in(self.folder)) as s:
            run: dict[str, Any] = status_on(s, run_id=self.run_id)["runs"][0]
        return run


@pytest.fixture(scope="module")
def served(real_host: Path, vllm_python: str, verifier: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The real server, deployed once for the module (real_host's teardown stops it)."""
    folder = tmp_path_factory.mktemp("served")
    playbook = server_playbook(folder, "realvllm", vllm_python, verifier)
    with host_session(PROJECT, str(real_host), quiet(), journal_in(folder)) as session:
        job = load_job(find_playbook(str(playbook), PROJECT.playbooks_dir))
        result = deploy_on(session, job)
        events = list(session.last_events)
    seen_file = (Path(result.processes[0]["log"]).parents[1] / "descendants.json")
    seen = json.loads(seen_file.read_text()) if seen_file.exists() else {}
    yield Served(real_host, playbook, verifier, playbook_port(playbook), result, events,
                 folder, seen)


def by_role(tree: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The real server's processes in a status tree, by what they are."""
    roles: dict[str, dict[str, Any]] = {}
    for node in tree:
        cmd = node.get("cmdline") or ""
        if "vllm.entrypoints.openai.api_server" in cmd:
            roles["api_server"] = node
        elif cmd.startswith("VLLM::EngineCore"):
            roles["engine"] = node
        elif cmd.startswith("VLLM::Worker"):
            roles["worker"] = node
        elif "multiprocessing.resource_tracker" in cmd:
            roles["resource_tracker"] = node
    return roles


def marker_entries(pid: int) -> list[bytes]:
    return [e for e in environ_of(pid).split(b"\0") if e.startswith(b"OUTRIG_")]


def test_deploy_waits_for_the_real_server_to_answer_a_request(served: Served) -> None:
    names = [(e["event"], e.get("process")) for e in served.events]
    assert ("launched", "server") in names and ("ready", "server") in names
    assert names.index(("launched", "server")) < names.index(("ready", "server"))
    ready = next(e for e in served.events if e["event"] == "ready")
    assert ready["via"] == "http"
    steps = [e["msg"] for e in served.events if e["event"] == "step"]
    # ready.generate: one real /v1/completions was answered before the server counted as up
    assert "server answered a /v1/completions request (200)" in steps
    assert steps.index("server answered a /v1/completions request (200)") < [
        e["event"] for e in served.events if e["event"] in ("step", "ready")].index("ready")
    run = run_json(served.host, served.run_id)
    rec = served.record()
    assert run["status"] == "running" and rec["outcome"] == "ready"
    assert run["ready_at"] >= rec["started_at"]
    # the recorded start is the real one: the wrapper's start time in /proc, this boot
    rest = Path(f"/proc/{rec['pid']}/stat").read_bytes().rsplit(b")", 1)[1].split()
    assert int(rest[19]) == rec["start_ticks"]
    assert rec["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    log = Path(rec["log"]).read_text(errors="replace")
    assert f"Starting vLLM server on http://127.0.0.1:{served.port}" in log
    assert "Application startup complete." in log
    assert re.search(r'"GET /health HTTP/1.1" 200', log)
    assert re.search(r'"POST /v1/completions HTTP/1.1" 200', log)
    code, body, _ = http("GET", f"http://127.0.0.1:{served.port}/v1/models")
    assert code == 200 and json.loads(body)["data"][0]["id"] == str(served.model)


def test_deploys_wait_recorded_the_renamed_children_that_carry_no_marker(
        served: Served) -> None:
    """The deploy's wait saw the engine and worker in the run's group and recorded them
    (pid + start time) before any status or cleanup: the record that proves them ours."""
    rec = served.record()
    members = [p for p in group_of(rec["pid"]) if p != rec["pid"]]
    renamed = {p: cmdline_of(p) for p in members
               if cmdline_of(p) and cmdline_of(p)[0].startswith("VLLM::")}
    assert sorted(c[0] for c in renamed.values()) == ["VLLM::EngineCore", "VLLM::Worker"]
    seen = {item["pid"]: item["start_ticks"] for item in served.seen_at_deploy["processes"]}
    for pid, cmd in renamed.items():
        assert cmd == [cmd[0]], "setproctitle pads the old argv area with NULs"
        assert marker_entries(pid) == [], f"{cmd[0]} still shows a marker in environ"
        assert environ_of(pid).startswith(b"\0"), "the start's environment is cleared"
        ticks = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[19])
        assert seen.get(pid) == ticks, f"{cmd[0]} was not recorded by the deploy"


def test_status_shows_the_real_tree_and_the_rule_that_proves_each_ours(
        served: Served) -> None:
    run = served.status()
    proc = run["processes"][0]
    assert proc["state"] == "running" and proc["ready"] is True
    roles = by_role(proc["tree"])
    assert set(roles) == {"api_server", "engine", "worker", "resource_tracker"}, proc["tree"]
    rec = served.record()
    for role, node in roles.items():
        assert node["pgid"] == rec["pid"] and node["sid"] == rec["pid"], role
        assert node["proof"] == "group", (role, node)
    assert roles["engine"]["comm"] == "VLLM::EngineCor"  # comm keeps 15 bytes
    assert roles["worker"]["ppid"] == roles["engine"]["pid"]
    assert roles["api_server"]["ppid"] == rec["pid"]  # the wrapper's child
    # the API server is not renamed: its environ still has the marker; the renamed have none
    assert f"OUTRIG_RUN={served.run_id}".encode() in marker_entries(roles["api_server"]["pid"])
    assert marker_entries(roles["engine"]["pid"]) == []
    assert marker_entries(roles["worker"]["pid"]) == []


# ---------------------------------------------------------------- stand-ins vs the real server
# What fake_vllm.py and hs_vllm.py imitate that the CPU build also has, compared with the
# real server above, so that neither can drift (tests/standins/README.md).
READINESS_LINES = (
    r"\(APIServer pid=\d+\) INFO \d\d-\d\d \d\d:\d\d:\d\d \[entry\.py:\d+\] "
    r"Starting vLLM server on http://127\.0\.0\.1:{port}$",
    r"Route: /health, Methods: GET$",
    r"Route: /v1/models, Methods: GET$",
    r"Route: /v1/completions, Methods: POST$",
    r"^INFO:     Application startup complete\.$",
)
HS_CONFIG = ["--speculative-config", json.dumps(
    {"method": "extract_hidden_states", "num_speculative_tokens": 1,
     "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1]}}})]


def answers(port: int, model: str) -> dict[str, Any]:
    """What a client sees of a server: the routes and answers outrig and the trainer use."""
    base = f"http://127.0.0.1:{port}"
    seen: dict[str, Any] = {}
    code, body, _ = http("GET", base + "/health")
    seen["health"] = (code, body)
    code, body, _ = http("GET", base + "/v1/models")
    listing = json.loads(body)
    first = listing["data"][0]
    seen["models"] = {"code": code, "object": listing["object"], "keys": set(first),
                      "id": first["id"], "root": first["root"], "kind": first["object"],
                      "owned_by": first["owned_by"]}
    code, body, _ = http("POST", base + "/v1/completions",
                         {"model": model, "prompt": [0], "max_tokens": 1})
    done = json.loads(body)
    seen["completion"] = {
        "code": code, "keys": set(done), "object": done["object"],
        "choice_keys": set(done["choices"][0]), "usage_keys": set(done["usage"]),
        "finish": done["choices"][0]["finish_reason"], "model": done["model"],
        "tokens": done["usage"]["completion_tokens"], "id": done["id"].split("-")[0]}
    code, body, _ = http("POST", base + "/v1/completions",
                         {"model": "no-such-model", "prompt": [0], "max_tokens": 1})
    seen["unknown_model"] = (code, json.loads(body)["error"]["type"])
    code, body, _ = http("GET", base + "/no-such-route")
    seen["not_found"] = (code, json.loads(body))
    code, body, _ = http("GET", base + "/metrics")
    seen["metrics"] = code == 200 and b"vllm:num_requests_running" in body
    return seen


# hs_vllm.py imitates vLLM 0.33 (the version the H200 runs), the CPU build here is 0.32:
# keys 0.33 added that 0.32 lacks. Exact, so any other difference still fails.
NEWER_KEYS: dict[str, dict[str, set[str]]] = {
    "hs_vllm": {"choice_keys": {"weight_versions"}}}


def assert_same_answers(real: dict[str, Any], standin: dict[str, Any], name: str) -> None:
    """The stand-in answers what the real server answers (keys: a subset of the real ones,
    but for the known NEWER_KEYS)."""
    assert standin["health"] == real["health"] == (200, b""), name
    for key in ("code", "object", "id", "root", "kind", "owned_by"):
        assert standin["models"][key] == real["models"][key], (name, key)
    assert standin["models"]["keys"] <= real["models"]["keys"], name
    for key in ("code", "object", "finish", "model", "tokens", "id"):
        assert standin["completion"][key] == real["completion"][key], (name, key)
    for key in ("keys", "choice_keys", "usage_keys"):
        extra = standin["completion"][key] - real["completion"][key]
        assert extra == NEWER_KEYS.get(name, {}).get(key, set()), (name, key, extra)
    assert standin["unknown_model"] == real["unknown_model"], name
    assert standin["not_found"] == real["not_found"] == (404, {"detail": "Not Found"}), name


def readiness_lines(log: str, port: int) -> list[str]:
    """The readiness lines outrig's recipes and docs rely on that the log lacks."""
    lines = log.splitlines()
    return [rx for rx in READINESS_LINES
            if not any(re.search(rx.format(port=port), line) for line in lines)]


def renamed_children(pgid: int) -> dict[str, dict[str, Any]]:
    """The children of a server's group renamed by setproctitle (or its imitation)."""
    out: dict[str, dict[str, Any]] = {}
    for pid in group_of(pgid):
        cmd = cmdline_of(pid)
        if cmd and cmd[0].startswith("VLLM::"):
            stat = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
            env = environ_of(pid)
            out[re.sub(r"_(DP|TP)\d+", "", cmd[0])] = {
                "argv": len(cmd), "comm": Path(f"/proc/{pid}/comm").read_text().strip(),
                "title": cmd[0], "ppid": int(stat[1]), "pgid": int(stat[2]),
                "sid": int(stat[3]), "pid": pid, "env_cleared": env.startswith(b"\0"),
                "markers": [e for e in env.split(b"\0") if e.startswith(b"OUTRIG_")]}
    return out


def assert_same_tree(real: dict[str, dict[str, Any]], fake: dict[str, dict[str, Any]],
                     real_server: int, fake_server: int) -> None:
    assert set(fake) == set(real) == {"VLLM::EngineCore", "VLLM::Worker"}
    for name in real:
        for tree, server in ((real, real_server), (fake, fake_server)):
            node = tree[name]
            assert node["argv"] == 1 and node["comm"] == node["title"][:15], (name, node)
            assert node["env_cleared"] and node["markers"] == [], (name, node)
            stat = Path(f"/proc/{server}/stat").read_bytes().rsplit(b")", 1)[1].split()
            assert (node["pgid"], node["sid"]) == (int(stat[2]), int(stat[3])), (name, node)
        assert real["VLLM::Worker"]["ppid"] == real["VLLM::EngineCore"]["pid"]
        assert fake["VLLM::Worker"]["ppid"] == fake["VLLM::EngineCore"]["pid"]


def wait_health(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            if http("GET", f"http://127.0.0.1:{port}/health", timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.fail(f"no /health on {port}: {log.read_text(errors='replace')[-2000:]}")


def test_the_hang_judges_counters_are_on_the_real_servers_metrics_page(
        served: Served) -> None:
    """The names the hang judge reads from /metrics by default (outrig/hang/judge.py) are
    on the real server's page, and its progress counters move with a request; the real
    server at rest is not hung to status."""
    names = [*PROGRESS_COUNTERS, *BUSY_GAUGES]
    base = f"http://127.0.0.1:{served.port}"
    code, body, _ = http("GET", base + "/metrics")
    assert code == 200
    before = parse_metrics(body.decode(), names)
    assert sorted(before) == sorted(names), body.decode()[:3000]
    code, _, _ = http("POST", base + "/v1/completions",
                      {"model": str(served.model), "prompt": [0], "max_tokens": 4})
    assert code == 200
    _, body, _ = http("GET", base + "/metrics")
    after = parse_metrics(body.decode(), names)
    for name in PROGRESS_COUNTERS:
        assert after[name] > before[name], (name, before, after)
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0
    assert "hung" not in served.status()["processes"][0]


def test_fake_vllm_answers_logs_and_renames_like_the_real_server(
        served: Served, procs: ProcessTracker, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "fake_vllm.log"
    fake = procs.spawn(
        [sys.executable, str(standin_path("fake_vllm")), "serve", str(served.model),
         "--port", str(port), "--host", "127.0.0.1", "--tensor-parallel-size", "2",
         "--fake-startup-delay", "0.2"],
        env={"CUDA_VISIBLE_DEVICES": "0,1", "OUTRIG_RUN": "contract"},
        stdout=log.open("wb"), stderr=subprocess.STDOUT)
    wait_health(port, fake, log)
    real = answers(served.port, str(served.model))
    assert real["metrics"], "the real server serves /metrics with vllm: counters"
    assert_same_answers(real, answers(port, str(served.model)), "fake_vllm")
    real_log = Path(served.record()["log"]).read_text(errors="replace")
    assert readiness_lines(real_log, served.port) == []
    assert readiness_lines(log.read_text(errors="replace"), port) == []
    api = by_role(served.status()["processes"][0]["tree"])["api_server"]["pid"]
    assert_same_tree(renamed_children(served.record()["pid"]), renamed_children(fake.pid),
                     api, fake.pid)


def test_hs_vllm_answers_and_logs_like_the_real_server(
        served: Served, vllm_python: str, procs: ProcessTracker, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "hs_vllm.log"
    kv = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
          "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "hs")}}
    hs = procs.spawn(
        [vllm_python, str(standin_path("hs_vllm")), "serve", str(served.model), "--port",
         str(port), "--host", "127.0.0.1", "--max-model-len", "512", *HS_CONFIG,
         "--kv-transfer-config", json.dumps(kv)],
        stdout=log.open("wb"), stderr=subprocess.STDOUT)
    wait_health(port, hs, log)
    real = answers(served.port, str(served.model))
    assert_same_answers(real, answers(port, str(served.model)), "hs_vllm")
    assert readiness_lines(log.read_text(errors="replace"), port) == []


def test_orphans_of_a_killed_api_server_are_found_and_only_they_are_stopped(
        served: Served, vllm_python: str, procs: ProcessTracker) -> None:
    # A foreign process that looks like vLLM: renamed by setproctitle, its own session,
    # started outside outrig. It must survive the cleanup.
    foreign = procs.spawn(
        [vllm_python, "-c", "import setproctitle, sys, time\n"
         "setproctitle.setproctitle('VLLM::EngineCore')\nprint('up', flush=True)\n"
         "time.sleep(900)"], stdout=subprocess.PIPE)
    assert foreign.stdout is not None and foreign.stdout.readline().strip() == b"up"
    assert cmdline_of(foreign.pid) == ["VLLM::EngineCore"]
    roles = by_role(served.status()["processes"][0]["tree"])
    api = roles["api_server"]["pid"]
    orphans = [roles[r]["pid"] for r in ("engine", "worker", "resource_tracker")]
    os.kill(api, signal.SIGKILL)  # what a crash or `pkill -9 -f api_server` does
    rec = served.record()
    assert wait_gone([api, rec["pid"]], timeout=60) == []  # the wrapper ends with its child
    assert all(alive(p) for p in orphans), "vLLM's children outlive a SIGKILLed API server"

    run = served.status()
    proc = run["processes"][0]
    assert proc["state"] == "killed" and proc["signal"] == 9
    lines = status_lines({"runs": [run]}, 100)  # what `outrig status` prints for people
    print("\n".join(lines))
    assert any("outlive it; cleanup stops them" in line for line in lines), lines
    assert any(line.endswith("VLLM::EngineCore (group)") for line in lines), lines
    found = {node["pid"]: node["proof"] for node in proc["tree"]}
    assert set(orphans) <= set(found), proc["tree"]
    assert {found[p] for p in orphans} == {"group"}
    assert foreign.pid not in found
    assert marker_entries(roles["engine"]["pid"]) == []  # found without any marker

    with host_session(PROJECT, str(served.host), quiet(), journal_in(served.folder)) as s:
        result = cleanup_on(s, run_id=served.run_id)
    server = next(p for p in result["runs"][0]["processes"] if p["process"] == "server")
    # the leader was gone; exactly the three orphans were found and SIGKILLed
    assert server["how"] == "kill" and server["stragglers"] == len(orphans), result
    assert wait_gone(orphans, timeout=60) == []
    assert alive(foreign.pid), "a look-alike outside the run was stopped"
    foreign.kill()
    assert foreign.wait(30) == -signal.SIGKILL
