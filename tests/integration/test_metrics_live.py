"""The series as ``status``, ``watch`` and ``tail-logs`` feed them, against the sandbox box
(real sshd, the agent, the fake trainer printing speculators' metric lines, the fake
nvidia-smi holding its GPU memory): status keeps the records of its log tails and the run's
GPUs and shows the loss sparkline; watch does the same at every answer; tail-logs' mirror
then gives every record, parsed once; the report of it is written."""

from __future__ import annotations

import io
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.metrics.series import LOSS, SPARKS, by_step
from outrig.metrics.store import MetricStore
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import deploy
from outrig.ops.logs import tail_logs
from outrig.ops.metrics import metrics_export, write_report
from outrig.ops.status import status
from outrig.ops.watch import watch
from outrig.ops.watch_record import WatchOptions
from outrig.session import Project

pytestmark = pytest.mark.integration


def trainer_playbook(tmp_path: Path, standin: Any, epochs: int) -> Path:
    path = tmp_path / "playbooks" / "job.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"name": "job", "processes": {"trainer": {
        "command": [sys.executable, "-u", str(standin("fake_trainer")),
                    "--verifier-name-or-path", "Qwen/Qwen3-8B", "--speculator-type", "dflash",
                    "--save-path", "ckpt", "--epochs", str(epochs),
                    "--fake-steps-per-epoch", "4", "--fake-step-seconds", "0.1"],
        "gpus": [1], "stop": {"grace": 5}}}}))
    return path


def test_status_keeps_the_tails_records_and_gpus_and_shows_the_trend(
        box_host: Path, tmp_path: Path, standin: Any) -> None:
    journal = Journal(tmp_path / "state")
    project = Project(tmp_path)
    playbook = trainer_playbook(tmp_path, standin, epochs=200)
    quiet = Reporter(quiet=True)
    try:
        run_id = deploy(project, str(box_host), str(playbook), quiet, wait=False,
                        journal=journal).plan.run_id
        store = MetricStore(journal, run_id)
        text = ""
        deadline = time.monotonic() + 30
        while len(store.trend("trainer")) < 4:
            assert time.monotonic() < deadline, store.points()
            out = io.StringIO()
            human = Reporter(out=out)
            human.stdout_console.width = 80
            status(project, str(box_host), human, run_id=run_id, journal=journal)
            text = out.getvalue()
            time.sleep(0.5)
        points = store.points()
        assert points and {p.source for p in points} == {"status"}
        steps = [p.step for p in points]
        assert steps == sorted(set(steps))  # each answer adds only the records newer
        trend = re.search(f"loss ([{SPARKS}]+) [0-9.]+", text)
        assert trend is not None, text
        samples = store.gpu_samples()
        assert samples and [g["i"] for g in samples[0]["gpus"]] == [1]  # the plan's GPU only
        assert samples[0]["gpus"][0]["used"] > 0 and samples[0]["gpus"][0]["total"] > 0

        tail_logs(project, str(box_host), quiet, run_id=run_id, follow=False, journal=journal)
        doc = metrics_export(Reporter(out=io.StringIO()), [run_id], fmt="json",
                             journal=journal)
        assert doc["lines_parsed"] > 0
        mirrored = by_step(store.points(), LOSS)
        assert [s for s, _, _ in mirrored] == list(range(mirrored[-1][0] + 1))  # every step
        again = metrics_export(Reporter(out=io.StringIO()), [run_id], fmt="json",
                               journal=journal)
        assert again["lines_parsed"] == 0
        summary = write_report(quiet, [run_id], output=str(tmp_path / "r.html"),
                               journal=journal)
        assert summary["points"] >= len(mirrored) and summary["charts"] > 5
    finally:
        cleanup(project, str(box_host), quiet, all_runs=True, journal=journal)


def test_watch_keeps_the_series_and_gpus_until_the_run_finishes(
        box_host: Path, tmp_path: Path, standin: Any) -> None:
    journal = Journal(tmp_path / "state")
    project = Project(tmp_path)
    playbook = trainer_playbook(tmp_path, standin, epochs=6)
    quiet = Reporter(quiet=True)
    try:
        run_id = deploy(project, str(box_host), str(playbook), quiet, journal=journal
                        ).plan.run_id
        done: list[Any] = []
        thread = threading.Thread(target=lambda: done.append(watch(
            project, str(box_host), "job", Reporter(json_mode=True, out=io.StringIO()),
            options=WatchOptions(period=0.5), journal=journal)), daemon=True)
        thread.start()
        thread.join(120)
        assert not thread.is_alive() and done and done[0]["status"] == "finished"
        store = MetricStore(journal, run_id)
        points = store.points()
        assert len(points) >= 4 and {p.source for p in points} == {"status"}
        assert store.gpu_samples()
        assert len(store.trend("trainer")) >= 4
    finally:
        cleanup(project, str(box_host), quiet, all_runs=True, journal=journal)
