"""``inv status`` against the stand-ins on the sandbox box: a training run with progress and a
checkpoint, a server that is not ready, a process that exited with a code, one that was
killed; the GPU table names which of our processes holds each GPU."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import deploy
from outrig.ops.status import print_status, status
from outrig.session import Project
from tests.support.network import free_port

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)




def test_status_running_exited_killed_not_ready_with_progress_and_gpus(
        box_host: Path, tmp_path: Path, standin: Any) -> None:
    journal = Journal(tmp_path / "state")
    port = free_port()
    playbook = tmp_path / "job.yaml"
    playbook.write_text(yaml.safe_dump({"name": "job", "processes": {
        "server": {
            "command": [sys.executable, str(standin("fake_vllm")), "serve", "Qwen/Qwen3-8B",
                        "--port", str(port), "--host", "127.0.0.1",
                        "--fake-startup-delay", "60"],
            "gpus": [0], "ready": {"http": f"http://127.0.0.1:{port}/health", "timeout": 120},
            "stop": {"grace": 2}},
        "trainer": {
            "command": [sys.executable, "-u", str(standin("fake_trainer")),
                        "--verifier-name-or-path", "Qwen/Qwen3-8B", "--speculator-type",
                        "dflash", "--save-path", "ckpt", "--epochs", "100",
                        "--fake-steps-per-epoch", "3", "--fake-step-seconds", "0.05"],
            "gpus": [1], "stop": {"grace": 5}},
        "crasher": {"command": [sys.executable, "-c",
                                "import time,sys; print('boom: bad config', flush=True);"
                                " time.sleep(0.3); sys.exit(3)"], "gpus": []},
        "victim": {"command": [sys.executable, "-c",
                               "import os,signal,time; time.sleep(0.3);"
                               " os.kill(os.getpid(), signal.SIGKILL)"], "gpus": []},
    }}))
    quiet = Reporter(quiet=True)
    try:
        deploy(PROJECT, str(box_host), str(playbook), quiet, wait=False, journal=journal)
        deadline = time.monotonic() + 20
        while True:  # until a checkpoint exists and both short-lived ones have ended
            report = status(PROJECT, str(box_host), Reporter(json_mode=True, out=io.StringIO()),
                            journal=journal)
            procs = {p["name"]: p for p in report["runs"][0]["processes"]}
            if ((procs["trainer"].get("checkpoint") or {}).get("path")
                    and procs["crasher"]["state"] != "running"
                    and procs["victim"]["state"] != "running"):
                break
            assert time.monotonic() < deadline, procs
            time.sleep(0.3)

        server, trainer = procs["server"], procs["trainer"]
        assert server["state"] == "running" and server["ready"] is False
        assert server["server"]["health"] is None and server["server"]["health_error"]
        assert trainer["state"] == "running" and trainer["uptime"] > 0
        progress = trainer["progress"]
        assert progress["step"] >= 3 and progress["loss"] > 0
        assert progress["epochs_total"] == 100 and "train/eal" in progress["acceptance"]
        assert progress["total_steps"] == 300 and progress["eta_s"] > 0
        assert trainer["checkpoint"]["path"].endswith("/ckpt/" + trainer["checkpoint"]["name"])
        assert procs["crasher"]["state"] == "exited" and procs["crasher"]["exit_code"] == 3
        assert "boom: bad config" in procs["crasher"]["log_tail"]
        assert procs["victim"]["state"] == "killed" and procs["victim"]["signal"] == 9
        assert "tail_text" not in trainer  # raw text is parsed, then dropped from the document
        gpus = {g["index"]: g for g in report["gpus"]}
        assert trainer["gpus_held"] == [1]
        assert [h["process"] for h in gpus[1]["holders"]] == ["trainer"]
        assert gpus[1]["holders"][0]["ours"] is True
        json.dumps(report)  # one JSON document

        text = io.StringIO()
        human = Reporter(out=text, gpu_table=True)
        human.stdout_console.width = 80
        print_status(human, report)
        shown = text.getvalue()
        for needle in ("exited (3)", "killed (signal 9)", "boom: bad config", "ETA",
                       "newest complete checkpoint", "/health down", "trainer (pid"):
            assert needle in shown, needle
        # at 80 columns only a single unbreakable word (a long path) may run past
        assert [ln for ln in shown.splitlines() if len(ln) > 80 and " " in ln.strip()] == []
        brief = io.StringIO()
        print_status(Reporter(out=brief), report)
        one_line = brief.getvalue()  # the default: the GPUs in one (wrapped) summary
        assert "gpus: 8× NVIDIA L40S 48 GiB" in one_line and "· 1 ours (trainer of run" in one_line
        assert "trainer (pid" not in one_line
    finally:
        cleanup(PROJECT, str(box_host), quiet, all_runs=True, journal=journal)
