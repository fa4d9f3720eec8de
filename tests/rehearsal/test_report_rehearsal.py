"""``outrig report`` of a real training: the real speculators trainer on CPU (the stand-in
serves hidden states), watched with ``status`` on its box, moved midway by ``migrate`` to a
second box where it resumes, its logs mirrored by ``tail-logs``. The report's curve goes on
across the move (aligned by step), its GPU charts hold what status sampled, its timeline
the deploy, checkpoints, move and resume; opened in headless Chromium it draws without an
error. ``OUTRIG_REPORT_SHOT=PATH`` keeps its screenshot there (docs/report-rehearsal.png is
one)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from outrig.metrics.series import LOSS, by_step
from outrig.metrics.store import MetricStore
from outrig.ops.logs import tail_logs
from outrig.ops.metrics import write_report
from outrig.ops.migrate import migrate
from outrig.ops.status import status
from tests.rehearsal.harness import Rehearsal, mid_epoch_link
from tests.support.browser import Browser, find_chromium

SAMPLE_EVERY = 11.0  # seconds between two status calls (the store keeps one GPU sample / 10 s)


def watch_a_while(r: Rehearsal, box: str, run_id: str, until: float) -> int:
    """``status`` of the run now and then until ``until`` (monotonic); how many calls."""
    calls = 0
    while True:
        status(r.project, box, r.reporter, run_id=run_id, journal=r.journal)
        calls += 1
        if time.monotonic() >= until:
            return calls
        time.sleep(max(0.0, min(SAMPLE_EVERY, until - time.monotonic())))


def test_the_report_of_a_real_training_moved_midway(rehearsal: Rehearsal,
                                                    tmp_path: Path) -> None:
    r = rehearsal
    old, new = "cpu-box", r.add_box("new-box")
    playbook = r.playbook("movable", data_path="${workdir}/data/tokenized",
                          save_path="${workdir}/data/checkpoints", checkpoint_freq=0.5)
    old_save = r.workdir(old) / "data" / "checkpoints"
    first = r.deploy(old, playbook)
    old_run = first.plan.run_id
    r.wait_log(old, old_run, "trainer", "global_step=1")
    status(r.project, old, r.reporter, run_id=old_run, journal=r.journal)
    # moved as soon as the first mid-epoch checkpoint is there (the migrate test's timing:
    # a CPU epoch is short, and its link is gone once the epoch ends)
    r.wait_checkpoint(mid_epoch_link, "mid-epoch checkpoint link", save=old_save)
    status(r.project, old, r.reporter, run_id=old_run, journal=r.journal)

    report = migrate(r.project, old, new, r.reporter, playbook=str(playbook),
                     journal=r.journal, probe_attempts=1)
    new_run = report["run_id"]
    r.wait_log(new, new_run, "trainer", "Resuming")
    deadline = time.monotonic() + 900
    while r.exit_code(new, new_run, "trainer") is None and time.monotonic() < deadline:
        watch_a_while(r, new, new_run, time.monotonic() + SAMPLE_EVERY)
    assert r.wait_exit(new, new_run, "trainer") == 0

    for box, run_id in ((old, old_run), (new, new_run)):
        tail_logs(r.project, box, r.reporter, run_id=run_id, follow=False, journal=r.journal)
    out = tmp_path / "report.html"
    summary = write_report(r.reporter, [old_run], output=str(out), journal=r.journal)
    assert summary["runs"] == sorted([old_run, new_run])

    old_loss = by_step(MetricStore(r.journal, old_run).points(), LOSS)
    new_loss = by_step(MetricStore(r.journal, new_run).points(), LOSS)
    assert old_loss and new_loss
    # the new box resumed from the old box's newest complete checkpoint: its first step
    # follows one the old box trained, so by step the curve goes on
    assert old_loss[0][0] == 0 and new_loss[0][0] <= old_loss[-1][0] + 1
    assert new_loss[-1][0] > old_loss[-1][0]
    assert all(t is not None for _, t, _ in old_loss + new_loss)
    assert MetricStore(r.journal, old_run).gpu_samples()
    assert MetricStore(r.journal, new_run).gpu_samples()

    html = out.read_text()
    doc = json.loads(re.search(r'id="outrig-data">(.*?)</script>', html, re.S).group(1)
                     .replace("\\u003c", "<").replace("\\u003e", ">").replace("\\u0026", "&"))
    kinds = {(e["run_id"], e["kind"]) for e in doc["events"]}
    assert {(old_run, "deploy"), (old_run, "checkpoint"), (old_run, "migrate"),
            (new_run, "deploy"), (new_run, "resume")} <= kinds
    executable = find_chromium()
    if executable is None:
        return  # the browser half is tests/unit/test_report_browser.py's (skipped there)
    browser = Browser(executable)
    try:
        browser.open_page(1280, 900)
        browser.navigate(out.resolve().as_uri())
        state = browser.evaluate("({done: window.outrigReport.done, errors: "
                                 "window.outrigReport.errors, charts: "
                                 "window.outrigReport.charts.filter(c => c.drawn).length})")
        assert state["done"] and state["errors"] == [] and browser.console_errors() == []
        assert state["charts"] == 2 * len(doc["charts"]) + 2  # + GPU memory and utilisation
        shot = Path(os.environ.get("OUTRIG_REPORT_SHOT") or tmp_path / "report.png")
        browser.screenshot(shot, height=1500)
        if os.environ.get("OUTRIG_REPORT_SHOT"):
            (shot.with_suffix(".html")).write_text(html)
    finally:
        browser.close()
