"""Serve mode, the box's side of the live agent (remote/agent/serve.py), run as a real process
here: its frames, its children, what a client leaving or the channel ending does to them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from outrig.agent import client as agent_client
from outrig.agent_code import serve
from outrig.connectors.keeper.live import serve_argv
from tests.support.processes import alive, wait_gone

REPO = Path(__file__).resolve().parents[2]

# A Server whose requests are small programs: "echo" copies stdin to stdout until EOF, then
# says "eof"; "exit N" exits N; "pid" prints its pid then waits for stdin's end; "sleep" waits.
ECHO_SERVER = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
from remote.agent.serve import Server

def run(line):
    words = line.decode().split()
    if words[0] == "echo":
        for chunk in iter(lambda: os.read(0, 65536), b""):
            os.write(1, chunk)
        os.write(1, b"eof\n")
    elif words[0] == "exit":
        os.write(2, b"leaving\n")
        os._exit(int(words[1]))
    elif words[0] == "pid":
        os.write(1, b"%d\n" % os.getpid())
        while os.read(0, 65536):
            pass
        open(words[1], "w").write("stdin ended")
    elif words[0] == "env":
        os.environ["SEEN"] = words[1]
        os.write(1, os.environ.get("SEEN", "").encode() + b"\n")
    elif words[0] == "parent-env":
        os.write(1, os.environ.get("SEEN", "-").encode() + b"\n")

Server(run, heartbeat=float(sys.argv[2]), preload=lambda: None).serve({"digest": "d"})
"""


class Agent:
    """A serve-mode process and the frames it sent (read on a thread of their own, as the
    keeper reads its channel: the agent blocks on a full stdout otherwise)."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        self.frames = serve.FrameBuffer()
        self.got: list[tuple[bytes, int, bytes]] = []
        self.arrived = threading.Condition()
        self.ended = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            data = os.read(fd, 65536)
            with self.arrived:
                if not data:
                    self.ended = True
                else:
                    self.got.extend(self.frames.feed(data))
                self.arrived.notify_all()
            if not data:
                return

    def send(self, kind: bytes, rid: int, payload: bytes = b"") -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(serve.frame(kind, rid, payload))
        self.proc.stdin.flush()

    def until(self, done: Any, limit: float = 60.0) -> list[tuple[bytes, int, bytes]]:
        """Frames until ``done(frame)`` is true for one (that one included)."""
        deadline = time.monotonic() + limit
        with self.arrived:
            while time.monotonic() < deadline:
                for index, item in enumerate(self.got):
                    if done(item):
                        taken, self.got[:] = self.got[:index + 1], self.got[index + 1:]
                        return taken
                if self.ended:
                    break
                self.arrived.wait(0.5)
        raise AssertionError(f"no such frame; got {self.got}")

    def output(self, rid: int) -> tuple[bytes, bytes, int]:
        """Stdout, stderr and exit status of request ``rid`` (read until its ``x``)."""
        frames = self.until(lambda f: f[0] == b"x" and f[1] == rid)
        mine = [f for f in frames if f[1] == rid]
        with self.arrived:
            self.got[:0] = [f for f in frames if f[1] != rid]
        return (b"".join(p for k, _, p in mine if k == b"o"),
                b"".join(p for k, _, p in mine if k == b"r"), int(json.loads(mine[-1][2])))

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(60)


@pytest.fixture
def agent() -> Iterator[Agent]:
    one = Agent([sys.executable, "-c", ECHO_SERVER, str(REPO), "0.2"])
    try:
        yield one
    finally:
        if one.proc.poll() is None:
            os.killpg(one.proc.pid, signal.SIGKILL)  # the group this test started
            one.proc.wait()


def test_it_says_ready_then_requests_run_side_by_side(agent: Agent) -> None:
    ready = agent.until(lambda f: f[0] == b"R")[-1]
    assert json.loads(ready[2])["digest"] == "d" and ready[1] == 0
    agent.send(b"q", 1, b"echo")
    agent.send(b"q", 2, b"echo")
    agent.send(b"i", 2, b"two\n")
    agent.send(b"i", 1, b"one\n")
    agent.send(b"e", 2)
    assert agent.output(2) == (b"two\neof\n", b"", 0)
    agent.send(b"i", 1, b"still one\n")
    agent.send(b"e", 1)
    assert agent.output(1) == (b"one\nstill one\neof\n", b"", 0)


def test_exit_status_stderr_and_a_large_stdin_come_through(agent: Agent) -> None:
    agent.send(b"q", 7, b"exit 3")
    assert agent.output(7) == (b"", b"leaving\n", 3)
    agent.send(b"q", 8, b"echo")
    big = os.urandom(3 << 20)
    for start in range(0, len(big), serve.MAX_PAYLOAD):
        agent.send(b"i", 8, big[start:start + serve.MAX_PAYLOAD])
    agent.send(b"e", 8)
    out, _err, status = agent.output(8)
    assert out == big + b"eof\n" and status == 0


def test_a_request_env_stays_in_its_child(agent: Agent) -> None:
    agent.send(b"q", 1, b"env one")
    assert agent.output(1)[0] == b"one\n"
    agent.send(b"q", 2, b"parent-env")
    assert agent.output(2)[0] == b"-\n"


def test_the_client_leaving_closes_the_childs_stdin_and_sends_nothing_more(
        agent: Agent, tmp_path: Path) -> None:
    marker = tmp_path / "ended"
    agent.send(b"q", 4, f"pid {marker}".encode())
    pid = int(agent.until(lambda f: f[0] == b"o" and f[1] == 4)[-1][2])
    agent.send(b"c", 4)
    # The child's end is the event waited for: it writes the marker, then exits. (Waiting
    # for the marker to exist raced twice under load: the file exists, still empty, from its
    # open to its write; and the child could still be on its way out at `alive` below, after
    # a whole request of another client had come and gone.)
    assert wait_gone([pid], timeout=60) == [], "the child saw its stdin end and exited"
    assert marker.read_text() == "stdin ended"
    agent.send(b"q", 5, b"exit 0")
    frames = agent.until(lambda f: f[0] == b"x" and f[1] == 5)
    assert not [f for f in frames if f[1] == 4], "frames for a request whose client left"


def test_heartbeats_while_quiet_and_the_channel_ending_ends_it_and_its_children(
        agent: Agent, tmp_path: Path) -> None:
    agent.until(lambda f: f[0] == b"R")
    beats = agent.until(lambda f: f[0] == b"h")
    kind, rid, clock = beats[-1]
    assert (kind, rid) == (b"h", 0) and serve.CLOCK.unpack(clock)[0] > 0  # the agent's clock
    marker = tmp_path / "ended"
    agent.send(b"q", 9, f"pid {marker}".encode())
    pid = int(agent.until(lambda f: f[0] == b"o" and f[1] == 9)[-1][2])
    assert agent.close() == 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.02)
    assert marker.read_text() == "stdin ended" and not alive(pid)


def test_the_real_bundle_serves_the_exec_paths_request_and_names_its_digest(
        tmp_path: Path) -> None:
    """The bundle as the keeper starts it (serve_argv): ready with the workstation's digest,
    then a ``check`` answered with the same result line the exec path gives."""
    digest = agent_client.agent_digest()
    one = Agent(serve_argv(sys.executable, digest, "", agent_client.agent_b64(), 5.0))
    try:
        ready = json.loads(one.until(lambda f: f[0] == b"R")[-1][2])
        assert ready["digest"] == digest and ready["pid"] == one.proc.pid
        request = {"v": 1, "op": "check", "workdir": str(tmp_path / "wd"), "env": {}}
        one.send(b"q", 1, json.dumps(request).encode() + b"\n")
        out, _err, status = one.output(1)
        result = json.loads(out.splitlines()[-1])
        assert status == 0 and result["event"] == "result" and result["ok"] is True
        assert set(result) >= {"workdir_writable", "disk_free_bytes", "python", "facts"}
        one.send(b"q", 2, b'{"op": "nosuch"}\n')
        out, _err, status = one.output(2)
        failed = json.loads(out.splitlines()[-1])
        assert failed["ok"] is False and failed["error"]["kind"] == "bad_request"
        assert one.close() == 0
    finally:
        if one.proc.poll() is None:
            os.killpg(one.proc.pid, signal.SIGKILL)
            one.proc.wait()


def test_a_frame_longer_than_the_limit_is_a_broken_stream() -> None:
    buffer = serve.FrameBuffer()
    with pytest.raises(ValueError):
        buffer.feed(serve.FRAME.pack(b"q", 1, serve.MAX_PAYLOAD + 1))
    assert serve.FrameBuffer().feed(serve.frame(b"i", 3, b"ab")[:-1]) == []


def test_a_request_is_acknowledged_when_started_and_refused_after_its_deadline(
        agent: Agent) -> None:
    """``Q`` carries a deadline on the agent's own clock: read in time, the request starts and
    ``a`` says so before its output; read after it (a stopped agent resumed), it is refused
    with the exit status EXPIRED and never started: the keeper has served it elsewhere."""
    ready = json.loads(agent.until(lambda f: f[0] == b"R")[-1][2])
    assert isinstance(ready["clock"], float)
    clock = serve.CLOCK.unpack(agent.until(lambda f: f[0] == b"h")[-1][2])[0]
    agent.send(b"Q", 4, serve.CLOCK.pack(clock + 3600) + b"env fresh")
    frames = agent.until(lambda f: f[0] == b"x" and f[1] == 4)
    mine = [f[0] for f in frames if f[1] == 4]
    assert mine[0] == b"a" and b"o" in mine, mine
    agent.send(b"Q", 5, serve.CLOCK.pack(clock - 1) + b"env stale")
    out, err, status = agent.output(5)
    assert status == serve.EXPIRED and out == b"" and b"after its deadline" in err
    assert not [f for f in agent.got if f[1] == 5 and f[0] == b"a"], "a late request started"
