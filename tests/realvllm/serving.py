"""Helpers of the real-vLLM tier: verifiers, server playbooks, run records, HTTP and /proc
reads, shared by its tests and fixtures (tests/realvllm/README.md)."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.recipes.dflash import SERVER_FATAL
from outrig.session import Project
from tests.support.network import free_port

REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)
MAKE_VERIFIER = REPO / "tests" / "rehearsal" / "make_verifier.py"
SERVER_TIMEOUT_S = 900  # /health comes 70-150 s after start on 2 loaded cores; a bound only


def make_verifier(python: str, out: Path, config: dict[str, Any] | None = None) -> Path:
    """A tiny random Qwen3 the CPU vLLM serves (tests/rehearsal/make_verifier.py)."""
    argv = [python, str(MAKE_VERIFIER), str(out), "--preset", "vllm-cpu", "--conversations", "2"]
    if config:
        argv += ["--config", json.dumps(config)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return Path(json.loads(done.stdout.strip().splitlines()[-1])["model"])


def server_playbook(folder: Path, name: str, python: str, model: Path, *,
                    max_model_len: int = 512, generate: bool = True,
                    timeout: float = SERVER_TIMEOUT_S) -> Path:
    """A plain ``processes:`` playbook: the real OpenAI API server of the CPU build, ready
    when /health answers, /v1/models serves the model and (``generate``) one request is
    answered; the dflash recipe's fatal patterns."""
    port = free_port()
    ready: dict[str, Any] = {"http": "http://127.0.0.1:${port}/health", "model": str(model),
                             "timeout": timeout}
    if generate:
        ready["generate"] = True
    body = {
        "name": name,
        "params": {"port": port},
        "processes": {"server": {
            "command": [python, "-m", "vllm.entrypoints.openai.api_server", "--model",
                        str(model), "--host", "127.0.0.1", "--port", "${port}",
                        "--max-model-len", str(max_model_len), "--dtype", "bfloat16",
                        # no torch.compile warm-up: /health in ~45 s instead of ~4 min here;
                        # what these tests check is outrig, not vLLM's compiler
                        "--enforce-eager"],
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
            "ready": ready,
            "fatal": list(SERVER_FATAL),
            "stop": {"grace": 30},
        }},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def playbook_port(path: Path) -> int:
    return int(yaml.safe_load(path.read_text())["params"]["port"])


def workdir_of(host: Path) -> Path:
    return Path(yaml.safe_load(host.read_text())["workdir"])


def run_json(host: Path, run_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (workdir_of(host) / "runs" / run_id / "run.json").read_text())
    return data


def quiet() -> Reporter:
    return Reporter(quiet=True)


def journal_in(folder: Path) -> Journal:
    return Journal(folder / "state")




def http(method: str, url: str, body: Any = None, timeout: float = 60
         ) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, headers) of one request on loopback; proxies ignored."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as resp:
            return int(resp.status), resp.read(), {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read(), {k.lower(): v for k, v in exc.headers.items()}


def environ_of(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()


def cmdline_of(pid: int) -> list[str]:
    """argv as /proc shows it, trailing NUL padding dropped (setproctitle pads with NULs)."""
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def group_of(pgid: int) -> list[int]:
    """Live pids of one process group (this test's own server)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            rest = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(rest[2]) == pgid and rest[0] not in (b"Z", b"X"):
            out.append(int(entry.name))
    return sorted(out)
