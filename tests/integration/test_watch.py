"""``watch`` against real sshd sandboxes behind the latency proxy, with the vLLM and trainer
stand-ins: a real death moves the job to the spare with no command typed; a crash on a box
that answers is never moved (and restarts in place when asked); a jittery, stalling link
that stays up moves nothing; a restarted watch carries on from the journal.

The watch runs in a thread of the test (``stop`` ends it); the tests wait for its events and
its record, never for a time."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import outrig.ops.migrate as migrate_module
from outrig.connectors.ssh.transport import probe_port
from outrig.console import Reporter
from outrig.errors import OutrigError
from outrig.journal import Journal, read_json
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import DeployResult, deploy
from outrig.ops.watch import watch
from outrig.ops.watch_record import WatchOptions, watch_file
from outrig.sandbox.box import SandboxBox
from outrig.sandbox.proxy import LatencyProxy
from outrig.session import Project
from outrig.watching.health import limits_for
from outrig.watching.notify import EVENTS, Notifier
from tests.support.network import free_port
from tests.support.processes import alive
from tests.support.runs import (
    kill_run,
    resumed_log,
    trainer_tag,
    wait_checkpoints,
    with_tag,
    write_playbooks,
)

# A worker thread of the watch that dies of an exception fails the test (it would otherwise be
# only a warning at the end of the run).
pytestmark = [pytest.mark.integration,
              pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")]
THRESHOLD = 4.0  # seconds: small, so a death is called soon; the judge scales it by the RTT
PERIOD = 0.5


class Running:
    """A watch in a thread: its notifier (the events sent), its end and its error."""

    def __init__(self, project: Project, host: str, journal: Journal, options: WatchOptions,
                 playbook: str = "mig-4gpu", reporter: Reporter | None = None) -> None:
        reporter = reporter or Reporter(quiet=True)
        self.notifier = Notifier(None)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.result: dict[str, Any] | None = None
        self.record_path = watch_file(journal, host, playbook)

        def target() -> None:
            try:
                self.result = watch(project, host, playbook, reporter,
                                    options=options, journal=journal, notifier=self.notifier,
                                    stop=self.stop)
            except BaseException as exc:  # handed to the test
                self.error = exc

        self.thread = threading.Thread(target=target, name="test-watch", daemon=True)
        self.thread.start()

    def events(self) -> list[str]:
        return [str(e["event"]) for e in self.notifier.sent]

    def wait_event(self, name: str, timeout: float = 180, count: int = 1) -> dict[str, Any]:
        """The ``count``-th event ``name`` once sent (fails if the watch ended first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.notifier.sent if e["event"] == name]
            if len(found) >= count:
                return found[count - 1]
            if not self.thread.is_alive():
                break
            time.sleep(0.1)
        raise AssertionError(f"no {name} event (sent: {self.events()}; error: {self.error})")

    def wait_record(self, check: Callable[[dict[str, Any]], bool],
                    timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = read_json(self.record_path)
            if isinstance(data, dict) and check(data):
                return data
            if not self.thread.is_alive():
                break
            time.sleep(0.1)
        raise AssertionError(f"the watch record never got there: {read_json(self.record_path)}"
                             f" (events {self.events()}; error: {self.error})")

    def end(self, timeout: float = 60) -> None:
        self.stop.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the watch stops when asked"


def behind_proxy(box: SandboxBox, tmp_path: Path, proxy: LatencyProxy, name: str = "a") -> Path:
    path = box.write_host_file(tmp_path / "hosts" / f"{name}.yaml", workdir=box.workdir)
    config = yaml.safe_load(path.read_text())
    config["port"] = proxy.port
    path.write_text(yaml.safe_dump(config))
    return path


def start_job(box: SandboxBox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              proxy: LatencyProxy, epochs: int | None = None, step_seconds: float = 0.5,
              tag: str | None = None) -> tuple[Project, Journal, Path, DeployResult]:
    """mig-4gpu running on ``box`` (through ``proxy``) until its first checkpoint; with
    ``epochs``, a trainer that finishes after that many (``step_seconds`` a step); with
    ``tag``, deployed with ``--param tag=TAG`` (tests.support.runs.with_tag)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    project = write_playbooks(tmp_path / "proj", free_port())
    if tag is not None:
        with_tag(project)
    if epochs is not None:
        book = project.playbooks_dir / "mig-4gpu.yaml"
        data = yaml.safe_load(book.read_text())
        argv = data["processes"]["trainer"]["command"]
        argv[argv.index("--epochs") + 1] = str(epochs)
        argv[argv.index("--fake-step-seconds") + 1] = str(step_seconds)
        book.write_text(yaml.safe_dump(data, sort_keys=False))
    journal = Journal()
    a = behind_proxy(box, tmp_path, proxy)
    first = deploy(project, str(a), "mig-4gpu", Reporter(quiet=True), journal=journal,
                   params=None if tag is None else {"tag": tag})
    wait_checkpoints(box.workdir / "ckpt", 1)
    return project, journal, a, first


def run_pids(workdir: Path, run_id: str) -> list[int]:
    """The pids of the run's wrapped processes, as the box's run record lists them."""
    run = json.loads((workdir / "runs" / run_id / "run.json").read_text())
    return [int(p["pid"]) for p in run["processes"] if p.get("pid")]


def kill_process(workdir: Path, run_id: str, name: str) -> None:
    """One process of the run crashes (SIGKILL to the program under outrig's wrapper, which
    records how it ended); the rest of the box stays up."""
    run = json.loads((workdir / "runs" / run_id / "run.json").read_text())
    wrapper = next(p for p in run["processes"] if p["name"] == name)["pid"]
    children = Path(f"/proc/{wrapper}/task/{wrapper}/children").read_text().split()
    os.kill(int(children[0]), signal.SIGKILL)


@pytest.fixture
def watches() -> Iterator[list[Running]]:
    made: list[Running] = []
    yield made
    for running in made:
        running.stop.set()
    for running in made:
        running.thread.join(60)


def test_a_dead_box_moves_to_the_first_spare_that_passes_check(
        box_a: SandboxBox, host_b: Path, tmp_path: Path,
        make_proxy: Callable[..., LatencyProxy], monkeypatch: pytest.MonkeyPatch,
        watches: list[Running]) -> None:
    proxy = make_proxy(box_a.port, one_way_delay=0.01)
    project, journal, a, first = start_job(box_a, tmp_path, monkeypatch, proxy)
    gone = tmp_path / "hosts" / "gone.yaml"  # a spare nobody answers for: skipped
    gone.write_text(yaml.safe_dump({**yaml.safe_load(host_b.read_text()), "port": free_port()}))
    b_workdir = Path(yaml.safe_load(host_b.read_text())["workdir"])
    real_migrate = migrate_module.migrate

    def migrate_with_timings(*args: Any, **kwargs: Any) -> dict[str, Any]:
        """migrate as it is, with a report["timings"] where this migrate has none."""
        report = real_migrate(*args, **kwargs)
        report.setdefault("timings", {"deploy": 1.0, "total": 2.0})
        return report

    monkeypatch.setattr(migrate_module, "migrate", migrate_with_timings)
    out = io.StringIO()
    running = Running(project, str(a), journal, WatchOptions(
        spares=[str(gone), str(host_b)], threshold=THRESHOLD, period=PERIOD),
        reporter=Reporter(err=out, out=io.StringIO()))
    watches.append(running)
    try:
        mirrored = running.wait_record(lambda r: r.get("mirrored") is not None)["mirrored"]
        assert (tmp_path / "xdg" / "outrig" / "checkpoints" / "mig" / str(mirrored)).is_dir()
        assert "suspect" not in running.events(), "a healthy box is not suspect"

        box_a.stop()  # the node dies: sshd and its sessions, the link, every process
        proxy.cut_all()
        kill_run(box_a.workdir, first.plan.run_id)

        resumed = running.wait_event("resumed")
        events = running.events()
        assert events[:4] == ["suspect", "dead", "migrating", "resumed"], events
        assert "failed" not in events
        migrating = running.wait_event("migrating")
        assert migrating["to"] == str(host_b)
        assert [s.split(":")[0] for s in migrating["skipped"]] == [str(gone)]
        assert resumed["old_run_id"] == first.plan.run_id
        checkpoint = resumed["checkpoint"]
        timings = resumed["timings"]
        assert set(timings) >= {"deploy", "total"}, "migrate's timings travel with resumed"
        assert "recovery: " in out.getvalue() and "deploy " in out.getvalue(), \
            "and are printed"
        assert f"spare {gone} skipped" in out.getvalue(), "the skipped spare's reason shown"
        assert checkpoint is not None and checkpoint >= mirrored
        record = running.wait_record(lambda r: r.get("host") == str(host_b))
        assert record["spares"] == [str(gone)], "the spare used is spent; the other stays"
        assert record["moved"][0]["run_id"] == first.plan.run_id
        new_run = record["run_id"]
        assert resumed["run_id"] == new_run and resumed["host"] == str(host_b)
        journalled = journal.run(new_run)
        assert journalled is not None and journalled["migrated_from"]["alive"] is False
        assert f"Resuming training on epoch {checkpoint + 1}" in \
            resumed_log(b_workdir, new_run)
        # and it now watches B: progress of the new run arrives
        running.wait_record(lambda r: (r.get("progress") or {}).get("state") == "running"
                            and r.get("run_id") == new_run)
        assert "dead" not in running.events()[2:], "B is alive"

        # A comes back: the watch fences it (outrig.ops.cleanup.fence_on, through the hook)
        box_a.start()
        fenced_event = running.wait_event("fenced")
        assert fenced_event["run_id"] == first.plan.run_id and fenced_event["host"] == "a"
        fenced = running.wait_record(lambda r: bool(r["moved"][0].get("fenced")))
        assert fenced["moved"][0]["stopped"] == [first.plan.run_id]
        assert [e["event"] for e in running.notifier.sent].count("fenced") == 1, \
            "once, on the old box"
        old_record = journal.run(first.plan.run_id)
        assert old_record is not None and old_record.get("fenced"), "journal says fenced"
        running.end()
        assert running.error is None

        # (d) a watch started again for A carries on on B, from the journal
        again = Running(project, str(a), journal, WatchOptions(threshold=THRESHOLD,
                                                               period=PERIOD))
        watches.append(again)
        again.wait_record(lambda r: (r.get("progress") or {}).get("state") == "running"
                          and r.get("updated", 0) > time.time() - 5
                          and r.get("run_id") == new_run)
        again.end()
        assert again.error is None
        assert again.events() == [], "nothing to report: B is alive, nothing moved again"
        assert read_json(again.record_path)["host"] == str(host_b)
    finally:
        cleanup(project, str(host_b), Reporter(quiet=True), all_runs=True, journal=journal)


def test_a_link_gone_for_good_is_a_death_and_moves_the_job(
        box_a: SandboxBox, host_b: Path, tmp_path: Path,
        make_proxy: Callable[..., LatencyProxy], monkeypatch: pytest.MonkeyPatch,
        watches: list[Running]) -> None:
    """The link to A is blackholed for good (live connections silent, new connects never
    answered): every signal fails, the fresh probe too (its TCP connect times out), so the
    job moves to B from the mirror."""
    proxy = make_proxy(box_a.port, one_way_delay=0.01)
    project, journal, a, first = start_job(box_a, tmp_path, monkeypatch, proxy)
    # Behind a dead link A's run goes on. Both boxes share this machine's ports, so B's
    # member of the family serves on a port of its own.
    book = project.playbooks_dir / "mig-8gpu.yaml"
    data = yaml.safe_load(book.read_text())
    data["params"]["port"] = free_port()
    book.write_text(yaml.safe_dump(data, sort_keys=False))
    b_workdir = Path(yaml.safe_load(host_b.read_text())["workdir"])
    running = Running(project, str(a), journal, WatchOptions(
        spares=[str(host_b)], threshold=THRESHOLD, period=PERIOD))
    watches.append(running)
    try:
        running.wait_record(lambda r: r.get("mirrored") is not None)
        proxy.blackhole_all(drop_new=True)
        resumed = running.wait_event("resumed")
        assert running.events()[:4] == ["suspect", "dead", "migrating", "resumed"]
        dead = running.wait_event("dead")
        assert "fresh connection failed" in dead["why"]
        checkpoint = resumed["checkpoint"]
        assert checkpoint is not None
        assert f"Resuming training on epoch {checkpoint + 1}" in \
            resumed_log(b_workdir, resumed["run_id"])
        record = running.wait_record(lambda r: r.get("host") == str(host_b))
        assert record["moved"] == [{"host": str(a), "run_id": first.plan.run_id,
                                    "fenced": None}]
        old_pids = run_pids(box_a.workdir, first.plan.run_id)
        assert any(alive(pid) for pid in old_pids), "A's run trained on behind the dead link"

        # the link comes back: the watch fences A (its run stopped, nothing else) and B
        # trains on
        proxy.restore()
        fenced = running.wait_event("fenced")
        assert fenced["run_id"] == first.plan.run_id
        assert not any(alive(pid) for pid in old_pids), "the old run is stopped"
        new_pids = run_pids(b_workdir, resumed["run_id"])
        assert new_pids and all(alive(pid) for pid in new_pids), "B's run is untouched"
        assert "dead" not in running.events()[2:], "B stays alive throughout"
        running.end()
    finally:
        proxy.restore()
        kill_run(box_a.workdir, first.plan.run_id)
        cleanup(project, str(host_b), Reporter(quiet=True), all_runs=True, journal=journal)


def test_a_crash_on_a_live_box_is_reported_and_restarted_in_place_not_moved(
        box_a: SandboxBox, host_b: Path, tmp_path: Path,
        make_proxy: Callable[..., LatencyProxy], monkeypatch: pytest.MonkeyPatch,
        watches: list[Running]) -> None:
    proxy = make_proxy(box_a.port, one_way_delay=0.01)
    project, journal, a, first = start_job(box_a, tmp_path, monkeypatch, proxy)
    running = Running(project, str(a), journal, WatchOptions(
        spares=[str(host_b)], restarts=1, threshold=THRESHOLD, period=PERIOD),
        reporter=Reporter())  # the lines a person reads, too (pytest keeps them)
    watches.append(running)
    try:
        running.wait_record(lambda r: (r.get("progress") or {}).get("state") == "running")
        kill_process(box_a.workdir, first.plan.run_id, "trainer")  # the job crashes

        failed = running.wait_event("failed")
        assert "trainer was killed" in failed["why"]
        running.wait_event("restarting")
        record = running.wait_record(lambda r: r.get("run_id") != first.plan.run_id
                                     and r.get("restarts_used") == 1)
        second = record["run_id"]
        assert record["host"] == str(a), "restarted in place"
        assert "Resuming training on epoch" in resumed_log(box_a.workdir, second)

        kill_process(box_a.workdir, second, "trainer")  # again: no restart left
        running.thread.join(120)
        assert not running.thread.is_alive()
        assert isinstance(running.error, OutrigError)
        assert "was not moved" in str(running.error)
        assert running.events() == ["failed", "restarting", "failed"]
        assert read_json(running.record_path)["status"] == "failed"
        b_workdir = Path(yaml.safe_load(host_b.read_text())["workdir"])
        assert not (b_workdir / "runs").exists(), "nothing was moved to the spare"
    finally:
        kill_run(box_a.workdir, first.plan.run_id)


def test_watchs_move_carries_the_params_and_needs_no_host_file_of_the_dead_box(
        box_a: SandboxBox, host_b: Path, tmp_path: Path,
        make_proxy: Callable[..., LatencyProxy], monkeypatch: pytest.MonkeyPatch,
        watches: list[Running]) -> None:
    """Deployed with --param tag=carried; A dies and its host file is deleted (as
    `sandbox-down` does, as a user does with a dead rented box): watch moves the run to B
    at the address it already holds, with tag=carried."""
    proxy = make_proxy(box_a.port, one_way_delay=0.12)
    project, journal, a, first = start_job(box_a, tmp_path, monkeypatch, proxy,
                                           tag="carried")
    running = Running(project, str(a), journal, WatchOptions(
        spares=[str(host_b)], threshold=THRESHOLD, period=PERIOD))
    watches.append(running)
    try:
        running.wait_record(lambda r: r.get("mirrored") is not None)
        a.unlink()  # the dead box's host file is gone
        box_a.stop()
        proxy.cut_all()
        kill_run(box_a.workdir, first.plan.run_id)
        resumed = running.wait_event("resumed")
        new_run = resumed["run_id"]
        assert trainer_tag(journal, new_run) == "carried"
        record = journal.run(new_run)
        assert record is not None and record["param_overrides"] == {"tag": "carried"}
        assert "Resuming training on epoch" in resumed_log(
            Path(yaml.safe_load(host_b.read_text())["workdir"]), new_run)
        running.end()
        assert running.error is None
    finally:
        cleanup(project, str(host_b), Reporter(quiet=True), all_runs=True, journal=journal)


def test_a_watch_restart_keeps_the_params(
        box_a: SandboxBox, tmp_path: Path, make_proxy: Callable[..., LatencyProxy],
        monkeypatch: pytest.MonkeyPatch, watches: list[Running]) -> None:
    """Deployed with --param tag=carried, the trainer crashes: the restart in place
    (--restarts 1) runs the playbook as deployed, with tag=carried, even though the file
    was edited since."""
    proxy = make_proxy(box_a.port, one_way_delay=0.12)
    project, journal, a, first = start_job(box_a, tmp_path, monkeypatch, proxy,
                                           tag="carried")
    book = project.playbooks_dir / "mig-4gpu.yaml"
    book.write_text(book.read_text().replace("from-the-file", "edited-since"))
    running = Running(project, str(a), journal, WatchOptions(
        restarts=1, threshold=THRESHOLD, period=PERIOD))
    watches.append(running)
    try:
        running.wait_record(lambda r: (r.get("progress") or {}).get("state") == "running")
        kill_process(box_a.workdir, first.plan.run_id, "trainer")
        record = running.wait_record(lambda r: r.get("run_id") != first.plan.run_id
                                     and r.get("restarts_used") == 1)
        second = record["run_id"]
        assert trainer_tag(journal, second) == "carried"
        again = journal.run(second)
        assert again is not None and again["param_overrides"] == {"tag": "carried"}
        assert "Resuming training on epoch" in resumed_log(box_a.workdir, second)
        running.end()
        assert running.error is None
    finally:
        kill_run(box_a.workdir, first.plan.run_id)


def test_a_blackholed_link_that_still_accepts_tcp_is_suspect_not_moved(
        box_a: SandboxBox, host_b: Path, tmp_path: Path,
        make_proxy: Callable[..., LatencyProxy], monkeypatch: pytest.MonkeyPatch,
        watches: list[Running]) -> None:
    """Through a blackhole that still accepts TCP (here the proxy; out there a provider's
    port gateway) nothing proves the box dead before the login limit (five thresholds): the
    watch says ``suspect``, moves nothing, and says ``recovered`` when the link comes back
    (tests/unit/test_health.py judges what happens past that limit)."""
    proxy = make_proxy(box_a.port, one_way_delay=0.01)
    project, journal, a, first = start_job(box_a, tmp_path, monkeypatch, proxy)
    running = Running(project, str(a), journal, WatchOptions(
        spares=[str(host_b)], threshold=THRESHOLD, period=PERIOD))
    watches.append(running)
    try:
        running.wait_record(lambda r: (r.get("progress") or {}).get("state") == "running")
        proxy.blackhole_all()
        running.wait_event("suspect")
        running.stop.wait(3 * THRESHOLD)  # well past the threshold, still blackholed
        assert "dead" not in running.events() and "migrating" not in running.events()
        proxy.restore()
        running.wait_event("recovered")
        running.end()
        assert running.error is None
        assert running.events() == ["suspect", "recovered"]
        assert read_json(running.record_path)["run_id"] == first.plan.run_id
    finally:
        proxy.restore()
        kill_run(box_a.workdir, first.plan.run_id)


SOAK_SECONDS = float(os.environ.get("OUTRIG_SOAK_SECONDS", "40"))


def test_soak_jitter_and_stalls_below_the_threshold_move_nothing(
        box_a: SandboxBox, host_b: Path, tmp_path: Path,
        make_proxy: Callable[..., LatencyProxy], monkeypatch: pytest.MonkeyPatch,
        watches: list[Running]) -> None:
    """240 ms RTT, up to +100 ms jitter per chunk, and stalls of 80 % of the threshold, while
    the box stays alive: zero migrations (``OUTRIG_SOAK_SECONDS`` makes it longer)."""
    proxy = make_proxy(box_a.port, one_way_delay=0.12)
    proxy.set_jitter(0.1)
    project, journal, a, first = start_job(box_a, tmp_path, monkeypatch, proxy,
                                           epochs=10 ** 6, step_seconds=0.1)
    threshold = 6.0
    stall = 0.8 * limits_for(threshold, 0.24).threshold  # the watch's RTT is at least this
    running = Running(project, str(a), journal, WatchOptions(
        spares=[str(host_b)], threshold=threshold))
    watches.append(running)
    try:
        running.wait_record(lambda r: (r.get("progress") or {}).get("state") == "running")
        end = time.monotonic() + SOAK_SECONDS
        stalls = 0
        while time.monotonic() < end and running.thread.is_alive():
            proxy.stall_all(stall)
            stalls += 1
            running.stop.wait(stall)  # the stall's own length, then a stretch of calm
            running.wait_record(lambda r: (r.get("progress") or {}).get("state") == "running"
                                and r.get("updated", 0) > time.time() - 30)
            running.stop.wait(min(10.0, max(0.0, end - time.monotonic())))
        assert stalls >= 1
        assert running.thread.is_alive() and running.error is None, \
            f"{running.error!r}; events {running.notifier.sent}"
        events = running.events()
        assert "dead" not in events and "migrating" not in events, events
        assert "suspect" in events, "the stalls were long enough to be noticed"
        print(f"soak: {SOAK_SECONDS:.0f}s, {stalls} stalls of {stall:.1f}s, events {events}")
        record = read_json(running.record_path)
        assert record["host"] == str(a) and record["run_id"] == first.plan.run_id
        running.end()
    finally:
        kill_run(box_a.workdir, first.plan.run_id)


def test_a_finished_run_ends_the_watch(
        box_a: SandboxBox, tmp_path: Path, make_proxy: Callable[..., LatencyProxy],
        monkeypatch: pytest.MonkeyPatch, watches: list[Running]) -> None:
    """The trainer ends by itself (exit 0) while the server runs on: the job is done."""
    proxy = make_proxy(box_a.port, one_way_delay=0.01)
    project, journal, a, first = start_job(box_a, tmp_path, monkeypatch, proxy, epochs=4)
    running = Running(project, str(a), journal, WatchOptions(threshold=THRESHOLD,
                                                             period=PERIOD))
    watches.append(running)
    try:
        running.thread.join(120)
        assert not running.thread.is_alive() and running.error is None
        assert running.events() == ["finished"]
        assert read_json(running.record_path)["status"] == "finished"
    finally:
        kill_run(box_a.workdir, first.plan.run_id)


def cli_watch(procs: Any, project: Project, a: Path, out: Path, *extra: str) -> Any:
    """``outrig watch`` as a user runs it (a process of its own; --json lines to ``out``)."""
    argv = [sys.executable, "-c", "import sys; from outrig.cli import program; "
            "program.run(['outrig', *sys.argv[1:]])", "watch", "--project", str(project.root),
            "--host", str(a), "--playbook", "mig-4gpu", "--threshold", str(THRESHOLD),
            "--json", *extra]
    with out.open("ab") as sink:
        return procs.spawn(argv, stdout=sink, stderr=subprocess.STDOUT)


def test_a_killed_watch_started_again_carries_on_from_the_journal(
        box_a: SandboxBox, tmp_path: Path, make_proxy: Callable[..., LatencyProxy],
        monkeypatch: pytest.MonkeyPatch, procs: Any) -> None:
    """The CLI's watch restarts a crashed run in place (its one restart), is SIGKILLed, and
    is started again: it follows the restarted run, knows the restart is spent, and so
    reports the next crash as final (exit 1) instead of restarting again."""
    proxy = make_proxy(box_a.port, one_way_delay=0.01)
    project, journal, a, first = start_job(box_a, tmp_path, monkeypatch, proxy)
    record_path = watch_file(journal, str(a), "mig-4gpu")
    out = tmp_path / "watch.out"
    first_watch = cli_watch(procs, project, a, out, "--restarts", "1")
    try:
        def record(check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                data = read_json(record_path)
                if isinstance(data, dict) and check(data):
                    return data
                time.sleep(0.1)
            raise AssertionError(f"{read_json(record_path)}\n{out.read_text()}")

        record(lambda r: (r.get("progress") or {}).get("state") == "running")
        kill_process(box_a.workdir, first.plan.run_id, "trainer")
        second = record(lambda r: r.get("restarts_used") == 1
                        and (r.get("progress") or {}).get("state") == "running")["run_id"]
        assert second != first.plan.run_id
        started = read_json(record_path)["started"]
        os.killpg(first_watch.pid, signal.SIGKILL)  # the watch dies, not the job
        first_watch.wait(30)

        again = cli_watch(procs, project, a, out)  # no --restarts: the journal has it
        record(lambda r: r.get("updated", 0) > time.time() - 3
               and (r.get("progress") or {}).get("state") == "running")
        kill_process(box_a.workdir, second, "trainer")
        assert again.wait(120) == 1, out.read_text()
        text = out.read_text()
        assert "carrying on the saved watch of mig-4gpu" in text
        final = read_json(record_path)
        assert final["started"] == started and final["run_id"] == second
        assert final["status"] == "failed" and final["restarts_used"] == 1
        assert [e["event"] for e in final["events"]] == ["failed", "restarting", "failed"]
        lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        assert [d["event"] for d in lines if d.get("event") in EVENTS] == \
            ["failed", "restarting", "failed"], "each event is a JSON line, as the hook gets it"
    finally:
        kill_run(box_a.workdir, first.plan.run_id)


def test_a_second_watch_of_the_same_run_is_refused_naming_the_first(
        box_a: SandboxBox, tmp_path: Path, make_proxy: Callable[..., LatencyProxy],
        monkeypatch: pytest.MonkeyPatch, procs: Any) -> None:
    """Two watches of one run both restarted it, the second's redeploy replacing the
    first's (issue 40). The second is refused (exit 2) naming the first's pid, and writes
    nothing: the first's saved watch is as it was."""
    proxy = make_proxy(box_a.port, one_way_delay=0.01)
    project, journal, a, first = start_job(box_a, tmp_path, monkeypatch, proxy)
    record_path = watch_file(journal, str(a), "mig-4gpu")
    out, second_out = tmp_path / "watch.out", tmp_path / "second.out"
    first_watch = cli_watch(procs, project, a, out, "--restarts", "1")
    try:
        deadline = time.monotonic() + 120
        while not (isinstance(read_json(record_path), dict) and
                   (read_json(record_path).get("progress") or {}).get("state") == "running"):
            assert time.monotonic() < deadline and first_watch.poll() is None, out.read_text()
            time.sleep(0.1)
        before = read_json(record_path)
        second = cli_watch(procs, project, a, second_out, "--restarts", "3")
        assert second.wait(120) == 2, second_out.read_text()
        said = second_out.read_text()
        assert f"run {first.plan.run_id} is already watched by another `outrig watch` " \
               f"(pid {first_watch.pid})" in " ".join(said.split()), said
        after = read_json(record_path)
        assert after["restarts"] == before["restarts"] == 1  # not the second's --restarts 3
        assert after["started"] == before["started"] and after["status"] == "watching"
        assert first_watch.poll() is None, "the first watch carries on"
    finally:
        kill_run(box_a.workdir, first.plan.run_id)


@pytest.mark.parametrize(("behaviour", "tcp", "banner"), [
    ("banner", True, True), ("silent", True, False), ("close", False, False),
    ("refuse", False, False), ("http", True, False)])
def test_probe_port_tells_a_banner_from_a_silent_port_and_a_dropped_one(
        behaviour: str, tcp: bool, banner: bool) -> None:
    """The ``tcp`` and ``banner`` signals: a port that accepts and stays silent (a stalled link,
    a gateway) is TCP only; one that accepts and closes at once (a stopped sshd behind a
    gateway) fails both, like a refused connect."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    held: list[socket.socket] = []
    if behaviour == "refuse":
        server.close()
    else:
        server.listen(4)

        def serve() -> None:
            conn, _ = server.accept()
            if behaviour == "banner":
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
            elif behaviour == "http":
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n")
            elif behaviour == "close":
                conn.close()
                return
            held.append(conn)

        threading.Thread(target=serve, daemon=True).start()
    try:
        got_tcp, got_banner = probe_port("127.0.0.1", port, 1.0)
        assert (got_tcp.signal, got_banner.signal) == ("tcp", "banner")
        assert (got_tcp.ok, got_banner.ok) == (tcp, banner), (got_tcp, got_banner)
    finally:
        for conn in held:
            conn.close()
        server.close()
