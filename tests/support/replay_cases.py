"""Op cases for the replay runner (tests/unit/test_replay_cases.py): one recording per case
under tests/fixtures/replay/, made from the real agent, replayed with no box and no link.

pyinfra's data-driven op tests are the model: a folder of cases, each a recorded exchange
(here: the agent calls the op made, as the box answered them, and what the op returned and
showed), and one parametrised test that runs them all. A case is a :class:`Case`: what the
workstation holds (``workstation``: playbooks, folders; made for the recording and for each
replay), what the box holds (``box``: runs deployed before the op; made only for the
recording) and the op itself (``act``: an op entry point on a host string, returning what
the case compares).

Record (or re-record) with ``python -m tests.support.replay_cases [NAME ...]``: each case runs
on this machine's agent (a ``local`` host) with every agent call kept, and its file is
rewritten. Paths of the recording's folder are kept as ``<root>``, so a replay in another
folder compares equal.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import yaml

from outrig import session as session_module
from outrig.console import Reporter
from outrig.errors import OutrigError
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import deploy
from outrig.ops.logs import logs
from outrig.ops.migrate import probe
from outrig.ops.stage import stage, sync_checkpoints
from outrig.ops.watch_record import current_run
from outrig.session import Project
from outrig.transport import Transport
from tests.support.hosts import write_host_file
from tests.support.replay import Recording, RecordingConnector

CASES_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "replay"
ROOT_MARK = "<root>"
# a process that prints three lines and stays up (logs, watch); the `up` line is its ready
CHATTY = ("import time\nfor i in range(3): print('line', i, flush=True)\n"
          "print('up', flush=True)\ntime.sleep(600)")


@dataclass(frozen=True)
class Case:
    """One op case: see the module docstring."""

    name: str
    act: Callable[[Project, str, Reporter, Journal], Any]
    workstation: Callable[[Path], None] = lambda root: None
    box: Callable[[Project, str, Journal], None] = lambda project, host, journal: None
    # what the op showed is compared too, unless it shows how fast it went (a transfer's
    # rate and ETA): the tests assert on events and counts, never on speed
    shown: bool = True


def host_file(root: Path, name: str, hostname: str) -> Path:
    """A host file for this machine's agent (``local``) or for a recording (``replay:…``)."""
    workdir = root / "box"
    workdir.mkdir(exist_ok=True)
    return write_host_file(root, name, hostname=hostname, workdir=str(workdir),
                           python=sys.executable)


def write_book(root: Path, name: str, body: dict[str, Any]) -> None:
    path = root / "playbooks" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"name": name, **body}, sort_keys=False))


def chatty_book(root: Path) -> None:
    write_book(root, "chatty", {"processes": {"talker": {
        "command": [sys.executable, "-c", CHATTY], "ready": {"log": "^up$", "timeout": 20},
        "stop": {"grace": 2}}}})


def deploy_chatty(project: Project, host: str, journal: Journal) -> None:
    deploy(project, host, "chatty", Reporter(quiet=True), journal=journal)


def staged_book(root: Path) -> None:
    """A playbook staging one small workstation folder to the box."""
    data = root / "data"
    data.mkdir(exist_ok=True)
    (data / "a.txt").write_text("alpha\n")
    (data / "sub").mkdir(exist_ok=True)
    (data / "sub" / "b.txt").write_text("beta\n" * 3)
    write_book(root, "staged", {
        "stage": {"data": {"source": str(data), "path": "${workdir}/data"}},
        "processes": {"noop": {"command": "true"}}})


def ckpt_book(root: Path) -> None:
    write_book(root, "ckpt", {
        "stage": {"ckpt": {"path": "${workdir}/ckpt", "kind": "checkpoints"}},
        "processes": {"talker": {"command": [sys.executable, "-c", CHATTY],
                                 "ready": {"log": "^up$", "timeout": 20},
                                 "stop": {"grace": 2}}}})


def deploy_ckpt(project: Project, host: str, journal: Journal) -> None:
    deploy(project, host, "ckpt", Reporter(quiet=True), journal=journal)


def failure(run: Callable[[], Any]) -> Any:
    """What the op returned, or the error it raised (its type and message)."""
    try:
        return {"returned": run()}
    except OutrigError as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}


def tail(project: Project, host: str, reporter: Reporter, journal: Journal) -> Any:
    result = logs(project, host, reporter, playbook="chatty", lines=10, journal=journal)
    return {"lines": result.lines, "processes": sorted(result.cursors)}


def staged(project: Project, host: str, reporter: Reporter, journal: Journal) -> Any:
    result = failure(lambda: stage(project, host, "staged", reporter, journal=journal))
    for item in result.get("returned", {}).get("items", []):
        item.pop("seconds", None)  # how long it took: not what the case checks
    return result


def synced(project: Project, host: str, reporter: Reporter, journal: Journal) -> Any:
    return failure(lambda: sync_checkpoints(project, host, reporter, playbook="ckpt",
                                            journal=journal))


def watched(project: Project, host: str, reporter: Reporter, journal: Journal) -> Any:
    return failure(lambda: current_run(project, journal, host, "chatty", reporter))


def probed(project: Project, host: str, reporter: Reporter, journal: Journal) -> Any:
    session, tried = probe(project, host, reporter, journal, attempts=1)
    if session is not None:
        session.close()
    return {"reached": session is not None, "tried": [t.split(": ")[0] for t in tried]}


CASES: dict[str, Case] = {case.name: case for case in (
    Case("logs-last-lines", tail, chatty_book, deploy_chatty),
    Case("stage-workstation-folder", staged, staged_book, shown=False),
    Case("sync-checkpoints-nothing-new", synced, ckpt_book, deploy_ckpt),
    Case("watch-follows-the-current-run", watched, chatty_book, deploy_chatty),
    Case("watch-refuses-without-a-run", watched, chatty_book),
    Case("migrate-probe-reaches-the-box", probed),
)}


def masked(value: Any, root: Path, hostname: str) -> Any:
    """``value`` (JSON) with the case folder's path as ``<root>`` and the box's address (in
    an error's "on box (ADDRESS)") as ``<address>``: ``local`` live, ``replay:…`` replayed."""
    text = json.dumps(value, default=str).replace(f"box ({hostname})", "box (<address>)")
    return json.loads(text.replace(str(root), ROOT_MARK))


def moved(call: Recording, old: str, new: str) -> Recording:
    """``call`` with the path ``old`` written as ``new`` in what the agent printed."""
    return Recording(bytearray(bytes(call.stdout).replace(old.encode(), new.encode())),
                     call.stderr.replace(old, new), call.exit_status)


@contextmanager
def recorded(calls: list[Recording]) -> Any:
    """Every connector a session opens is wrapped in a :class:`RecordingConnector`."""
    real = session_module.transport_for

    def wrapped(*args: Any, **kw: Any) -> Transport:
        recorder = RecordingConnector(real(*args, **kw))
        recorder.calls = calls  # one list: a case's sessions answer in the order they ran
        return recorder

    with mock.patch.object(session_module, "transport_for", wrapped):
        yield


def state_home(root: Path) -> dict[str, str]:
    """The environment that puts outrig's workstation state (the checkpoint mirror, the
    journal's default) inside the case folder, for the recording and for each replay."""
    return {"HOME": str(root / "home"), "XDG_STATE_HOME": str(root / "home" / "state")}


def record(case: Case) -> Path:
    """Run ``case`` on this machine's agent and write its file."""
    with tempfile.TemporaryDirectory(prefix="outrig-case-") as tmp, \
            mock.patch.dict(os.environ, state_home(Path(tmp).resolve())):
        root = Path(tmp).resolve()
        (root / "playbooks").mkdir()
        case.workstation(root)
        project, journal = Project(root), Journal(root / "state")
        host = str(host_file(root, "box", "local"))
        case.box(project, host, journal)
        calls: list[Recording] = []
        out = io.StringIO()
        try:
            with recorded(calls):
                result = case.act(project, host, Reporter(out=out, err=out), journal)
        finally:
            cleanup(project, host, Reporter(quiet=True), all_runs=True, journal=journal)
        path = CASES_DIR / f"{case.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "case": case.name, "result": masked(result, root, "local"),
            "shown": out.getvalue().replace(str(root), ROOT_MARK),
            "calls": [moved(c, str(root), ROOT_MARK).to_json() for c in calls]},
            indent=1) + "\n")
        return path


if __name__ == "__main__":
    for name in sys.argv[1:] or list(CASES):
        print(record(CASES[name]))
