"""The one channel reader (outrig/agent/reader.py): how every agent stream ends, decided once.

Channels here are replayed (tests/support/replay.py): what a stream ends with is set by the
recording, so each ending is shown without a box, a link or a wait."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from outrig.agent.reader import ChannelReader, take_events
from outrig.console import Reporter
from outrig.errors import LinkLost, RemoteError
from outrig.inventory import Host
from outrig.journal import Journal
from outrig.ops.logs import tail_logs
from outrig.session import Project
from outrig.transport import AgentChannel
from tests.support.replay import Recording, ReplayConnector, save

HOST = Host(name="box", hostname="replay:-", workdir="/w", python="python3")


def channel(stdout: bytes, status: int | None = 0, stderr: str = "") -> AgentChannel:
    replay = ReplayConnector(HOST, calls=[Recording(bytearray(stdout), stderr, status)])
    return replay.start(["python3"])


class Silent(AgentChannel):
    """A channel that never speaks; ``up`` says whether its link is still there."""

    def __init__(self, up: bool) -> None:
        self.up = up

    def write(self, data: bytes) -> None: ...

    def read(self, timeout: float) -> bytes | None:
        return None

    def stderr_text(self) -> str:
        return ""

    def exit_status(self, timeout: float = 5.0) -> int | None:
        return None

    def close(self) -> None: ...

    def alive(self) -> bool:
        return self.up


def test_events_until_the_result_line_across_reads() -> None:
    lines = b"".join(b'{"event": "progress", "t": 1, "n": %d}\n' % i for i in range(2000))
    seen: list[dict[str, object]] = []
    result = ChannelReader(channel(lines + b'{"event": "result", "ok": true}\n'), HOST,
                           60.0).result(seen.append)
    assert result == {"event": "result", "ok": True}
    assert [e["n"] for e in seen] == list(range(2000))


def test_silence_past_the_limit_and_a_dead_link_are_lost_links() -> None:
    with pytest.raises(LinkLost) as quiet:
        list(ChannelReader(Silent(up=True), HOST, 0.0, poll=0.0).chunks())
    assert quiet.value.silent and quiet.value.request_sent and quiet.value.phase == "stream"
    with pytest.raises(LinkLost) as down:  # the limit is far away: the dead link ends it
        list(ChannelReader(Silent(up=False), HOST, 3600.0, poll=0.0).chunks())
    assert not down.value.silent


@pytest.mark.parametrize(("status", "stderr", "kind"), [
    (127, "sh: python3: not found", "no_python"),
    (1, "outrig agent needs Python >= 3.8, this is 3.6.9", "old_python"),
    (1, "", "bad_python"),
    (1, "Traceback (most recent call last):\nMemoryError", "agent_crash"),
])
def test_an_end_without_a_result_names_why(status: int, stderr: str, kind: str) -> None:
    with pytest.raises(RemoteError) as ended:
        ChannelReader(channel(b"", status, stderr), HOST, 60.0).result()
    assert ended.value.kind == kind


def test_an_end_without_an_exit_status_is_a_lost_link() -> None:
    with pytest.raises(LinkLost):
        ChannelReader(channel(b'{"event": "run", "t": 1}\n', None), HOST, 60.0).result()


def test_a_line_that_is_not_an_event_is_kept_as_output() -> None:
    buffer = bytearray(b'{"event": "a"}\nTraceback here\n\n[1]\n{"event": "b"}\n{"event"')
    assert take_events(buffer) == [{"event": "a"}, {"event": "output", "line": "Traceback here"},
                                   {"event": "b"}]
    assert buffer == bytearray(b'{"event"')


def test_tail_logs_names_a_missing_interpreter_like_every_other_op(tmp_path: Path) -> None:
    """The follow stream is read by the same reader: a box without the host's python is
    ``no_python`` with its fix, not a generic agent crash."""
    saved = save(tmp_path / "rec.json", [Recording(bytearray(), "sh: python3: not found", 127)])
    host = tmp_path / "box.yaml"
    host.write_text(yaml.safe_dump({"hostname": f"replay:{saved}", "workdir": str(tmp_path),
                                    "python": "python3"}))
    with pytest.raises(RemoteError) as failed:
        tail_logs(Project(tmp_path), str(host), Reporter(out=io.StringIO(), err=io.StringIO()),
                  follow=False, journal=Journal(tmp_path / "state"))
    assert failed.value.kind == "no_python"


def test_a_lost_link_says_what_keeps_running_only_when_something_was_launched() -> None:
    nothing = b'{"event": "run", "t": 1}\n'
    with pytest.raises(LinkLost) as before:
        ChannelReader(channel(nothing, None), HOST, 60.0).result()
    assert "keeps running" not in str(before.value)
    assert "reported nothing launched" in str(before.value)
    assert "outrig status --host box" in str(before.value)
    launched = nothing + b'{"event": "launched", "t": 2, "process": "svc", "pid": 7}\n'
    with pytest.raises(LinkLost) as after:
        ChannelReader(channel(launched, None), HOST, 60.0).result()
    assert "What was launched keeps running on the box" in str(after.value)
    with pytest.raises(LinkLost) as silent:  # the same after a silence with nothing heard
        list(ChannelReader(Silent(up=True), HOST, 0.0, poll=0.0).events())
    assert "keeps running" not in str(silent.value)


def test_the_keepers_word_on_a_lost_request_is_the_errors_cause_and_its_silence_is_kept() -> None:
    """The keeper ends a lent request with ``L`` and why (its link found dead by silence, or
    the box's live agent gone): the error names that cause, not "the connection dropped",
    says what keeps running, and a silent link is handed to the transport for the fresh
    connection that follows (one silent attempt fewer)."""
    import json
    import socket

    from outrig.connectors.keeper.client import _KeptChannel
    from outrig.connectors.keeper.wire import send_frame

    for why, silent in (("the kept SSH link gave no answer to a keepalive within 5 s", True),
                        ("the box's live agent ended: killed, or its channel closed", False)):
        ours, keeper = socket.socketpair()
        told: list[str] = []
        lent = _KeptChannel(ours, "box", on_silent=told.append)
        send_frame(keeper, b"o", b'{"event": "launched", "t": 1, "process": "a"}\n')
        send_frame(keeper, b"L", json.dumps({"why": why, "silent": silent}).encode())
        with pytest.raises(LinkLost) as caught:
            ChannelReader(lent, HOST, 60.0).result()
        text = str(caught.value)
        assert f"before it finished ({why})" in text and "keeps running" in text, text
        assert caught.value.silent is silent and caught.value.request_sent
        assert told == ([why] if silent else [])
        lent.close()
        keeper.close()
