"""tail-logs as the tests drive it: a run on the box as deploy leaves it (only what follow
reads), a writer that appends to its log at a steady rate, and :class:`Follow`, the op in a
thread with its JSON lines kept."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from outrig.console import Reporter
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.ops.logs import LogTailer, TailResult
from outrig.session import HostSession, Project

PROJECT = Project(Path(__file__).resolve().parents[2])


def make_run(host_file: Path, names: list[str], run_id: str = "job-20260101-000000-abcd",
             playbook: str = "job", status: str = "running") -> Path:
    """A run on the box as deploy leaves it (only what follow reads); returns its logs dir."""
    workdir = Path(yaml.safe_load(host_file.read_text())["workdir"])
    logs = workdir / "runs" / run_id / "logs"
    logs.mkdir(parents=True)
    (workdir / "runs" / run_id / "run.json").write_text(json.dumps({
        "v": 1, "run_id": run_id, "playbook": playbook, "status": status,
        "processes": [{"name": n, "log": str(logs / f"{n}.log")} for n in names]}))
    (workdir / ".outrig" / "current").mkdir(parents=True, exist_ok=True)
    (workdir / ".outrig" / "current" / playbook).write_text(run_id + "\n")
    return logs


class Writer(threading.Thread):
    """Appends numbered lines to a log at a steady rate (unbuffered, like a real process)."""

    def __init__(self, path: Path, count: int, interval: float, prefix: str = "line") -> None:
        super().__init__(daemon=True)
        self.path, self.count, self.interval, self.prefix = path, count, interval, prefix

    def run(self) -> None:
        with open(self.path, "ab", buffering=0) as f:
            for i in range(self.count):
                f.write(f"{self.prefix} {i:06d} {'x' * (i % 37)}\n".encode())
                time.sleep(self.interval)


class Follow:
    """The tail-logs op (``--json``) in a thread; its JSON lines land in a StringIO."""

    def __init__(self, host: Path, journal: Journal, **kw: Any) -> None:
        self.out = io.StringIO()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.result: TailResult | None = None
        reporter = Reporter(json_mode=True, out=self.out, err=io.StringIO())
        self.session = HostSession(PROJECT, str(host), reporter, journal,
                                   host=HostBook(PROJECT.hosts_dir)(str(host)))
        self.tailer = LogTailer(self.session, stop=self.stop, **kw)

        def target() -> None:
            try:
                self.result = self.tailer.run()
            except BaseException as exc:
                self.error = exc
            finally:
                self.session.close()

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def finish(self, timeout: float = 20.0) -> TailResult:
        self.stop.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "tail-logs did not stop"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result

    def lines(self, process: str | None = None) -> list[str]:
        docs = [json.loads(x) for x in self.out.getvalue().splitlines() if x.strip()]
        return [d["line"] for d in docs if process is None or d["process"] == process]


def mirror_dir(journal: Journal, host: Path, run_id: str) -> Path:
    return journal.root / "logs" / host.stem / run_id


def wait_for(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
