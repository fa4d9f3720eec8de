"""``outrig runs`` and the fallbacks for a box that is gone, against real sshd boxes: the
shared sandbox (``--host sandbox``) stays up, box A (its own sshd) is stopped mid-run.

``runs`` must show both boxes' runs, the sandbox's reconciled now and A's as last seen
("not seen since T", with the progress and checkpoint a status saw); ``tail-logs --run R
--no-follow`` of A's run shows the local mirror and says so (exit 0); ``status --run R`` of
it shows the journal's last known state, marked, and exits 1."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.journal import Journal
from outrig.sandbox.box import SandboxBox
from tests.support.cli import outrig
from tests.support.runs import kill_run

pytestmark = pytest.mark.integration
SECRET = "hf_HISTORYsecret0123456789"
LEAKY = "import os, time\nprint('token', os.environ['HF_TOKEN'], flush=True)\ntime.sleep(600)\n"


@pytest.fixture
def project(box_project: Path, box_host: Path, box_a: SandboxBox, standin: Any,
            monkeypatch: pytest.MonkeyPatch) -> Path:
    """``sandbox`` and ``a`` as hosts; ``train`` (a trainer that saves checkpoints) and
    ``once`` (one process that prints and exits 0) as playbooks."""
    box_a.write_host_file(box_project / "hosts" / "a.yaml", workdir=box_a.workdir)
    books = {
        "train": {"trainer": {
            "command": [sys.executable, "-u", str(standin("fake_trainer")),
                        "--verifier-name-or-path", "m", "--save-path", "ckpt",
                        "--epochs", "1000", "--fake-steps-per-epoch", "2",
                        "--fake-step-seconds", "0.05"],
            "gpus": [0], "ready": {"log": "global_step=", "timeout": 60},
            "stop": {"grace": 5}},
            "leaky": {"command": [sys.executable, "-u", "-c", LEAKY], "gpus": []}},
        "once": {"hello": {"command": [sys.executable, "-c",
                                       "print('hello from once', flush=True)"], "gpus": []}},
    }
    for name, processes in books.items():
        (box_project / "playbooks" / f"{name}.yaml").write_text(yaml.safe_dump(
            {"name": name, "processes": processes, "secrets": ["HF_TOKEN"]}))
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.chdir(box_project)
    for var in ("OUTRIG_HOST", "OUTRIG_PLAYBOOK", "OUTRIG_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    return box_project


def deployed(host: str, playbook: str, capsys: pytest.CaptureFixture[str]) -> str:
    code, out, err = outrig(["deploy", "--host", host, "--playbook", playbook, "--json"],
                            capsys)
    assert code == 0, err
    return next(json.loads(line)["run_id"] for line in out.splitlines()
                if json.loads(line).get("event") == "deployed")


def status_until_checkpoint(host: str, run_id: str, capsys: pytest.CaptureFixture[str],
                            timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        code, out, err = outrig(["status", "--host", host, "--run", run_id, "--json"], capsys)
        assert code == 0, err
        trainer = next(p for p in json.loads(out)["runs"][0]["processes"]
                       if p["name"] == "trainer")
        if (trainer.get("checkpoint") or {}).get("path") and (trainer.get("progress") or {}) \
                .get("step"):
            return dict(trainer)
        assert time.monotonic() < deadline, trainer
        time.sleep(0.3)


def test_runs_lists_every_box_and_marks_a_stopped_one_not_seen_since(
        project: Path, box_a: SandboxBox, capsys: pytest.CaptureFixture[str]) -> None:
    on_sandbox = deployed("sandbox", "train", capsys)
    on_a = deployed("a", "train", capsys)
    trainer = status_until_checkpoint("a", on_a, capsys)
    code, out, err = outrig(["tail-logs", "--host", "a", "--run", on_a, "--no-follow"], capsys)
    assert code == 0 and "global_step=" in out and "leaky" in out, err
    assert SECRET not in out
    mirrored = [line for line in out.splitlines() if line.startswith("trainer")]

    box_a.stop()  # the box is gone: no sshd, no processes
    kill_run(box_a.workdir, on_a)

    code, out, err = outrig(["runs", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    rows = {r["run_id"]: r for r in doc["runs"]}
    assert list(rows)[:2] == [on_a, on_sandbox]  # newest first
    here, gone = rows[on_sandbox], rows[on_a]
    assert here["seen_now"] and here["state"] == "running" and here["host"] == "sandbox"
    assert not gone["seen_now"] and gone["state"] == "running"  # as last seen
    assert gone["seen_at"] is not None and gone["seen_at"] <= time.time()
    assert gone["progress"]["step"] >= 1
    assert gone["checkpoint"]["name"] == trainer["checkpoint"]["name"] or \
        int(gone["checkpoint"]["name"]) >= int(trainer["checkpoint"]["name"])
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert hosts["a"]["contacted"] and not hosts["a"]["answered"] and hosts["a"]["error"]
    assert hosts["sandbox"]["answered"]

    code, out, err = outrig(["runs"], capsys)
    assert code == 0, err
    assert "not seen since" in out and "a did not answer:" in out
    # 80 columns, but for a path longer than that on a line of its own (never cut)
    assert all(len(line) <= 80 or " " not in line.strip() for line in out.splitlines()), out

    # tail-logs of the gone box's run: the mirror, said to be that, exit 0
    code, out, err = outrig(["tail-logs", "--host", "a", "--run", on_a, "--no-follow"], capsys)
    assert code == 0, err
    assert "local mirror" in err and "could not be read" in err
    assert [line for line in out.splitlines() if line.startswith("trainer")] == mirrored
    assert "token" in out and SECRET not in out + err  # the mirror's secret stays hidden
    code, out, err = outrig(["tail-logs", "--host", "a", "--run", on_a, "--no-follow",
                             "--lines", "1"], capsys)
    assert code == 0 and out.splitlines()[-1:] == mirrored[-1:], (out, err)
    assert len(out.splitlines()) == 2  # one line of each process

    # status of it: the journal's last known state, marked, exit 1
    code, out, err = outrig(["status", "--host", "a", "--run", on_a], capsys)
    assert code == 1
    text = " ".join(out.split())
    assert f"run {on_a} (train) on a: running as last seen at" in text
    assert "journal's last known state" in text and "checkpoint:" in text and "step" in text
    assert "error:" in err
    code, out, err = outrig(["status", "--host", "a", "--run", on_a, "--json"], capsys)
    assert code == 1
    doc = json.loads(out)
    assert doc["source"] == "journal" and doc["run"]["run_id"] == on_a


def test_a_finished_run_is_listed_with_its_length_and_its_logs_still_read(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_id = deployed("sandbox", "once", capsys)
    deadline = time.monotonic() + 20
    while True:
        code, out, err = outrig(["runs", "--json"], capsys)
        assert code == 0, err
        row = next(r for r in json.loads(out)["runs"] if r["run_id"] == run_id)
        if row["state"] == "finished":
            break
        assert time.monotonic() < deadline, row
        time.sleep(0.3)
    assert row["seen_now"] and row["duration_s"] is not None and row["ended_at"]
    code, out, err = outrig(["tail-logs", "--host", "sandbox", "--run", run_id, "--no-follow"],
                            capsys)
    assert code == 0 and "hello from once" in out, err
    assert "local mirror" not in err  # the box answered: read from it, as always

    # --playbook narrows; a playbook without runs gives an empty list, exit 0
    code, out, err = outrig(["runs", "--playbook", "train", "--json"], capsys)
    assert code == 0 and json.loads(out)["runs"] == [], err
    assert Journal().run(run_id) is not None
