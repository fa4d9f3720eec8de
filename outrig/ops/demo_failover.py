"""``outrig demo --failover``: the rented-replacement loop, end to end, on this machine.

A box is rented from the ``sandbox`` provider, the shipped smoke job deployed on it, and
``watch --spare auto`` follows it. Then the box dies (its sshd, its sessions and its runs
stop, as a machine that loses power). The watch calls the death, rents a new sandbox box,
moves the job there and resumes it from the newest mirrored checkpoint, and releases the
dead box; ``boxes`` shows what each cost. Everything it rented is released at the end.
See docs/providers.md.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from outrig.console import Reporter
from outrig.errors import OutrigError
from outrig.journal import Journal, read_json
from outrig.ops.cleanup import cleanup, stop_all_runs
from outrig.ops.demo import DEMO_PLAYBOOK, demo_playbook, ensure_sshd
from outrig.ops.deploy import deploy
from outrig.ops.watch import watch
from outrig.ops.watch_record import WatchOptions, watch_file
from outrig.providers import ledger
from outrig.providers import sandbox as market
from outrig.providers.reconcile import boxes_lines, reconcile
from outrig.providers.renting import release, rent
from outrig.session import Project
from outrig.watching.notify import Notifier

BOX = "failover-a"
LIMIT = 300.0  # seconds each stage may take before the demo gives up and says so


def run_failover_demo(reporter: Reporter) -> None:
    """The loop of the module docstring, printed as it goes."""
    ensure_sshd(reporter)
    root = Path(tempfile.mkdtemp(prefix="outrig-failover-"))
    project, journal = Project(root), Journal()
    demo_playbook(root)
    (root / "outrig.yaml").write_text(yaml.safe_dump({
        "spares": {"provider": "sandbox", "gpus": "8xH100", "release_dead": True},
        "budget": {"max_boxes": 2, "max_price_per_hour": 6}}))
    stop = threading.Event()
    thread: threading.Thread | None = None
    try:
        rented = rent(project, "sandbox", "8xH100", name=BOX, journal=journal)
        reporter.success(f"rented {BOX} ({rented['instance_id']}) at "
                         f"${rented['price_per_hour']:.2f}/h in {rented['seconds']:.1f}s")
        from outrig.sandbox.box import free_port

        deploy(project, BOX, DEMO_PLAYBOOK, _quiet(), journal=journal,
               params={"port": free_port(), "steps": 100000})
        reporter.info(f"• smoke runs on {BOX}; watch --spare auto follows it")
        thread = threading.Thread(target=_watch, args=(project, journal, reporter, stop),
                                  name="outrig-demo-watch", daemon=True)
        thread.start()
        record = watch_file(journal, BOX, DEMO_PLAYBOOK)
        _wait(lambda: (read_json(record) or {}).get("mirrored") is not None,
              "the watch to mirror a checkpoint")
        reporter.info(f"• {BOX} dies: its sshd, sessions and runs stop")
        _power_off(project, journal, str(rented["instance_id"]), root)
        _wait(lambda: _moved_and_released(read_json(record) or {}),
              "the job to resume on a rented box and the dead one to be released")
        stop.set()
        reporter.lines(boxes_lines(reconcile(project, journal), show_all=True))
    finally:
        stop.set()
        if thread is not None:
            thread.join(60)
        _release_all(project, journal, reporter)
        shutil.rmtree(root, ignore_errors=True)


def _watch(project: Project, journal: Journal, reporter: Reporter,
           stop: threading.Event) -> None:
    with contextlib.suppress(OutrigError):  # a failed watch ends the demo at its deadline
        watch(project, BOX, DEMO_PLAYBOOK, reporter, journal=journal,
              notifier=Notifier(None, reporter), stop=stop,
              options=WatchOptions(spares=["auto"], threshold=5.0, period=0.5))


def _power_off(project: Project, journal: Journal, instance_id: str, root: Path) -> None:
    """The box dies: the provider powers it off, and its runs stop (outrig's own cleanup of
    them by record, through the box's folder on this machine, as the power cut would)."""
    market.power_off(instance_id)
    local = market.provider_root() / "instances" / instance_id / "host.yaml"
    here = root / "dead" / f"{BOX}.yaml"  # the same host name, so the journal matches it
    here.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(local, here)
    with contextlib.suppress(OutrigError):
        cleanup(project, str(here), _quiet(), all_runs=True, journal=journal)


def _moved_and_released(record: dict[str, Any]) -> bool:
    moved = record.get("moved") or []
    return record.get("host") != BOX and bool(moved) and bool(moved[0].get("stopped"))


def _wait(done: Any, what: str) -> None:
    deadline = time.monotonic() + LIMIT
    while not done():
        if time.monotonic() > deadline:
            raise OutrigError(f"the failover demo waited {LIMIT:.0f} s for {what}; run it "
                              "again, and see outrig boxes for anything it rented")
        time.sleep(0.2)


def _release_all(project: Project, journal: Journal, reporter: Reporter) -> None:
    """Give back every box the demo still rents (the replacement, or A on an error)."""
    for record in ledger.live(ledger.project_rentals(journal, str(project.root))):
        name = str(record.get("name"))
        with contextlib.suppress(OutrigError):
            done = release(project, name, force=True, journal=journal,
                               stop_runs=stop_all_runs)
            reporter.info(f"• released {name}: {ledger.money(float(done['cost']))}")


def _quiet() -> Reporter:
    return Reporter(quiet=True, out=io.StringIO(), err=io.StringIO())
