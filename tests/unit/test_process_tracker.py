"""The tests' ProcessTracker (tests/support/processes.py) ends what it recorded and nothing
that merely has its number now: a pid or group recorded with other start ticks (a pid
reused since, which a suite on a machine whose pid_max is 32768 sees) is left alone."""

from __future__ import annotations

import subprocess
import sys

from outrig.sandbox.service import start_ticks
from tests.support.processes import ProcessTracker, alive

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_recorded_pid_and_group_are_killed() -> None:
    tracker = ProcessTracker()
    grouped = tracker.spawn(SLEEP)
    other = subprocess.Popen(SLEEP, start_new_session=True)
    try:
        tracker.track_pid(other.pid)
        tracker.cleanup()
        assert grouped.wait(10) == -9 and other.wait(10) == -9
    finally:
        other.kill()
        other.wait()


def test_a_number_that_is_another_process_now_is_left_alone() -> None:
    stranger = subprocess.Popen(SLEEP, start_new_session=True)  # pid = pgid
    try:
        ticks = start_ticks(stranger.pid)
        assert ticks is not None
        tracker = ProcessTracker()
        # as if recorded for an earlier process that had the same number
        tracker.pids.append((stranger.pid, ticks - 1))
        tracker.groups.append((stranger.pid, ticks - 1))
        tracker.cleanup()
        assert alive(stranger.pid) and stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
