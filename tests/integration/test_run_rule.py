"""docs/cli.md, "Which run a command means", across commands on the real sshd sandbox: a
playbook whose ``name:`` differs from its file name (``playbooks/a.yaml`` with ``name: b``)
is the same playbook for deploy, status, tail-logs, watch, cleanup, sync-checkpoints and
forward, however it is named;
a failed run of another playbook does not make a plain tail-logs ambiguous; and a watch
started again after a redeploy follows the new run with its own flags."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.journal import Journal, atomic_write_json, read_json
from outrig.ops.watch import watch
from outrig.ops.watch_record import WatchOptions, watch_file
from outrig.session import Project
from tests.support.cli import deployed, outrig
from tests.support.network import free_port
from tests.support.processes import alive
from tests.support.trees import checkpoint

pytestmark = pytest.mark.integration
BEATS = ("import time\nfor i in range(3000):\n    print('beat', i, flush=True)\n"
         "    time.sleep(0.2)\n")
SHORT = ("import time\nfor i in range({n}):\n    print('tick', i, flush=True)\n"
         "    time.sleep(0.5)\n")


def book(project: Path, stem: str, name: str, code: str, ready: str) -> None:
    (project / "playbooks" / f"{stem}.yaml").write_text(yaml.safe_dump({
        "name": name, "processes": {"beat": {
            "command": [sys.executable, "-u", "-c", code], "gpus": [],
            "ready": {"log": ready, "timeout": 60}}}}))


@pytest.fixture
def project(box_project: Path, box_host: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The sandbox as ``--host sandbox``: ``a.yaml`` (name: b) beating for ten minutes,
    ``dud.yaml`` whose process exits at start, ``fin.yaml`` (name: done) ticking a few
    seconds and exiting 0, and ``short.yaml`` (name: short) as fin; the current folder is the
    project."""
    book(box_project, "a", "b", BEATS, "beat 0")
    book(box_project, "dud", "dud", "import sys; sys.exit(3)", "never printed")
    book(box_project, "fin", "done", SHORT.format(n=12), "tick 0")
    book(box_project, "short", "short", SHORT.format(n=12), "tick 0")
    monkeypatch.chdir(box_project)
    for var in ("OUTRIG_HOST", "OUTRIG_PLAYBOOK", "OUTRIG_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    assert box_host.stem == "sandbox"
    return box_project


def test_a_playbook_named_unlike_its_file_is_one_playbook_for_every_command(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: deploy --playbook a worked, then status/tail-logs/watch --playbook a said
    "playbook a has no current run" (they looked for runs filed as a)."""
    run = deployed("a", capsys)
    run_id, pid = run["run_id"], run["processes"][0]["pid"]
    assert run_id.startswith("b-")
    for spelling in ("a", "b", "playbooks/a.yaml"):
        code, out, err = outrig(["status", "--host", "sandbox", "--playbook", spelling,
                                 "--json"], capsys)
        assert code == 0, (spelling, err)
        assert [r["run_id"] for r in json.loads(out)["runs"]] == [run_id], spelling
        code, out, err = outrig(["tail-logs", "--host", "sandbox", "--playbook", spelling,
                                 "--no-follow", "--lines", "1"], capsys)
        assert code == 0, (spelling, err)
        assert out.startswith("beat | beat "), (spelling, out)
    code, out, err = outrig(["cleanup", "--host", "sandbox", "--playbook", "a", "--json"],
                            capsys)
    assert code == 0, err
    assert not alive(pid), "cleanup --playbook a stopped the run filed as b"


def test_a_watch_of_a_playbook_named_unlike_its_file_follows_its_run(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_id = deployed("fin", capsys)["run_id"]
    code, out, err = outrig(["watch", "--host", "sandbox", "--playbook", "fin", "--json"],
                            capsys)
    assert code == 0, err
    assert f"watching {run_id} on sandbox" in err
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [e["event"] for e in events if e.get("event") == "finished"] == ["finished"]
    assert {e["run_id"] for e in events} == {run_id}


def test_a_failed_run_of_another_playbook_leaves_the_one_live_run_to_plain_commands(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: tail-logs without --run/--playbook failed with "several current runs" once
    another playbook's deploy had failed; now it takes the live run, and status shows
    both. Two live runs still exit 2, naming each run and the flags that pick one."""
    live = deployed("a", capsys)["run_id"]
    code, _, err = outrig(["deploy", "--host", "sandbox", "--playbook", "dud"], capsys)
    assert code == 1, err
    code, out, err = outrig(["tail-logs", "--host", "sandbox", "--no-follow", "--lines", "1"],
                            capsys)
    assert code == 0, err
    assert out.startswith("beat | beat "), out
    code, out, err = outrig(["status", "--host", "sandbox", "--json"], capsys)
    assert code == 0, err
    runs = {r["playbook"]: r["run_id"] for r in json.loads(out)["runs"]}
    assert runs["b"] == live and "dud" in runs
    other = deployed("fin", capsys)["run_id"]
    code, out, err = outrig(["tail-logs", "--host", "sandbox", "--no-follow"], capsys)
    assert code == 2, err
    assert live in err and other in err and "dud" in err, err
    assert "--run RUN_ID" in err and "--playbook NAME" in err and "2 of them live" in err


def test_a_watch_after_a_redeploy_follows_the_new_run_with_its_own_flags(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An interrupted watch left its record for run 1; a redeploy stopped run 1 on purpose.
    Before: the next watch carried on the old one, reported run 1 `failed: killed by signal
    15`, dropped its --spare and exited 1. Now it follows run 2 with the new --spare. (A
    playbook named after its file: this is the watch's own rule, not the name's.)"""
    first = deployed("short", capsys)["run_id"]
    journal = Journal()
    saved = watch_file(journal, "sandbox", "short")
    atomic_write_json(saved, {"origin": "sandbox", "host": "sandbox", "playbook": "short",
                              "run_id": first, "spares": [], "restarts": 0,
                              "restarts_used": 0, "mirrored": None, "mirror_tried": None,
                              "moved": [], "events": [], "status": "watching",
                              "started": 1.0})
    second = deployed("short", capsys)["run_id"]
    assert second != first
    code, out, err = outrig(["watch", "--host", "sandbox", "--playbook", "short", "--spare",
                             "sandbox", "--json"], capsys)
    assert code == 0, err
    assert f"the saved watch of short followed run {first}" in err, err
    assert f"watching {second} on sandbox (spares: sandbox)" in err, err
    record = read_json(saved)
    assert isinstance(record, dict)
    assert record["run_id"] == second and record["spares"] == ["sandbox"]
    assert record["status"] == "finished" and record["started"] != 1.0
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert "failed" not in [e.get("event") for e in events]


def test_a_watch_started_again_for_the_same_run_carries_it_on_and_says_so(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same run: the saved watch is carried on (its start time kept), the command
    line's --restarts replaces the saved one, and a heartbeat line appears."""
    run_id = deployed("fin", capsys)["run_id"]
    journal = Journal()
    saved = watch_file(journal, "sandbox", "done")
    atomic_write_json(saved, {"origin": "sandbox", "host": "sandbox", "playbook": "done",
                              "run_id": run_id, "spares": ["elsewhere"], "restarts": 0,
                              "restarts_used": 0, "mirrored": None, "mirror_tried": None,
                              "moved": [], "events": [], "status": "watching",
                              "started": 1.0})
    err = io.StringIO()
    watch(Project(project), "sandbox", "done", Reporter(err=err), journal=journal,
          options=WatchOptions(restarts=2, period=0.5, beat_every=0.0))
    text = err.getvalue()
    assert (f"carrying on the saved watch of done (begun on sandbox): it follows the current "
            f"run {run_id}") in text, text
    assert "spares left elsewhere, restarts used 0 of 2 (as this command line says)" in text
    beats = [line for line in text.splitlines()
             if line.startswith(f"  sandbox {run_id}: ") and " · " in line]
    assert beats and ("the box answered" in beats[0] or "no answer" in beats[0]), text
    record = read_json(saved)
    assert isinstance(record, dict)
    assert record["started"] == 1.0 and record["restarts"] == 2
    assert record["status"] == "finished"


def test_sync_checkpoints_of_a_playbook_named_unlike_its_file_pulls_its_run(
        project: Path, box_host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``ck.yaml`` (name: ckb) with a checkpoints item: sync-checkpoints --playbook ck, then
    --playbook ckb, then with no --playbook (the newest run's) all mean the one playbook:
    the first pulls the box's complete checkpoint, the next two find nothing new."""
    workdir = Path(yaml.safe_load(box_host.read_text())["workdir"])
    (project / "playbooks" / "ck.yaml").write_text(yaml.safe_dump({
        "name": "ckb", "stage": {"ckpt": {"path": "${workdir}/ckpt", "kind": "checkpoints"}},
        "processes": {"beat": {"command": [sys.executable, "-u", "-c", BEATS], "gpus": [],
                               "ready": {"log": "beat 0", "timeout": 60}}}}))
    run_id = deployed("ck", capsys)["run_id"]
    assert run_id.startswith("ckb-")
    checkpoint(workdir / "ckpt", 0)  # complete, settled ten minutes ago
    pulled = []
    for spelling in (["--playbook", "ck"], ["--playbook", "ckb"], []):
        code, out, err = outrig(["sync-checkpoints", "--host", "sandbox", *spelling,
                                 "--json"], capsys)
        assert code == 0, (spelling, err)
        document = json.loads(out.splitlines()[-1])
        assert document["playbook"] == "ckb", (spelling, document)
        pulled.append(len(document["pulled"]))
    assert pulled == [1, 0, 0], pulled
    code, _, err = outrig(["cleanup", "--host", "sandbox", "--playbook", "ck", "--json"],
                          capsys)
    assert code == 0, err


def test_forward_of_a_playbook_named_unlike_its_file_reaches_its_server(
        project: Path, capsys: pytest.CaptureFixture[str], procs: Any) -> None:
    """``web.yaml`` (name: site) serving HTTP: forward --playbook web and --playbook site
    both find its running run, name it, and carry a request to its server."""
    port = free_port()
    (project / "playbooks" / "web.yaml").write_text(yaml.safe_dump({
        "name": "site", "processes": {"server": {
            "command": [sys.executable, "-m", "http.server", str(port), "--bind",
                        "127.0.0.1"], "gpus": [],
            "ready": {"http": f"http://127.0.0.1:{port}/", "timeout": 60}}}}))
    run_id = deployed("web", capsys)["run_id"]
    assert run_id.startswith("site-")
    command = str(Path(sys.executable).with_name("outrig"))
    for spelling in ("web", "site"):
        forwarding = procs.spawn([command, "forward", "--host", "sandbox", "--playbook",
                                  spelling, "--process", "server", "--json"],
                                 cwd=project, stdout=subprocess.PIPE, text=True)
        assert forwarding.stdout is not None
        event = json.loads(forwarding.stdout.readline())
        assert event["event"] == "forwarding", (spelling, event)
        assert f"process server of run {run_id}" in event["what"], (spelling, event)
        with urllib.request.urlopen(event["url"], timeout=60) as answer:
            assert answer.status == 200, spelling
        forwarding.send_signal(signal.SIGINT)
        assert forwarding.wait(timeout=30) == 130, spelling
    code, _, err = outrig(["cleanup", "--host", "sandbox", "--playbook", "web", "--json"],
                          capsys)
    assert code == 0, err
