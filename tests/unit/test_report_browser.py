"""The report opened in a real headless Chromium (the system's, started by the test and
driven over the DevTools protocol, tests/support/browser.py): no console error, no request
but the file itself, every chart drawn with as many points as the document holds for its
metrics, the canvases painted, the timeline complete, and a screenshot kept as the test's
artefact (``OUTRIG_TEST_ARTEFACTS``, else the test's temporary folder).

Skipped, with the reason, only where no Chromium is installed (``make test`` installs it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.metrics.store import remember_samples
from outrig.ops.metrics import write_report
from outrig.ops.watch_record import WatchRecord, watch_file
from outrig.watching.notify import Notifier
from tests.support.browser import Browser, find_chromium
from tests.unit.test_metrics import GPUS, H200, MIGRATE, START, make_run, status_answer

PAINTED = """[...document.querySelectorAll('canvas')].map(c => {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; })"""


@pytest.fixture
def browser() -> Iterator[Browser]:
    executable = find_chromium()
    if executable is None:
        pytest.skip("no Chromium here (apt-get install chromium; `make test` does)")
    chromium = Browser(executable)
    try:
        chromium.open_page(1280, 900)
        chromium.send("Network.enable")
        yield chromium
    finally:
        chromium.close()


def artefacts(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("OUTRIG_TEST_ARTEFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def journal_with_runs(root: Path) -> Journal:
    """The H200 trainer's run with GPU samples (as status saw them) and an evaluation;
    the H200x2 rehearsal's migrated run with the watch that moved it."""
    journal = Journal(root)
    make_run(journal, "h200-run", "uk-node", H200, ready_at=START + 40,
             plan={"processes": [{"name": "trainer", "gpus": [0, 1],
                                  "argv": ["torchrun", "--nproc_per_node", "2", "-m",
                                           "speculators.train", "--speculator-type",
                                           "dflash"]}],
                   "facts": {"gpu_count": 8, "gpu_memory_mib": 143771}})
    text = H200.read_text()
    for k, cut in enumerate(range(20000, len(text) + 1, 6000)):
        used = [dict(g, memory_used_mib=g["memory_used_mib"] + 40 * k) for g in GPUS]
        remember_samples(journal, status_answer("h200-run", text[:cut][-16384:], used),
                         at=START + 95 + 20 * k)
    journal.record_evaluation("ev1", {
        "eval_id": "ev1", "playbook": "dflash", "host": "uk-node", "run_id": "h200-run",
        "checkpoint": {"path": "/work/run/ckpt/0", "epoch": 0, "step": 30},
        "method": "dflash", "acceptance_length": 1.42, "per_position": [0.31, 0.08, 0.02],
        "speedup": 1.07, "at": START + 200})
    make_run(journal, "old", "cpu-box", MIGRATE / "cpu-box-movable-trainer.log")
    make_run(journal, "new", "new-box", MIGRATE / "new-box-movable-trainer.log",
             migrated_from={"run_id": "old", "host": "cpu-box"})
    journal.mark_moved("old", host="cpu-box", to_host="new-box", to_run_id="new",
                       at=START + 300)
    record = WatchRecord(watch_file(journal, "cpu-box", "dflash"),
                         {"run_id": "old", "host": "cpu-box", "events": []})
    notifier = Notifier(None, Reporter(quiet=True))
    record.add_event(notifier.send("suspect", host="cpu-box", run_id="old",
                                   why="no answer for 20s"))
    record.add_event(notifier.send("dead", host="cpu-box", run_id="old", why="no banner"))
    return journal


def expected_charts(doc: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """chart id → (series, points) from the document the page holds: what must be drawn."""
    out: dict[str, tuple[int, int]] = {}
    for chart in doc["charts"]:
        for kind in ("step", "time"):
            series = points = 0
            for run in doc["runs"]:
                for metric in chart["metrics"]:
                    s = doc["series"][run["run_id"]].get(metric)
                    if not s or not s["v"]:
                        continue
                    count = len(s["v"]) if kind == "step" else sum(t is not None for t in s["t"])
                    if count:
                        series += 1
                        points += count
            out[f"{chart['id']}-{kind}"] = (series, points)
    return out


def open_report(browser: Browser, path: Path) -> dict[str, Any]:
    browser.navigate(path.resolve().as_uri())
    state: dict[str, Any] = browser.evaluate(
        "JSON.stringify({done: window.outrigReport.done, errors: window.outrigReport.errors,"
        " events: window.outrigReport.events, rows: document.querySelectorAll("
        "'section:last-of-type tbody tr').length, charts: window.outrigReport.charts.map("
        "c => ({id: c.id, series: c.series, points: c.points, drawn: c.drawn}))})")
    return json.loads(state) if isinstance(state, str) else state


def test_the_report_draws_every_metric_without_an_error(browser: Browser, tmp_path: Path
                                                        ) -> None:
    journal = journal_with_runs(tmp_path / "state")
    out = tmp_path / "report.html"
    summary = write_report(Reporter(quiet=True), ["h200-run", "old"], output=str(out),
                           journal=journal)
    html = out.read_text()
    doc = json.loads(re.search(r'id="outrig-data">(.*?)</script>', html, re.S).group(1)
                     .replace("\\u003c", "<").replace("\\u003e", ">").replace("\\u0026", "&"))
    state = open_report(browser, out)
    assert state["done"] and state["errors"] == []
    assert browser.console_errors() == []
    assert browser.requests() == [out.resolve().as_uri()]  # nothing but the file itself
    drawn = {c["id"]: (c["series"], c["points"]) for c in state["charts"] if c["drawn"]}
    want = expected_charts(doc)
    assert {k: v for k, v in drawn.items() if k in want} == want
    assert len(doc["charts"]) == summary["charts"] >= 10
    loss = next(c for c in doc["charts"] if c["metrics"] == ["train/loss"])
    # three runs in two chains on the loss chart: 34 + 7 + 6 points over the step
    assert want[f"{loss['id']}-step"] == (3, 47)
    per_position = next(c for c in doc["charts"] if c["title"].startswith("train/position"))
    assert len(per_position["metrics"]) == 7
    assert drawn["gpu-memory"][0] == 2 and drawn["gpu-util"][0] == 2  # GPUs 0 and 1 only
    assert drawn["gpu-memory"][1] == 2 * len(doc["gpu"]["h200-run"]["0"]["t"]) > 2
    assert drawn["evaluation"] == (1, 3)
    painted = browser.evaluate(PAINTED)
    assert len(painted) == len(state["charts"]) and min(painted) > 500
    assert state["events"] == state["rows"] == len(doc["events"])
    kinds = {e["kind"] for e in doc["events"]}
    assert {"deploy", "ready", "checkpoint", "interrupt", "evaluate", "migrate", "suspect",
            "dead", "resume"} <= kinds
    evaluate = next(e for e in doc["events"] if e["kind"] == "evaluate")
    assert "per position 0.31 0.08 0.02" in evaluate["text"]
    shot = artefacts(tmp_path) / "report.png"
    data = browser.screenshot(shot, height=1800)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20000


def test_a_report_without_metrics_still_opens(browser: Browser, tmp_path: Path) -> None:
    journal = Journal(tmp_path / "state")
    make_run(journal, "quiet", "uk-node", None)
    out = tmp_path / "empty.html"
    write_report(Reporter(quiet=True), ["quiet"], output=str(out), journal=journal)
    state = open_report(browser, out)
    assert state["done"] and state["errors"] == [] and browser.console_errors() == []
    assert state["charts"] == [] and state["events"] == 1  # its deploy
    shutil.rmtree(tmp_path / "state")


def test_a_series_with_extreme_values_is_still_drawn(browser: Browser, tmp_path: Path) -> None:
    """A loss holding ±1e308 (and NaN, ±Inf): uPlot drew no line at all for it (its range,
    max - min, overflows); now the other values are drawn and the page says what it left
    out."""
    journal = Journal(tmp_path / "state")
    log = make_run(journal, "wild", "uk-node", None)
    values = ["1.5", "nan", "1.4", "inf", "1.3", "1e308", "1.2", "-inf", "-1e308", "1.1"]
    log.write_text("".join(f"[08:31:{10 + step:02d}] INFO     train/loss={value}, "
                           f"train/eal=1.0, global_step={step}\n"
                           for step, value in enumerate(values)))
    out = tmp_path / "wild.html"
    write_report(Reporter(quiet=True), ["wild"], output=str(out), journal=journal)
    state = open_report(browser, out)
    assert state["done"] and state["errors"] == [] and browser.console_errors() == []
    drawn = {c["id"]: c for c in state["charts"]}
    loss = drawn["c0-step"]
    assert loss["drawn"] and loss["points"] == 5, loss
    painted = browser.evaluate(PAINTED)
    assert min(painted) > 500
    note = browser.evaluate("[...document.querySelectorAll('.chart p.meta')]"
                            ".map(p => p.textContent)")
    assert any("2 value(s) beyond ±1e+150 not drawn" in text for text in note), note


def test_a_run_without_times_is_drawn_over_the_step_only(browser: Browser,
                                                         tmp_path: Path) -> None:
    """A trainer that prints no timestamps: every "over time" panel said `no values`, half a
    row each, and the timeline showed 2 of its 20 checkpoint and epoch lines. Now the page
    draws each metric over the step, says once why there is no time axis, and lists every
    event."""
    from tests.unit.test_report_cli import UNTIMED

    journal = Journal(tmp_path / "state")
    make_run(journal, "plain", "uk-node", None).write_text(UNTIMED)
    out = tmp_path / "plain.html"
    write_report(Reporter(quiet=True), ["plain"], output=str(out), journal=journal)
    state = open_report(browser, out)
    assert state["done"] and state["errors"] == [] and browser.console_errors() == []
    assert [c["id"] for c in state["charts"]] == ["c0-step"]
    assert state["charts"][0]["drawn"] and state["charts"][0]["points"] == 20
    page = browser.evaluate("document.body.innerText")
    assert "no values" not in page
    assert "Over time: not drawn." in page
    assert state["events"] == state["rows"] == 21  # the deploy, 16 checkpoints, 4 epochs
    shot = artefacts(tmp_path) / "report-untimed.png"
    assert browser.screenshot(shot, height=900)[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_log_draws_the_metrics_on_a_log_scale(browser: Browser, tmp_path: Path) -> None:
    """`report --log`: every metric chart's y axis is log10 (uPlot's distr 3), the GPU charts
    stay linear, and a value a log axis cannot place is named under its chart."""
    journal = Journal(tmp_path / "state")
    log = make_run(journal, "decay", "uk-node", None)
    log.write_text("".join(f"[08:31:{10 + step:02d}] INFO     train/loss={value}, "
                           f"global_step={step}\n"
                           for step, value in enumerate(["10", "1", "0.1", "0.01", "0"])))
    out = tmp_path / "decay.html"
    write_report(Reporter(quiet=True), ["decay"], output=str(out), journal=journal, log=True)
    state = open_report(browser, out)
    assert state["done"] and state["errors"] == [] and browser.console_errors() == []
    logged = browser.evaluate("JSON.stringify(window.outrigReport.charts.map(c => c.log))")
    assert json.loads(logged) == [True, True]  # the loss over step and over time
    drawn = {c["id"]: c for c in state["charts"]}
    assert drawn["c0-step"]["drawn"] and drawn["c0-step"]["points"] == 4  # the 0 left out
    page = browser.evaluate("document.body.innerText")
    assert "train/loss (log scale)" in page
    assert "decay train/loss: 1 value(s) ≤ 0 not drawn on the log scale" in page
