"""Seeded fault campaigns: a cut at every SSH phase of deploy, status, cleanup and tail-logs,
and of stage and sync-checkpoints (three seeded phases and a cut inside the transfer in the
short campaign, every phase in the long one), and a link that is already dead when status,
check or deploy start, through the warm connection (the keeper) and directly.

Each command either succeeds by itself after reconnecting, or stops with a lost link that
names the command to run next (never "authentication failed"); afterwards the box runs
exactly one copy of each process. The short campaign runs in the normal suite. The long one
(several faults per command: cuts and stalls, at random byte offsets of the stream, jitter,
more cuts inside transfers) runs with ``OUTRIG_FAULT_CAMPAIGN=long``; ``OUTRIG_FAULT_SEED``
picks its seed (default 11).

The deploy, status, cleanup and tail-logs campaigns run twice: on the direct path (no warm
connection) and on the warm path, through a keeper (connectors/keeper/client.py). On the warm path
each command finds no live keeper and starts one, so the fault strikes the keeper's own
connection: its handshake (which the keeper retries as a direct connect does) or its first
channel, exec and answer (the command then connects directly); and an established kept
link is reset between two commands (the next one notices and starts a fresh keeper). A link
that goes *silent* under a warm connection that is already up is tried 0, 0.5, 2 and 5 s
before the command (never reported later than on the direct path), and the keeper's live
agent is stopped, killed mid-request, or shares its channel with a suspended client.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.connectors.keeper.client import close_keepers, keepers, wait_gone
from outrig.connectors.ssh.pipelined_login import PIPELINE_ENV
from outrig.console import Reporter
from outrig.errors import AuthRefused, LinkLost, OutrigError
from outrig.inventory import resolve_host
from outrig.journal import Journal
from outrig.ops.check import check
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import deploy
from outrig.ops.logs import tail_logs
from outrig.ops.stage import mirror_root, stage, sync_checkpoints
from outrig.ops.status import status
from outrig.sandbox.proxy import Fault, LatencyProxy
from outrig.session import Project
from outrig.timing import dead_link_limit
from tests.support.logs import make_run
from tests.support.trees import checkpoint, make_tree, same_tree

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)
PHASES = ["tcp", "banner", "kex", "auth", "channel", "exec", "stream"]
LONG = os.environ.get("OUTRIG_FAULT_CAMPAIGN") == "long"
SEED = int(os.environ.get("OUTRIG_FAULT_SEED", "11"))


def transfer_phases(rng: random.Random) -> list[str]:
    """The phases stage and sync-checkpoints are cut at: all of them in the long campaign; in
    the short one, a seeded three (the handshake phases are the same code for every command,
    and the status, tail-logs, deploy and cleanup campaigns cover every one)."""
    return list(PHASES) if LONG else sorted(rng.sample(PHASES, 3), key=PHASES.index)


def faults_for(phase: str, rng: random.Random) -> list[Fault]:
    """The short campaign: one cut at ``phase``. The long one: one to three faults in a row
    (within every retry budget: 4 handshakes, 4 channel opens, 3 re-runs of a safe op), each a
    cut or a short stall, at a random byte of the stream when the phase is ``stream``."""
    if not LONG:
        return [Fault(phase=phase)]
    return [Fault(phase=phase, after_bytes=rng.randrange(0, 4096) if phase == "stream" else 0,
                  action=rng.choice(["cut", "cut", "cut", "stall"]),
                  seconds=rng.uniform(0.1, 0.6))
            for _ in range(rng.randint(1, 3))]


@contextlib.contextmanager
def layout_for(phase: str) -> Iterator[None]:
    """The connection layout a fault at ``phase`` needs: the channel open has a client flight
    of its own only while it waits for the login's answer (``OUTRIG_SSH_PIPELINE=login``); by
    default it leaves with the login, which the ``auth`` cut covers. The command's keeper, if
    it starts one, gets the same environment."""
    if phase != "channel":
        yield
        return
    saved = os.environ.get(PIPELINE_ENV)
    os.environ[PIPELINE_ENV] = "login"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(PIPELINE_ENV, None)
        else:
            os.environ[PIPELINE_ENV] = saved


@pytest.fixture(params=["direct", "warm"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The connector under test: ``direct`` (keeping off, as in most tests) or ``warm``
    (every command through a keeper)."""
    monkeypatch.setenv("OUTRIG_KEEP_SECONDS", "60" if request.param == "warm" else "0")
    return str(request.param)


class Campaign:
    """Runs commands through one proxy with faults armed, and tallies the outcomes. On the
    warm path every command starts with no live keeper (so its fault strikes the keeper it
    starts) and must leave a live keeper behind (it really went through one)."""

    def __init__(self, box_host: Path, proxy: LatencyProxy, path: str = "direct") -> None:
        self.warm = path == "warm"
        config = yaml.safe_load(box_host.read_text())
        config["port"] = proxy.port
        self.host = box_host.parent / "campaign.yaml"
        self.host.write_text(yaml.safe_dump(config))
        self.proxy = proxy
        self.rng = random.Random(SEED)
        self.outcomes: list[tuple[str, str, str]] = []  # (command, phase, outcome)
        self.false_auth = 0
        if LONG:
            proxy.set_jitter(0.01)

    def run(self, command: str, phase: str, action: Any) -> OutrigError | None:
        """Arm the faults, run ``action``; a lost link must name the next command."""
        if self.warm:
            stop_keepers()
        self.proxy.inject(*faults_for(phase, self.rng))
        try:
            with layout_for(phase):
                action()
        except OutrigError as exc:
            text = str(exc)
            if isinstance(exc, AuthRefused) or "authentication failed" in text:
                self.false_auth += 1
            assert isinstance(exc, LinkLost), f"{command} at {phase}: {exc!r}"
            assert "outrig status --host" in text or "again" in text, text
            self.outcomes.append((command, phase, "lost link, told what next"))
            return exc
        finally:
            self.proxy.disarm()  # a fault the command never reached must not hit the next
        self.outcomes.append((command, phase, "ok"))
        return None

    def reset_warm_link(self, command: str, action: Any) -> None:
        """Warm path: a keeper holding an established link (made by ``action`` without a
        fault), the link reset under it, then ``action`` again, which must succeed and
        leave a live keeper (a fresh one)."""
        action()
        before = keepers()
        assert before, f"{command} did not leave a warm connection"
        assert self.proxy.cut_all() >= 1
        action()
        after = keepers()
        assert after and {(k["pid"], k["started"]) for k in after} != {
            (k["pid"], k["started"]) for k in before}, \
            f"{command} after a reset link: keepers {before} then {after}"
        self.outcomes.append((command, "reset kept link", "ok"))


def stop_keepers() -> None:
    """End this test's live keepers (by the pid each socket's listener has) and wait."""
    for entry in close_keepers():
        assert wait_gone(int(entry["pid"]), 20), f"keeper {entry['pid']} did not stop"


def live_copies(prefix: str) -> dict[str, int]:
    """How many live copies of each process (one copy: outrig's wrapper and the command under
    it, sharing one run id) there are for runs whose id starts with ``prefix``."""
    runs: dict[str, set[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        values = dict(x.split(b"=", 1) for x in env if b"=" in x)
        run = values.get(b"OUTRIG_RUN", b"").decode()
        if run.startswith(prefix):
            runs.setdefault(values.get(b"OUTRIG_PROCESS", b"?").decode(), set()).add(run)
    return {name: len(ids) for name, ids in runs.items()}


def playbook(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "processes": {"svc": {
        "command": [sys.executable, "-u", "-c",
                    "import time\nprint('up', flush=True)\ntime.sleep(600)"],
        "ready": {"log": "up", "timeout": 30}, "stop": {"grace": 2}}}}))
    return path


def test_status_and_tail_logs_survive_a_cut_at_every_phase(box_host: Path, make_proxy: Any,
                                                          tmp_path: Path, path: str) -> None:
    config = yaml.safe_load(box_host.read_text())
    campaign = Campaign(box_host, make_proxy(config["port"], one_way_delay=0.005), path)
    logs = make_run(box_host, ["trainer"])
    lines = [f"line {i}" for i in range(500)]
    (logs / "trainer.log").write_text("".join(f"{x}\n" for x in lines))
    for phase in PHASES:
        journal = Journal(tmp_path / f"state-{phase}")
        err = campaign.run("status", phase, lambda j=journal: status(
            PROJECT, str(campaign.host), Reporter(quiet=True), journal=j))
        assert err is None, f"status is safe to re-run, so it must succeed: {err}"
        out = io.StringIO()
        err = campaign.run("tail-logs", phase, lambda j=journal, o=out: tail_logs(
            PROJECT, str(campaign.host), Reporter(json_mode=True, out=o, err=io.StringIO()),
            follow=False, lines=1000, journal=j, backoff=0.05))
        assert err is None, f"tail-logs resumes by cursor, so it must succeed: {err}"
        shown = [json.loads(x)["line"] for x in out.getvalue().splitlines()]
        assert shown == lines, f"tail-logs at {phase}: lines lost or repeated"
    if campaign.warm:
        journal = Journal(tmp_path / "state-reset")
        campaign.reset_warm_link("status", lambda: status(
            PROJECT, str(campaign.host), Reporter(quiet=True), journal=journal))
        outs: list[io.StringIO] = []

        def tail() -> None:
            outs.append(io.StringIO())
            tail_logs(PROJECT, str(campaign.host), Reporter(json_mode=True, out=outs[-1],
                                                            err=io.StringIO()),
                      follow=False, lines=1000, journal=Journal(tmp_path / f"t{len(outs)}"),
                      backoff=0.05)

        campaign.reset_warm_link("tail-logs", tail)
        shown = [json.loads(x)["line"] for x in outs[-1].getvalue().splitlines()]
        assert shown == lines, "tail-logs over a reset kept link: lines lost or repeated"
    assert campaign.false_auth == 0
    assert {p for (_c, p, _a) in campaign.proxy.fired} == set(PHASES)


def test_deploy_and_cleanup_survive_or_name_the_next_step_at_every_phase(
        box_host: Path, make_proxy: Any, tmp_path: Path, path: str) -> None:
    config = yaml.safe_load(box_host.read_text())
    campaign = Campaign(box_host, make_proxy(config["port"], one_way_delay=0.005), path)
    name = f"camp{uuid.uuid4().hex[:8]}"
    book = playbook(tmp_path, name)
    journal = Journal(tmp_path / "state")
    quiet = Reporter(quiet=True)
    try:
        for phase in PHASES:
            err = campaign.run("deploy", phase, lambda: deploy(
                PROJECT, str(campaign.host), str(book), quiet, journal=journal))
            if err is not None:  # the user does what the message says: deploy again
                deploy(PROJECT, str(campaign.host), str(book), quiet, journal=journal)
            assert live_copies(name) == {"svc": 1}, f"deploy cut at {phase}"
            err = campaign.run("cleanup", phase, lambda: cleanup(
                PROJECT, str(campaign.host), quiet, playbook=name, journal=journal))
            assert err is None, f"cleanup is safe to re-run, so it must succeed: {err}"
            assert live_copies(name) == {}, f"cleanup cut at {phase} left processes"
        if campaign.warm:
            campaign.reset_warm_link("deploy", lambda: deploy(
                PROJECT, str(campaign.host), str(book), quiet, journal=journal))
            assert live_copies(name) == {"svc": 1}, "deploy over a reset kept link"
            campaign.reset_warm_link("cleanup", lambda: cleanup(
                PROJECT, str(campaign.host), quiet, playbook=name, journal=journal))
            assert live_copies(name) == {}, "cleanup over a reset kept link left processes"
    finally:
        cleanup(PROJECT, str(box_host), Reporter(quiet=True), all_runs=True,
                journal=Journal(tmp_path / "teardown"))
    assert campaign.false_auth == 0
    fired = {p for (_c, p, _a) in campaign.proxy.fired}
    assert fired == set(PHASES), fired


def test_stage_survives_or_resumes_after_a_cut_at_every_phase(
        box_host: Path, make_proxy: Any, tmp_path: Path) -> None:
    config = yaml.safe_load(box_host.read_text())
    campaign = Campaign(box_host, make_proxy(config["port"], one_way_delay=0.005))
    source = tmp_path / "dataset"
    make_tree(source, {"a.bin": 1_500_000, "sub/b.bin": 600_000, "c.json": 100})
    # A byte cut deep in the client's bytes lands inside the file transfer itself (the
    # handshake and the agent in the first exec's command line come first, ~100 KB).
    rng = random.Random(SEED)
    offsets = [rng.randrange(300_000, 2_000_000) for _ in range(6 if LONG else 1)]
    phases = transfer_phases(rng)
    cases = [(p, Fault(phase=p)) for p in phases] + [
        ("transfer", Fault(phase="byte", direction="c2s", after_bytes=n)) for n in offsets]
    for name, fault in cases:
        box_data = tmp_path / f"box-{name}-{fault.after_bytes}"
        book = tmp_path / f"stage-{name}.yaml"
        book.write_text(yaml.safe_dump({"name": "job", "stage": {"data": {
            "path": str(box_data), "source": str(source)}}, "processes": {
            "a": {"command": "true"}}}))
        journal = Journal(tmp_path / f"state-{name}-{fault.after_bytes}")
        campaign.proxy.inject(fault)
        try:
            with layout_for(name):
                stage(PROJECT, str(campaign.host), str(book), Reporter(quiet=True),
                      journal=journal, streams=1)
        except OutrigError as exc:
            assert not isinstance(exc, AuthRefused) and "authentication failed" not in str(exc)
            assert isinstance(exc, LinkLost), f"stage at {name}: {exc!r}"
            assert "again" in str(exc), str(exc)
            campaign.proxy.disarm()
            stage(PROJECT, str(campaign.host), str(book), Reporter(quiet=True),
                  journal=journal)  # what the message says to do: it resumes
        campaign.proxy.disarm()
        assert same_tree(source, box_data), f"stage cut at {name}: the trees differ"
        assert not list(box_data.rglob("*.outrig-part"))
    fired = {p for (_c, p, _a) in campaign.proxy.fired}
    assert fired == {*phases, "byte"}, fired


def test_sync_checkpoints_survives_or_resumes_after_a_cut_at_every_phase(
        box_host: Path, make_proxy: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = yaml.safe_load(box_host.read_text())
    campaign = Campaign(box_host, make_proxy(config["port"], one_way_delay=0.005))
    save = tmp_path / "ckpt"
    for epoch in (0, 1):
        checkpoint(save, epoch)
        (save / str(epoch) / "model.safetensors").write_bytes(os.urandom(400_000))
        old = os.stat(save / str(epoch) / "config.json").st_mtime
        os.utime(save / str(epoch) / "model.safetensors", (old, old))
    book = tmp_path / "trainjob.yaml"
    book.write_text(yaml.safe_dump({"name": "trainjob", "stage": {"ckpt": {
        "path": str(save), "kind": "checkpoints"}}, "processes": {"a": {"command": "true"}}}))
    rng = random.Random(SEED)
    offsets = [rng.randrange(150_000, 900_000) for _ in range(6 if LONG else 1)]
    phases = transfer_phases(rng)
    cases = [(p, Fault(phase=p)) for p in phases] + [
        ("pull", Fault(phase="byte", direction="s2c", after_bytes=n)) for n in offsets]
    for name, fault in cases:
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / f"xdg-{name}-{fault.after_bytes}"))
        journal = Journal(tmp_path / f"state-{name}-{fault.after_bytes}")
        campaign.proxy.inject(fault)

        def sync(j: Journal = journal) -> None:
            sync_checkpoints(PROJECT, str(campaign.host), Reporter(quiet=True),
                             playbook=str(book), journal=j)

        try:
            with layout_for(name):
                sync()
        except OutrigError as exc:
            assert not isinstance(exc, AuthRefused) and "authentication failed" not in str(exc)
            assert isinstance(exc, LinkLost), f"sync-checkpoints at {name}: {exc!r}"
            assert "again" in str(exc), str(exc)
            campaign.proxy.disarm()
            sync()  # what the message says to do
        campaign.proxy.disarm()
        mirror = mirror_root("trainjob")
        for epoch in ("0", "1"):
            assert same_tree(save / epoch, mirror / epoch), f"cut at {name}: epoch {epoch}"
        assert not list(mirror.rglob("*.outrig-part"))
    fired = {p for (_c, p, _a) in campaign.proxy.fired}
    assert fired == {*phases, "byte"}, fired


DEAD_LIMIT = 2.0  # the dead-link tests' connect_timeout: (every link limit then)


GAPS = [0.0, 0.5, 2.0, 5.0]  # seconds the link is dead before the command starts


def live_ready(host_file: Path) -> None:
    """Wait until the host's keeper has its live agent ready (a call after the first one is
    served by it: the warm path's usual case)."""
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        found = [k for k in keepers() if k.get("name") == host_file.stem]
        assert len(found) == 1, found
        if (found[0].get("live") or {}).get("state") == "ready":
            return
        time.sleep(0.02)
    raise AssertionError("the keeper's live agent never became ready")


@pytest.mark.parametrize(("path", "gap"), [("direct", 0.0)] + [("warm", g) for g in GAPS])
def test_a_dead_link_is_reported_through_the_keeper_no_later_than_directly(
        path: str, gap: float, box_host: Path, make_proxy: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The link goes dead (every connection silent, new ones accepted and never answered)
    ``gap`` seconds before the command, while a keeper holds it with its live agent ready,
    or between two direct commands. status, check and deploy then fail in the handshake
    limits, never later than on the direct path, whatever the gap: a link heard from a
    moment ago is lent, and the keepalive sent beside the request finds it silent within
    the keepalive limit (the request is never started, and the fresh connection gets the one
    silent attempt left); a link quiet for a few RTTs is probed before it is lent; one that
    the keeper found dead on its own (its live agent silent, a keepalive unanswered) is gone
    with its keeper, and the command connects afresh as a direct one does. No command waits
    out the mid-call limit, and the deploy that launched nothing does not say that
    something keeps running. The limits waited are read from the error (each names its
    own)."""
    config = yaml.safe_load(box_host.read_text())
    proxy: LatencyProxy = make_proxy(config["port"], one_way_delay=0.005)
    config.update(port=proxy.port, connect_timeout=DEAD_LIMIT)
    host_file = tmp_path / "dead.yaml"
    host_file.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("OUTRIG_KEEP_SECONDS", "600" if path == "warm" else "0")
    host = resolve_host(str(host_file), hosts_dir=PROJECT.hosts_dir)
    journal = Journal(tmp_path / "state")
    book = playbook(tmp_path, f"dead{uuid.uuid4().hex[:8]}")
    commands = {
        "status": lambda r: status(PROJECT, str(host_file), r, journal=journal),
        "check": lambda r: check(PROJECT, str(host_file), r, journal=journal),
        "deploy": lambda r: deploy(PROJECT, str(host_file), str(book), r, journal=journal)}
    try:
        for name, command in commands.items():
            status(PROJECT, str(host_file), Reporter(quiet=True), journal=journal)  # works
            known = journal.host_facts(host.name).get("rtt")
            rtt = known if isinstance(known, float) else None
            direct_limit = dead_link_limit(host, rtt, kept=False)
            said: list[str] = []
            reporter = Reporter(quiet=True)
            reporter.info = said.append  # type: ignore[method-assign]
            reporter.warn = said.append  # type: ignore[method-assign]
            if path == "warm":
                live_ready(host_file)
            proxy.blackhole_all()
            time.sleep(gap)  # the setup of the case: how long the link has been dead
            before, started = proxy.accepted, time.monotonic()
            try:
                with pytest.raises(LinkLost) as caught:
                    command(reporter)
            finally:
                elapsed = time.monotonic() - started
                proxy.restore()
            text, opened = str(caught.value), proxy.accepted - before
            case = (name, gap, text)
            assert caught.value.silent and caught.value.phase == "banner", case
            assert "lost contact with the agent" not in text, case  # the mid-call limit
            assert "keeps running" not in text, case
            assert not any("Reconnecting" in line for line in said), (case, said)
            connects = [float(x) for x in re.findall(r"connect timeout of ([\d.]+) s", text)]
            tried = int(re.findall(r"Tried (\d+) time", text)[-1])
            keepalive = [float(x) for x in re.findall(r"keepalive within ([\d.]+) s", text)]
            if keepalive:  # the kept link found silent in this command: one connect left
                assert path == "warm" and opened == tried == 1, case
                assert keepalive == [DEAD_LIMIT], case
                assert any("no answer to a keepalive" in line for line in said), said
            else:  # direct, or the keeper had already found its link dead and left
                assert opened == tried == 2, case
            waited = sum(keepalive) + tried * connects[-1]
            assert waited <= direct_limit, case
            # the time itself only as a generous bound: the mid-call limit is a minute
            assert elapsed <= 3 * direct_limit + 20.0, (case, elapsed)
            assert live_copies(book.stem) == {}, name
    finally:
        for entry in close_keepers():
            wait_gone(int(entry["pid"]), 10.0)


# ------------------------------------------------------------------ the resident agent's faults

AGENT_FAULTS = ["stopped", "killed", "slow client"]


class AgentFault:
    """One fault of the keeper's live agent, struck while the commands run: ``stopped``
    (SIGSTOP before each command, SIGCONT after), ``killed`` (SIGKILL as soon as a request
    is open on it) or ``slow client`` (a tail-logs of another process, suspended as Ctrl-Z
    does, whose stream backs up in the keeper). Every pid it signals is one the test's own
    sshd started (the live agent) or the test itself (the client)."""

    def __init__(self, kind: str, host_file: Path, logs: Path, procs: Any) -> None:
        self.kind, self.host_file, self.logs, self.procs = kind, host_file, logs, procs
        self.stopped: list[int] = []
        self.struck = 0
        self.client: Any = None

    def live(self) -> dict[str, Any]:
        found = [k for k in keepers() if k.get("name") == self.host_file.stem]
        return (found[0].get("live") or {}) if found else {}

    @contextlib.contextmanager
    def around(self) -> Iterator[None]:
        """The fault around one command."""
        live_ready(self.host_file)
        pid = int(self.live()["pid"])
        if self.kind == "stopped":
            os.kill(pid, signal.SIGSTOP)
            self.stopped.append(pid)
            self.struck += 1
        done = threading.Event()
        killer = threading.Thread(target=self._kill_when_busy, args=(pid, done), daemon=True)
        if self.kind == "killed":
            killer.start()
        try:
            yield
        finally:
            done.set()
            if killer.is_alive():
                killer.join(30)
            for stopped in self.stopped:
                os.kill(stopped, signal.SIGCONT)
            for stopped in self.stopped:
                assert wait_gone(stopped, 60), "a resumed live agent stayed"
            self.stopped.clear()

    def _kill_when_busy(self, pid: int, done: threading.Event) -> None:
        while not done.is_set():
            if self.live().get("requests_open"):
                os.kill(pid, signal.SIGKILL)
                self.struck += 1
                return
            time.sleep(0.005)

    def start_slow_client(self, project: Path) -> None:
        """A tail-logs of its own process, suspended, whose stream backs up in the keeper."""
        self.client = self.procs.spawn(
            [sys.executable, "-c", "import sys; from outrig.cli import program; "
             "program.run(['outrig', *sys.argv[1:]])", "tail-logs", "--host",
             self.host_file.stem, "--playbook", "job", "--json"], cwd=project,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=dict(os.environ))
        assert self.client.stdout is not None
        assert "line 0" in self.client.stdout.readline()
        self.client.send_signal(signal.SIGSTOP)
        with open(self.logs / "noise.log", "a") as log:
            for _ in range(4):
                log.write("".join(f"{os.urandom(48).hex()}\n" for _ in range(20000)))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.live().get("backlog", 0) < 1 << 20:
            time.sleep(0.05)
        assert self.live().get("backlog", 0) >= 1 << 20, self.live()
        self.struck += 1

    def end_slow_client(self) -> None:
        if self.client is not None:
            assert self.live().get("requests_open", 0) >= 1, "the slow client was dropped"
            self.client.send_signal(signal.SIGCONT)
            self.client.send_signal(signal.SIGINT)
            self.client.communicate(timeout=120)


@pytest.mark.parametrize("kind", AGENT_FAULTS)
def test_status_tail_logs_and_deploy_survive_the_resident_agents_faults(
        kind: str, box_host: Path, make_proxy: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, procs: Any) -> None:
    """Warm path, the keeper's live agent ready: with it stopped, killed mid-request or
    sharing its channel with a suspended client, status and tail-logs succeed (lines exact),
    and deploy succeeds or names the next step, after which the box runs one copy; a
    request sent to a stopped agent never runs when it resumes."""
    monkeypatch.setenv("OUTRIG_KEEP_SECONDS", "600")
    config = yaml.safe_load(box_host.read_text())
    campaign = Campaign(box_host, make_proxy(config["port"], one_way_delay=0.005), "warm")
    logs = make_run(box_host, ["trainer", "noise"])
    lines = [f"line {i}" for i in range(500)]
    (logs / "trainer.log").write_text("".join(f"{x}\n" for x in lines))
    (logs / "noise.log").write_text("line 0\n")
    name = f"agent{uuid.uuid4().hex[:8]}"
    book = playbook(tmp_path, name)
    journal = Journal(tmp_path / "state")
    quiet = Reporter(quiet=True)
    fault = AgentFault(kind, campaign.host, logs, procs)
    project = tmp_path / "project"
    (project / "hosts").mkdir(parents=True)
    (project / "hosts" / campaign.host.name).write_text(campaign.host.read_text())
    status(PROJECT, str(campaign.host), quiet, journal=journal)  # the keeper and its agent
    try:
        if kind == "slow client":
            live_ready(campaign.host)
            fault.start_slow_client(project)
        for round_ in range(2):
            with fault.around():
                status(PROJECT, str(campaign.host), quiet, journal=journal)
            out = io.StringIO()
            with fault.around():
                tail_logs(PROJECT, str(campaign.host), Reporter(
                    json_mode=True, out=out, err=io.StringIO()), playbook="job",
                    processes=["trainer"],
                    follow=False, lines=1000, journal=Journal(tmp_path / f"t{round_}"),
                    backoff=0.05)
            shown = [json.loads(x)["line"] for x in out.getvalue().splitlines()]
            assert shown == lines, f"tail-logs, {kind}: lines lost or repeated"
            try:
                with fault.around():
                    deploy(PROJECT, str(campaign.host), str(book), quiet, journal=journal)
            except LinkLost as exc:
                # killed after the launch: what was launched keeps running; killed before it
                # (the kill can land either side): nothing was reported launched. Either way
                # the message says which, and the deploy below leaves exactly one copy
                assert kind == "killed", str(exc)
                assert "keeps running" in str(exc) or \
                    "reported nothing launched" in str(exc), str(exc)
                assert "This is a bug" not in str(exc)
                deploy(PROJECT, str(campaign.host), str(book), quiet, journal=journal)
            assert live_copies(name) == {"svc": 1}, f"deploy, {kind}"
        fault.end_slow_client()
    finally:
        cleanup(PROJECT, str(box_host), Reporter(quiet=True), all_runs=True,
                journal=Journal(tmp_path / "teardown"))
        stop_keepers()
    assert fault.struck >= (1 if kind != "stopped" else 6), fault.struck
