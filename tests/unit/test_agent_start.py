"""One way to start the agent (``AgentCall.start``, outrig/agent/client.py) for every op and
for tail-logs' follow stream: the same command (the cached bundle in the workdir, whichever
path the request takes), the same stdin, and a write that fails tagged as the request not
having reached the box. Channels are replayed (tests/support/replay.py): no box, no link."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from outrig.agent import client as agent_client
from outrig.agent.client import AgentCall, agent_command, agent_payload, argv_command
from outrig.console import Reporter
from outrig.errors import LinkLost
from outrig.inventory import Host, HostBook, resolve_host
from outrig.journal import Journal
from outrig.ops.logs import LOG_WINDOW, LogTailer
from outrig.session import HostSession, Project, base_request
from outrig.transport import AgentChannel
from tests.support.replay import Recording, ReplayConnector, _ReplayChannel

RESULT = b'{"event": "result", "ok": true}\n'
BOX = Host(name="box", hostname="replay:-", workdir="/w", python="python3")


class Watched(_ReplayChannel):
    """A replayed channel that can lose its link on every write, and says when closed."""

    def __init__(self, recording: Recording, cut_writes: bool) -> None:
        super().__init__(recording)
        self.cut_writes = cut_writes
        self.closed = False

    def write(self, data: bytes) -> None:
        if self.cut_writes:
            raise LinkLost("cut while sending", phase="stream", request_sent=True)
        super().write(data)

    def close(self) -> None:
        self.closed = True


class Kept(ReplayConnector):
    """Replays, and keeps each channel (what was written to the agent's stdin is there) and
    window size it handed out. ``cut_writes``: every write is a lost link."""

    def __init__(self, host: Host, calls: list[Recording], cut_writes: bool) -> None:
        super().__init__(host, calls=calls)
        self.cut_writes = cut_writes
        self.channels: list[Watched] = []
        self.windows: list[int | None] = []

    def start(self, argv: list[str], *, window_size: int | None = None) -> AgentChannel:
        self.argvs.append(list(argv))
        self.channels.append(Watched(self.calls.pop(0), self.cut_writes))
        self.windows.append(window_size)
        return self.channels[-1]


def session_on(tmp_path: Path, *, cut_writes: bool = False) -> tuple[HostSession, Kept]:
    """A session on a replayed box with a workdir (where the agent's bundle is cached)."""
    host_file = tmp_path / "box.yaml"
    host_file.write_text(yaml.safe_dump({"hostname": "replay:-", "python": "python3",
                                         "workdir": str(tmp_path / "work")}))
    host = resolve_host(str(host_file), hosts_dir=tmp_path / "hosts")
    replay = Kept(host, calls=[Recording(bytearray(RESULT))], cut_writes=cut_writes)
    session = HostSession(Project(tmp_path), str(host_file),
                          Reporter(out=io.StringIO(), err=io.StringIO()),
                          Journal(tmp_path / "state"), transport=replay,
                          host=HostBook(tmp_path / "hosts")(str(host_file)))
    return session, replay


def follow_call(session: HostSession) -> dict[str, object] | None:
    """One follow exec of tail-logs (``--no-follow``), as its loop makes it."""
    return LogTailer(session, follow=False)._call()


def test_follow_on_the_stdin_path_runs_the_cached_bundle_in_the_workdir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A follow request too long for the command line goes on stdin, and the box still runs
    the bundle unpacked in the workdir (not from memory), as every other op's does."""
    monkeypatch.setattr(agent_client, "ARGV_LIMIT", 0)  # every request takes the stdin path
    session, replay = session_on(tmp_path)
    assert follow_call(session) == {"event": "result", "ok": True}
    workdir = session.host.workdir
    assert workdir
    assert replay.argvs == [agent_command("python3", workdir)]
    assert replay.windows == [LOG_WINDOW]
    written = bytes(replay.channels[0].written)
    assert written.startswith(agent_payload())
    request = written[len(agent_payload()):]
    assert request.endswith(b"\n") and b'"op": "follow"' in request


def test_follow_on_the_command_line_path_carries_the_request_there(tmp_path: Path) -> None:
    session, replay = session_on(tmp_path)
    assert follow_call(session) == {"event": "result", "ok": True}
    argv = replay.argvs[0]
    assert argv[5] == session.host.workdir and argv[6] != "-" and argv[7]
    assert bytes(replay.channels[0].written) == b""
    assert replay.windows == [LOG_WINDOW]


@pytest.mark.parametrize("who", ["op", "follow"])
def test_a_failed_stdin_write_is_a_request_that_never_reached_the_box(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, who: str) -> None:
    """The request did not get through whole, so the agent cannot have acted on it: phase
    ``exec``, not sent (an op that is not safe to re-run may still be retried), and the
    channel is closed."""
    monkeypatch.setattr(agent_client, "ARGV_LIMIT", 0)
    session, replay = session_on(tmp_path, cut_writes=True)
    with pytest.raises(LinkLost) as lost:
        if who == "op":
            AgentCall(session.transport).start(session.request("status"))
        else:
            follow_call(session)
    assert lost.value.phase == "exec" and not lost.value.request_sent
    assert len(replay.channels) == 1 and replay.channels[0].closed


def test_argv_command_takes_the_workdir_from_its_caller() -> None:
    encoded = json.dumps(base_request(BOX, "status")).encode()
    argv = argv_command("python3", encoded, "/elsewhere")
    assert argv is not None and argv[5] == "/elsewhere"


def test_the_request_goes_out_as_built(tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``base_request`` sets the protocol version; starting the agent adds nothing to it."""
    monkeypatch.setattr(agent_client, "ARGV_LIMIT", 0)
    session, replay = session_on(tmp_path)
    request = {"op": "check", "workdir": "/w", "env": {}}
    AgentCall(session.transport).start(request)
    written = bytes(replay.channels[0].written)
    assert written == agent_payload() + json.dumps(request).encode() + b"\n"
