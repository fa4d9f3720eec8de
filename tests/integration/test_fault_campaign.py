"""Seeded fault campaigns: a cut at every SSH phase of deploy, status, cleanup and tail-logs,
and of stage and sync-checkpoints (three seeded phases and a cut inside the transfer in the
short campaign, every phase in the long one).

Each command either succeeds by itself after reconnecting, or stops with a lost link that
names the command to run next (never "authentication failed"); afterwards the box runs
exactly one copy of each process. The short campaign runs in the normal suite. The long one
(several faults per command: cuts and stalls, at random byte offsets of the stream, jitter,
more cuts inside transfers) runs with ``OUTRIG_FAULT_CAMPAIGN=long``; ``OUTRIG_FAULT_SEED``
picks its seed (default 11).
"""

from __future__ import annotations

import io
import json
import os
import random
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.console import Reporter
from outrig.errors import AuthRefused, LinkLost, OutrigError
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import deploy
from outrig.ops.logs import tail_logs
from outrig.ops.stage import mirror_root, stage, sync_checkpoints
from outrig.ops.status import status
from outrig.sandbox.proxy import Fault, LatencyProxy
from outrig.session import Project
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


class Campaign:
    """Runs commands through one proxy with faults armed, and tallies the outcomes."""

    def __init__(self, box_host: Path, proxy: LatencyProxy) -> None:
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
        self.proxy.inject(*faults_for(phase, self.rng))
        try:
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
                                                          tmp_path: Path) -> None:
    config = yaml.safe_load(box_host.read_text())
    campaign = Campaign(box_host, make_proxy(config["port"], one_way_delay=0.005))
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
    assert campaign.false_auth == 0
    assert {p for (_c, p, _a) in campaign.proxy.fired} == set(PHASES)


def test_deploy_and_cleanup_survive_or_name_the_next_step_at_every_phase(
        box_host: Path, make_proxy: Any, tmp_path: Path) -> None:
    config = yaml.safe_load(box_host.read_text())
    campaign = Campaign(box_host, make_proxy(config["port"], one_way_delay=0.005))
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
