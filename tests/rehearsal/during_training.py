"""``evaluate.during_training`` in the shared real training (conftest ``_train_for_real``):
the playbook's section, and ``outrig watch`` following the resumed run in a thread while the
trainer trains, evaluating each new complete checkpoint with the real CPU vLLM on GPU 2 (set
aside; the CPU build ignores it), then the final one once the trainer has ended. What it
saw, and what ``status`` and the report then show, is kept as plain JSON for the tests
(test_evaluate_trained.py)."""

from __future__ import annotations

import io
import json
import re
import threading
from pathlib import Path
from typing import Any

import yaml

from outrig.console import Reporter
from outrig.evaluation.served import SERVED
from outrig.ops.metrics import write_report
from outrig.ops.status import evaluation_lines, status
from outrig.ops.watch import watch
from outrig.ops.watch_record import WatchOptions
from tests.realvllm.evaluating import server_settings
from tests.rehearsal.harness import REAL_GPU, REAL_VLLM_WAIT_S, Rehearsal

SET_ASIDE = [2]  # the box has 3 (fake) GPUs: the server 0, the trainer 1, evaluations 2
EVENTS = ("evaluating", "evaluated", "evaluation_failed")


def evaluate_during_training(playbook: Path, vllm_python: str | None) -> None:
    """Add the ``evaluate:`` section: 4 prompts, 2 at a time, no baseline (each CPU server
    start costs a minute or two; the cached baseline is tests/realvllm's), end-of-epoch
    checkpoints (a server start here outlasts several mid-epoch saves, which rewrite their
    folder: such a measurement is refused, tests/unit/test_during_training.py)."""
    if REAL_GPU or not vllm_python:
        return
    body = yaml.safe_load(playbook.read_text())
    body["evaluate"] = {"requests": 4, "concurrency": 2, "max_tokens": 24, "baseline": False,
                        "settle": 3, "server": server_settings(vllm_python),
                        "during_training": {"every": "epoch", "gpus": SET_ASIDE}}
    playbook.write_text(yaml.safe_dump(body, sort_keys=False))


class Watching:
    """A watch of one run in a thread; what it printed is kept (the docs quote it)."""

    def __init__(self, r: Rehearsal, box: str, run_id: str) -> None:
        self.r, self.box, self.run_id = r, box, run_id
        self.out = io.StringIO()
        self.done: list[dict[str, Any]] = []
        self.error: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="rehearsal-watch", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        try:
            self.done.append(watch(
                self.r.project, self.box, "real", Reporter(out=self.out, err=self.out),
                options=WatchOptions(run_id=self.run_id, period=2.0, threshold=600.0),
                journal=self.r.journal, stop=self.stop))
        except BaseException as exc:  # the record says what went wrong
            self.error.append(f"{type(exc).__name__}: {exc}")

    def evidence(self) -> dict[str, Any]:
        """Wait for the watch to end (the run finished: the evaluation in flight, then the
        final checkpoint), then read what it said, the journal, ``status`` and the report."""
        self.thread.join(REAL_VLLM_WAIT_S * 2)
        if self.thread.is_alive():
            self.stop.set()
            self.thread.join(60)
        record = self.done[0] if self.done else {}
        events = [e for e in record.get("events") or [] if e.get("event") in EVENTS]
        evaluations = self.r.journal.evaluations(run_id=self.run_id)
        shown = status(self.r.project, self.box, Reporter(json_mode=True, out=io.StringIO()),
                       run_id=self.run_id, journal=self.r.journal)
        report = self.r.root / "report.html"
        write_report(Reporter(quiet=True), [self.run_id], output=str(report),
                     journal=self.r.journal)
        html = report.read_text()
        found = re.search(r'id="outrig-data">(.*?)</script>', html, re.S)
        data = json.loads(found.group(1)) if found else {}
        chart = next((c for c in data.get("charts") or [] if SERVED in c.get("metrics", [])),
                     {})
        return {
            "watch_status": record.get("status"), "watch_error": self.error,
            "watch_output": self.out.getvalue(), "events": events,
            "evaluations": [{k: ev.get(k) for k in (
                "eval_id", "acceptance_length", "per_position", "drafts", "server_runs",
                "checkpoint", "num_speculative_tokens")} for ev in evaluations],
            "status_lines": evaluation_lines(shown),
            "status_served": [run.get("served") for run in shown.get("runs") or []
                              if run.get("run_id") == self.run_id],
            "report_chart": chart.get("metrics"),
            "report_served": ((data.get("series") or {}).get(self.run_id) or {}).get(
                SERVED, {}),
        }


def watch_in_thread(r: Rehearsal, box: str, run_id: str) -> Watching:
    return Watching(r, box, run_id)
