"""Fan-out mechanics without SSH: every host's outcome comes back in order, a host past its
deadline is reported as giving no answer while the others' results stand, --max-parallel
bounds the hosts in progress, and the table fits 80 columns with the failures listed."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.cli.rows import Rows, report, status_summary
from outrig.console import Reporter
from outrig.errors import ConfigError, OutrigError
from outrig.fanout import FanOutFailed, run_fanout
from outrig.session import HostSession, Project


def _project(tmp_path: Path, names: list[str]) -> Project:
    hosts = tmp_path / "hosts"
    hosts.mkdir()
    for name in names:  # local hosts: a session opens without contacting anything
        (hosts / f"{name}.yaml").write_text(yaml.safe_dump(
            {"hostname": "local", "workdir": str(tmp_path / "w" / name)}))
    return Project(tmp_path)


def test_a_stuck_host_is_given_up_at_its_deadline_and_the_others_stand(tmp_path: Path) -> None:
    project = _project(tmp_path, ["a", "b", "stuck", "bad"])
    release = threading.Event()

    def core(session: HostSession) -> dict[str, Any]:
        if session.host_spec == "stuck":
            release.wait(60)  # never answers within its deadline
        if session.host_spec == "bad":
            raise OutrigError("the box said no")
        return {"host": session.host_spec}

    try:
        outcomes = run_fanout(project, ["a", "stuck", "b", "bad"], core, deadline=1.0)
    finally:
        release.set()
    assert [o.host for o in outcomes] == ["a", "stuck", "b", "bad"]
    assert [o.state for o in outcomes] == ["ok", "no answer", "ok", "failed"]
    assert outcomes[0].result == {"host": "a"} and outcomes[2].result == {"host": "b"}
    assert outcomes[1].error is not None and "no answer within 1 s" in outcomes[1].error
    assert outcomes[3].error == "the box said no"


def test_max_parallel_bounds_the_hosts_in_progress(tmp_path: Path) -> None:
    names = [f"h{i}" for i in range(6)]
    project = _project(tmp_path, names)
    lock = threading.Lock()
    now, most = [0], [0]
    two_in = threading.Barrier(2, timeout=30)

    def core(session: HostSession) -> dict[str, Any]:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        two_in.wait()  # both slots are taken before either host finishes
        with lock:
            now[0] -= 1
        return {}

    outcomes = run_fanout(project, names, core, max_parallel=2, deadline=60)
    assert all(o.ok for o in outcomes) and most[0] == 2
    with pytest.raises(ConfigError, match="--max-parallel must be at least 1"):
        run_fanout(project, names, core, max_parallel=0)


def test_the_table_fits_80_columns_lists_failures_and_raises(tmp_path: Path) -> None:
    project = _project(tmp_path, ["node-a", "node-b"])
    result = {"runs": [{"playbook": "smoke", "status": "running"}],
              "gpus": [{"index": 0, "holders": [{"pid": 1}]}, {"index": 1, "holders": []}]}

    def core(session: HostSession) -> dict[str, Any]:
        if session.host_spec == "node-b":
            raise OutrigError("cannot reach 10.0.0.2:22: connection refused " * 3)
        return result

    outcomes = run_fanout(project, ["node-a", "node-b"], core, deadline=30)
    out = io.StringIO()
    human = Reporter(out=out, err=io.StringIO())
    human.stdout_console.width = 80
    with pytest.raises(FanOutFailed, match="status failed on 1 of 2 hosts: node-b"):
        report(human, outcomes, status_summary, what="status")
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0].split() == ["host", "state", "summary"]
    assert "node-a" in lines[1] and "1 run: smoke running · GPUs 1/2 free" in lines[1]
    assert "1 of 2 hosts failed:" in text and "node-b: cannot reach" in text
    assert max(len(line) for line in lines) <= 80

    doc = io.StringIO()
    with pytest.raises(FanOutFailed):
        report(Reporter(json_mode=True, out=doc), outcomes, status_summary, what="status")
    rows = [json.loads(line) for line in doc.getvalue().splitlines()]
    assert [(r["host"], r["ok"], r["state"]) for r in rows] == [
        ("node-a", True, "ok"), ("node-b", False, "failed")]
    assert rows[0]["result"] == result and rows[1]["error"].startswith("cannot reach")


def test_each_outcome_is_handed_on_as_soon_as_it_is_known(tmp_path: Path) -> None:
    """The slow host is released only once the quick ones' outcomes were handed on: the
    rows of the quick hosts come before the slow one finishes."""
    project = _project(tmp_path, ["slow", "a", "b"])
    release = threading.Event()
    seen: list[str] = []

    def core(session: HostSession) -> dict[str, Any]:
        if session.host_spec == "slow":
            assert release.wait(60), "the quick hosts' outcomes were not handed on"
        return {}

    def shown(outcome: Any) -> None:
        seen.append(outcome.host)
        if sorted(seen) == ["a", "b"]:
            release.set()

    outcomes = run_fanout(project, ["slow", "a", "b"], core, deadline=120, on_outcome=shown)
    assert [o.state for o in outcomes] == ["ok", "ok", "ok"]
    assert seen[-1] == "slow" and sorted(seen) == ["a", "b", "slow"]


def test_rows_are_printed_one_by_one_with_warnings_and_failures_last(tmp_path: Path) -> None:
    project = _project(tmp_path, ["node-a", "b"])

    def core(session: HostSession) -> dict[str, Any]:
        session.reporter.warn("run x on node-a was moved to b")
        session.reporter.info("a note nobody needs in a table")
        if session.host_spec == "b":
            raise OutrigError("cannot reach b")
        return {"runs": [], "gpus": []}

    out = io.StringIO()
    human = Reporter(out=out, err=io.StringIO())
    rows = Rows(human, ["node-a", "b"], status_summary, what="status")
    rows.start()
    assert out.getvalue().split() == ["host", "state", "summary"]
    outcomes = run_fanout(project, ["node-a", "b"], core, deadline=30, on_outcome=rows.show)
    assert outcomes[0].warnings == ["run x on node-a was moved to b"]
    with pytest.raises(FanOutFailed, match="status failed on 1 of 2 hosts: b"):
        rows.finish(outcomes)
    lines = out.getvalue().splitlines()
    row = lines.index("  node-a  ok         no runs · GPUs: none")
    assert lines[row + 1] == "    warning: run x on node-a was moved to b"
    assert "a note nobody needs" not in out.getvalue()
    assert lines[-2:] == ["1 of 2 hosts failed:", "  b: cannot reach b"]

    doc = io.StringIO()
    rows = Rows(Reporter(json_mode=True, out=doc), ["node-a", "b"], status_summary,
                what="status")
    rows.show(outcomes[0])
    assert json.loads(doc.getvalue())["warnings"] == ["run x on node-a was moved to b"]


def test_a_deploys_deadline_counts_its_processes_ready_waits(tmp_path: Path) -> None:
    """Processes start one after another, each waiting up to its ready timeout: a deploy on
    several hosts adds their sum to each host's deadline."""
    from outrig.cli.sweep import deploy_work
    from outrig.playbook import load_job

    project = _project(tmp_path, ["a", "b"])
    book = tmp_path / "two.yaml"
    book.write_text(yaml.safe_dump({"name": "two", "processes": {
        "server": {"command": "true", "gpus": [], "ready": {"port": 8000, "timeout": 30}},
        "trainer": {"command": "true", "gpus": [], "after": ["server"],
                    "ready": {"log": "step", "timeout": 45}},
        "helper": {"command": "true", "gpus": []}}}))
    assert deploy_work(project, load_job(book), ["a", "b"]) == 75.0
