"""``outrig metrics``, ``plot`` and ``report`` as the installed command runs them, over a
journal holding the real H200 trainer's log in its mirror and the H200x2 rehearsal's
migrated run: the exports, the terminal plot at 80 columns with and without colour (and
under ``NO_COLOR``), the report file, and every bad input refused with exit 2."""

from __future__ import annotations

import csv
import io
import json
import os
import re
from pathlib import Path

import pytest

from outrig.journal import Journal
from outrig.metrics.series import LOSS
from outrig.metrics.termplot import Curve, plot_lines
from tests.support.cli import outrig
from tests.unit.test_metrics import H200, MIGRATE, START, make_run, metric_lines

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Journal:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.chdir(tmp_path)
    journal = Journal(tmp_path / "state" / "outrig")
    make_run(journal, "h200-run", "uk-node", H200,
             plan={"processes": [{"name": "trainer", "gpus": [0],
                                  "argv": ["torchrun", "-m", "speculators.train"]}]})
    make_run(journal, "old", "cpu-box", MIGRATE / "cpu-box-movable-trainer.log")
    make_run(journal, "new", "new-box", MIGRATE / "new-box-movable-trainer.log",
             migrated_from={"run_id": "old", "host": "cpu-box"})
    journal.mark_moved("old", host="cpu-box", to_host="new-box", to_run_id="new", at=START)
    return journal


def test_metrics_csv_and_json_hold_every_record(journal: Journal,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = outrig(["metrics", "--run", "h200-run", "--csv"], capsys)
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(int(r["step"]), float(r[LOSS])) for r in rows] == metric_lines(H200)
    assert {"train/eal", "train/position_7_acc", "lr/Muon", "profile/tokens_per_s",
            "epoch"} <= set(rows[0])
    assert rows[0]["time_utc"].endswith("08:31:22") and rows[0]["run_id"] == "h200-run"
    code, out, err = outrig(["metrics", "--run", "h200-run", "--json", "--metric", LOSS],
                            capsys)
    doc = json.loads(out)
    assert code == 0 and doc["metrics"] == [LOSS] and doc["lines_parsed"] == 0  # parsed above
    assert [p["values"][LOSS] for p in doc["runs"][0]["points"]] == \
        [v for _, v in metric_lines(H200)]
    code, out, err = outrig(["metrics", "--run", "h200-run"], capsys)
    assert code == 0 and "train/loss" in out and "34" in out
    assert all(len(line) <= 80 for line in out.splitlines())


def test_metrics_of_a_migrated_run_bring_its_successor(journal: Journal,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    code, out, err = outrig(["metrics", "--run", "old", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert [r["run_id"] for r in doc["runs"]] == ["old", "new"]
    assert {r["chain"] for r in doc["runs"]} == {0}
    steps = [[p["step"] for p in r["points"] if LOSS in p["values"]] for r in doc["runs"]]
    assert steps == [list(range(7)), list(range(5, 11))]


def test_plot_without_colour_is_a_table_at_80_columns(journal: Journal,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for env in ({}, {"NO_COLOR": "1", "FORCE_COLOR": "1"}):  # NO_COLOR wins (no-color.org)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        code, out, err = outrig(["plot", "--run", "old"], capsys)
        assert code == 0, err
        lines = out.splitlines()
        assert "\x1b" not in out
        assert max(len(line) for line in lines) <= 80
        assert lines[0] == LOSS
        assert lines[1].startswith("  [1] old (cpu-box)") and "steps 0–6" in lines[1]
        assert lines[2].startswith("  [2] new (new-box)") and "steps 5–10" in lines[2]
        table = [line.split() for line in lines[4:] if line.strip() and
                 line.split()[0].isdigit()]
        assert [int(row[0]) for row in table][:11] == list(range(11))  # steps 0..10, both runs
        assert table[5][1:] == ["1.673", "1.708"]  # step 5 of the old run and of the new one


def test_plot_with_colour_is_a_chart_at_80_columns(journal: Journal,
                                                   capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = outrig(["plot", "--run", "h200-run", "--metric", LOSS,
                             "--metric", "train/eal"], capsys)
    assert code == 0, err
    assert "\x1b[" in out
    plain = ANSI.sub("", out).splitlines()
    assert max(len(line) for line in plain) <= 80
    titles = [line.strip() for line in plain if line.strip() in (LOSS, "train/eal")]
    assert titles == [LOSS, "train/eal"]
    dots = sum(len(re.findall("[\u2801-\u28ff]", line)) for line in plain)
    assert dots > 30  # braille dots: the curves
    assert any(line.strip() == "step" for line in plain)


def test_plot_lines_degrade_to_the_table_below_the_chart_width() -> None:
    curve = Curve("r", LOSS, [(0, 2.0), (1, 1.5), (2, 1.0)])
    narrow = plot_lines([(LOSS, [curve])], 30, colour=True)
    assert "\x1b" not in "".join(narrow) and max(len(line) for line in narrow) <= 30
    assert plot_lines([(LOSS, [Curve("r", LOSS, [(0, 1.0)])])], 80, colour=True)[1] \
        .startswith("  [1] r")


def test_plot_json(journal: Journal, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = outrig(["plot", "--run", "new", "--metric", LOSS, "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and [(c["run_id"], c["steps"]) for c in doc["curves"]] == \
        [("old", list(range(7))), ("new", list(range(5, 11)))]


def test_report_writes_one_self_contained_file(journal: Journal,
                                               capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    code, out, err = outrig(["report", "--run", "old", "--json"], capsys)
    assert code == 0, err
    summary = json.loads(out)
    path = tmp_path / "outrig-report-old.html"
    assert summary["report"] == "outrig-report-old.html" and path.exists()
    assert summary["runs"] == ["new", "old"] and summary["points"] == 13
    html = path.read_text()
    assert "default-src 'none'" in html  # the page may fetch nothing
    assert not re.search(r"""<(?:script|link|img)[^>]+(?:src|href)=""", html)
    data = json.loads(re.search(r'id="outrig-data">(.*?)</script>', html, re.S).group(1))
    assert [r["run_id"] for r in data["runs"]] == ["old", "new"]
    assert {e["kind"] for e in data["events"]} >= {"deploy", "checkpoint", "resume", "migrate"}
    assert os.stat(path).st_mode & 0o077 == 0
    code, out, err = outrig(["report", "--run", "h200-run", "-o", "sub.html"], capsys)
    assert code == 0 and "wrote sub.html" in err and (tmp_path / "sub.html").exists()


@pytest.mark.parametrize("args, words", [
    (["metrics"], "--run is needed"),
    (["metrics", "--run", "nope"], "--run nope: the journal"),
    (["plot", "--run", "nope"], "--run nope: the journal"),
    (["report", "--run", "nope"], "--run nope: the journal"),
    (["metrics", "--run", "old", "--json", "--csv"], "one of --json and --csv"),
    (["plot", "--run", "old", "--metric", "train/nope"], "--metric train/nope: no such"),
    (["metrics", "--run", "old", "--metric", "train/nope"], "--metric train/nope: no such"),
    (["report", "--run", "old", "-o", "missing/r.html"], "the folder missing does not exist"),
    (["report", "--run", "old", "-o", "."], "that is a folder"),
])
def test_bad_input_is_refused_with_exit_2(journal: Journal,
                                          capsys: pytest.CaptureFixture[str],
                                          args: list[str], words: str) -> None:
    code, out, err = outrig(args, capsys)
    assert code == 2, (args, out, err)
    assert words in err and "Traceback" not in err
    assert not list(Path.cwd().glob("*.html"))


def test_an_unwritable_folder_is_refused_with_exit_2(journal: Journal, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    if os.geteuid() == 0:  # root writes anywhere: a read-only place stands in
        target = "/proc/outrig-report.html"
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        target = str(locked / "r.html")
    code, _out, err = outrig(["report", "--run", "old", "-o", target], capsys)
    assert code == 2, err
    assert f"-o {target}" in err and "Nothing was written" in err


def test_evaluated_checkpoints_are_a_series_beside_train_eal(
        journal: Journal, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Two evaluations of the old run's checkpoints (and one of a checkpoint evaluated again:
    the newer counts): ``served/acceptance_length`` at the checkpoints' global steps in
    metrics, on train/eal's chart in the report and the plot."""
    from outrig.evaluation.served import SERVED

    for eval_id, at, step, length in (("e1", 1.0, 2, 1.5), ("e2", 2.0, 5, 1.1),
                                      ("e3", 3.0, 5, 1.25)):
        journal.record_evaluation(eval_id, {"eval_id": eval_id, "run_id": "old", "at": at,
                                            "checkpoint": {"path": f"/c/{step}",
                                                           "global_step": step},
                                            "acceptance_length": length,
                                            "per_position": [length - 1]})
    code, out, err = outrig(["metrics", "--run", "old", "--json", "--metric", SERVED], capsys)
    assert code == 0, err
    points = [(p["step"], p["values"][SERVED]) for run in json.loads(out)["runs"]
              for p in run["points"] if SERVED in p["values"]]
    assert points == [(2, 1.5), (5, 1.25)]
    code, out, err = outrig(["report", "--run", "old"], capsys)
    assert code == 0, err
    html = (tmp_path / "outrig-report-old.html").read_text()
    data = json.loads(re.search(r'id="outrig-data">(.*?)</script>', html, re.S).group(1))
    chart = next(c for c in data["charts"] if SERVED in c["metrics"])
    assert chart["metrics"] == ["train/eal", SERVED] and chart["title"] == "train/eal"
    assert data["series"]["old"][SERVED]["v"] == [1.5, 1.25]
    code, out, err = outrig(["plot", "--run", "old", "--metric", "train/eal"], capsys)
    assert code == 0, err
    assert "old (cpu-box) served" in out


# a run whose loss holds what a diverging trainer prints: NaN, ±Inf, ±1e308
WILD = [("1.5", 0), ("nan", 1), ("1.4", 2), ("inf", 3), ("1.3", 4), ("1e308", 5),
        ("1.2", 6), ("-inf", 7), ("-1e308", 8), ("1.1", 9)]


def wild_run(journal: Journal) -> None:
    log = make_run(journal, "wild", "uk-node", None)
    log.write_text("".join(f"[08:31:{10 + step:02d}] INFO     {LOSS}={value}, "
                           f"train/eal=1.0, global_step={step}\n" for value, step in WILD))


def strict_json(text: str) -> object:
    def refuse(name: str) -> object:
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_metrics_json_of_values_that_are_not_finite_is_valid_json(
        journal: Journal, capsys: pytest.CaptureFixture[str]) -> None:
    """NaN and ±Inf are the strings "NaN", "Infinity" and "-Infinity" (bare NaN, what
    Python wrote before, is refused by jq and JSON.parse); ±1e308 stay numbers."""
    wild_run(journal)
    code, out, err = outrig(["metrics", "--run", "wild", "--json", "--metric", LOSS], capsys)
    assert code == 0, err
    doc = strict_json(out)
    assert isinstance(doc, dict)
    values = [p["values"][LOSS] for p in doc["runs"][0]["points"]]
    assert values == [1.5, "NaN", 1.4, "Infinity", 1.3, 1e308, 1.2, "-Infinity", -1e308, 1.1]
    code, out, err = outrig(["metrics", "--run", "wild"], capsys)  # the summary: finite only
    assert code == 0 and "-1e+308" in out and "1e+308" in out, err


def test_plot_in_colour_of_a_series_with_extreme_values_draws_the_rest_and_says_so(
        journal: Journal, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: plotext raised (OverflowError / ValueError in _distinguishing_digit)."""
    wild_run(journal)
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "100")
    code, out, err = outrig(["plot", "--run", "wild", "--metric", LOSS], capsys)
    assert code == 0, err
    plain = ANSI.sub("", out)
    assert len(re.findall("[\u2801-\u28ff]", plain)) > 5  # the finite values: a curve
    assert "2 value(s) beyond ±1e+150 not drawn (step 5 = 1e+308, step 8 = -1e+308)" in plain


def test_the_report_of_a_series_with_extreme_values_keeps_the_rest_and_says_so(
        journal: Journal, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    wild_run(journal)
    code, _out, err = outrig(["report", "--run", "wild", "--json"], capsys)
    assert code == 0, err
    html = (tmp_path / "outrig-report-wild.html").read_text()
    data = strict_json(re.search(r'id="outrig-data">(.*?)</script>', html, re.S).group(1))
    assert isinstance(data, dict)
    loss = data["series"]["wild"][LOSS]
    assert loss["s"] == [0, 2, 4, 6, 9] and loss["v"] == [1.5, 1.4, 1.3, 1.2, 1.1]
    chart = next(c for c in data["charts"] if c["metrics"] == [LOSS])
    assert "2 value(s) beyond ±1e+150 not drawn" in chart["note"]


def test_a_chart_of_many_points_keeps_each_spike_and_the_ends() -> None:
    """plot hands plotext at most two rows per dot of width (each bucket's lowest and
    highest): a million points are not drawn one by one, and a spike must not be thinned
    away."""
    from outrig.metrics.termplot import envelope

    rows = [(s, 1.0 + (s % 7) * 1e-3) for s in range(100_000)]
    rows[54_321] = (54_321, 9.0)
    rows[77_777] = (77_777, -3.0)
    kept = envelope(rows, 160)
    assert len(kept) <= 322 and kept[0] == rows[0] and kept[-1] == rows[-1]
    assert (54_321, 9.0) in kept and (77_777, -3.0) in kept
    assert [s for s, _ in kept] == sorted(s for s, _ in kept)
    assert envelope(rows[:50], 160) == rows[:50]


UNTIMED = "".join(
    [f"Training epoch {e}/2 started\n"
     + "".join(f"train/loss={2.0 / (1 + 10 * e + s):.4f}, global_step={10 * e + s}\n"
               for s in range(1, 11))
     + "".join(f"Checkpoint saved to /ckpt/{e}/{k}\n" for k in range(8))
     + f"Training epoch {e}/2 completed\n" for e in range(2)])


def test_the_timeline_keeps_log_events_of_a_trainer_that_prints_no_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer that prints no timestamps: its 16 checkpoints and 4 epoch lines were left
    out of the report's timeline (only events with a time were kept). Each is kept, in
    the log's order, saying that no time was printed."""
    from outrig.console import Reporter
    from outrig.ops.metrics import write_report

    journal = Journal(tmp_path / "state")
    make_run(journal, "plain", "uk-node", None).write_text(UNTIMED)
    out = tmp_path / "plain.html"
    write_report(Reporter(quiet=True), ["plain"], output=str(out), journal=journal)
    data = json.loads(re.search(r'id="outrig-data">(.*?)</script>', out.read_text(), re.S)
                      .group(1).replace("\\u003c", "<").replace("\\u003e", ">")
                      .replace("\\u0026", "&"))
    kinds = [e["kind"] for e in data["events"]]
    assert kinds.count("checkpoint") == 16 and kinds.count("epoch") == 4, kinds
    logged = [e for e in data["events"] if e["kind"] in ("checkpoint", "epoch")]
    assert [e["text"] for e in logged][:2] == ["epoch 0/2 started", "/ckpt/0/0"]
    assert all(e["t"] is None and e["when"] == "no time printed" for e in logged), logged[0]
    steps = [e["step"] for e in logged if e["step"] is not None]
    assert steps == sorted(steps)
    assert data["events"][0]["kind"] == "deploy"  # the timed ones first, by time


def test_plot_log_keeps_the_end_of_a_loss_falling_over_decades_readable() -> None:
    """`plot` drew the loss on a linear scale only: a loss falling from 10 to 1e-11 lay flat
    on the bottom line for its whole second half. With `--log` the second half still climbs
    down the chart, the title says the scale, and the value a log axis cannot place (0) is
    named under the chart (and the sparkline of the table follows the log too)."""
    rows = [(s, 10.0 * 0.5 ** s) for s in range(40)] + [(40, 0.0)]
    curve = [(LOSS, [Curve("r", LOSS, rows)])]

    def rows_of_second_half(lines: list[str]) -> int:
        plain = [ANSI.sub("", line) for line in lines]
        body = [m.group(1) for line in plain if (m := re.match(r"^[^┤│]*[┤│](.*)│\s*$", line))]
        return sum(1 for line in body if re.search("[\u2801-\u28ff]", line[len(line) // 2:]))

    linear = plot_lines(curve, 80, colour=True)
    log = plot_lines(curve, 80, colour=True, log=True)
    assert rows_of_second_half(linear) <= 2
    assert rows_of_second_half(log) >= 5
    plain = [ANSI.sub("", line) for line in log]
    assert any(line.strip() == f"{LOSS} (log scale)" for line in plain)
    assert plain[-1].strip() == "r: 1 value(s) ≤ 0 not drawn on the log scale"
    table = plot_lines(curve, 80, colour=False, log=True)
    assert table[0] == f"{LOSS} (log scale)" and max(len(line) for line in table) <= 80
    spark = table[1].split()[2]
    assert len(set(spark)) >= 6  # on a linear scale it is one full block, then the floor
