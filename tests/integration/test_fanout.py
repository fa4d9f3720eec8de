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
from outrig.ops.deploy import deploy
from outrig.sandbox.box import SandboxBox, SandboxError, find_sshd, start_sandbox
from outrig.sandbox.proxy import LatencyProxy
from outrig.session import Project
from tests.support.processes import alive, wait_gone
from tests.support.trees import checkpoint

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
    """The "moved run" warning (outrig/moves.py) of one host reaches its JSON object and
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


def _make_run(root: Path, host: str, run_id: str) -> Path:
    """A running run of playbook ``job`` on ``host``'s workdir as deploy leaves it (only
    what the follow op reads: run.json, the current pointer, a log per process); returns
    its trainer log, which the test writes itself."""
    workdir = Path(yaml.safe_load((root / "hosts" / f"{host}.yaml").read_text())["workdir"])
    logs = workdir / "runs" / run_id / "logs"
    logs.mkdir(parents=True)
    (workdir / "runs" / run_id / "run.json").write_text(json.dumps({
        "v": 1, "run_id": run_id, "playbook": "job", "status": "running",
        "processes": [{"name": "trainer", "log": str(logs / "trainer.log")}]}))
    (workdir / ".outrig" / "current").mkdir(parents=True, exist_ok=True)
    (workdir / ".outrig" / "current" / "job").write_text(run_id + "\n")
    log = logs / "trainer.log"
    log.write_text("")
    return log


def _append(log: Path, *lines: str) -> None:
    with open(log, "a", encoding="utf-8") as handle:
        handle.write("".join(f"{line}\n" for line in lines))


def test_tail_logs_on_several_hosts_prefixes_each_line_once_and_names_the_dead_box(
        fleet: list[SandboxBox], project: tuple[Path, list[LatencyProxy]]) -> None:
    root, _ = project
    logs = {h: _make_run(root, h, f"job-2026010{i}-000000-abcd")
            for i, h in enumerate(["b0", "b1", "b2"])}
    for host, log in logs.items():
        _append(log, f"{host} one", f"{host} two")
    fleet[3].stop()  # refusing: given up after its fan-out deadline (connect 3 s + call)
    b3 = root / "hosts" / "b3.yaml"
    b3.write_text(yaml.safe_dump({**yaml.safe_load(b3.read_text()), "connect_timeout": 3}))

    code, docs = _run(cli.tail_logs, root, host=["b0,b1,b2,b3"], no_follow=True)

    assert code == 1
    lines = [d for d in docs if "line" in d]
    for host in logs:
        assert [d["line"] for d in lines if d["host"] == host] == [f"{host} one",
                                                                    f"{host} two"]
        assert all(d["process"] == "trainer" for d in lines if d["host"] == host)
    ends = {d["host"]: d for d in docs if "state" in d}
    assert sorted(ends) == ["b0", "b1", "b2", "b3"]
    assert [ends[h]["ok"] for h in ("b0", "b1", "b2", "b3")] == [True, True, True, False]
    assert ends["b3"]["error"] and ends["b0"]["result"]["lines"] == 2

    _append(logs["b1"], "b1 three")  # exactly once per host: only the new line comes
    code, docs = _run(cli.tail_logs, root, host=["b0,b1,b2"], no_follow=True)
    assert code == 0
    assert [(d["host"], d["line"]) for d in docs if "line" in d] == [("b1", "b1 three")]

    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        with pytest.raises(Exit):
            cli.tail_logs(Context(), project=str(root), host=["b0,b3"], no_follow=True,
                          lines="1")
    finally:
        sys.stdout, sys.stderr = saved
    assert out.getvalue().splitlines() == ["b0 | trainer | b0 two"]
    assert "b3 | failed:" in err.getvalue() and "1 of 2 hosts failed:" in err.getvalue()


def test_tail_logs_follow_goes_on_when_one_host_dies(
        fleet: list[SandboxBox], project: tuple[Path, list[LatencyProxy]]) -> None:
    """b1's box stops while the three are followed: b1 is named at once on stderr, and the
    lines written on b0 and b2 after that still arrive, each once."""
    import threading

    from outrig.fanout import FanOutFailed
    from outrig.ops.tail_hosts import tail_hosts
    from outrig.session import Project as OutrigProject

    root, _ = project
    logs = {h: _make_run(root, h, f"job-2026010{i}-000000-abcd")
            for i, h in enumerate(["b0", "b1", "b2"])}
    got: list[dict[str, Any]] = []
    firsts, seconds, b1_failed = threading.Event(), threading.Event(), threading.Event()

    def line(text: str) -> None:
        got.append(json.loads(text))
        shown = [d.get("line") for d in got]
        if all(f"{h} first" in shown for h in logs):
            firsts.set()
        if all(f"{h} second" in shown for h in ("b0", "b2")):
            seconds.set()

    def note(text: str) -> None:
        if text.startswith("b1 | failed:"):
            b1_failed.set()

    stop = threading.Event()
    reporter = Reporter(json_mode=True, out=_Lines(line), err=_Lines(note))
    failure: list[BaseException] = []

    def follow() -> None:
        try:
            tail_hosts(OutrigProject(root), list(logs), reporter, follow=True, stop=stop,
                       give_up_after=2.0)
        except BaseException as exc:  # handed to the test's thread
            failure.append(exc)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        for host, log in logs.items():
            _append(log, f"{host} first")
        assert firsts.wait(90), got
        fleet[1].stop()
        assert b1_failed.wait(120), got
        _append(logs["b0"], "b0 second")
        _append(logs["b2"], "b2 second")
        assert seconds.wait(90), got
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive()
    (exc,) = failure
    assert isinstance(exc, FanOutFailed) and "1 of 3 hosts: b1" in str(exc)
    for host in logs:
        want = [f"{host} first"] + ([] if host == "b1" else [f"{host} second"])
        assert [d["line"] for d in got if d.get("host") == host and "line" in d] == want
    ends = {d["host"]: d for d in got if "state" in d}
    assert ends["b1"]["ok"] is False and ends["b0"]["ok"] and ends["b2"]["ok"]


def test_provision_stage_deploy_and_sync_run_the_same_job_on_every_host(
        fleet: list[SandboxBox], project: tuple[Path, list[LatencyProxy]],
        tmp_path: Path) -> None:
    """A sweep: one single-node playbook on b0 and b1 (b3 refusing): provision, stage and
    deploy give one row per host, each host's run has its own id and journal record, and
    sync-checkpoints pulls from each."""
    from outrig.journal import Journal

    root, _ = project
    data = tmp_path / "dataset"
    data.mkdir()
    (data / "part-0.arrow").write_bytes(os.urandom(10_000))
    book = tmp_path / "sweep.yaml"
    book.write_text(yaml.safe_dump({
        "name": "sweep", "requires": {"python": ">=3.8", "disk_gb": 0.001},
        "stage": {"data": {"path": "${workdir}/data", "source": str(data)},
                  "ckpt": {"path": "${workdir}/ckpt", "kind": "checkpoints"}},
        "processes": {"sleeper": {"command": [sys.executable, "-c",
                                              "import time; time.sleep(600)"], "gpus": []}}}))
    fleet[3].stop()  # refusing

    code, rows = _run(cli.provision, root, host=["b0,b1,b3"], playbook=str(book))
    assert code == 1
    by_host = {r["host"]: r for r in rows}
    assert [by_host[h]["ok"] for h in ("b0", "b1", "b3")] == [True, True, False]
    assert by_host["b0"]["result"]["checks"] and by_host["b3"]["error"]

    code, rows = _run(cli.stage_, root, host=["b0,b1"], playbook=str(book))
    assert code == 0, rows
    for row in rows:
        (item,) = row["result"]["items"]
        assert item["route"] == "workstation" and item["bytes"] == 10_000
        workdir = Path(yaml.safe_load((root / "hosts" / f"{row['host']}.yaml").read_text())[
            "workdir"])
        assert (workdir / "data" / "part-0.arrow").read_bytes() == (
            data / "part-0.arrow").read_bytes()

    code, rows = _run(cli.deploy, root, host=["b0,b1,b3"], playbook=str(book))
    assert code == 1
    by_host = {r["host"]: r for r in rows}
    assert by_host["b3"]["ok"] is False and by_host["b3"]["error"]
    ids = [by_host[h]["result"]["run_id"] for h in ("b0", "b1")]
    assert len(set(ids)) == 2
    journal = Journal()
    for host, run_id in zip(("b0", "b1"), ids, strict=True):
        assert by_host[host]["result"]["status"] == "running"
        record = journal.run(run_id)
        assert record is not None and record["host"] == host
        assert record["status"] == "running"

    for host in ("b0", "b1"):
        workdir = Path(yaml.safe_load((root / "hosts" / f"{host}.yaml").read_text())[
            "workdir"])
        checkpoint(workdir / "ckpt", 0 if host == "b0" else 1)
    code, rows = _run(cli.sync_checkpoints, root, host=["b0,b1"], playbook=str(book))
    assert code == 0, rows
    pulled = sorted(p["epoch"] for r in rows for p in r["result"]["pulled"])
    assert pulled == [0, 1]

    code, rows = _run(cli.cleanup, root, host=["b0,b1"], all=True)
    assert code == 0 and [len(r["result"]["runs"]) for r in rows] == [1, 1]


def test_plan_on_a_group_shows_each_hosts_runs_free_gpus_and_the_fit(
        fleet: list[SandboxBox], project: tuple[Path, list[LatencyProxy]],
        tmp_path: Path) -> None:
    root, _ = project
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    holder = tmp_path / "holder.yaml"
    holder.write_text(yaml.safe_dump({"name": "holder", "processes": {
        "trainer": {"command": sleep, "gpus": [0, 1]}}}))
    wants = tmp_path / "wants.yaml"
    wants.write_text(yaml.safe_dump({"name": "wants", "processes": {
        "trainer": {"command": sleep, "gpus": [1, 2]}}}))
    huge = tmp_path / "huge.yaml"
    huge.write_text(yaml.safe_dump({"name": "huge", "processes": {
        "trainer": {"command": sleep, "gpus": [8, 9]}}}))
    held = deploy(Project(root), "b0", str(holder), Reporter(quiet=True), wait=False)
    fleet[3].stop()  # refusing
    try:
        code, rows = _run(cli.plan, root, host=["b0,b1,b3"], playbook=str(wants))
        assert code == 1
        by_host = {r["host"]: r["result"] for r in rows}
        assert by_host["b3"] is None
        b0, b1 = by_host["b0"], by_host["b1"]
        assert [(r["run_id"], r["gpus"]) for r in b0["runs"]] == [(held.plan.run_id, [0, 1])]
        assert b0["free"] == [2, 3, 4, 5, 6, 7] and b0["gpus"] == 8
        assert b0["fits"] is False and held.plan.run_id in b0["why"]
        assert b1["runs"] == [] and b1["free"] == list(range(8))
        assert b1["fits"] is True and b1["needs"] == [1, 2]

        code, rows = _run(cli.plan, root, host=["b0,b1"], playbook=str(huge))
        assert code == 0
        assert [r["result"]["fits"] for r in rows] == [False, False]
        assert all("GPU" in r["result"]["why"] for r in rows)

        code, rows = _run(cli.plan, root, host=["b0,b1"])  # no playbook: runs and GPUs only
        assert code == 0 and all("fits" not in r["result"] for r in rows)
    finally:
        _run(cli.cleanup, root, host=["b0,b1"], all=True)


def test_ctrl_c_during_a_fan_out_ends_it_at_once_and_says_what_runs_on(
        fleet: list[SandboxBox], project: tuple[Path, list[LatencyProxy]]) -> None:
    """Ctrl-C while a blackholed host is pending (its deadline far away): the command ends
    with status 130 and its one-paragraph message, after the rows already printed, without
    waiting for the pending host and without a traceback."""
    import signal
    import subprocess

    root, proxies = project
    proxies[4].blackhole_all()  # connections accepted and held, nothing forwarded
    binary = Path(sys.executable).parent / "outrig"
    proc = subprocess.Popen([str(binary), "status", "--host", "b4,b0", "--json", "--no-keep",
                             "--deadline", "600", "--project", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())  # b0's row: b4 is still pending
        assert first["host"] == "b0" and first["ok"]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proxies[4].restore()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert out.strip() == ""  # no row for b4: it never answered
