"""A ``watch`` running in a thread of a test: the events it sent, its record, its end (the
hang tests; tests/integration/test_watch.py has its own)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from outrig.console import Reporter
from outrig.journal import Journal, read_json
from outrig.ops.watch import watch
from outrig.ops.watch_record import WatchOptions, watch_file
from outrig.session import Project
from outrig.watching.notify import Notifier


class Running:
    """A watch in a thread: its notifier (the events sent), its end and its error."""

    def __init__(self, project: Project, host: str, journal: Journal, options: WatchOptions,
                 playbook: str, reporter: Reporter | None = None) -> None:
        reporter = reporter or Reporter(quiet=True)
        self.notifier = Notifier(None)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.record_path = watch_file(journal, host, playbook)

        def target() -> None:
            try:
                watch(project, host, playbook, reporter, options=options, journal=journal,
                      notifier=self.notifier, stop=self.stop)
            except BaseException as exc:  # handed to the test
                self.error = exc

        self.thread = threading.Thread(target=target, name="test-watch", daemon=True)
        self.thread.start()

    def events(self) -> list[str]:
        return [str(e["event"]) for e in self.notifier.sent]

    def wait_event(self, name: str, timeout: float = 180) -> dict[str, Any]:
        """The first event ``name`` once sent (fails if the watch ended first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.notifier.sent if e["event"] == name]
            if found:
                return found[0]
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
