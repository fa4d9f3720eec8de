"""The early connect (outrig/connectors/preconnect.py): the banner sent ahead is written once,
a failure is kept for the attempt that takes it, and the SSH configuration's words that can
send a connection elsewhere keep it from starting."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from outrig.connectors import preconnect
from outrig.connectors.preconnect import (
    CLIENT_BANNER,
    BannerSentSocket,
    EarlyConnect,
    early_connect_allowed,
)

LINE = f"{CLIENT_BANNER}\r\n".encode()


def test_the_banner_sent_ahead_is_taken_as_written_and_the_rest_goes_out() -> None:
    ours, theirs = socket.socketpair()
    try:
        wrapped = BannerSentSocket(ours, LINE)
        assert wrapped.send(LINE[:5]) == 5  # paramiko's write_all may hand it over in parts
        assert wrapped.send(LINE[5:] + b"KEXINIT") == len(LINE) - 5
        wrapped.sendall(b"KEXINIT")
        theirs.settimeout(5)
        assert theirs.recv(100) == b"KEXINIT"  # the banner itself was not sent again
        assert wrapped.fileno() == ours.fileno()  # everything else is the socket's
    finally:
        ours.close()
        theirs.close()


def test_a_different_banner_is_refused_not_sent() -> None:
    ours, theirs = socket.socketpair()
    try:
        with pytest.raises(OSError, match="differs"):
            BannerSentSocket(ours, LINE).send(b"SSH-2.0-other\r\n")
    finally:
        ours.close()
        theirs.close()


def test_the_early_connect_sends_the_banner_and_hands_the_socket_over() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        early = EarlyConnect("127.0.0.1", listener.getsockname()[1], 10)
        server, _ = listener.accept()
        server.settimeout(10)
        got = b""
        while not got.endswith(b"\r\n"):
            got += server.recv(100)
        assert got == LINE
        sock, failure = early.take(10)
        assert failure is None and isinstance(sock, BannerSentSocket)
        assert early.take(1) == (None, None), "handed over once"
        sock.close()
        server.close()
    finally:
        listener.close()


def test_a_refused_early_connect_is_the_attempts_failure() -> None:
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    early = EarlyConnect("127.0.0.1", port, 10)
    sock, failure = early.take(10)
    assert sock is None and isinstance(failure, ConnectionRefusedError)
    assert early.take(1) == (None, None), "the failure is the first attempt's alone"


@pytest.mark.parametrize("text,port,allowed", [
    ("", None, True),
    ("Host gpu\n  HostName 127.0.0.1\n  User root\n", None, True),
    ("Host *\n  ProxyJump bastion\n", 22, False),
    ("Host gpu\n    proxycommand ssh -W %h:%p bastion\n", 2222, False),
    ("Host gpu\n  Port 2222\n", None, False),  # the early connect would knock on 22
    ("Host gpu\n  Port=2222\n", None, False),
    ("Host gpu\n  Port 2222\n", 2222, True),  # the host file names the port
    ("# ProxyJump bastion\n#   Port 22\n", None, True),  # comments say nothing
])
def test_the_ssh_configuration_decides_whether_it_may_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, port: int | None,
        allowed: bool) -> None:
    config = tmp_path / "config"
    config.write_text(text)
    monkeypatch.setattr(preconnect, "SSH_CONFIGS", (str(config),))
    monkeypatch.setattr(preconnect, "SSH_CONFIG_DIR", str(tmp_path / "none"))
    assert early_connect_allowed("gpu.example", port) is allowed


def test_a_file_of_the_configuration_folder_counts_too(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "ssh_config.d"
    folder.mkdir()
    (folder / "50-corp.conf").write_text("Match host *.corp\n  ProxyJump gate\n")
    monkeypatch.setattr(preconnect, "SSH_CONFIGS", ())
    monkeypatch.setattr(preconnect, "SSH_CONFIG_DIR", str(folder))
    assert early_connect_allowed("gpu.example", 22) is False
    assert early_connect_allowed("", 22) is False
