"""The SSH configuration followed as OpenSSH follows it (outrig/hosts/ssh_config.py), on the real
sshd: a ``ProxyCommand`` kept in an ``Include``d file carries every connection outrig makes,
and none goes to the box directly (issue 40, item 1: it connected straight to HostName:Port,
four times, while ``ssh`` used the relay)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.connectors.ssh.transport import SSHTransport
from outrig.inventory import resolve_host
from tests.support.cli import outrig
from tests.support.hosts import write_host_file

pytestmark = pytest.mark.integration

RELAY = """\
import os, socket, sys, threading
count, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(count, "a") as f:
    f.write(f"{host}:{port}\\n")
sock = socket.create_connection((host, port))
def up():
    while True:
        data = os.read(0, 65536)
        if not data:
            break
        sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while True:
    data = sock.recv(65536)
    if not data:
        break
    os.write(1, data)
"""


@pytest.fixture
def through_relay(box_project: Path, box_host: Path, make_proxy: Any, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Any]:
    """``~/.ssh/config`` names the box X (HostName, Port: the latency proxy before sshd) and
    includes ``bastion.conf``, relative, whose ``Host X`` sends it through the relay (which
    appends a line to the count file per connection). ``hosts/X.yaml`` is the sandbox with
    hostname X and no port. Returns the count file and the proxy (which counts every TCP
    connection that reached sshd)."""
    config = yaml.safe_load(box_host.read_text())
    proxy = make_proxy(config["port"], one_way_delay=0.0)
    relay, count = tmp_path / "relay.py", tmp_path / "relayed"
    relay.write_text(RELAY)
    ssh_dir = Path.home() / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "config").write_text(
        f"Include bastion.conf\nHost X\n  HostName 127.0.0.1\n  Port {proxy.port}\n")
    (ssh_dir / "bastion.conf").write_text(
        f"Host X\n  ProxyCommand {sys.executable} {relay} {count} %h %p\n")
    config["hostname"] = "X"
    del config["port"]
    write_host_file(box_project, "X", **config)
    monkeypatch.chdir(box_project)
    monkeypatch.delenv("OUTRIG_PROJECT", raising=False)
    return count, proxy


def relayed(count: Path) -> list[str]:
    return count.read_text().split() if count.exists() else []


def test_a_proxycommand_from_an_included_file_carries_every_connection(
        through_relay: tuple[Path, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's reproduction: ``outrig status --host X --no-keep``."""
    count, proxy = through_relay
    code, _, err = outrig(["status", "--host", "X", "--no-keep"], capsys)
    assert code == 0, err
    assert len(relayed(count)) >= 1, err
    # every connection that reached the box came through the relay: none direct
    assert proxy.accepted == len(relayed(count)), (proxy.accepted, relayed(count))
    assert set(relayed(count)) == {f"127.0.0.1:{proxy.port}"}  # %h %p after HostName, Port


def test_the_liveness_probe_goes_through_the_proxy_too(
        through_relay: tuple[Path, Any], box_project: Path) -> None:
    """``watch`` and ``migrate`` look at the box with a fresh connect and banner: through the
    configured proxy, never to HostName:Port directly."""
    count, proxy = through_relay
    transport = SSHTransport(resolve_host("X", hosts_dir=box_project / "hosts"))
    tcp, banner = transport.probe(10.0)
    assert tcp.ok and banner.ok, (tcp, banner)
    assert transport.confirm_alive(10.0).ok
    assert proxy.accepted == len(relayed(count)) == 3  # probe, confirm: probe + login


def test_an_alias_defined_only_in_an_included_file_resolves(
        through_relay: tuple[Path, Any], box_project: Path) -> None:
    (Path.home() / ".ssh" / "bastion.conf").write_text(
        "Host only-included\n  HostName 127.0.0.1\n")
    host = resolve_host("only-included", hosts_dir=box_project / "nohosts")
    assert host.hostname == "only-included" and host.source == "~/.ssh/config"


def test_the_keepers_connection_goes_through_the_proxy_too(
        through_relay: tuple[Path, Any], keeping: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The warm path: the keeper (another process) connects through the relay, and the
    second command rides its connection: one connection in all, relayed."""
    count, proxy = through_relay
    for _ in range(2):
        code, _, err = outrig(["status", "--host", "X"], capsys)
        assert code == 0, err
    assert proxy.accepted == len(relayed(count)) == 1, (proxy.accepted, relayed(count))
