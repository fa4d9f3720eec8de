"""``status --follow``'s screen (pure: frames into a stream) and its flags' bad input: a
frame redrawn over the last one on a terminal (up as many lines as it drew, cleared below,
cut to the terminal's height), plain frames elsewhere; ``--every`` without ``--follow`` and
``--follow`` on several hosts refused with exit 2 before anything is contacted."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from outrig.ops.status_follow import CLEAR_BELOW, Screen, cursor_up, screen_for
from tests.support.cli import outrig


def test_on_a_terminal_each_frame_replaces_the_last() -> None:
    out = io.StringIO()
    screen = Screen(out, in_place=True, rows=6)
    screen.draw("head 1", ["a", "b"])
    assert out.getvalue() == "head 1\na\nb\n"
    screen.draw("head 2", ["c"])
    assert out.getvalue().endswith(cursor_up(3) + CLEAR_BELOW + "head 2\nc\n")
    screen.draw("head 3", [str(i) for i in range(20)])  # taller than the terminal: cut
    last = out.getvalue().rsplit(CLEAR_BELOW, 1)[1]
    assert out.getvalue().count(cursor_up(2) + CLEAR_BELOW) == 1
    assert last.splitlines() == ["head 3", "0", "1", "2", "3"]  # rows - 1 lines
    screen.draw("head 4", [])
    assert out.getvalue().endswith(cursor_up(5) + CLEAR_BELOW + "head 4\n")


def test_elsewhere_frames_are_plain_lines_one_after_another() -> None:
    out = io.StringIO()
    screen = screen_for(out)  # a StringIO is not a terminal
    assert not screen.in_place
    screen.draw("head 1", ["a"])
    screen.draw("head 2", ["b"])
    assert out.getvalue() == "head 1\na\n\nhead 2\nb\n"


@pytest.mark.parametrize("args, words", [
    (["status", "--host", "local", "--every", "1"], "--every is the pause of --follow"),
    (["status", "--host", "local", "--follow", "--every", "0"], "--every"),
    (["status", "--host", "local", "--follow", "--every", "x"], "--every must be a number"),
    (["status", "--host", "local,user@127.0.0.1:22", "--follow"], "--follow shows one box"),
])
def test_bad_follow_flags_are_refused_with_exit_2(args: list[str], words: str,
                                                  capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _out, err = outrig(args, capsys)
    assert code == 2 and words in err, err
