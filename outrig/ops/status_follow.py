"""``outrig status --follow``: the status of a box refreshed in place until Ctrl-C.

Each refresh is the same agent call and the same gathering as ``outrig status``
(:func:`outrig.ops.status.status_on`: processes, readiness, GPUs, the trainer's step, loss
and its trend, the newest checkpoint, the newest ``evaluate`` figures), made on one session:
one SSH connection for the whole view (the warm path: the kept link and the resident agent
answer each refresh in a round trip), never a new login per refresh.

On a terminal the frame is redrawn over the last one (cursor up, clear to the end), cut to
the terminal's height. Anywhere else (a pipe, a log file) each frame is plain lines under a
header line, with no cursor movement, so a log of the view reads as a list of snapshots.
``--json`` prints each refresh's status document as one JSON line. Ctrl-C leaves with exit
130; nothing on the box is touched.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from outrig.console import Reporter
from outrig.errors import Interrupted
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.ops.status import status_on
from outrig.redeploy.record import run_host
from outrig.session import HostSession, Project, host_session
from outrig.text.terminal import terminal_width

DEFAULT_EVERY = 2.0  # seconds between refreshes
CLEAR_BELOW = "\x1b[J"


def cursor_up(lines: int) -> str:
    """To the start of the line ``lines`` above (CSI F)."""
    return f"\x1b[{lines}F" if lines > 0 else "\r"


@dataclass
class Screen:
    """Where frames go: redrawn in place on a terminal, appended as plain lines elsewhere.
    Pure apart from the writes to ``out``; ``rows``: the terminal's height (None: unknown)."""

    out: IO[str]
    in_place: bool
    rows: int | None = None
    drawn: int = 0  # lines of the frame on screen now (in place only)
    frames: int = field(default=0)

    def draw(self, header: str, lines: list[str]) -> None:
        frame = [header, *lines]
        if self.in_place:
            if self.rows:
                frame = frame[:max(2, self.rows - 1)]
            text = (cursor_up(self.drawn) + CLEAR_BELOW if self.drawn else "") + \
                "\n".join(frame) + "\n"
            self.drawn = len(frame)
        else:
            text = ("\n" if self.frames else "") + "\n".join(frame) + "\n"
        self.out.write(text)
        self.out.flush()
        self.frames += 1


def screen_for(out: IO[str]) -> Screen:
    """In place when ``out`` is a terminal (and the colour rules allow escapes: never
    under ``TERM=dumb``), plain lines otherwise."""
    try:
        tty = out.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        tty = False
    rows = None
    if tty:
        try:
            rows = os.get_terminal_size(out.fileno()).lines
        except (AttributeError, OSError, ValueError):
            rows = None
    return Screen(out, in_place=tty, rows=rows)


def captured(session: HostSession, draw: Callable[[], object], *, colour: bool,
             width: int) -> list[str]:
    """What ``draw`` shows through the session's reporter, as lines (its tables, notes and
    warnings in the order it printed them), laid out for ``width`` columns."""
    buffer = io.StringIO()
    shown = Reporter.capturing(buffer, width=width, colour=colour,
                               gpu_table=session.reporter.gpu_table)
    real, session.reporter = session.reporter, shown
    try:
        draw()
    finally:
        session.reporter = real
    return buffer.getvalue().rstrip("\n").split("\n")


def follow_status(project: Project, host_spec: str, reporter: Reporter, *,
                  run_id: str | None = None, playbook: str | None = None, log_lines: int = 5,
                  every: float = DEFAULT_EVERY, journal: Journal | None = None,
                  refreshes: int | None = None, book: HostBook | None = None) -> int:
    """Refresh ``status`` every ``every`` seconds on one session until Ctrl-C (then
    :class:`Interrupted`, exit 130), or ``refreshes`` times; returns the refreshes made."""
    journal = journal or Journal()
    book = book or HostBook(project.hosts_dir)
    host = run_host(book, journal, host_spec, run_id)[0] if run_id else None
    screen = screen_for(reporter.out)
    made = 0
    with host_session(project, host_spec, reporter, journal, host=host,
                      book=book) as session:
        try:
            while refreshes is None or made < refreshes:
                if made:
                    time.sleep(every)
                refresh(session, screen, run_id=run_id, playbook=playbook,
                        log_lines=log_lines, every=every)
                made += 1
        except KeyboardInterrupt:
            raise Interrupted(f"status --follow stopped (Ctrl-C) after {made} refresh(es); "
                              "nothing on the box was touched") from None
    return made


def refresh(session: HostSession, screen: Screen, *, run_id: str | None,
            playbook: str | None, log_lines: int, every: float) -> None:
    """One refresh: a status call on the session, drawn as one frame (or one JSON line)."""
    if session.reporter.json_mode:
        status_on(session, run_id=run_id, playbook=playbook, log_lines=log_lines)
        return
    width = terminal_width(screen.out)
    lines = captured(session, lambda: status_on(session, run_id=run_id, playbook=playbook,
                                                log_lines=log_lines),
                     colour=session.reporter.colour and screen.in_place, width=width)
    clock = time.strftime("%H:%M:%S UTC", time.gmtime())
    header = (f"status of {session.host.name} at {clock}, every {every:g}s, refresh "
              f"{screen.frames + 1}; Ctrl-C leaves")
    screen.draw(header[:width], lines)
