"""Colour on a real terminal (a pseudo-terminal here): on by default, off with NO_COLOR
(no-color.org) and on without a terminal with FORCE_COLOR (force-color.org), for rich's
output and for the process names tail-logs colours itself."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from typing import IO

import pytest

from outrig.console import Reporter
from outrig.ops.logs import LinePrinter

ESC = "\x1b["


@pytest.fixture
def terminal() -> Iterator[tuple[IO[str], int]]:
    """The writing end of a pseudo-terminal (a text stream whose isatty() is true) and the
    reading end's descriptor."""
    reader, writer = os.openpty()
    stream = open(writer, "w", encoding="utf-8", closefd=True)  # noqa: SIM115
    try:
        yield stream, reader
    finally:
        stream.close()
        os.close(reader)


def read_all(fd: int) -> str:
    """What reached the terminal so far."""
    os.set_blocking(fd, False)
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace")


def show(reporter: Reporter) -> None:
    """A warning and a success (rich) and two tail-logs lines (outrig's own escapes)."""
    reporter.warn("disk almost full")
    reporter.success("ready")
    LinePrinter(reporter, None).lines([("server", "up"), ("trainer", "step 1")])


@pytest.mark.parametrize(("env", "coloured"), [
    ({}, True), ({"NO_COLOR": "1"}, False), ({"NO_COLOR": ""}, True),
    ({"FORCE_COLOR": "1"}, True), ({"NO_COLOR": "1", "FORCE_COLOR": "1"}, False)])
def test_a_terminal_gets_colour_unless_no_color_says_otherwise(
        terminal: tuple[IO[str], int], monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
        coloured: bool) -> None:
    stream, reader = terminal
    monkeypatch.setenv("TERM", "xterm-256color")
    for name in ("NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    show(Reporter(out=stream, err=stream))
    stream.flush()
    text = read_all(reader)
    assert "disk almost full" in text and "trainer | step 1" in text.replace("\x1b[0m", "")
    assert (ESC in text) is coloured, repr(text)


def test_force_color_colours_a_pipe_but_draws_no_live_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """FORCE_COLOR asks for colour in a log that renders escapes (CI), not for a status line
    redrawn in place: the wait is still printed as plain lines."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")
    out, err = io.StringIO(), io.StringIO()
    reporter = Reporter(out=out, err=err)
    show(reporter)
    reporter.live("waiting for server to be ready: 3s")
    reporter.close()
    assert ESC in out.getvalue() and ESC in err.getvalue()
    assert "waiting for server to be ready: 3s\n" in err.getvalue()
    assert "\x1b[?25l" not in err.getvalue() and "\x1b[1A" not in err.getvalue()  # no spinner
    monkeypatch.delenv("FORCE_COLOR")
    out, err = io.StringIO(), io.StringIO()
    show(Reporter(out=out, err=err))
    assert ESC not in out.getvalue() + err.getvalue()  # a pipe, by default: plain
