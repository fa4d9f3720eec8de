"""The keeper's socket speaks the live agent's frames (one codec, ``remote/agent/serve.py``),
and a keeper an older outrig left running (``>cI`` frames, ``<digest>.sock``) is never spoken
to: the new command starts its own keeper beside it, ``outrig connections`` names it, and
``--close`` stops it by the pid its socket confirms (connectors/keeper/wire.py, "Places")."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from outrig.agent_code import serve
from outrig.connectors.keeper.client import KeptTransport, close_keepers, keepers, wait_gone
from outrig.connectors.keeper.connections import older_keepers
from outrig.connectors.keeper.wire import (
    MAX_FRAME,
    key_of,
    recv_frame,
    runtime_dir,
    send_frame,
    socket_path,
)
from outrig.console import Reporter
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.session import HostSession, Project

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PROJECT = Project(REPO)
OUTRIG = [sys.executable, "-c",
          "import sys; from outrig.cli import program; program.run(['outrig', *sys.argv[1:]])"]

# An older outrig's keeper, as far as its socket goes: it binds ``<digest>.sock`` (0600),
# writes ``<digest>.json`` naming its pid, and reads ``>cI`` frames (the framing before the
# one codec). It writes every byte it is sent to ``heard`` and answers an ``info`` request
# in its own framing; SIGTERM ends it, as it ended the real one.
OLD_KEEPER = textwrap.dedent("""
    import json, os, socket, struct, sys, time
    sock_path, record, heard = sys.argv[1:4]
    head = struct.Struct(">cI")
    os.umask(0o177)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(4)
    with open(record, "w") as out:
        json.dump({"pid": os.getpid(), "name": "proxied", "host": "older@box:22",
                   "hostname": "127.0.0.1", "started": time.time(),
                   "keep_seconds": 600}, out)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        conn.settimeout(2.0)
        got = b""
        try:
            while len(got) < head.size:
                chunk = conn.recv(head.size - len(got))
                if not chunk:
                    break
                got += chunk
        except OSError:
            pass
        with open(heard, "ab") as out:
            out.write(got)
        conn.close()
""")


def test_the_keeper_socket_speaks_the_live_agents_frames() -> None:
    """What the keeper's socket carries is the box agent's frame with id 0, read back by the
    box agent's own buffer; a frame of another id or an oversize length is refused."""
    left, right = socket.socketpair()
    with left, right:
        payload = json.dumps({"op": "info"}).encode()
        send_frame(left, b"h", payload)
        raw = right.recv(65536)
        assert raw == serve.frame(b"h", 0, payload)
        assert serve.FrameBuffer().feed(raw) == [(b"h", 0, payload)]
        left.sendall(serve.frame(b"o", 0, b"out"))
        assert recv_frame(right) == (b"o", b"out")
        left.sendall(serve.frame(b"o", 7, b"x"))  # a live agent's request id: not ours
        assert recv_frame(right) is None
    left, right = socket.socketpair()
    with left, right:
        left.sendall(serve.FRAME.pack(b"o", 0, MAX_FRAME + 1))
        assert recv_frame(right) is None


def proxied(box_host: Path, make_proxy: Any) -> Path:
    config = yaml.safe_load(box_host.read_text())
    proxy = make_proxy(config["port"], one_way_delay=0.005)
    config["port"] = proxy.port
    path = box_host.with_name("proxied.yaml")
    path.write_text(yaml.safe_dump(config))
    return path


def test_an_older_outrigs_keeper_is_left_alone_listed_and_closed_by_pid(
        box_host: Path, make_proxy: Any, tmp_path: Path, keeping: None) -> None:
    host_file = proxied(box_host, make_proxy)
    host = HostBook(PROJECT.hosts_dir)(str(host_file))
    folder = runtime_dir()
    folder.mkdir(parents=True, mode=0o700, exist_ok=True)
    old_sock, old_record = folder / f"{key_of(host)}.sock", folder / f"{key_of(host)}.json"
    heard = tmp_path / "heard"
    heard.touch()
    old = subprocess.Popen([sys.executable, "-c", OLD_KEEPER, str(old_sock), str(old_record),
                            str(heard)], stdout=subprocess.PIPE, text=True)
    try:
        assert old.stdout is not None and old.stdout.readline().strip() == "ready"
        session = HostSession(PROJECT, str(host_file), Reporter(quiet=True),
                              Journal(tmp_path / "state"), host=host)
        try:
            assert session.call("status", stream=False)["ok"]
        finally:
            session.transport.close()
        assert isinstance(session.transport, KeptTransport)
        assert session.transport.keepers_started == 1 and session.transport.kept_channels == 1
        assert heard.read_bytes() == b"", "the new command spoke to the older keeper"
        assert old_sock.exists() and old_record.exists() and old.poll() is None
        assert socket_path(host, folder).exists()

        listed = keepers()
        assert [e["socket"] for e in listed] == [str(socket_path(host, folder))]
        older = older_keepers()
        assert [(e["pid"], e["socket"], e["older"]) for e in older] == [
            (old.pid, str(old_sock), True)]
        assert heard.read_bytes() == b"", "listing sends no frame (SO_PEERCRED only)"

        shown = subprocess.run([*OUTRIG, "connections"], cwd=tmp_path, capture_output=True,
                               text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr
        assert f"an older outrig's warm connection to older@box:22 (proxied), pid {old.pid}" \
            in " ".join(shown.stdout.split()), shown.stdout
        assert str(listed[0]["pid"]) in shown.stdout  # the current keeper's row too

        closed = close_keepers()
        assert sorted(e["pid"] for e in closed) == sorted([old.pid, listed[0]["pid"]])
        assert old.wait(10) == -signal.SIGTERM
        assert wait_gone(int(listed[0]["pid"]), 10.0)
        assert older_keepers() == [] and not old_record.exists()
        assert heard.read_bytes() == b""
    finally:
        if old.poll() is None:
            old.kill()
            old.wait()


def test_a_record_that_names_another_pid_is_never_signalled(
        tmp_path: Path, keeping: None) -> None:
    """An older record whose pid is not its socket's listener is listed nowhere and never
    signalled (the same rule as the current keepers')."""
    folder = runtime_dir()
    folder.mkdir(parents=True, mode=0o700, exist_ok=True)
    old_sock, old_record = folder / "0123abcd.sock", folder / "0123abcd.json"
    old = subprocess.Popen([sys.executable, "-c", OLD_KEEPER, str(old_sock), str(old_record),
                            str(tmp_path / "heard")], stdout=subprocess.PIPE, text=True)
    try:
        assert old.stdout is not None and old.stdout.readline().strip() == "ready"
        doc = json.loads(old_record.read_text())
        old_record.write_text(json.dumps({**doc, "pid": os.getpid()}))
        assert older_keepers() == [] and close_keepers() == []
        time.sleep(0.2)
        assert old.poll() is None and old_record.exists()
    finally:
        old.kill()
        old.wait()
