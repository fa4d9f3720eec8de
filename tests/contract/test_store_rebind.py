"""Contract: a rendezvous store starts on the port of one that was killed a moment ago.

A job moved (or restarted) keeps its playbook's ``rdzv_port``; on one machine (the sandbox's
boxes share loopback) the new node 0's store binds the port the old store held, whose
connections sit in TIME_WAIT after the kill. torch's TCPStore reuses the address
(``SO_REUSEADDR``), so it binds; the rendezvous stand-in (tests/standins/fake_torchrun.py)
must do the same. This checks both against the same killed store: torch's ``TCPStore``
(with a Python that has torch: this one, else ``OUTRIG_TORCH_PYTHON`` or the CI's
``OUTRIG_REHEARSAL_PYTHON``) and the stand-in's ``host_store``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.support.runs import standin_path

# Host a store, let a client use it, SIGKILL the host, then bind a new store on that port
# at once: with torch's TCPStore, and (given a path) with the stand-in's host_store.
SCRIPT = """\
import importlib.util, signal, socket, subprocess, sys, time
from datetime import timedelta
import torch.distributed as dist
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
host = subprocess.Popen([sys.executable, "-c", "import sys, time\\n"
    "from datetime import timedelta\\nimport torch.distributed as d\\n"
    f"s = d.TCPStore('127.0.0.1', {port}, None, True, timeout=timedelta(seconds=30), "
    "wait_for_workers=False)\\nprint('up', flush=True)\\ntime.sleep(120)"],
    stdout=subprocess.PIPE, text=True)
assert host.stdout.readline().strip() == "up"
client = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=20))
client.set("joined", "1")
host.send_signal(signal.SIGKILL); host.wait()
plain = socket.socket()
try:
    plain.bind(("127.0.0.1", port)); print("plain: bound")
except OSError as exc:
    print("plain:", exc.errno)
plain.close()
again = dist.TCPStore("127.0.0.1", port, None, True, timeout=timedelta(seconds=10),
                      wait_for_workers=False)
print("torch: bound")
del again
spec = importlib.util.spec_from_file_location("fake_torchrun", sys.argv[1])
standin = importlib.util.module_from_spec(spec); spec.loader.exec_module(standin)
store = standin.host_store("127.0.0.1", port, 2, "1")
print("standin:", "bound" if store is not None else "not bound")
"""


def _torch_python() -> str | None:
    if importlib.util.find_spec("torch") is not None:
        return sys.executable
    return os.environ.get("OUTRIG_TORCH_PYTHON") or os.environ.get("OUTRIG_REHEARSAL_PYTHON")


def test_a_store_binds_the_port_of_one_killed_a_moment_ago_as_torch_does() -> None:
    python = _torch_python()
    if python is None:
        pytest.skip("no Python with torch: set OUTRIG_TORCH_PYTHON (or the CI's "
                    "OUTRIG_REHEARSAL_PYTHON)")
    done = subprocess.run([python, "-c", SCRIPT, str(standin_path("fake_torchrun"))],
                          capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr[-2000:]
    # the old store's connections are in TIME_WAIT: a socket without SO_REUSEADDR is refused
    assert lines[0] == "plain: 98", lines
    assert lines[1:] == ["torch: bound", "standin: bound"], lines
