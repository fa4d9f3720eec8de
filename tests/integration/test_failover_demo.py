"""``outrig demo --failover`` end to end at 240 ms: two real sshd sandbox boxes, the smoke job
watched with a spare, the first box killed like a power cut, the run moved by the watch and
resumed on the spare from the last checkpoint the watch mirrored; nothing left running."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from outrig.console import Reporter
from outrig.ops.failover import MIRRORED_BEFORE_CRASH, run_failover

pytestmark = pytest.mark.integration


def test_demo_failover_moves_the_run_and_it_resumes_from_its_last_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # its folder, checked for leftovers below
    out, err = io.StringIO(), io.StringIO()
    result = run_failover(Reporter(out=out, err=err), one_way_delay=0.12)
    events = result["events"]
    assert events[:4] == ["suspect", "dead", "migrating", "resumed"], events
    assert "failed" not in events
    assert result["new_run"] != result["old_run"]
    checkpoint = result["checkpoint"]
    assert isinstance(checkpoint, int) and checkpoint >= MIRRORED_BEFORE_CRASH
    found = re.search(r"Resuming from checkpoint \S+/(\d+) at step (\d+)",
                      result["resume_line"])
    assert found, result["resume_line"]
    assert int(found.group(1)) == checkpoint, "the spare resumed from what was moved"
    text = out.getvalue() + err.getvalue()
    assert "crashing sandbox" in text and "failover demo done" in text
    assert "--steps 4000" in text.split("plan: smoke on spare")[1], \
        "the spare runs the same job (the demo's playbook, not another smoke)"
    assert not any(tmp_path.glob("outrig-failover-*")), "its folder is removed"
