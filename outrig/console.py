"""Terminal output: human (rich) or machine (``--json``), chosen once per command.

Humans get the plan as a table, one line per event, and a live line while waiting for a
process to become ready (elapsed / limit and the last log line). ``--json`` gets JSON lines on
stdout and nothing else there, so scripts can parse it; human chatter then goes to stderr.

The plan is a type here only: every command that reports imports this module, and the
planner (with the recipes and the playbook models) only the commands that plan.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import IO, TYPE_CHECKING, Any

from outrig.errors import CLOSED_PIPE_EXIT
from outrig.text.layout import paragraph, plan_lines, status_lines, visible
from outrig.text.terminal import wrap_width

if TYPE_CHECKING:
    from rich.console import Console

    from outrig.plan import Plan


@functools.cache
def _console_class() -> type[Console]:
    """rich's Console, ending quietly with :data:`~outrig.errors.CLOSED_PIPE_EXIT` when the
    reader went away (``outrig plan | head``), as every other write of outrig's does
    (:class:`outrig.cli.invoke_program.OutrigProgram`); rich itself would exit 1. Made once, on
    first use, so that rich is imported only then."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            try:
                fd = self.file.fileno()
            except (AttributeError, OSError, ValueError):
                fd = None  # not a real file: nothing will flush it at exit
            if fd is not None:  # point it at /dev/null so that the flush at exit cannot fail
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, fd)
                os.close(devnull)
            raise SystemExit(CLOSED_PIPE_EXIT)

    return _Console


def make_console(stream: IO[str]) -> Console:
    """rich's Console on ``stream``, colour as :func:`wants_colour` says."""
    return _console_class()(file=stream, highlight=False, soft_wrap=True,
                            no_color=not wants_colour(stream))


class LazyConsole:
    """A reporter's console on one of its streams (the attribute ``stream`` names), made on
    first use: rich (about 40 modules) is imported when something is first drawn for
    people, so a --json command that warns of nothing never imports it. Assignable (a step
    reporter shares its parent's)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = f"_{name}"

    def __init__(self, stream: str) -> None:
        self.stream = stream

    def __get__(self, reporter: Any, owner: type | None = None) -> Console:
        if reporter is None:  # looked up on the class (introspection): the descriptor
            return self  # type: ignore[return-value]
        made: Console | None = reporter.__dict__.get(self.slot)
        if made is None:
            made = reporter.__dict__[self.slot] = make_console(getattr(reporter, self.stream))
        return made

    def __set__(self, reporter: Any, console: Console) -> None:
        reporter.__dict__[self.slot] = console


def escape(text: str) -> str:
    """rich's markup escape (rich imported on first use, as the consoles are)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def wants_colour(stream: IO[str]) -> bool:
    """Whether text for people on ``stream`` gets colour: never with ``NO_COLOR`` set to
    anything (no-color.org), always with ``FORCE_COLOR`` set to anything (force-color.org,
    e.g. a CI log that renders escapes), else when ``stream`` is a terminal. ``NO_COLOR`` wins
    when both are set, as it does in rich, which draws the rest of the output."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return is_tty(stream)


def is_tty(stream: IO[str]) -> bool:
    """Whether ``stream`` is a terminal (a closed or odd stream is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


_LINE_BREAK = {"\n": "\\n", "\r": "\\r"}


def one_line(text: object) -> str:
    """Box-side text (a process name, an exit code, an agent's message) to be embedded in
    one of outrig's own lines: newline and carriage return shown as ``\\n`` and ``\\r``.
    The box's files can be rewritten by anything running there; a newline in a process name
    would otherwise start a line that looks like outrig's own (a forged ``error:`` or
    hint). Only these two: the other controls stay exact in the message (``--json`` keeps
    them) and :func:`visible` shows them as escapes wherever a person reads it."""
    return re.sub("[\n\r]", lambda m: _LINE_BREAK[m.group()], str(text))


# Reporters whose status line is drawn now (see stop_live)
_LIVE: weakref.WeakSet[Reporter] = weakref.WeakSet()


def stop_live() -> None:
    """Stop every reporter's status line (its spinner erased, the cursor shown again), so
    that what is printed next (an error, Ctrl-C's message) is not drawn over, and no spinner
    frame is left on the terminal. ``friendly`` calls it before it prints why a task ended."""
    for reporter in list(_LIVE):
        reporter.close()


class Reporter:
    """Where every op sends what the user should see."""

    console = LazyConsole("err")  # notes, warnings, waits
    stdout_console = LazyConsole("out")  # the layouts and tables

    def __init__(self, *, json_mode: bool = False, out: IO[str] | None = None,
                 err: IO[str] | None = None, quiet: bool = False,
                 gpu_table: bool = False) -> None:
        self.json_mode = json_mode
        self.quiet = quiet
        self.gpu_table = gpu_table  # the full GPU table instead of the one-line summary
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        # colour for what an op writes on stdout itself (tail-logs' process names)
        self.colour = wants_colour(self.out) and not json_mode
        self._status: Any = None
        self._last_wait_print = 0.0

    # --- plain messages -------------------------------------------------------------------
    # Notes, warnings and ✓ lines are prose: wrapped at spaces to the terminal (the
    # continuation two columns in), so that no word is cut at its edge; left whole on one
    # line when stderr is not a terminal (outrig.text.terminal.wrap_width). Output of a process
    # (the "output" event) is printed as it came.
    def _message(self, message: str, mark: str = "", markup: str = "") -> None:
        text = paragraph(visible(message), wrap_width(self.console.file), first=mark)
        if mark:  # the mark in colour, the text as text
            text = f"{markup}{escape(text[:len(mark)].rstrip())}[/] " + escape(text[len(mark):])
            self.console.print(text)
        else:
            self.console.print(escape(text))

    def info(self, message: str) -> None:
        if not self.quiet:
            self._stop_status()
            self._message(message)

    def warn(self, message: str) -> None:
        self._stop_status()
        self._message(message, "warning: ", "[yellow]")

    def success(self, message: str) -> None:
        if self.quiet:
            return
        self._stop_status()
        self._message(message, "✓ ", "[green]")

    def emit_json(self, document: Any) -> None:
        """One JSON line on stdout (only in --json mode)."""
        if self.json_mode:
            self.out.write(json.dumps(document, default=str) + "\n")
            self.out.flush()

    # --- agent events ---------------------------------------------------------------------
    def event(self, event: dict[str, Any]) -> None:
        if self.json_mode:
            self.emit_json(event)
            return
        kind = event.get("event")
        if kind in {"waiting", "stopping"}:
            self._waiting(event)
            return
        text = describe_event(event)
        if text is None:
            return
        if kind == "warning":
            self.warn(text)
        elif kind == "output":  # a process's own line: as it came, never re-wrapped
            if not self.quiet:
                self._stop_status()
                self.console.print(escape(visible(text)))
        else:
            self.info(text)

    def _waiting(self, event: dict[str, Any]) -> None:
        name = event.get("process", "?")
        elapsed = float(event.get("elapsed") or 0)
        if event.get("event") == "stopping":
            limit = event.get("grace")
            what = f"stopping {name} (SIGTERM sent; SIGKILL after the grace period)"
        else:
            limit = event.get("timeout")
            what = f"waiting for {name} to be ready"
        last = str(event.get("last_line") or "")[-120:]
        text = f"{what}: {elapsed:.0f}s" + (
            f" / {float(limit):.0f}s" if limit else "") + (f" — {last}" if last else "")
        self.live(text)

    def live(self, text: str) -> None:
        """A transient status line (a wait, pip's last line, a transfer's rate): redrawn in
        place on a terminal, printed at most every 10 s otherwise, nothing in --json mode."""
        if self.json_mode or self.quiet:
            return
        text = visible(text)
        if is_tty(self.console.file):  # not merely FORCE_COLOR: no redrawing into a log
            if self._status is None:
                self._status = self.console.status(escape(text))
                self._status.start()
                _LIVE.add(self)
            else:
                self._status.update(escape(text))
        elif time.monotonic() - self._last_wait_print >= 10:
            self._last_wait_print = time.monotonic()
            self.console.print(escape(text))

    def _stop_status(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        _LIVE.discard(self)

    def close(self) -> None:
        self._stop_status()

    # --- layouts (outrig/text/layout.py) --------------------------------------------------
    @property
    def width(self) -> int:
        """Columns to lay out for: the terminal's (or COLUMNS), 80 when not a terminal."""
        return int(self.stdout_console.width)

    def lines(self, lines: list[str]) -> None:
        """Print laid-out lines on stdout as they are (rich never re-wraps them)."""
        self._stop_status()
        for line in lines:
            self.stdout_console.print(escape(line), soft_wrap=True, highlight=False)

    def table(self, title: str, columns: Sequence[str], rows: Iterable[Sequence[str]], *,
              fold: bool = False) -> None:
        """A titled table of plain-text rows on stdout (cleanup's stopped runs and GPUs,
        migrate's placement, evaluate's comparison). The reporter owns the markup: title,
        headers and cells are text, escaped here, so an op hands over rows, never rich's
        objects. ``fold``: a cell too wide for its column folds onto more lines."""
        from rich.table import Table

        drawn = Table(title=escape(title), title_justify="left")
        for column in columns:
            if fold:
                drawn.add_column(escape(column), overflow="fold")
            else:
                drawn.add_column(escape(column))
        for row in rows:
            drawn.add_row(*(escape(cell) for cell in row))
        self.stdout_console.print(drawn)

    @classmethod
    def capturing(cls, buffer: IO[str], *, width: int, colour: bool,
                  gpu_table: bool = False) -> Reporter:
        """A reporter that writes everything (stdout's tables and stderr's notes) into
        ``buffer``, laid out for ``width`` columns (``status --follow`` redraws what
        ``status`` would print)."""
        from rich.console import Console

        shown = cls(out=buffer, err=buffer, gpu_table=gpu_table)
        shown.stdout_console = shown.console = Console(
            file=buffer, width=width, force_terminal=colour, no_color=not colour,
            highlight=False, soft_wrap=True)
        return shown

    def plan(self, plan: Plan, *, full: bool = False) -> None:
        if self.json_mode or self.quiet:
            return
        self.lines(plan_lines(plan, self.width, full=full))

    def status(self, result: dict[str, Any]) -> None:
        """``outrig status`` for people (see :func:`outrig.text.layout.status_lines`)."""
        if not result.get("runs"):
            self.info("no outrig runs on this box")
        self.lines(status_lines(result, self.width, gpu_table=self.gpu_table))


def had_ended(stopped: dict[str, Any]) -> str | None:
    """How a process that cleanup found gone had ended, when the box recorded it
    (``exit_code`` / ``exit_signal`` of a ``stopped`` record); None otherwise. "was not
    running" of a trainer that finished with exit 0 read as if it had died."""
    if stopped.get("how") != "gone":
        return None
    if isinstance(stopped.get("exit_signal"), int):
        return f"had been killed (signal {stopped['exit_signal']})"
    code = stopped.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool):
        return "had finished (exit 0)" if code == 0 else f"had exited {code}"
    return None


def describe_event(event: dict[str, Any]) -> str | None:
    """A one-line human form of an agent event, or None for events not worth a line."""
    kind = event.get("event")
    if kind == "step":
        return f"• {event.get('msg', '')}"
    if kind == "facts":
        gpus = event.get("gpus") or []
        if gpus:
            mem = gpus[0].get("memory_total_mib")
            gpu_text = f"{len(gpus)}× {visible(str(gpus[0].get('name', 'GPU')))}" + (
                f" ({int(mem) // 1024} GiB)" if mem else "")
        else:
            gpu_text = f"no GPUs ({event.get('gpu_error') or 'nvidia-smi found none'})"
        return f"• box {event.get('hostname', '?')}: python {event.get('python', '?')}, {gpu_text}"
    if kind == "stopped":
        how = {"term": "stopped on SIGTERM", "kill": "killed after the grace period",
               "gone": "was not running", "reused": "pid reused by another process: untouched"}
        text = how.get(str(event.get("how")), str(event.get("how")))
        ended = had_ended(event)  # it had ended before: no stop took any time
        extra = f", {event['stragglers']} straggler(s) killed" if event.get("stragglers") else ""
        took = "" if ended else f" in {float(event.get('seconds') or 0):.1f}s"
        return (f"• {event.get('process')} (run {event.get('run_id')}) {ended or text}"
                f"{took}{extra}")
    if kind == "launched":
        return (f"• launched {event.get('process')} (pid {event.get('pid')}, "
                f"pgid {event.get('pgid')})")
    if kind == "ready":
        elapsed = float(event.get("elapsed") or 0)
        if event.get("via") == "alive":
            return (f"✓ {event.get('process')} still running after {elapsed:.1f}s (it has no "
                    "ready: check; only its start is confirmed)")
        return f"✓ {event.get('process')} ready after {elapsed:.1f}s ({event.get('via')})"
    if kind == "finished":
        last = str(event.get("last_line") or "")[-120:]
        return (f"✓ {event.get('process')} finished: exited 0 after "
                f"{float(event.get('elapsed') or 0):.1f}s, before it was ready"
                + (f" — {last}" if last else ""))
    if kind == "warning":
        return str(event.get("msg", ""))
    if kind == "output":
        return str(event.get("line", ""))
    return None
