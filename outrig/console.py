"""Terminal output: human (rich) or machine (``--json``), chosen once per command.

Humans get the plan as a table, one line per event, and a live line while waiting for a
process to become ready (elapsed / limit and the last log line). ``--json`` gets JSON lines on
stdout and nothing else there, so scripts can parse it; human chatter then goes to stderr.
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import IO, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from outrig.plan import Plan

# Every C0 control but tab and newline, DEL, and every C1 control (0x9b is a one-byte CSI).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """Text from a process (or a box) made harmless for a terminal: control characters shown
    as ``\\x1b``-style escapes instead of acting (window titles, clear screen, OSC 52
    clipboard writes, cursor moves). Tab and newline stay. ``--json`` output keeps exact text,
    so this is applied only where humans read."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class Reporter:
    """Where every op sends what the user should see."""

    def __init__(self, *, json_mode: bool = False, out: IO[str] | None = None,
                 err: IO[str] | None = None, quiet: bool = False) -> None:
        self.json_mode = json_mode
        self.quiet = quiet
        self.out = out or sys.stdout
        self.console = Console(file=err or sys.stderr, highlight=False, soft_wrap=True)
        self.stdout_console = Console(file=self.out, highlight=False, soft_wrap=True)
        self._status: Any = None
        self._last_wait_print = 0.0

    # --- plain messages -------------------------------------------------------------------
    def info(self, message: str) -> None:
        if not self.quiet:
            self._stop_status()
            self.console.print(escape(visible(message)))

    def warn(self, message: str) -> None:
        self._stop_status()
        self.console.print(f"[yellow]warning:[/yellow] {escape(visible(message))}")

    def success(self, message: str) -> None:
        if self.quiet:
            return
        self._stop_status()
        self.console.print(f"[green]✓[/green] {escape(visible(message))}")

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
        if self.console.is_terminal:
            if self._status is None:
                self._status = self.console.status(escape(text))
                self._status.start()
            else:
                self._status.update(escape(text))
        elif time.monotonic() - self._last_wait_print >= 10:
            self._last_wait_print = time.monotonic()
            self.console.print(escape(text))

    def _stop_status(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def close(self) -> None:
        self._stop_status()

    # --- tables ---------------------------------------------------------------------------
    def plan(self, plan: Plan, *, full: bool = False) -> None:
        if self.json_mode or self.quiet:
            return
        self._stop_status()
        mode = " (test mode)" if plan.test_mode else ""
        title = f"plan: {plan.playbook}{mode} on {plan.host} → {plan.workdir}  run {plan.run_id}"
        table = Table(title=escape(title), title_justify="left", show_lines=full)
        for col in ("#", "process", "gpus", "after", "ready when", "stop", "command"):
            table.add_column(col, overflow="fold")
        for index, name in enumerate(plan.order, 1):
            proc = plan.processes.get(name)
            if proc is None:
                continue
            gpus = ",".join(map(str, proc.gpus)) or "-"
            if proc.parallel:
                gpus += f" (TP{proc.parallel[0]}×DP{proc.parallel[1]})"
            command = " ".join(_shown(a) for a in proc.argv)
            if len(command) > 100:  # with full=True the whole argv follows the table
                command = command[:97] + "..."
            table.add_row(str(index), name, gpus, ",".join(proc.after) or "-",
                          proc.ready.describe() if proc.ready else "up 2 s after launch",
                          f"TERM, {proc.stop_grace:g}s, KILL", escape(command))
        self.stdout_console.print(table)
        if full:
            for name in plan.order:
                proc = plan.processes[name]
                self.stdout_console.print(f"[bold]{escape(name)}[/bold] argv:")
                for line in _argv_lines(proc.argv):
                    self.stdout_console.print(f"    {escape(line)}", soft_wrap=True)
                env = " ".join(f"{k}={_shown(v)}" for k, v in sorted(proc.env.items()))
                self.stdout_console.print(f"  env: {escape(env)}")
        if plan.files:
            files = ", ".join(remote for remote, _ in plan.files)
            self.stdout_console.print(f"files pushed: {escape(files)}")
        if plan.secrets:
            self.stdout_console.print(
                f"secrets passed over the channel: {', '.join(plan.secrets)} (values hidden)")
        for note in plan.notes:
            self.stdout_console.print(f"[dim]note: {escape(note)}[/dim]")


def _argv_lines(argv: list[str]) -> list[str]:
    """Shell-quoted argv, one option per line with its values (``--flag v1 v2``), so a long
    rendered command reads like the hand-written one it replaces."""
    lines: list[str] = []
    for arg in argv:
        if lines and not (arg.startswith("-") and len(arg) > 1 and not arg[1:2].isdigit()):
            lines[-1] += " " + _shown(arg)
        else:
            lines.append(_shown(arg))
    return lines


def _shown(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def describe_event(event: dict[str, Any]) -> str | None:
    """A one-line human form of an agent event, or None for events not worth a line."""
    kind = event.get("event")
    if kind == "step":
        return f"• {event.get('msg', '')}"
    if kind == "facts":
        gpus = event.get("gpus") or []
        if gpus:
            mem = gpus[0].get("memory_total_mib")
            gpu_text = f"{len(gpus)}× {gpus[0].get('name', 'GPU')}" + (
                f" ({int(mem) // 1024} GiB)" if mem else "")
        else:
            gpu_text = f"no GPUs ({event.get('gpu_error') or 'nvidia-smi found none'})"
        return f"• box {event.get('hostname', '?')}: python {event.get('python', '?')}, {gpu_text}"
    if kind == "stopped":
        how = {"term": "stopped on SIGTERM", "kill": "killed after the grace period",
               "gone": "was not running", "reused": "pid reused by another process: untouched"}
        text = how.get(str(event.get("how")), str(event.get("how")))
        extra = f", {event['stragglers']} straggler(s) killed" if event.get("stragglers") else ""
        return (f"• {event.get('process')} (run {event.get('run_id')}) {text} "
                f"in {float(event.get('seconds') or 0):.1f}s{extra}")
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
