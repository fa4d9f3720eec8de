"""The latency proxy's fault injector: faults strike where they are aimed (checked against
paramiko's own view of the SSH handshake), bytes before a fault arrive whole and in order,
blackholes stay open and silent, stalls resume, jitter keeps order."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.agent.client import AgentCall
from outrig.connectors.ssh.transport import SSHTransport
from outrig.errors import LinkLost
from outrig.inventory import resolve_host
from outrig.sandbox.proxy import Fault, LatencyProxy, PhaseTracker
from tests.support.network import EchoServer

pytestmark = pytest.mark.integration


@pytest.fixture
def echo() -> Any:
    server = EchoServer()
    yield server
    server.close()


def through(box_host: Path, proxy: LatencyProxy, tmp_path: Path) -> SSHTransport:
    config = yaml.safe_load(box_host.read_text())
    config["port"] = proxy.port
    path = tmp_path / "hosts" / "via-proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    return SSHTransport(resolve_host(str(path), hosts_dir=tmp_path / "hosts"), link_attempts=1)


# A reset right after the proxy accepts reaches the client either while its connect() is
# still being answered or while it waits for the banner: both are the start of the link,
# and which one a loaded machine shows is a race, so both are accepted.
@pytest.mark.parametrize("phase,seen", [("tcp", {"connect", "banner"}), ("banner", {"banner"}),
                                        ("kex", {"kex"}), ("auth", {"auth"}),
                                        ("channel", {"channel"})])
def test_a_cut_strikes_the_phase_it_is_aimed_at(box_host: Path, tmp_path: Path,
                                                make_proxy: Callable[..., LatencyProxy],
                                                phase: str, seen: set[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if phase == "channel":  # a moment of its own only while the open waits for the login
        monkeypatch.setenv("OUTRIG_SSH_PIPELINE", "login")
    config = yaml.safe_load(box_host.read_text())
    proxy = make_proxy(config["port"], one_way_delay=0.005)
    # every attempt gets the fault, so the error shows the phase paramiko had reached
    proxy.inject(*[Fault(phase=phase) for _ in range(4)])
    transport = through(box_host, proxy, tmp_path)
    try:
        with pytest.raises(LinkLost) as caught:
            transport.start(["true"])
    finally:
        transport.close()
    assert caught.value.phase in seen
    assert proxy.fired[0] == (1, phase, "cut")


def test_an_exec_cut_keeps_the_command_from_the_box(box_host: Path, tmp_path: Path,
                                                    make_proxy: Callable[..., LatencyProxy]
                                                    ) -> None:
    config = yaml.safe_load(box_host.read_text())
    proxy = make_proxy(config["port"], one_way_delay=0.005)
    marker = tmp_path / "ran"
    proxy.inject(Fault(phase="exec"))
    transport = through(box_host, proxy, tmp_path)
    try:
        with pytest.raises(LinkLost) as caught:
            AgentCall(transport).reader(transport.start(["touch", str(marker)])).result()
    finally:
        transport.close()
    assert caught.value.request_sent and proxy.fired == [(1, "exec", "cut")]
    assert not marker.exists(), "the exec request must not have reached sshd"


def test_a_byte_cut_delivers_exactly_the_bytes_before_it(
        echo: EchoServer, make_proxy: Callable[..., LatencyProxy]) -> None:
    proxy = make_proxy(echo.port, one_way_delay=0.01)
    proxy.inject(Fault(phase="byte", direction="s2c", after_bytes=1000))
    received = bytearray()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(bytes(range(256)) * 20)  # 5120 bytes, echoed back
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    assert bytes(received) == (bytes(range(256)) * 20)[:1000]
    assert proxy.fired == [(1, "byte", "cut")]


def test_a_blackhole_accepts_and_stays_silent_and_open(
        echo: EchoServer, make_proxy: Callable[..., LatencyProxy]) -> None:
    proxy = make_proxy(echo.port, one_way_delay=0.0)
    proxy.inject(Fault(phase="byte", direction="s2c", after_bytes=3, action="blackhole"))
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(b"abcdef")
        assert s.recv(3) == b"abc"  # what came before the fault is delivered
        s.settimeout(0.5)
        with pytest.raises(socket.timeout):
            s.recv(1)  # then nothing, and no close: an EOF would return b""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(b"next")  # the fault was spent on the first connection
        assert s.recv(4) == b"next"


def test_a_tcp_blackhole_never_answers(make_proxy: Callable[..., LatencyProxy],
                                       echo: EchoServer) -> None:
    proxy = make_proxy(echo.port, one_way_delay=0.0)
    proxy.inject(Fault(phase="tcp", action="blackhole"))
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(b"hello")
        s.settimeout(0.5)
        with pytest.raises(socket.timeout):
            s.recv(1)
    assert proxy.fired == [(1, "tcp", "blackhole")]


def test_a_stall_holds_then_delivers_everything(
        echo: EchoServer, make_proxy: Callable[..., LatencyProxy]) -> None:
    proxy = make_proxy(echo.port, one_way_delay=0.0)
    proxy.inject(Fault(phase="byte", direction="c2s", after_bytes=0, action="stall",
                       seconds=1.0))
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(b"held")
        s.settimeout(0.3)
        with pytest.raises(socket.timeout):
            s.recv(4)  # held
        s.settimeout(10)
        got = b""
        while len(got) < 4:
            got += s.recv(4)
    assert got == b"held"


def test_jitter_keeps_order(echo: EchoServer, make_proxy: Callable[..., LatencyProxy]) -> None:
    proxy = make_proxy(echo.port, one_way_delay=0.0)
    proxy.set_jitter(0.02)
    payload = b"".join(b"%06d" % i for i in range(3000))
    received = bytearray()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        def reader() -> None:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return
                received.extend(chunk)

        t = threading.Thread(target=reader)
        t.start()
        for i in range(0, len(payload), 600):
            s.sendall(payload[i:i + 600])
            time.sleep(0.001)
        s.shutdown(socket.SHUT_WR)
        t.join(20)
    assert bytes(received) == payload


def test_phase_tracker_reads_the_cleartext_handshake() -> None:
    tracker = PhaseTracker()
    assert tracker.feed("s2c", b"SSH-2.0-OpenSSH_9\r\n") == {"banner": 0}
    kexinit = b"\x00\x00\x00\x0c\x04\x14" + b"k" * 6 + b"\x00" * 4  # 12 bytes after length
    newkeys = b"\x00\x00\x00\x0c\x0a\x15" + b"\x00" * 10
    assert tracker.feed("c2s", b"SSH-2.0-paramiko\r\n" + kexinit[:3]) == {"kex": 18}
    assert tracker.feed("c2s", kexinit[3:] + newkeys + b"ENCRYPTED") == {
        "auth": len(kexinit) - 3 + len(newkeys)}
    tracker.feed("s2c", b"service accept")
    assert tracker.feed("c2s", b"userauth") == {}
    tracker.feed("s2c", b"success")
    assert tracker.feed("c2s", b"open") == {"channel": 0}
    assert tracker.feed("c2s", b"more of the same flight") == {}
    tracker.feed("s2c", b"confirmation")
    assert tracker.feed("c2s", b"exec") == {"exec": 0}
    assert tracker.feed("s2c", b"output") == {"stream": 0}


def test_faults_are_validated() -> None:
    for bad in ({"phase": "later"}, {"action": "explode"}, {"direction": "up"},
                {"after_bytes": -1}):
        with pytest.raises(ValueError):
            Fault(**bad)


def _recv_exactly(s: socket.socket, size: int) -> bytes:
    got = b""
    while len(got) < size:
        chunk = s.recv(size - len(got))
        if not chunk:
            break
        got += chunk
    return got


def test_stall_all_holds_live_and_new_connections_then_delivers(
        echo: EchoServer, make_proxy: Callable[..., LatencyProxy]) -> None:
    proxy = make_proxy(echo.port, one_way_delay=0.0)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as live:
        live.sendall(b"one")
        assert _recv_exactly(live, 3) == b"one"  # flowing before the stall
        proxy.stall_all(1.5)
        live.sendall(b"two")
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as new:
            new.sendall(b"new")
            for s in (live, new):
                s.settimeout(0.3)
                with pytest.raises(socket.timeout):
                    s.recv(1)  # held, and not closed (an EOF would return b"")
                s.settimeout(10)
            assert _recv_exactly(live, 3) == b"two"  # then delivered, the same connection
            assert _recv_exactly(new, 3) == b"new"
    assert proxy.fired == []


def test_blackhole_all_holds_until_restore(
        echo: EchoServer, make_proxy: Callable[..., LatencyProxy]) -> None:
    proxy = make_proxy(echo.port, one_way_delay=0.0)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as live:
        proxy.blackhole_all()
        live.sendall(b"lost?")
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as new:
            new.sendall(b"new")
            for s in (live, new):
                s.settimeout(1.0)
                with pytest.raises(socket.timeout):
                    s.recv(1)
            assert proxy.connections == 2, "both stay open"
            proxy.restore()
            for s in (live, new):
                s.settimeout(10)
            assert _recv_exactly(live, 5) == b"lost?"
            assert _recv_exactly(new, 3) == b"new"


def test_blackhole_all_drop_new_leaves_new_connects_unanswered_until_restore(
        echo: EchoServer, make_proxy: Callable[..., LatencyProxy]) -> None:
    """A link that is down: new connects time out (no SYN answered), live connections stay
    open and silent; after restore both work again."""
    proxy = make_proxy(echo.port, one_way_delay=0.0)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as live:
        proxy.blackhole_all(drop_new=True)
        live.sendall(b"held")
        with pytest.raises(TimeoutError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=1.0).close()
        live.settimeout(0.5)
        with pytest.raises(socket.timeout):
            live.recv(1)
        proxy.restore()
        live.settimeout(10)
        assert _recv_exactly(live, 4) == b"held"
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as new:
            new.sendall(b"back")
            assert _recv_exactly(new, 4) == b"back"
