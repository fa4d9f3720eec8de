"""``status``, ``check`` and ``cleanup`` on five sandbox boxes at once (five sshd on loopback,
each behind its own latency proxy), through the CLI tasks: the healthy boxes report while a
refusing and a blackholed one are named with their reason (exit 1), and ``cleanup --host
all --all`` stops exactly outrig's runs on every box, leaving a foreign process alone."""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from invoke.context import Context
from invoke.exceptions import Exit

from outrig import cli
from outrig.console import Reporter
from outrig.ops.base import Project
from outrig.ops.deploy import deploy
from outrig.sandbox.box import SandboxBox, SandboxError, find_sshd, start_sandbox
from outrig.sandbox.proxy import LatencyProxy
from tests.helpers import alive, wait_gone

pytestmark = pytest.mark.integration
BOXES = 5


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SandboxBox]]:
    """Five sandbox boxes, each its own sshd, keys, workdir and fake GPUs."""
    try:
        find_sshd()
    except SandboxError as exc:  # the same rule as conftest's sandbox fixture
        if os.environ.get("CI"):
            pytest.fail(f"CI requires the sandbox sshd: {exc}")
        pytest.skip(str(exc))
    boxes: list[SandboxBox] = []
    try:
        for i in range(BOXES):
            boxes.append(start_sandbox(tmp_path_factory.mktemp(f"fleet{i}"), name=f"b{i}"))
        yield boxes
    finally:
        for box in boxes:
            box.stop()


@pytest.fixture
def project(fleet: list[SandboxBox], tmp_path: Path,
            make_proxy: Callable[..., LatencyProxy]) -> tuple[Path, list[LatencyProxy]]:
    """A project whose hosts/ holds one file per box, each through a proxy (20 ms each way),
    with this test's own workdir and known_hosts; every box running again."""
    proxies = []
    for i, box in enumerate(fleet):
        if not box.is_running():
            box.start()
        proxy = make_proxy(box.port, one_way_delay=0.02)
        proxies.append(proxy)
        workdir = tmp_path / f"w{i}"
        workdir.mkdir()
        box.write_host_file(tmp_path / "hosts" / f"b{i}.yaml", port=proxy.port,
                            workdir=workdir, known_hosts=tmp_path / f"known_hosts{i}")
    return tmp_path, proxies


def _run(task: Any, root: Path, *, out: io.StringIO | None = None,
         **flags: Any) -> tuple[int, list[dict[str, Any]]]:
    """A task as the CLI runs it, with --json: its exit status and JSON lines."""
    out = out if out is not None else io.StringIO()
    saved = sys.stdout
    sys.stdout = out
    try:
        task(Context(), project=str(root), json=True, **flags)
        code = 0
    except Exit as exc:
        code = exc.code
    finally:
        sys.stdout = saved
    return code, [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


def test_status_names_the_refusing_and_blackholed_boxes_and_shows_the_rest(
        fleet: list[SandboxBox], project: tuple[Path, list[LatencyProxy]]) -> None:
    root, proxies = project
    (root / "hosts" / "groups.yaml").write_text(yaml.safe_dump(
        {"groups": {"pair": ["b0", "b1"], "rest": ["b2", "b3", "b4"],
                    "fleet": ["pair", "rest"]}}))
    fleet[3].stop()  # refusing: nothing listens behind its proxy
    proxies[4].blackhole_all(drop_new=True)  # blackholed: its connects get no answer

    code, rows = _run(cli.status, root, host=["fleet"])

    assert code == 1
    by_host = {r["host"]: r for r in rows}
    assert sorted(by_host) == ["b0", "b1", "b2", "b3", "b4"]
    for name in ("b0", "b1", "b2"):
        row = by_host[name]
        assert row["ok"] is True and row["error"] is None, row
        assert row["result"]["runs"] == [] and len(row["result"]["gpus"]) == 8
    assert by_host["b3"]["ok"] is False and by_host["b3"]["error"]
    assert by_host["b3"]["state"] in ("failed", "no answer")
    assert by_host["b4"]["state"] == "no answer"
    assert "no answer within" in by_host["b4"]["error"]


def test_cleanup_all_stops_exactly_outrigs_runs_on_every_box(
        fleet: list[SandboxBox], project: tuple[Path, list[LatencyProxy]],
        tmp_path: Path, procs: Any) -> None:
    root, _ = project
    playbook = tmp_path / "sleep.yaml"
    playbook.write_text(yaml.safe_dump({"name": "sleep", "processes": {"sleeper": {
        "command": [sys.executable, "-c", "import time; time.sleep(600)"], "gpus": []}}}))
    quiet = Reporter(quiet=True)
    pids = []
    for i in range(BOXES):
        deploy(Project(root), f"b{i}", str(playbook), quiet, wait=False)
    code, rows = _run(cli.status, root, host=["all"])
    assert code == 0 and sorted(r["host"] for r in rows) == [f"b{i}" for i in range(BOXES)]
    for row in sorted(rows, key=lambda r: str(r["host"])):
        (run,) = row["result"]["runs"]
        (proc,) = run["processes"]
        assert proc["state"] == "running"
        pids.append(int(proc["pid"]))
    foreign = procs.spawn([sys.executable, "-c", "import time; time.sleep(600)"])

    code, rows = _run(cli.cleanup, root, host=["all"], all=True)

    assert code == 0, rows
    assert all(r["ok"] for r in rows) and len(rows) == BOXES
    assert [len(r["result"]["runs"]) for r in rows] == [1] * BOXES
    assert wait_gone(pids) == []
    assert alive(foreign.pid)
    code, rows = _run(cli.status, root, host=["b0,b1", "b2", "b3", "b4"])
    assert code == 0 and all(r["result"]["runs"] == [] or all(
        run["status"] != "running" for run in r["result"]["runs"]) for r in rows)


def test_a_bad_selection_contacts_no_box(project: tuple[Path, list[LatencyProxy]]) -> None:
    root, proxies = project
    (root / "hosts" / "groups.yaml").write_text(yaml.safe_dump(
        {"groups": {"pair": ["b0", "b1"], "spare": []}}))
    for flags in ({"host": ["b0,nosuch"]}, {"host": ["pair", "spare"]}):
        code, rows = _run(cli.status, root, **flags)
        assert (code, rows) == (2, [])
    code, rows = _run(cli.cleanup, root, host=["pair"], run="some-run")
    assert (code, rows) == (2, [])
    assert [p.accepted for p in proxies] == [0] * BOXES


class _Lines(io.StringIO):
    """stdout that hands each complete line to ``seen`` the moment it is written."""

    def __init__(self, seen: Callable[[str], None]) -> None:
        super().__init__()
        self.seen = seen
        self.partial = ""

    def write(self, text: str) -> int:
        written = super().write(text)
        self.partial += text
        *lines, self.partial = self.partial.split("\n")
        for line in lines:
            self.seen(line)
        return written


def test_healthy_rows_are_printed_while_a_blackholed_box_is_pending(
        fleet: list[SandboxBox], project: tuple[Path, list[LatencyProxy]]) -> None:
    """b4's link holds every byte until the other four rows are on stdout; only then is it
    restored. So b4 can answer only if the healthy rows were printed while it was pending
    (with rows printed at the end, b4 would run into its deadline instead)."""
    root, proxies = project
    b4 = root / "hosts" / "b4.yaml"
    b4.write_text(yaml.safe_dump({**yaml.safe_load(b4.read_text()), "connect_timeout": 80}))
    proxies[4].blackhole_all()  # connections accepted and held, nothing forwarded
    order: list[str] = []

    def seen(line: str) -> None:
        order.append(json.loads(line)["host"])
        if sorted(order) == ["b0", "b1", "b2", "b3"]:
            proxies[4].restore()

    code, rows = _run(cli.status, root, out=_Lines(seen), host=["b4,b0,b1,b2,b3"],
                      deadline="90")

    assert order[-1] == "b4" and sorted(order[:-1]) == ["b0", "b1", "b2", "b3"]
    assert code == 0, rows
    assert all(r["ok"] for r in rows) and rows[-1]["host"] == "b4"


def test_each_hosts_warnings_are_shown_with_its_row(
        fleet: list[SandboxBox], project: tuple[Path, list[LatencyProxy]]) -> None:
    """The "moved run" warning (outrig/fencing.py) of one host reaches its JSON object and
    its row; the other host has none."""
    from outrig.journal import Journal

    root, _ = project
    Journal().mark_moved("old-run", host="b1", to_host="b2", to_run_id="new-run")
    code, rows = _run(cli.status, root, host=["b0,b1"])
    assert code == 0, rows
    by_host = {r["host"]: r for r in rows}
    assert by_host["b0"]["warnings"] == []
    (warning,) = by_host["b1"]["warnings"]
    assert "run old-run" in warning and "moved to b2" in warning

    out = io.StringIO()
    saved = sys.stdout
    sys.stdout = out
    try:
        cli.status(Context(), project=str(root), host=["b0,b1"])
    finally:
        sys.stdout = saved
    lines = out.getvalue().splitlines()
    row = next(i for i, line in enumerate(lines) if line.split()[:2] == ["b1", "ok"])
    assert lines[row + 1].strip().startswith("warning: run old-run")
