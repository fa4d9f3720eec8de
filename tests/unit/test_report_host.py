"""``metrics``, ``plot`` and ``report`` without ``--run``: the current run of ``--host``
(or the project's host), as the journal has it (its newest run that reached the box, of
``--playbook`` when given), named on stderr; ``--host`` with ``--run`` checks the run is
that box's. Before, ``report --host`` was "No idea what '--host' is" (exit 2) and each
needed ``--run``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from outrig.journal import Journal
from tests.support.cli import outrig
from tests.unit.test_metrics import H200, MIGRATE, START, make_run


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Journal:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for name in ("OUTRIG_HOST", "OUTRIG_PLAYBOOK", "OUTRIG_PROJECT", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    journal = Journal(tmp_path / "state" / "outrig")
    make_run(journal, "older", "uk-node", MIGRATE / "cpu-box-movable-trainer.log",
             created=START - 3600)
    make_run(journal, "h200-run", "uk-node", H200)
    make_run(journal, "eval-run", "uk-node", None, created=START - 60, playbook="eval")
    make_run(journal, "ghost", "uk-node", None, created=START + 60, status="not_on_box")
    make_run(journal, "elsewhere", "other-box", MIGRATE / "new-box-movable-trainer.log",
             created=START + 120)
    return journal


@pytest.mark.parametrize("task", ["metrics", "plot", "report"])
def test_host_alone_shows_its_current_run(journal: Journal, task: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    extra = ["-o", "r.html"] if task == "report" else []
    code, out, err = outrig([task, "--host", "uk-node", "--json", *extra], capsys)
    assert code == 0, err
    doc = json.loads(out)
    if task == "metrics":
        assert [r["run_id"] for r in doc["runs"]] == ["h200-run"]
    elif task == "plot":
        assert {c["run_id"] for c in doc["curves"]} == {"h200-run"}
    else:
        assert doc["runs"] == ["h200-run"] and Path("r.html").exists()
    assert "run h200-run: the current run of uk-node in the journal" in err


def test_the_projects_host_and_playbook_pick_the_run(journal: Journal, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    (tmp_path / "outrig.yaml").write_text("host: other-box\n")
    code, out, err = outrig(["metrics", "--json"], capsys)
    assert code == 0, err
    assert [r["run_id"] for r in json.loads(out)["runs"]] == ["elsewhere"]
    code, out, err = outrig(["metrics", "--host", "uk-node", "--playbook", "eval", "--json"],
                            capsys)
    assert code == 0, err
    assert [r["run_id"] for r in json.loads(out)["runs"]] == ["eval-run"]


def test_run_with_host_is_checked_and_bad_input_refused(journal: Journal,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    code, out, err = outrig(["metrics", "--run", "older", "--host", "uk-node", "--json"],
                            capsys)
    assert code == 0, err
    assert [r["run_id"] for r in json.loads(out)["runs"]] == ["older"]
    code, out, err = outrig(["report", "--run", "elsewhere", "--host", "uk-node"], capsys)
    assert code == 2 and "--run elsewhere ran on other-box, not on --host uk-node" in err
    assert not list(Path().glob("*.html"))
    code, out, err = outrig(["plot", "--host", "no-runs-here"], capsys)
    assert code == 2 and "--host no-runs-here: the journal" in err and "has no run" in err
    code, out, err = outrig(["metrics", "--host", "uk-node", "--playbook", "nope"], capsys)
    assert code == 2 and "no run of playbook nope" in err
    code, out, err = outrig(["report"], capsys)
    assert code == 2 and "--run or --host is needed" in err and not out
