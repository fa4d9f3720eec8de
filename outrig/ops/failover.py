"""``outrig demo --failover``: a box dies under its job and ``watch`` moves the job by itself.

Two sandbox boxes on this machine (real sshd on 127.0.0.1, fake GPUs): ``sandbox`` and a
``spare``. The demo deploys the smoke job to ``sandbox`` with a longer training run, follows it
with ``watch --spare spare`` (in a thread of this command, printing its events), waits until
the watch has mirrored a complete checkpoint, then kills the box as a power cut would (its
sshd and every process of its run at once, the host file left in place: what ``sandbox-down
--crash`` does to a detached sandbox). The watch finds every signal failing, confirms the death
with a fresh connection, and migrates: the spare passes ``check``, gets the newest mirrored
checkpoint, and the trainer resumes there from it. The demo shows the trainer's resume line,
then stops the run and both boxes.

Everything it writes (host files, the journal, the checkpoint mirror) lives in one temporary
folder, removed at the end: it never mixes with the user's own runs of smoke.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from outrig.console import Reporter
from outrig.errors import OutrigError
from outrig.journal import Journal
from outrig.notify import Notifier
from outrig.ops.cleanup import cleanup
from outrig.ops.demo import DEMO_PLAYBOOK, demo_playbook
from outrig.ops.deploy import deploy
from outrig.ops.logs import logs
from outrig.ops.watch import WatchOptions, watch
from outrig.session import Project

FAILOVER_STEPS = 4000  # 0.05 s a step: over three minutes of training, a checkpoint a second
FAILOVER_THRESHOLD = 15.0  # seconds every signal must fail before the box may be called dead
MIRRORED_BEFORE_CRASH = 3  # the box dies once the watch holds this checkpoint
WAIT_LIMIT = 300.0  # seconds for each stage (a checkpoint mirrored, the move) on a slow laptop


@contextlib.contextmanager
def own_state(root: Path) -> Iterator[None]:
    """outrig's state (journal, checkpoint mirror, watches) under ``root`` for the demo."""
    before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(root / "state")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = before


def failover_playbook(root: Path, port: int) -> Path:
    """The shipped smoke playbook with a longer run and a free port written into the file
    (so the move deploys the same job on the spare)."""
    path = demo_playbook(root)
    data = yaml.safe_load(path.read_text())
    data["params"].update(steps=FAILOVER_STEPS, port=port)
    data["description"] = "smoke, trained long enough for its box to die under it"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_failover(reporter: Reporter, *, one_way_delay: float = 0.0) -> dict[str, Any]:
    """The demo (module docstring): deploy, watch, crash, move, resume; then clean up. Its
    project is its own folder (``hosts/sandbox.yaml``, ``hosts/spare.yaml``,
    ``playbooks/smoke.yaml``), so the boxes go by those names. Returns what happened: the
    events the watch sent, the old and new run ids, the checkpoint resumed from and the
    trainer's resume line."""
    from outrig.sandbox.box import free_port, start_sandbox

    root = Path(tempfile.mkdtemp(prefix="outrig-failover-"))
    boxes: list[Any] = []
    proxies: list[Any] = []
    try:
        with own_state(root):
            reporter.info(f"• starting two sandbox boxes in {root}: sandbox and spare")
            project = Project(root / "job")
            for name in ("sandbox", "spare"):
                box = start_sandbox(root / name, name=name)
                boxes.append(box)
                _host_file(box, project.hosts_dir, name, one_way_delay, proxies)
            playbook = failover_playbook(root / "job", free_port())
            return _follow_and_crash(project, reporter, boxes, playbook, proxies)
    finally:
        for proxy in proxies:
            proxy.close()
        for box in boxes:
            box.stop()
        shutil.rmtree(root, ignore_errors=True)


def _host_file(box: Any, hosts_dir: Path, name: str, one_way_delay: float,
               proxies: list[Any]) -> Path:
    from outrig.sandbox.proxy import LatencyProxy

    port = box.port
    if one_way_delay > 0:
        proxy = LatencyProxy(box.host, box.port, one_way_delay=one_way_delay).start()
        proxies.append(proxy)
        port = proxy.port
    return Path(box.write_host_file(hosts_dir / f"{name}.yaml", port=port))


def _follow_and_crash(project: Project, reporter: Reporter, boxes: list[Any],
                      playbook: Path, proxies: list[Any]) -> dict[str, Any]:
    from outrig.sandbox.faults import kill_runs

    sandbox, spare = "sandbox", "spare"
    box, spare_box = boxes
    journal = Journal()
    reporter.info(f"• deploying {DEMO_PLAYBOOK} ({FAILOVER_STEPS} steps) to sandbox")
    first = deploy(project, sandbox, str(playbook), reporter, journal=journal)
    reporter.info(f"• watch --spare spare (death threshold {FAILOVER_THRESHOLD:.0f}s, "
                  "scaled with the RTT)")
    stop = threading.Event()
    notifier = Notifier(None, reporter)
    failure: list[BaseException] = []

    def follow() -> None:
        try:
            watch(project, sandbox, DEMO_PLAYBOOK, reporter, journal=journal,
                  notifier=notifier, stop=stop,
                  options=WatchOptions(spares=[spare], threshold=FAILOVER_THRESHOLD))
        except BaseException as exc:  # shown by the main thread
            failure.append(exc)

    thread = threading.Thread(target=follow, name="outrig-demo-watch", daemon=True)
    thread.start()
    try:
        _wait(lambda: _mirrored(journal, sandbox) >= MIRRORED_BEFORE_CRASH, thread, failure,
              f"the watch to mirror checkpoint {MIRRORED_BEFORE_CRASH}")
        reporter.info("• crashing sandbox: its sshd and every process of its run killed at "
                      "once; its host file stays (as `outrig sandbox-down --crash`)")
        box.stop()
        for proxy in proxies:
            proxy.cut_all()
        kill_runs(box.workdir)
        resumed = _wait(lambda: _event(notifier, "resumed"), thread, failure,
                        "the watch to move the run to spare")
        new_run = str(resumed["run_id"])
        line = _wait(lambda: _resumed(spare_box.workdir, new_run), thread, failure,
                     "the trainer on spare to resume")
        reporter.info(f"• the run moved to spare as {new_run}, from checkpoint "
                      f"{resumed.get('checkpoint')} (the last complete one the watch "
                      f"mirrored); the trainer there says: {line}")
        logs(project, spare, reporter, run_id=new_run, processes=["trainer"], lines=4,
             journal=journal)
    finally:
        stop.set()
        thread.join(60)
        with contextlib.suppress(OutrigError):
            cleanup(project, spare, Reporter(quiet=True), all_runs=True, journal=journal)
    reporter.success("failover demo done: deploy → box death → watch moved the run to the "
                     "spare → it resumed there from its last complete checkpoint")
    return {"events": [e.get("event") for e in notifier.sent], "old_run": first.plan.run_id,
            "new_run": new_run, "checkpoint": resumed.get("checkpoint"), "resume_line": line}


def _event(notifier: Notifier, name: str) -> dict[str, Any] | None:
    return next((e for e in notifier.sent if e.get("event") == name), None)


def _mirrored(journal: Journal, host: str) -> int:
    """The newest checkpoint the watch has mirrored (-1: none yet)."""
    from outrig.ops.watch import find_watch

    found = find_watch(journal, host, DEMO_PLAYBOOK)
    mirrored = None if found is None else found[1].get("mirrored")
    return int(mirrored) if isinstance(mirrored, int) else -1


def _resumed(workdir: Path, run_id: str) -> str | None:
    """Whether the trainer on the spare said it resumed (its log, read on this machine: the
    sandbox box is here; the demo then shows it through ``tail-logs``)."""
    try:
        text = (workdir / "runs" / run_id / "logs" / "trainer.log").read_text()
    except OSError:
        return None
    return next((line for line in text.splitlines() if "Resuming from checkpoint" in line),
                None)


def _wait(check: Any, thread: threading.Thread, failure: list[BaseException],
          what: str) -> Any:
    deadline = time.monotonic() + WAIT_LIMIT
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if failure:
            raise failure[0]
        if not thread.is_alive():
            raise OutrigError(f"the watch ended before {what}")
        time.sleep(0.5)
    raise OutrigError(f"waited {WAIT_LIMIT:.0f}s for {what}; see the lines above")
