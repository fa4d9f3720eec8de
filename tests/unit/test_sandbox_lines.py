"""What ``sandbox-down`` says: both pids, the runs it stopped, and the host file it removed
as typed (relative to the current folder), not as an absolute path of this machine."""
from __future__ import annotations

from pathlib import Path

import pytest

from outrig.ops.sandbox import down_lines


def _result(host_file: Path) -> dict[str, object]:
    return {"name": "sandbox", "stopped": [101, 102], "host_file": str(host_file),
            "host_file_removed": True, "stopped_runs": ["hello-1"]}


def test_the_removed_host_file_is_shown_relative_to_the_current_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    [line] = down_lines(_result(tmp_path / "hosts" / "sandbox.yaml"), "sandbox")
    assert line == ("sandbox sandbox stopped (pids 101, 102) and its run(s) hello-1;"
                    " removed hosts/sandbox.yaml")


def test_a_host_file_elsewhere_keeps_its_whole_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    elsewhere = tmp_path / "other" / "sandbox.yaml"
    [line] = down_lines(_result(elsewhere), "sandbox")
    assert line.endswith(f"removed {elsewhere}")
