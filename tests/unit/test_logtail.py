"""The pure half of tail-logs: cursors, chunk framing, segments, line splitting, and the
agent's seek-from-end (imported from remote/agent/follow.py, which is stdlib-only)."""

from __future__ import annotations

import base64
import io
import os
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from outrig._box.agent import follow as box_follow
from outrig.logs.mirror import MirrorStore
from outrig.logs.tail import (
    Chunk,
    Cursor,
    FramingError,
    LineSplitter,
    StreamState,
    clean_display,
    decode_chunk,
    partial_tail,
)
from outrig.timing import follow_idle_limit, heartbeat_for


@pytest.fixture(scope="module")
def agent() -> ModuleType:
    """The agent module under test, imported as any module is (outrig._box.agent.follow)."""
    return box_follow


def chunk_event(process: str, inode: int, offset: int, data: bytes,
                z: bool = False) -> dict[str, Any]:
    payload = zlib.compress(data) if z else data
    event: dict[str, Any] = {"event": "chunk", "process": process, "inode": inode,
                             "offset": offset, "size": len(data),
                             "data_b64": base64.b64encode(payload).decode()}
    if z:
        event["z"] = True
    return event


def test_decode_chunk_plain_and_zlib() -> None:
    assert decode_chunk(chunk_event("p", 7, 10, b"abc\n")) == Chunk("p", 7, 10, b"abc\n")
    assert decode_chunk(chunk_event("p", 7, 0, b"x" * 5000, z=True)).data == b"x" * 5000
    bad = chunk_event("p", 7, 0, b"abc")
    bad["size"] = 4
    with pytest.raises(FramingError, match="says 4 bytes"):
        decode_chunk(bad)
    with pytest.raises(FramingError):
        decode_chunk({"process": "p", "inode": 1, "offset": 0, "data_b64": "!!"})


def test_cursor_json_round_trip_and_rejects_nonsense() -> None:
    cur = Cursor(5, 100, 40, 2)
    assert Cursor.from_json(cur.to_json()) == cur
    assert cur.wire() == {"inode": 5, "offset": 100}
    for bad in (None, {}, {"inode": 1}, {"inode": -1, "offset": 0},
                {"inode": 1, "offset": 5, "base": 9}, {"inode": True, "offset": 1}):
        assert Cursor.from_json(bad) is None


def test_fresh_stream_splits_lines_across_chunks() -> None:
    s = StreamState("t")
    applied = s.on_open(inode=3, offset=0, display_from=0, reason="start")
    assert applied.reset and not applied.new_segment
    a = s.on_chunk(Chunk("t", 3, 0, b"one\ntw"))
    b = s.on_chunk(Chunk("t", 3, 6, b"o\nthree"))
    assert a.mirror == b"one\ntw" and a.lines == ["one"]
    assert b.mirror == b"o\nthree" and b.lines == ["two"]
    assert s.pending == Cursor(3, 13, 0, 0)
    assert s.flush() == ["three"]


def test_resume_below_cursor_is_deduplicated_and_gaps_are_errors() -> None:
    s = StreamState("t", Cursor(3, 10, 0, 0), partial=b"par")
    s.on_open(inode=3, offset=4, display_from=4, reason="lines")  # --lines started earlier
    applied = s.on_chunk(Chunk("t", 3, 4, b"xxxxxx" + b"tial\nnew\n"))
    assert applied.mirror == b"tial\nnew\n"  # only bytes at offsets >= 10 are new
    assert applied.lines == ["xxxxxxtial", "new"]  # a jump: the old partial does not continue
    with pytest.raises(FramingError, match="gap"):
        s.on_chunk(Chunk("t", 3, 100, b"late\n"))
    with pytest.raises(FramingError, match="gap"):
        s.on_chunk(Chunk("t", 99, 19, b"other file\n"))


def test_resume_at_cursor_continues_the_partial_line() -> None:
    s = StreamState("t", Cursor(3, 10, 0, 0), partial=b"half ")
    applied = s.on_open(inode=3, offset=10, display_from=10, reason="cursor")
    assert not applied.reset
    assert s.on_chunk(Chunk("t", 3, 10, b"line\n")).lines == ["half line"]


def test_rotation_truncation_and_jumps_start_new_segments() -> None:
    s = StreamState("t", Cursor(3, 10, 0, 0))
    applied = s.on_open(inode=4, offset=0, display_from=0, reason="rotated")
    assert applied.reset and applied.new_segment and s.pending == Cursor(4, 0, 0, 1)
    s.on_chunk(Chunk("t", 4, 0, b"abc\n"))
    applied = s.on_open(inode=4, offset=0, display_from=0, reason="truncated")
    assert applied.new_segment and s.pending == Cursor(4, 0, 0, 2)
    # --lines far ahead of the cursor: a new segment that starts mid-file
    s = StreamState("t", Cursor(3, 10, 0, 0))
    applied = s.on_open(inode=3, offset=5000, display_from=5000, reason="lines")
    assert applied.new_segment and s.pending == Cursor(3, 5000, 5000, 1)
    # an empty old segment is simply replaced, nothing to archive
    s = StreamState("t", Cursor(3, 0, 0, 0))
    applied = s.on_open(inode=9, offset=0, display_from=0, reason="rotated")
    assert applied.reset and not applied.new_segment


def test_display_from_later_than_offset_shows_only_the_tail() -> None:
    s = StreamState("t", Cursor(3, 0, 0, 0))
    s.on_open(inode=3, offset=0, display_from=6, reason="cursor")  # gap filled, not shown
    applied = s.on_chunk(Chunk("t", 3, 0, b"old 1\nnew 1\n"))
    assert applied.mirror == b"old 1\nnew 1\n" and applied.lines == ["new 1"]


def test_line_splitter_caps_runaway_lines_and_clean_display() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"x" * (70 * 1024)) == ["x" * (70 * 1024)]
    assert clean_display("10%\r50%\r100%\r") == "100%"
    assert partial_tail(b"a\nb\nrest") == b"rest" and partial_tail(b"a\n") == b""


def test_mirror_store_cuts_bytes_written_after_the_last_commit(tmp_path: Path) -> None:
    store = MirrorStore(tmp_path / "m")
    store.append("t", b"line 1\nline 2\nhal")
    store.commit("h", "r", {"t": Cursor(3, 17, 0, 0)})
    store.append("t", b"f done\nuncommitted\n")  # written, maybe fsynced, never committed
    store.close()
    again = MirrorStore(tmp_path / "m")
    cursors = again.load()
    assert cursors == {"t": Cursor(3, 17, 0, 0)}
    assert again.path("t").read_bytes() == b"line 1\nline 2\nhal"
    assert again.partial("t", cursors["t"]) == b"hal"
    again.new_segment("t", 1)
    assert (tmp_path / "m" / "t.log.1").read_bytes() == b"line 1\nline 2\nhal"


SECRET = b"hf_SECRETvalue123"


def test_a_secret_split_across_chunks_is_redacted_in_the_mirror_and_the_cursor_says_where(
        tmp_path: Path) -> None:
    """The mirror gets whole lines, redacted; the box offset (where the agent resumes) and
    the mirror's own size are kept apart, so a crash and a resume stay exactly-once."""
    s = StreamState("t", secrets=[SECRET])
    s.on_open(inode=3, offset=0, display_from=0, reason="start")
    log = b"token=" + SECRET + b" ok\nnext " + SECRET[:5]
    first = s.on_chunk(Chunk("t", 3, 0, log))
    assert first.mirror == b"token=*** ok\n"  # the unfinished line is held
    assert s.pending is not None and s.pending.offset == len(b"token=" + SECRET + b" ok\n")
    second = s.on_chunk(Chunk("t", 3, len(log), SECRET[5:] + b" end\n"))
    assert second.mirror == b"next *** end\n" and second.lines == ["next " + SECRET.decode()
                                                                   + " end"]
    box = log + SECRET[5:] + b" end\n"
    assert s.pending.offset == len(box)
    assert s.pending.size == len(b"token=*** ok\nnext *** end\n")
    store = MirrorStore(tmp_path / "m")
    store.append("t", first.mirror + second.mirror)
    store.commit("h", "r", {"t": s.pending})
    store.append("t", b"written but never committed\n")
    store.close()
    again = MirrorStore(tmp_path / "m")
    cursors = again.load()
    assert cursors == {"t": s.pending}  # the redaction count survives the journal
    assert again.path("t").read_bytes() == b"token=*** ok\nnext *** end\n"  # cut to size


def test_a_resume_sends_the_held_line_again_and_the_mirror_gets_it_once() -> None:
    s = StreamState("t", secrets=[SECRET])
    s.on_open(inode=3, offset=0, display_from=0, reason="start")
    s.on_chunk(Chunk("t", 3, 0, b"a\nhalf " + SECRET[:3]))
    s.commit()
    assert s.cursor == Cursor(3, 2, 0, 0)  # the held bytes are not covered
    s.on_open(inode=3, offset=2, display_from=2, reason="cursor")  # a reconnect
    again = s.on_chunk(Chunk("t", 3, 2, b"half " + SECRET + b"\n"))
    assert again.mirror == b"half ***\n" and again.lines == ["half " + SECRET.decode()]


def test_a_runaway_line_is_mirrored_but_never_through_a_secret() -> None:
    s = StreamState("t", secrets=[SECRET])
    s.on_open(inode=3, offset=0, display_from=0, reason="start")
    data = b"x" * (70 * 1024) + SECRET[:4]
    applied = s.on_chunk(Chunk("t", 3, 0, data))
    keep = len(SECRET) - 1  # what may still be the start of a secret
    assert applied.mirror == data[:-keep] and s.held == data[-keep:]
    rest = s.on_chunk(Chunk("t", 3, len(data), SECRET[4:] + b"\n"))
    assert rest.mirror == data[-keep:-4] + b"***\n"


def test_without_secrets_the_mirror_is_byte_exact_at_once() -> None:
    s = StreamState("t")
    s.on_open(inode=3, offset=0, display_from=0, reason="start")
    assert s.on_chunk(Chunk("t", 3, 0, b"a\nunfinished")).mirror == b"a\nunfinished"
    assert s.pending == Cursor(3, 12, 0, 0) and s.pending.size == 12


def test_an_old_cursor_without_a_redaction_count_still_loads() -> None:
    assert Cursor.from_json({"inode": 1, "offset": 9, "base": 2, "segments": 0}) == \
        Cursor(1, 9, 2, 0, 0)
    assert Cursor.from_json({"inode": 1, "offset": 9, "base": 2, "redacted": 8}) is None


def test_dead_link_limits_scale_with_rtt() -> None:
    assert heartbeat_for(None) == 2.0 and heartbeat_for(0.24) == pytest.approx(1.2)
    assert heartbeat_for(5.0) == 5.0
    assert follow_idle_limit(1.2, 0.24) == pytest.approx(4.56)
    assert follow_idle_limit(0.1, 0.0) == 3.0


# ------------------------------------------------------------------ the agent's seek from end


class CountingFile(io.RawIOBase):
    """A file object that counts the bytes read through it."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "rb")  # noqa: SIM115
        self.read_bytes = 0

    def seek(self, pos: int, whence: int = 0) -> int:
        return self.f.seek(pos, whence)

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.read_bytes += len(data)
        return data

    def close(self) -> None:
        self.f.close()


@pytest.mark.parametrize(("content", "count", "want"), [
    (b"a\nb\nc\n", 2, b"b\nc\n"), (b"a\nb\nc\n", 3, b"a\nb\nc\n"), (b"a\nb\nc\n", 9, b"a\nb\nc\n"),
    (b"a\nb\nc", 1, b"c"), (b"a\nb\nc", 2, b"b\nc"), (b"", 5, b""), (b"\n\n", 1, b"\n"),
    (b"a\nb\n", 0, b""),
])
def test_offset_of_last_lines(agent: ModuleType, tmp_path: Path, content: bytes, count: int,
                              want: bytes) -> None:
    path = tmp_path / "log"
    path.write_bytes(content)
    with open(path, "rb") as f:
        start, _ = agent.offset_of_last_lines(f, len(content), count)
    assert content[start:] == want


def test_offset_of_last_lines_on_a_big_sparse_file_reads_only_the_end(agent: ModuleType,
                                                                      tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    tail = b"".join(b"line %d\n" % i for i in range(5000))
    with open(path, "wb") as f:
        f.truncate(5 << 30)  # a 5 GiB log (sparse: costs no disk)
        f.seek(0, os.SEEK_END)
        f.write(tail)
    size = path.stat().st_size
    counting = CountingFile(path)
    try:
        start, scanned = agent.offset_of_last_lines(counting, size, 100)
    finally:
        counting.close()
    with open(path, "rb") as f:
        f.seek(start)
        assert f.read() == b"".join(b"line %d\n" % i for i in range(4900, 5000))
    assert counting.read_bytes == scanned < 128 * 1024


def test_offset_of_last_lines_gives_up_scanning_at_the_limit(agent: ModuleType,
                                                             tmp_path: Path) -> None:
    path = tmp_path / "noline.log"
    path.write_bytes(b"x" * 300_000 + b"\n" + b"y" * 300_000)
    with open(path, "rb") as f:
        start, scanned = agent.offset_of_last_lines(f, 600_001, 10, limit=200_000)
    assert scanned < 300_000 and start > 0
