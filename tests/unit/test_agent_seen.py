"""Ownership without the environment marker, and readiness that needs an answered request
(remote/agent/, run locally through tests/support/agent.py).

vLLM's renamed children lose OUTRIG_RUN from /proc/PID/environ (setproctitle, docs/cleanup.md).
Here a child execs with an empty environment, which /proc shows the same way: no marker. It is
still the run's by its group, the deploy's own wait records it (pid + start time), status lists
it with the rule that proves it, and once it has also left the group and session the record
alone finds it. ``ready.generate`` is checked against a small real HTTP server."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent import PY, R1, Box, error_of, names, stat_fields, wait_until
from tests.support.network import free_port
from tests.support.processes import alive

# The record's command: a child with an empty environment (no marker), in the same group, then
# (on child.leave) it leaves group and session; the parent exits on parent.exit.
NO_MARKER = r"""
import os, subprocess, sys, time
child = r'''
import os, time
open("child.pid", "w").write(str(os.getpid()))
while not os.path.exists("child.leave"):
    time.sleep(0.05)
os.setsid()
open("child.left", "w").write("1")
time.sleep(120)
'''
kid = subprocess.Popen([sys.executable, "-c", child], env={})
while not os.path.exists("child.pid"):
    time.sleep(0.02)
print("up", flush=True)
while not os.path.exists("parent.exit"):
    time.sleep(0.05)
"""


def deploy_no_marker(box: Box) -> int:
    _, result = box.deploy([{"name": "job", "argv": [PY, "-c", NO_MARKER],
                             "ready": {"log": "^up$", "timeout": 30}, "stop_grace": 1}],
                           env={"OUTRIG_CGROUPS": "0"})
    assert result["ok"] is True, result
    child = int((box.workdir / "child.pid").read_text())
    box.track(child)
    assert b"OUTRIG_RUN=" not in Path(f"/proc/{child}/environ").read_bytes()
    return child


def seen_pids(box: Box) -> dict[int, int]:
    data = json.loads((box.workdir / "runs" / R1 / "descendants.json").read_text())
    return {item["pid"]: item["start_ticks"] for item in data["processes"]}


def ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[19])


def test_deploys_wait_records_a_child_without_marker(box: Box) -> None:
    child = deploy_no_marker(box)
    assert seen_pids(box).get(child) == ticks(child)


def test_status_lists_the_tree_with_the_rule_that_proves_each(box: Box) -> None:
    child = deploy_no_marker(box)
    _, status = box.agent({"op": "status", "playbook": "smoke"})
    assert status["ok"] is True, status
    proc = status["runs"][0]["processes"][0]
    tree = {node["pid"]: node for node in proc["tree"]}
    leader = box.run_json()["processes"][0]["pid"]
    assert tree[child]["proof"] == "group" and tree[child]["pgid"] == leader
    assert all(node["proof"] == "group" for node in tree.values())


def test_child_that_left_group_and_session_after_it_was_seen_is_stopped(box: Box) -> None:
    child = deploy_no_marker(box)
    (box.workdir / "child.leave").touch()
    assert wait_until(lambda: (box.workdir / "child.left").exists(), timeout=20)
    parent = int(next(p["pid"] for p in box.run_json()["processes"]))
    st = stat_fields(child)
    assert st is not None and st[2] == child != parent  # its own group and session now
    (box.workdir / "parent.exit").touch()
    assert wait_until(lambda: not alive(parent), timeout=20)  # the wrapper ended too
    _, status = box.agent({"op": "status", "playbook": "smoke"})
    tree = {n["pid"]: n["proof"] for n in status["runs"][0]["processes"][0]["tree"]}
    assert tree.get(child) == "seen"  # no group, session, marker or parent leads to it
    _, result = box.agent({"op": "cleanup", "playbook": "smoke"})
    assert result["ok"] is True, result
    assert wait_until(lambda: not alive(child), timeout=20)


def test_a_stranger_that_looks_the_same_is_not_taken(box: Box) -> None:
    deploy_no_marker(box)
    stranger = os.spawnv(os.P_NOWAIT, PY, [PY, "-c", "import os, time; os.setsid(); "
                                                   "time.sleep(60)"])
    box.track(stranger)
    try:
        _, status = box.agent({"op": "status", "playbook": "smoke"})
        assert stranger not in [n["pid"] for n in status["runs"][0]["processes"][0]["tree"]]
        _, result = box.agent({"op": "cleanup", "playbook": "smoke"})
        assert result["ok"] is True, result
        assert alive(stranger)
    finally:
        os.kill(stranger, signal.SIGKILL)
        os.waitpid(stranger, 0)


# ------------------------------------------------------------------------------ ready.generate
SERVER = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port, code = int(sys.argv[1]), int(sys.argv[2])
class H(BaseHTTPRequestHandler):
    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health":
            self.reply(200, {})
        else:
            self.reply(200, {"object": "list", "data": [{"id": "m"}]})
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        req = json.loads(self.rfile.read(n))
        print("request", json.dumps(req), flush=True)
        if code != 200 and len(sys.argv) > 3:
            print(sys.argv[3], flush=True)
        self.reply(code, {"choices": [{"text": "x"}]} if code == 200 else
                   {"error": {"message": "engine dead", "code": code}})
    def log_message(self, *args):
        pass
print("listening", flush=True)
HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def generate_deploy(box: Box, code: int, *extra: str) -> tuple[list[Any], Any]:
    port = free_port()
    return box.deploy([{"name": "server", "argv": [PY, "-c", SERVER, str(port), str(code),
                                                    *extra],
                        "ready": {"http": f"http://127.0.0.1:{port}/health", "model": "m",
                                  "generate": True, "timeout": 30},
                        "fatal": ["EngineCore encountered a fatal error"], "stop_grace": 1}])


def test_generate_is_ready_only_after_an_answered_request(box: Box) -> None:
    events, result = generate_deploy(box, 200)
    assert result["ok"] is True, result
    assert "server answered a /v1/completions request (200)" in [
        e["msg"] for e in events if e["event"] == "step"]
    request = next(line for line in box.log("server").splitlines()
                   if line.startswith("request "))
    assert json.loads(request[len("request "):]) == {
        "model": "m", "prompt": [0], "max_tokens": 1, "temperature": 0}
    assert names(events, "ready") == ["server"]


def test_generate_refused_request_is_not_serving(box: Box) -> None:
    events, result = generate_deploy(box, 500)
    err = error_of(result, "not_serving")
    assert "answered 500" in err["message"] and "engine dead" in err["message"]
    assert names(events, "ready") == []
    assert box.run_json()["status"] == "failed"


def test_generate_refused_with_a_fatal_line_reports_the_line(box: Box) -> None:
    _, result = generate_deploy(box, 500, "EngineCore encountered a fatal error.")
    err = error_of(result, "fatal_log")
    assert "EngineCore encountered a fatal error." in err["message"]


@pytest.mark.parametrize("ready", [{"http": "http://127.0.0.1:1/health", "generate": True},
                                   {"log": "x", "model": "m", "generate": True}])
def test_generate_without_model_and_http_is_a_bad_request(box: Box, ready: dict[str, Any]
                                                          ) -> None:
    _, result = box.deploy([{"name": "server", "argv": [PY, "-c", "pass"], "ready": ready}])
    err = error_of(result, "bad_request")
    assert "ready." in err["message"] and ("generate" in err["message"]
                                           or "model" in err["message"])
    assert not (box.workdir / "runs" / R1).exists()
