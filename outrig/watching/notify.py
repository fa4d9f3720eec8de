"""The ``on_event`` hook: a local command told about what happens to an unattended run.

Why a command and not a built-in webhook client: the user's own command (``curl`` to Slack, a
``notify-send``, an e-mail script) is one line for them, and outrig then needs no network
credentials, retries or message formats of its own. Nothing is sent anywhere unless
``on_event`` is configured.

The command gets one event as a JSON object on its stdin (``event``, ``time``, ``host`` and
what the event knows: ``run_id``, ``playbook``, ``why``, ``to`` ...) and the event's name in
``OUTRIG_EVENT``. It runs without a shell (its argv is the configured list, or the configured
text split like a shell would), one at a time and in order, on a worker thread: a slow or
hanging hook never holds up the watch that sent the event; each run is limited to
``HOOK_TIMEOUT_S`` and then killed: every process of the session it was started in (a
``curl &`` or a daemon it left behind in another process group too), and outrig stops
waiting on its pipes, which a process that left the session may still hold, so the next
event is delivered. A failing hook is reported as a warning, never raised.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from outrig.console import Reporter
from outrig.errors import ConfigError

EVENTS = ("suspect", "dead", "migrating", "resumed", "fenced", "failed", "finished",
          "restarting", "recovered", "gpu_unhealthy", "hung",
          "rent_started", "rented", "released",  # these three: outrig.providers
          "node_lost", "job_moved", "spares_spent",  # these three: a job's watch (job_move)
          "evaluating", "evaluated", "evaluation_failed")  # evaluate.during_training
HOOK_TIMEOUT_S = 30.0
PIPE_GRACE_S = 2.0  # after the kill: how long the pipes may take to close before we let go
_STOP = object()


def session_members(sid: int) -> list[int]:
    """The pids in session ``sid`` (Linux ``/proc``; empty where there is none)."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 4 and int(fields[3]) == sid:
            members.append(int(entry))
    return members


def kill_session(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process of the session ``proc`` leads (it was started with
    ``start_new_session``, so the session id is its pid). Safe from pid reuse: ``proc`` is
    not reaped yet, so no other process can have its pid, and only a process with that pid
    can lead a session with that id. Its process group too, where /proc is missing."""
    for pid in session_members(proc.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def exit_status_unreaped(proc: subprocess.Popen[bytes]) -> int | None:
    """``proc``'s exit status if it has ended, left unreaped (``WNOWAIT``): its pid, and so
    its session id, stays its own until :func:`let_go` reaps it."""
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return proc.returncode
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def let_go(proc: subprocess.Popen[bytes], grace: float = PIPE_GRACE_S) -> bool:
    """After :func:`kill_session`: wait a moment for the pipes to close; when something
    outside the session (a daemon that called setsid) still holds them, close our ends
    instead and reap the hook. Whether the pipes had to be abandoned."""
    try:
        proc.communicate(timeout=grace)
        return False
    except subprocess.TimeoutExpired:
        pass
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)  # killed above: it is reaped at once
    return True


def hook_argv(value: Any, where: str) -> list[str] | None:
    """An ``on_event:`` value as argv: a list of words, or one text split like a shell would
    (quotes kept together, nothing expanded); ``None``/empty: no hook. Anything else is a
    ConfigError naming where it was set."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: on_event: cannot split {value!r} into words ({exc}); "
                              "close the quote, or give the command as a list") from None
        return argv or None
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise ConfigError(f"{where}: on_event: must be a command (text such as "
                      "'curl -s -d @- https://hooks.example/x', or a list of words), "
                      f"not {value!r}")


@dataclass
class Notifier:
    """Sends events to the ``on_event`` command; with no command, :meth:`send` does nothing
    but remember the event (``sent`` lists every event either way, for reports and tests)."""

    argv: list[str] | None = None
    reporter: Reporter | None = None
    timeout: float = HOOK_TIMEOUT_S
    grace: float = PIPE_GRACE_S
    sent: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._queue: queue.Queue[object] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def send(self, event: str, **fields: Any) -> dict[str, Any]:
        """Queue ``event`` for the hook and return its JSON object."""
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}; one of {', '.join(EVENTS)}")
        payload = {"event": event, "time": round(time.time(), 3), **fields}
        self.sent.append(payload)
        if self.argv:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._work, name="outrig-on-event",
                                                    daemon=True)
                    self._thread.start()
            self._queue.put(payload)
        return payload

    def close(self, timeout: float | None = None) -> None:
        """Let the queued events reach the hook (each within its own limit), then stop."""
        with self._lock:
            thread = self._thread
            self._thread = None
        if thread is None:
            return
        self._queue.put(_STOP)
        thread.join(timeout)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            assert isinstance(item, dict)
            problem = self._run(item)
            if problem:
                self.failures.append(problem)
                if self.reporter is not None:
                    self.reporter.warn(problem)

    def _run(self, payload: dict[str, Any]) -> str | None:
        """One run of the hook; what went wrong, or None."""
        assert self.argv
        name = str(payload["event"])
        data = (json.dumps(payload, sort_keys=True, default=str) + "\n").encode()
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    env={**os.environ, "OUTRIG_EVENT": name})
        except OSError as exc:
            return (f"on_event hook {self.argv[0]!r} could not start for event {name} "
                    f"({exc.strerror or exc}); fix on_event: in outrig.yaml")
        try:
            _, err = proc.communicate(data, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            exited = exit_status_unreaped(proc)  # did the hook itself end in time?
            kill_session(proc)
            held = let_go(proc, self.grace)
            what = (f"exited {exited}, but what it left running held its output open past "
                    f"{self.timeout:.0f}s" if exited is not None else
                    f"ran over {self.timeout:.0f}s")
            left = (" (a process outside its session still holds its output; outrig no "
                    "longer waits for it)") if held else ""
            return (f"on_event hook {self.argv[0]!r} {what} for event {name} and was "
                    f"stopped{left}; the next events are still sent")
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
            return (f"on_event hook {self.argv[0]!r} exited {proc.returncode} for event {name}"
                    + (f": {tail[0][:200]}" if tail[0] else ""))
        return None
