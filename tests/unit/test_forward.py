"""``outrig forward``'s checks before anything is sent, and its pump (``selectors``, which
works past the 1024 file descriptors ``select()`` is limited to)."""

from __future__ import annotations

import resource
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from outrig.console import Reporter
from outrig.errors import ConfigError
from outrig.inventory import resolve_host
from outrig.journal import Journal
from outrig.ops.forward import checked_port, forward, process_port, pump
from outrig.session import Project


class Listener:
    """A TCP listener on 127.0.0.1 that counts the connections it is sent (a box that must
    not be contacted)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


@pytest.fixture
def box() -> Iterator[Listener]:
    listener = Listener()
    yield listener
    listener.sock.close()


@pytest.mark.parametrize("flag,value", [
    ("remote_port", 70000), ("remote_port", -1), ("remote_port", 0),
    ("local_port", 70000), ("local_port", -1),
])
def test_a_port_out_of_range_is_refused_before_the_box_is_contacted(
        box: Listener, tmp_path: Path, flag: str, value: int) -> None:
    ports = {"remote_port": 8000, flag: value}
    with pytest.raises(ConfigError, match=f"--{flag.replace('_', '-')} {value} is not a TCP "
                                          "port.*Nothing was sent") as caught:
        forward(Project(tmp_path), resolve_host(f"root@127.0.0.1:{box.port}",
                                                hosts_dir=tmp_path / "hosts"),
                Reporter(quiet=True),
                journal=Journal(tmp_path / "state"), **ports)
    assert caught.value.exit_code == 2
    assert box.accepted == 0


def test_local_port_zero_means_any_free_port() -> None:
    assert checked_port(0, "--local-port", any_free=True) == 0
    assert checked_port(65535, "--remote-port") == 65535
    with pytest.raises(ConfigError):
        checked_port(True, "--remote-port")  # type: ignore[arg-type]


def test_a_plan_port_out_of_range_is_named_not_a_traceback(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "state")
    host = resolve_host("root@127.0.0.1:2222", hosts_dir=tmp_path)
    for run_id, ready in (("r-port", {"port": 70000}),
                          ("r-http", {"http": "http://127.0.0.1:99999/health"})):
        journal.record_run(run_id, {"run_id": run_id, "host": host.name, "status": "running",
                                    "plan": {"processes": [{"name": "server",
                                                            "ready": ready}]}})
        with pytest.raises(ConfigError, match="is not a TCP port.*--remote-port N"):
            process_port(journal, host, "server", run_id=run_id)


def test_pump_carries_bytes_on_descriptors_past_1024() -> None:
    """Both ends of the pump numbered above 1024 (``select()`` raises ValueError there)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit of open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    fillers = []
    try:
        while True:
            probe = socket.socket()
            fillers.append(probe)
            if probe.fileno() > 1030:
                break
        outer_client, client = socket.socketpair()
        channel, outer_channel = socket.socketpair()
        assert client.fileno() > 1024 and channel.fileno() > 1024
        outer_client.settimeout(10)
        outer_channel.settimeout(10)
        worker = threading.Thread(target=pump, args=(client, channel), daemon=True)
        worker.start()
        outer_client.sendall(b"request")
        assert outer_channel.recv(100) == b"request"
        outer_channel.sendall(b"answer")
        assert outer_client.recv(100) == b"answer"
        outer_client.close()  # the local side closes: the pump ends
        worker.join(10)
        assert not worker.is_alive()
        for sock in (client, channel, outer_channel):
            sock.close()
    finally:
        for sock in fillers:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
