"""The vast.ai provider against a test server on 127.0.0.1 that answers as vast.ai's REST API
does (paths, bodies and answers from vast.ai's own CLI, vast-ai/vast-python ``vast.py``, and
its API reference; docs/providers.md gives file and line for each), including its error
answers: an offer taken at create (retried, then the next), a bad key (401), the rate limit
(429, plain text), a server error. And the key: from the environment or a 0600 file, sent
only in the Authorization header, never in argv, a message, the journal or a log.
No test contacts anything but loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.errors import ConfigError
from outrig.providers.base import (
    CreateRequest,
    Instance,
    NeverAnswered,
    NoCapacity,
    ProviderError,
    parse_gpus,
)
from outrig.providers.registry import get_provider
from outrig.providers.renting import rent
from outrig.providers.webapi import HttpError
from outrig.sandbox.box import SandboxBox
from outrig.session import Project

pytestmark = [pytest.mark.integration]
KEY = "vk-test-7f3a9c1e5b"  # a made-up key; the server echoes it in one error to test masking

# vast.py 3095-3101: POST /api/v0/bundles/ answers {"offers": [...]}, fields as vast.py
# 441-463 lists them (id, num_gpus, gpu_name, dph_total, disk_space, geolocation)
OFFERS = {"offers": [
    {"id": 31001, "num_gpus": 8, "gpu_name": "H100 SXM", "dph_total": 19.2,
     "disk_space": 900.0, "geolocation": "Ohio, US"},
    {"id": 31002, "num_gpus": 8, "gpu_name": "H100 NVL", "dph_total": 21.5,
     "disk_space": 1500.0, "geolocation": "Quebec, CA"},
    {"id": 31003, "num_gpus": 8, "gpu_name": "A100 SXM4", "dph_total": 9.8,
     "disk_space": 700.0, "geolocation": "Texas, US"},
]}


class VastServer:
    """Answers as vast.ai's API: ``script`` holds the answers still to give per route, as
    (status, body); ``requests`` records what came in (method, path, headers, body)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script: dict[str, list[tuple[int, Any]]] = {}
        self.instances: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                del args

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                server.requests.append({"method": self.command, "path": self.path,
                                        "headers": dict(self.headers),
                                        "body": json.loads(raw) if raw else None})
                status, body = server.route(self.command, self.path)
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if isinstance(body, str)
                                 else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def route(self, method: str, path: str) -> tuple[int, Any]:
        key = f"{method} {path.split('?')[0]}"
        scripted = next((k for k in self.script if key.startswith(k) and self.script[k]), None)
        if scripted:
            return self.script[scripted].pop(0)
        if key == "POST /api/v0/bundles/":
            return 200, OFFERS
        if key == "GET /api/v0/instances/":  # vast.py 3751-3760: {"instances": [...]}
            return 200, {"instances": self.instances}
        if method == "DELETE" and path.startswith("/api/v0/instances/"):
            wanted = path.rstrip("/").rsplit("/", 1)[1]
            before = len(self.instances)
            self.instances = [i for i in self.instances if str(i["id"]) != wanted]
            if len(self.instances) == before:  # rate-limits-and-errors: the common shape
                return 404, {"success": False, "error": "no_such_instance",
                             "msg": "Instance not found."}
            return 200, {"success": True}
        return 404, {"success": False, "error": "not_found", "msg": f"no route {key}"}


@pytest.fixture
def vast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[VastServer, Path]]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("VAST_API_KEY", KEY)
    server = VastServer()
    root = tmp_path / "proj"
    (root / "hosts").mkdir(parents=True)
    (root / "outrig.yaml").write_text(yaml.safe_dump(
        {"providers": {"vastai": {"url": server.url, "poll_seconds": 0.1}}}))
    yield server, root
    server.http.shutdown()


def test_search_asks_vast_ai_for_on_demand_direct_ssh_offers_and_matches_the_gpus(
        vast: tuple[VastServer, Path]) -> None:
    server, root = vast
    provider = get_provider("vastai", root)
    offers = provider.search(parse_gpus("8xH100"), 20.0)
    assert [o.offer_id for o in offers] == ["31001"], "H100s within $20/h; not the A100s"
    assert offers[0].price_per_hour == 19.2 and offers[0].where == "Ohio, US"
    [request] = server.requests
    assert request["method"] == "POST" and request["path"] == "/api/v0/bundles/"
    body = request["body"]
    assert body["num_gpus"] == {"eq": 8} and body["rentable"] == {"eq": True}
    assert body["direct_port_count"] == {"gte": 1} and body["dph_total"] == {"lte": 20.0}
    assert body["order"] == [["dph_total", "asc"]]
    assert request["headers"]["Authorization"] == f"Bearer {KEY}"
    assert KEY not in request["path"], "the key never goes in the URL"


def test_create_retries_a_taken_offer_then_waits_for_ssh_and_terminates(
        vast: tuple[VastServer, Path], sandbox: SandboxBox) -> None:
    server, root = vast
    provider = get_provider("vastai", root)
    offer = provider.search(parse_gpus("8xH100"), None)[0]
    server.script["PUT /api/v0/asks/"] = [
        (400, {"success": False, "error": "no_such_ask",
               "msg": "Instance type is no longer available."}),
        (200, {"success": True, "new_contract": 7835610})]  # vast.py 1533
    with pytest.raises(NoCapacity, match="no longer available"):
        provider.create(offer, CreateRequest(name="outrig-h100-ab12", disk_gb=200))
    instance = provider.create(offer, CreateRequest(name="outrig-h100-ab12", disk_gb=200))
    assert instance.instance_id == "7835610"
    put = server.requests[-1]
    assert put["method"] == "PUT" and put["path"] == "/api/v0/asks/31001/"
    assert put["body"]["label"] == "outrig-h100-ab12" and put["body"]["disk"] == 200
    assert put["body"]["runtype"] == "ssh_direc ssh_proxy" and put["body"]["client_id"] == "me"
    # loading, then running with 22/tcp mapped (vast.py 3343-3350) to a real sshd here
    row = {"id": 7835610, "label": "outrig-h100-ab12", "actual_status": "loading",
           "public_ipaddr": "127.0.0.1", "ssh_host": "ssh5.vast.ai", "ssh_port": 20001,
           "dph_total": 19.2, "ports": {}}
    server.instances.append(row)
    assert provider.list()[0].state == "starting"

    def come_up() -> None:
        time.sleep(0.5)
        row.update(actual_status="running",
                   ports={"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(sandbox.port)}]})

    threading.Thread(target=come_up, daemon=True).start()
    ready = provider.wait_ssh(instance, time.monotonic() + 60)
    assert ready.state == "running"
    assert ready.host["hostname"] == "127.0.0.1" and ready.host["port"] == sandbox.port
    assert ready.host["user"] == "root"
    provider.terminate("7835610")
    assert server.requests[-1]["method"] == "DELETE"
    assert server.requests[-1]["path"] == "/api/v0/instances/7835610/"
    assert provider.list() == []
    provider.terminate("7835610")  # 404: already gone, harmless


def test_wait_ssh_gives_up_at_its_deadline_on_a_box_that_never_answers(
        vast: tuple[VastServer, Path]) -> None:
    server, root = vast
    provider = get_provider("vastai", root)
    server.instances.append({"id": 42, "label": "outrig-x", "actual_status": "loading",
                             "dph_total": 19.2, "ports": {}})
    with pytest.raises(NeverAnswered, match="did not answer SSH before its deadline"):
        provider.wait_ssh(Instance("vastai", "42", "outrig-x", "starting"),
                          time.monotonic() + 1.0)


@pytest.mark.parametrize(("status", "body", "says"), [
    (401, {"success": False, "error": "auth_error",
           "msg": f"Invalid user key {KEY}"}, "HTTP 401: Invalid user key ***"),
    (429, "API requests too frequent", "HTTP 429: API requests too frequent"),
    (500, {"success": False, "error": "server_error", "msg": "Internal error"},
     "HTTP 500: Internal error"),
])
def test_error_answers_become_one_clear_error_without_the_key(
        vast: tuple[VastServer, Path], status: int, body: Any, says: str) -> None:
    server, root = vast
    server.script["POST /api/v0/bundles/"] = [(status, body)]
    with pytest.raises(HttpError) as caught:
        get_provider("vastai", root).search(parse_gpus("8xH100"), None)
    assert caught.value.status == status
    assert says in str(caught.value) and KEY not in str(caught.value)


def outrig(root: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "outrig", *args], cwd=root,
                          capture_output=True, text=True, env=env, timeout=120, check=False)


def test_the_key_never_reaches_argv_messages_the_journal_or_logs(
        vast: tuple[VastServer, Path], tmp_path: Path) -> None:
    server, root = vast
    server.script["POST /api/v0/bundles/"] = [
        (401, {"success": False, "error": "auth_error", "msg": f"Invalid user key {KEY}"})]
    done = outrig(root, "rent", "--provider", "vastai", "--gpus", "8xH100",
                  env={**os.environ})
    assert done.returncode == 1
    assert "HTTP 401" in done.stderr and KEY not in done.stdout + done.stderr
    server.script["PUT /api/v0/asks/"] = [(500, {"success": False, "msg": f"boom {KEY}"})]
    failed = outrig(root, "rent", "--provider", "vastai", "--gpus", "8xH100",
                    env={**os.environ})
    assert failed.returncode == 1 and KEY not in failed.stdout + failed.stderr
    state = tmp_path / "xdg"
    assert any(state.rglob("*.json")), "the journal recorded the attempt"
    for path in [*state.rglob("*"), *(root / "hosts").rglob("*")]:
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
    assert all(KEY not in r["path"] for r in server.requests)


def test_a_missing_or_readable_key_is_bad_input_and_nothing_is_rented(
        vast: tuple[VastServer, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, root = vast
    env = {k: v for k, v in os.environ.items() if k != "VAST_API_KEY"}
    done = outrig(root, "rent", "--provider", "vastai", "--gpus", "8xH100", env=env)
    assert done.returncode == 2
    assert "set VAST_API_KEY" in " ".join(done.stderr.split())
    key_file = tmp_path / "vast.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o644)
    config = yaml.safe_load((root / "outrig.yaml").read_text())
    config["providers"]["vastai"]["api_key_file"] = str(key_file)
    (root / "outrig.yaml").write_text(yaml.safe_dump(config))
    loose = outrig(root, "rent", "--provider", "vastai", "--gpus", "8xH100", env=env)
    assert loose.returncode == 2 and "chmod 600" in loose.stderr
    assert KEY not in loose.stderr
    assert server.requests == [], "nothing was asked of the provider"
    key_file.chmod(0o600)
    monkeypatch.delenv("VAST_API_KEY")
    with pytest.raises(ConfigError, match="is below every offer"):
        rent(Project(root), "vastai", "8xH100", max_price=5.0)
    assert server.requests[-1]["headers"]["Authorization"] == f"Bearer {KEY}", \
        "the key came from the 0600 file"
    assert not any(r["method"] == "PUT" for r in server.requests), "nothing was rented"


# ---------------------------------------------------------------------------------- RunPod
# runpod-python 1.12.0: POST {base}/graphql {"query"} with a Bearer key (graphql.py 33-43);
# HTTP 401 is a bad key (45-48); {"errors": [{"message"}]} an error (50-51); data per query:
# gpuTypes (queries/gpus.py 5-44), myself.pods (queries/pods.py 5-44),
# podFindAndDeployOnDemand (mutations/pods.py 130-149), podTerminate (186-195).
GPU_TYPES = {"data": {"gpuTypes": [
    {"id": "NVIDIA H100 80GB HBM3", "displayName": "H100 SXM", "memoryInGb": 80,
     "lowestPrice": {"uninterruptablePrice": 2.69}},
    {"id": "NVIDIA H100 PCIe", "displayName": "H100 PCIe", "memoryInGb": 80,
     "lowestPrice": {"uninterruptablePrice": 2.39}},
    {"id": "NVIDIA A100 80GB PCIe", "displayName": "A100 PCIe", "memoryInGb": 80,
     "lowestPrice": {"uninterruptablePrice": 1.19}},
    {"id": "NVIDIA H200", "displayName": "H200 SXM", "memoryInGb": 141,
     "lowestPrice": {"uninterruptablePrice": None}},  # none free with 8 now
]}}
NO_CAPACITY = {"errors": [{"message": "There are no longer any instances available with the "
                                      "requested specifications. Please refresh and try "
                                      "again."}]}


class RunPodServer(VastServer):
    """Answers as RunPod's GraphQL endpoint does."""

    def route(self, method: str, path: str) -> tuple[int, Any]:
        query = str((self.requests[-1]["body"] or {}).get("query") or "")
        if method != "POST" or path != "/graphql":
            return 404, "not found"
        for word in ("gpuTypes", "podFindAndDeployOnDemand", "myself", "podTerminate"):
            if word in query and self.script.get(word):
                return self.script[word].pop(0)
        if "gpuTypes" in query:
            return 200, GPU_TYPES
        if "myself" in query:
            return 200, {"data": {"myself": {"pods": self.instances}}}
        if "podTerminate" in query:
            self.instances = [p for p in self.instances if f'"{p["id"]}"' not in query]
            return 200, {"data": {"podTerminate": None}}
        return 200, {"errors": [{"message": "unexpected query"}]}


@pytest.fixture
def runpod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RunPodServer,
                                                                             Path]]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    server = RunPodServer()
    root = tmp_path / "proj"
    (root / "hosts").mkdir(parents=True)
    (root / "outrig.yaml").write_text(yaml.safe_dump(
        {"providers": {"runpod": {"url": server.url, "poll_seconds": 0.1}}}))
    yield server, root
    server.http.shutdown()


def test_runpod_offers_a_gpu_type_priced_for_the_count_and_deploys_with_full_ssh(
        runpod: tuple[RunPodServer, Path], sandbox: SandboxBox) -> None:
    server, root = runpod
    provider = get_provider("runpod", root)
    offers = provider.search(parse_gpus("8xH100"), None)
    assert [(o.offer_id, o.price_per_hour) for o in offers] == [
        ("NVIDIA H100 PCIe", 19.12), ("NVIDIA H100 80GB HBM3", 21.52)]
    assert "gpuCount: 8" in server.requests[0]["body"]["query"]
    assert server.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"
    assert provider.search(parse_gpus("8xH200"), None) == [], "no price: no offer"
    server.script["podFindAndDeployOnDemand"] = [
        (200, NO_CAPACITY), (200, {"data": {"podFindAndDeployOnDemand": {
            "id": "abc123xyz", "machineId": "m1"}}})]
    with pytest.raises(NoCapacity, match="no longer any instances available"):
        provider.create(offers[0], CreateRequest(name="outrig-h100-cd34", disk_gb=300))
    pod = provider.create(offers[0], CreateRequest(name="outrig-h100-cd34", disk_gb=300))
    assert pod.instance_id == "abc123xyz"
    query = server.requests[-1]["body"]["query"]
    for part in ('name: "outrig-h100-cd34"', 'gpuTypeId: "NVIDIA H100 PCIe"', "gpuCount: 8",
                 "supportPublicIp: true", "startSsh: true", 'ports: "22/tcp"',
                 "volumeInGb: 300"):
        assert part in query, part
    row: dict[str, Any] = {"id": "abc123xyz", "name": "outrig-h100-cd34",
                           "desiredStatus": "RUNNING", "costPerHr": 19.12, "runtime": None}
    server.instances.append(row)
    assert provider.list()[0].state == "starting", "RUNNING wanted, no container yet"

    def come_up() -> None:
        time.sleep(0.5)
        row["runtime"] = {"ports": [
            {"ip": "100.65.0.2", "isIpPublic": False, "privatePort": 22, "publicPort": 22,
             "type": "tcp"},
            {"ip": "127.0.0.1", "isIpPublic": True, "privatePort": 22,
             "publicPort": sandbox.port, "type": "tcp"}]}

    threading.Thread(target=come_up, daemon=True).start()
    ready = provider.wait_ssh(pod, time.monotonic() + 60)
    assert ready.host["hostname"] == "127.0.0.1" and ready.host["port"] == sandbox.port, \
        "the public IP's port mapped to 22, not the private one"
    provider.terminate("abc123xyz")
    assert 'podTerminate(input: { podId: "abc123xyz" })' in \
        server.requests[-1]["body"]["query"]
    assert provider.list() == []


def test_runpod_error_answers_and_a_bad_key_say_so_without_the_key(
        runpod: tuple[RunPodServer, Path]) -> None:
    server, root = runpod
    provider = get_provider("runpod", root)
    server.script["gpuTypes"] = [(401, "Unauthorized"),
                                 (200, {"errors": [{"message": f"bad token {KEY}"}]})]
    with pytest.raises(ProviderError, match="refused the API key \\(HTTP 401\\)"):
        provider.search(parse_gpus("8xH100"), None)
    with pytest.raises(ProviderError) as caught:
        provider.search(parse_gpus("8xH100"), None)
    assert "bad token ***" in str(caught.value) and KEY not in str(caught.value)
    name = 'x" } ) { id } podTerminate(input: { podId: "all'  # refused before any call
    with pytest.raises(ConfigError, match="--name"):
        rent(Project(root), "runpod", "8xH100", name=name)
