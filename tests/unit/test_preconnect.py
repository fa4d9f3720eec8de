"""The early connect (outrig/connectors/ssh/preconnect.py): the banner sent ahead is written once,
a failure is kept for the attempt that takes it (where the SSH configuration lets it start:
tests/unit/test_ssh_config.py)."""

from __future__ import annotations

import socket

import pytest

from outrig.connectors.ssh.preconnect import (
    CLIENT_BANNER,
    BannerSentSocket,
    EarlyConnect,
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
