"""Contract: the Mooncake master stand-in (tests/standins/fake_mooncake_master.py) does what
the real ``mooncake_master`` does in everything outrig relies on: the process, its RPC port,
its readiness, its answer to a taken port and to SIGTERM.

The same checks run against both. The real binary (mooncake-transfer-engine 0.3.13.post1,
manylinux x86_64) installs with pip on these CPUs but needs the RDMA user libraries even
for TCP (libibverbs.so.1, libnl-3, libnl-route-3); set ``OUTRIG_MOONCAKE_MASTER`` to its
``mooncake_master`` (and ``LD_LIBRARY_PATH`` to where those libraries are) to run it here;
unset, only the stand-in runs (tests/README.md says where the real one ran)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.network import free_port
from tests.support.runs import standin_path

REAL_ENV = "OUTRIG_MOONCAKE_MASTER"


def commands() -> list[object]:
    real = os.environ.get(REAL_ENV)
    return [pytest.param([sys.executable, str(standin_path("fake_mooncake_master"))],
                         id="standin"),
            pytest.param([real] if real else None, id="real",
                         marks=[] if real else pytest.mark.skip(
                             reason=f"set {REAL_ENV} to a mooncake_master (see the module)"))]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def start(command: list[str], rpc: int, metrics: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([*command, "--rpc_port", str(rpc), "--metrics_port",
                                 str(metrics), "--rpc_address", "127.0.0.1", "--metrics_host",
                                 "127.0.0.1"], stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture
def master(request: pytest.FixtureRequest, tmp_path: Path
           ) -> Iterator[tuple[list[str], subprocess.Popen[bytes], int, int, Path]]:
    command = request.param
    rpc, metrics = free_port(), free_port()
    log = tmp_path / "master.log"
    proc = start(command, rpc, metrics, log)
    try:
        yield command, proc, rpc, metrics, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_for(check: object, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("master", commands(), indirect=True)
def test_master_port_readiness_and_stop(
        master: tuple[list[str], subprocess.Popen[bytes], int, int, Path],
        tmp_path: Path) -> None:
    command, proc, rpc, metrics, log = master
    assert wait_for(lambda: listening(rpc)), log.read_text()[-2000:]
    assert "Master service started on port" in log.read_text()
    # the admin server's health answer: what a readiness check on it would read
    assert wait_for(lambda: listening(metrics)), log.read_text()[-2000:]
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/health", timeout=10) as answer:
        assert answer.status == 200
        assert json.loads(answer.read())["service_ready"] is True
    # a second master on the taken RPC port: exit 1, after the same start line
    second = start(command, rpc, free_port(), tmp_path / "second.log")
    assert second.wait(timeout=60) == 1
    assert "Master service started on port" in (tmp_path / "second.log").read_text()
    assert proc.poll() is None and listening(rpc)  # the first one is untouched
    # SIGTERM: the shutdown line, exit 0, the port free again
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert "Shutdown signal received, exiting gracefully" in log.read_text()
    assert wait_for(lambda: not listening(rpc))
