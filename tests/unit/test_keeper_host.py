"""The keepers' hosting process (outrig/connectors/keeper/launch.py ``host``) ends on SIGTERM
while its launcher is still there, also on a burst of them: the handler only sets an event
(a handler that took the keepers' lock could run again, on the same thread, while the first
one held it, and sleep on it for good)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

HOST = ("import socket, sys\n"
        "from outrig.connectors.keeper.launch import host\n"
        "sys.exit(host(socket.socket(fileno=0)))\n")


def start_host() -> tuple[subprocess.Popen[bytes], socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen([sys.executable, "-c", HOST, "ready"], stdin=theirs.fileno(),
                            start_new_session=True)
    theirs.close()
    return proc, ours


def wait_started(proc: subprocess.Popen[bytes]) -> None:
    """Until the interpreter has imported the module and set its handlers (SIGTERM's is
    no longer the default)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        with open(f"/proc/{proc.pid}/status") as status:
            caught = next(line for line in status if line.startswith("SigCgt:"))
        if int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.05)
    raise AssertionError("the hosting process never set its SIGTERM handler")


def test_the_hosting_process_stays_while_its_launcher_is_there_and_ends_on_sigterm() -> None:
    proc, launcher = start_host()
    try:
        wait_started(proc)
        time.sleep(1.5)  # more than a tick of its loop
        assert proc.poll() is None, "it left while its launcher was still there"
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        launcher.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this test started
            proc.wait()


def test_a_burst_of_sigterms_ends_it() -> None:
    proc, launcher = start_host()
    try:
        wait_started(proc)
        for _ in range(200):
            if proc.poll() is not None:
                break
            os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        launcher.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
