"""Hangs on real sshd sandboxes behind the latency proxy at 240 ms: a SIGSTOPped trainer and a
vLLM stand-in whose engine froze with a request running are ``hung`` after the playbook's
confirmations (``status`` shows it, with the evidence), and ``watch`` restarts or moves them;
a 30 s stall of the link is never a hang (docs/watch.md#hangs).

The watch runs in a thread of the test; the tests wait for its events and records, and for
what status answers, never for a time."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.hang.store import hang_file
from outrig.journal import Journal, read_json
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import deploy
from outrig.ops.status import status
from outrig.ops.watch_record import WatchOptions
from outrig.sandbox.box import SandboxBox
from outrig.sandbox.proxy import LatencyProxy
from outrig.session import Project
from tests.support.network import free_port
from tests.support.runs import STANDINS, resumed_log, wait_checkpoints, write_playbooks
from tests.support.watching import Running

pytestmark = [pytest.mark.integration,
              pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")]
RTT_HALF = 0.12  # one-way delay: a 240 ms round trip, a far-away box
FAST = {"confirmations": 3, "interval": 1.0, "log": {"floor": 3.0, "factor": 3.0, "learn": 2}}


def behind_proxy(box: SandboxBox, tmp_path: Path, proxy: LatencyProxy) -> Path:
    path = box.write_host_file(tmp_path / "hosts" / "a.yaml", workdir=box.workdir)
    config = yaml.safe_load(path.read_text())
    config["port"] = proxy.port
    path.write_text(yaml.safe_dump(config))
    return path


def with_hang(project: Project, name: str, hang: dict[str, Any]) -> None:
    book = project.playbooks_dir / f"{name}.yaml"
    data = yaml.safe_load(book.read_text())
    data["hang"] = hang
    book.write_text(yaml.safe_dump(data, sort_keys=False))


def trainer_job(box: SandboxBox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                proxy: LatencyProxy) -> tuple[Project, Journal, Path, str]:
    """mig-4gpu (the vLLM and trainer stand-ins) on ``box`` through ``proxy``, with fast
    hang settings, running until its first checkpoint."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    project = write_playbooks(tmp_path / "proj", free_port())
    with_hang(project, "mig-4gpu", FAST)
    journal = Journal()
    a = behind_proxy(box, tmp_path, proxy)
    first = deploy(project, str(a), "mig-4gpu", Reporter(quiet=True), journal=journal)
    wait_checkpoints(box.workdir / "ckpt", 1)
    return project, journal, a, first.plan.run_id


def record(workdir: Path, run_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((workdir / "runs" / run_id / "run.json").read_text())
    return data


def process(result: dict[str, Any], name: str) -> dict[str, Any]:
    run = result["runs"][0]
    return next(p for p in run["processes"] if p["name"] == name)


def test_a_stopped_trainer_is_hung_after_the_confirmations_and_restarted(
        box_a: SandboxBox, tmp_path: Path, make_proxy: Callable[..., LatencyProxy],
        monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = make_proxy(box_a.port, one_way_delay=RTT_HALF)
    project, journal, a, run_id = trainer_job(box_a, tmp_path, monkeypatch, proxy)
    quiet = Reporter(quiet=True)
    try:
        for _ in range(3):  # a healthy run: nothing holds, whatever the samples' spacing
            healthy = status(project, str(a), quiet, run_id=run_id, journal=journal)
            assert "hung" not in process(healthy, "trainer"), process(healthy, "trainer")
        trainer = next(p for p in record(box_a.workdir, run_id)["processes"]
                       if p["name"] == "trainer")
        os.killpg(trainer["pgid"], signal.SIGSTOP)  # the job stops; the box answers on
        seen: list[int] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            answer = process(status(project, str(a), quiet, run_id=run_id, journal=journal),
                             "trainer")
            verdict = answer.get("hung") or {}
            stopped = [e for e in verdict.get("evidence") or [] if e["signal"] == "stopped"]
            if stopped:
                seen.append(stopped[0]["confirmations"])
            if verdict.get("hung"):
                break
        assert verdict.get("hung"), verdict
        assert answer["state"] == "running", "the process lives: hung, not dead"
        assert verdict["signal"] == "stopped" and seen[0] == 1 and seen[-1] == 3, seen
        assert seen == sorted(seen), "one confirmation at a time"
        assert all(e["needed"] == 3 for e in verdict["evidence"])

        alone = Running(project, str(a), journal, WatchOptions(period=0.5), "mig-4gpu")
        alone.thread.join(120)  # no restart, no spare: the hang is reported, the watch fails
        assert alone.events() == ["hung", "failed"], alone.events()
        assert "the run hangs and no spare took the job" in alone.notifier.sent[1]["why"]
        assert alone.error is not None and f"run {run_id} on {a} is hung" in str(alone.error)
        assert "--restarts N or --spare HOST" in str(alone.error)

        running = Running(project, str(a), journal, WatchOptions(restarts=1, period=0.5),
                          "mig-4gpu")
        try:
            hung = running.wait_event("hung")
            assert hung["run_id"] == run_id and hung["processes"][0]["process"] == "trainer"
            assert "stopped" in hung["why"]
            running.wait_event("restarting")
            again = running.wait_record(lambda r: r.get("run_id") != run_id
                                        and (r.get("progress") or {}).get("state") == "running")
            assert "Resuming training" in resumed_log(box_a.workdir, again["run_id"])
            events = running.events()
            assert events[:2] == ["hung", "restarting"], events
            assert "dead" not in events and "migrating" not in events
        finally:
            running.end()
        assert running.error is None
        assert not any(os.path.exists(f"/proc/{p['pid']}") and _live(p["pid"])
                       for p in record(box_a.workdir, run_id)["processes"]), \
            "the stopped run was stopped for good by the restart"
    finally:
        cleanup(project, str(a), quiet, all_runs=True, journal=journal)


def _live(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def server_playbook(project_root: Path, port: int) -> Project:
    """One vLLM stand-in whose engine freezes while ``${workdir}/freeze`` exists."""
    (project_root / "playbooks").mkdir(parents=True)
    book = {
        "name": "srv", "params": {"port": port},
        "stage": {"ckpt": {"path": "${workdir}/ckpt", "kind": "checkpoints"}},
        "hang": {"confirmations": 3, "interval": 1.0},
        "processes": {"server": {
            "command": [sys.executable, str(STANDINS / "fake_vllm.py"), "serve", "m",
                        "--port", "${port}", "--fake-startup-delay", "0.2"],
            "env": {"FAKE_VLLM_FREEZE_FILE": "${workdir}/freeze"},
            "gpus": [0],
            "ready": {"http": "http://127.0.0.1:${port}/health", "timeout": 60},
            "stop": {"grace": 5}}}}
    (project_root / "playbooks" / "srv.yaml").write_text(yaml.safe_dump(book, sort_keys=False))
    return Project(project_root)


def metrics(port: int) -> dict[str, float]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{")[0].split()[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def long_request(port: int) -> threading.Thread:
    """A request that generates for ever (until the server goes), sent in a thread."""
    body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 10 ** 9}).encode()

    def send() -> None:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with contextlib.suppress(OSError):
            opener.open(request, timeout=600).read()

    thread = threading.Thread(target=send, name="test-long-request", daemon=True)
    thread.start()
    return thread


def test_a_server_whose_counters_freeze_with_a_request_running_is_hung_and_moved(
        box_a: SandboxBox, host_b: Path, tmp_path: Path,
        make_proxy: Callable[..., LatencyProxy], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    port = free_port()
    project = server_playbook(tmp_path / "proj", port)
    proxy = make_proxy(box_a.port, one_way_delay=RTT_HALF)
    a = behind_proxy(box_a, tmp_path, proxy)
    journal = Journal()
    quiet = Reporter(quiet=True)
    first = deploy(project, str(a), "srv", quiet, journal=journal)
    running = Running(project, str(a), journal, WatchOptions(spares=[str(host_b)],
                                                             period=0.5), "srv")
    try:
        long_request(port)
        deadline = time.monotonic() + 60
        while metrics(port).get("vllm:num_requests_running", 0) < 1:
            assert time.monotonic() < deadline, metrics(port)
            time.sleep(0.1)
        running.wait_record(lambda r: (r.get("progress") or {}).get("state") == "running")
        store = hang_file(journal, first.plan.run_id)
        deadline = time.monotonic() + 60  # the watch has judged the server at work
        while not (isinstance(read_json(store), dict) and read_json(store)["verdicts"]):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert "hung" not in running.events(), "a server at work is not hung"
        (box_a.workdir / "freeze").touch()  # the engine wedges inside a step
        frozen = metrics(port)
        while True:  # the step under way when the file came may still finish
            time.sleep(0.5)
            now = metrics(port)
            if now == frozen:
                break
            frozen = now
        assert frozen["vllm:num_requests_running"] >= 1
        progress = (frozen["vllm:iteration_tokens_total_count"]
                    + frozen["vllm:generation_tokens_total"])

        hung = running.wait_event("hung")
        assert hung["run_id"] == first.plan.run_id
        evidence = hung["processes"][0]["evidence"]
        counters = next(e for e in evidence if e["signal"] == "counters")
        assert counters["confirmations"] == 3 == counters["needed"], evidence
        assert f"stood at {progress:.0f}" in hung["why"]
        migrating = running.wait_event("migrating")
        assert migrating["to"] == str(host_b)
        resumed = running.wait_event("resumed")
        moved = running.wait_record(lambda r: r.get("host") == str(host_b)
                                    and (r.get("progress") or {}).get("state") == "running")
        assert resumed["run_id"] == moved["run_id"] != first.plan.run_id
        events = running.events()
        assert events[:3] == ["hung", "migrating", "resumed"], events
        assert "dead" not in events
        old = record(box_a.workdir, first.plan.run_id)
        assert all(p.get("stopped_by") for p in old["processes"]), \
            "the move stopped the hung server on A (the box answered)"
        assert (metrics(port)["vllm:num_requests_running"] == 0), "B's server is a new one"
    finally:
        running.end()
        cleanup(project, str(host_b), quiet, all_runs=True, journal=journal)
        cleanup(project, str(a), quiet, all_runs=True, journal=journal)
    assert running.error is None


def test_a_30s_link_stall_is_never_a_hang(
        box_a: SandboxBox, tmp_path: Path, make_proxy: Callable[..., LatencyProxy],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The link holds every byte for 30 s (the trainer logs on, the box is fine): the watch
    may find the box suspect, but no hang signal holds when the answers come back, because
    every fact the judge reads is the box's own, on the box's clock, and a missing answer
    confirms nothing. One confirmation is enough here: any sample in which a signal held
    would call the hang."""
    proxy = make_proxy(box_a.port, one_way_delay=RTT_HALF)
    project, journal, a, run_id = trainer_job(box_a, tmp_path, monkeypatch, proxy)
    with_hang(project, "mig-4gpu", {**FAST, "confirmations": 1})  # one stale look would do
    running = Running(project, str(a), journal, WatchOptions(threshold=60, period=0.5),
                      "mig-4gpu")
    store = hang_file(journal, run_id)
    try:
        running.wait_record(lambda r: (r.get("progress") or {}).get("state") == "running")
        deadline = time.monotonic() + 60
        while not (isinstance(read_json(store), dict) and read_json(store)["verdicts"]):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        proxy.stall_all(30)
        stalled_at = time.time()
        time.sleep(31)  # the stall itself: what the test is about
        deadline = time.monotonic() + 60  # then answers judged after the stall, three times
        judged = 0
        last = 0.0
        while judged < 3:
            assert time.monotonic() < deadline, read_json(store)
            data = read_json(store)
            if isinstance(data, dict) and data["at"] > max(last, stalled_at + 30):
                last = data["at"]
                judged += 1
                assert not any(v["hung"] or v["evidence"] for v in data["verdicts"]), data
            time.sleep(0.2)
        assert "hung" not in running.events(), running.events()
        assert "dead" not in running.events()
    finally:
        running.end()
        cleanup(project, str(a), Reporter(quiet=True), all_runs=True, journal=journal)
    assert running.error is None
