"""GPU values and drivers that lie, end to end on the sandbox (a real sshd; the fake
nvidia-smi answers what a sick driver answers, docs/gpu-health.md):

* a health or inventory value that is not a finite, in-range number (``nan``, ``-3``,
  ``inf``, ``1e400``) is judged ``unknown`` with its field named, never ``ok``, and
  ``check``, ``status --gpus`` and ``deploy`` go on without a traceback;
* a driver that fails (exit 9, "couldn't communicate with the NVIDIA driver") or hangs:
  deploy refuses processes with GPUs there (``--allow-unhealthy-gpu`` places them),
  ``check`` fails instead of its ✓, and cleanup claims no GPU audit it could not make;
* a GPU name holding terminal escapes reaches the terminal as visible escapes.

The tests wait for events, states and records, never for a time."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from outrig.console import Reporter
from outrig.errors import RemoteError
from outrig.journal import Journal
from outrig.ops.check import check
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import deploy
from outrig.ops.status import print_status, status
from outrig.sandbox.nvidia_smi import set_driver_failure, set_gpu_fields
from outrig.session import Project
from tests.support.runs import box_workdir, write_playbook

pytestmark = [pytest.mark.integration,
              pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")]
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)
CONTROLS = [chr(c) for c in [*range(0, 9), *range(11, 32), *range(0x7f, 0xa0)]]

# GPU → (the field that lies, what nvidia-smi answers for it)
LIES = {0: ("ecc.errors.uncorrected.volatile.total", "nan"),
        1: ("ecc.errors.uncorrected.volatile.total", "-3"),
        2: ("clocks_throttle_reasons.active", "nan"),
        3: ("pcie.link.width.current", "inf"),
        4: ("memory.total", "1e400"),
        5: ("ecc.errors.corrected.volatile.total", "1e400"),
        6: ("clocks_throttle_reasons.active", "inf")}


def gpu_playbook(tmp_path: Path, gpus: list[int], name: str = "liar") -> Path:
    return write_playbook(tmp_path, {"processes": {"worker": {
        "command": [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"],
        "gpus": gpus, "stop": {"grace": 5}}}}, name)


def no_run_made(box_host: Path) -> bool:
    runs = box_workdir(box_host) / "runs"
    return not runs.exists() or not list(runs.iterdir())


def test_values_that_are_not_finite_in_range_numbers_are_unknown_with_their_field(
        box_host: Path, tmp_path: Path, teardown_runs: None) -> None:
    gpu_dir = tmp_path / "gpu"
    journal = Journal(tmp_path / "state")
    for index, (field, value) in LIES.items():
        set_gpu_fields(gpu_dir, index, {field: value})
    out, err = io.StringIO(), io.StringIO()
    checked = check(PROJECT, str(box_host), Reporter(out=out, err=err), journal)
    verdicts = {v["index"]: v for v in checked["gpu_health"]}
    for index, (field, value) in LIES.items():
        verdict = verdicts[index]
        assert verdict["verdict"] == "unknown", (index, verdict)
        named = [f for f in verdict["findings"] if f["field"] == field]
        assert named and named[0]["verdict"] == "unknown", (index, verdict["findings"])
        assert repr(value) in named[0]["why"], named[0]
        assert not any(f["verdict"] == "ok" and f["field"] == field
                       for f in verdict["findings"])
    assert verdicts[7]["verdict"] == "ok"
    shown = out.getvalue() + err.getvalue()
    assert "0-6 unknown" in shown and "7 ok" in shown, shown
    assert "Traceback" not in shown

    seen = status(PROJECT, str(box_host), Reporter(quiet=True), journal=journal)
    assert {g["index"]: g["health"]["verdict"] for g in seen["gpus"]}[4] == "unknown"
    assert {g["index"]: g["memory_total_mib"] for g in seen["gpus"]}[4] is None
    human = io.StringIO()
    print_status(Reporter(out=human, err=io.StringIO(), gpu_table=True), seen)
    assert "GPUs" in human.getvalue()

    placed = deploy(PROJECT, str(box_host), str(gpu_playbook(tmp_path, [4, 5])),
                    Reporter(quiet=True), journal=journal)
    assert placed.status == "running"


def test_a_driver_that_cannot_be_reached_refuses_gpu_work_and_claims_no_audit(
        box_host: Path, tmp_path: Path, teardown_runs: None) -> None:
    gpu_dir = tmp_path / "gpu"
    journal = Journal(tmp_path / "state")
    set_driver_failure(gpu_dir, "unreachable")
    book = gpu_playbook(tmp_path, [0, 1])
    with pytest.raises(RemoteError) as refused:
        deploy(PROJECT, str(box_host), str(book), Reporter(quiet=True), journal=journal)
    assert refused.value.kind == "gpu_unhealthy"
    message = str(refused.value)
    for words in ("cannot be read", "exit 9", "couldn't communicate with the NVIDIA driver",
                  "GPU(s) 0, 1", "Nothing was stopped or started", "--allow-unhealthy-gpu"):
        assert words in message, message
    assert no_run_made(box_host)

    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(RemoteError) as failed:
        check(PROJECT, str(box_host), Reporter(out=out, err=err), journal)
    assert failed.value.kind == "gpu_unhealthy" and "cannot be read" in str(failed.value)
    assert "reachable" in out.getvalue() + err.getvalue()
    assert "✓" not in out.getvalue() + err.getvalue()

    placed = deploy(PROJECT, str(box_host), str(book), Reporter(quiet=True), journal=journal,
                    allow_unhealthy_gpu=True)
    assert placed.status == "running"
    out, err = io.StringIO(), io.StringIO()
    cleanup(PROJECT, str(box_host), Reporter(out=out, err=err), all_runs=True,
            journal=journal)
    shown = out.getvalue() + err.getvalue()
    assert "nothing of ours holds a GPU" not in shown, shown
    assert "could not be audited" in shown and "1 process(es) stopped" in shown, shown
    assert "✓" not in shown


def test_a_hung_driver_refuses_gpu_work(box_host: Path, tmp_path: Path,
                                        teardown_runs: None) -> None:
    set_driver_failure(tmp_path / "gpu", "hang")
    with pytest.raises(RemoteError) as refused:
        deploy(PROJECT, str(box_host), str(gpu_playbook(tmp_path, [0])), Reporter(quiet=True),
               journal=Journal(tmp_path / "state"))
    assert refused.value.kind == "gpu_unhealthy"
    assert "nvidia-smi timed out" in str(refused.value), str(refused.value)
    assert no_run_made(box_host)


def test_a_gpu_name_with_terminal_escapes_is_shown_as_visible_escapes(
        box_host: Path, tmp_path: Path) -> None:
    name = "NVIDIA H200\x1b]0;PWN\x07\x1b[2J"
    for index in range(8):
        set_gpu_fields(tmp_path / "gpu", index, {"name": name})
    seen = status(PROJECT, str(box_host), Reporter(quiet=True),
                  journal=Journal(tmp_path / "state"))
    assert seen["gpus"][0]["name"] == name  # --json keeps the exact text
    for table in (True, False):
        human = io.StringIO()
        print_status(Reporter(out=human, err=io.StringIO(), gpu_table=table), seen)
        text = human.getvalue()
        assert "NVIDIA H200\\x1b]0;PWN\\x07\\x1b[2J" in text, text
        assert not [ch for ch in text if ch in CONTROLS], repr(text)
