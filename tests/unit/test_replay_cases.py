"""Every op case of tests/fixtures/replay/ replayed with no box and no link: the op, given
what the real agent once answered, must return and show what it did live.

One parametrised runner, as in pyinfra's data-driven op tests; the cases and how to record
them are in tests/support/replay_cases.py. These are the second-long companions of the sshd
tests of the same ops (tests/integration/test_logs.py, test_stage.py, test_watch.py,
test_migrate.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.session import Project
from tests.support.replay import Recording, save
from tests.support.replay_cases import (
    CASES,
    CASES_DIR,
    ROOT_MARK,
    host_file,
    masked,
    moved,
    state_home,
)

FILES = sorted(CASES_DIR.glob("*.json"))


def test_every_case_has_its_recording_and_every_recording_its_case() -> None:
    assert sorted(p.stem for p in FILES) == sorted(CASES)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_replayed_op_returns_and_shows_what_it_did_live(
        path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = json.loads(path.read_text())
    case = CASES[recorded["case"]]
    root = tmp_path.resolve()
    for name, value in state_home(root).items():
        monkeypatch.setenv(name, value)
    (root / "playbooks").mkdir()
    case.workstation(root)
    calls = [moved(Recording.from_json(c), ROOT_MARK, str(root)) for c in recorded["calls"]]
    hostname = f"replay:{save(root / 'calls.json', calls)}"
    host = host_file(root, "box", hostname)
    out = io.StringIO()
    result = case.act(Project(root), str(host), Reporter(out=out, err=out),
                      Journal(root / "state"))
    assert masked(result, root, hostname) == recorded["result"]
    if case.shown:
        assert out.getvalue().replace(str(root), ROOT_MARK) == recorded["shown"]
