"""``inv tail-logs``: every log of a run over one SSH channel, exactly once, into a local mirror.

The agent's ``follow`` op streams framed chunks (process, inode, offset, bytes); the pure rules
live in :mod:`outrig.logs.tail`. This module does the I/O, in an order that makes a crash or a
dropped link harmless:

1. append the new bytes to the mirror ``<state>/logs/<host>/<run>/<process>.log``
   (:mod:`outrig.logs.mirror`);
2. fsync the mirror;
3. write the cursors (``cursors.json`` beside the mirrors) atomically;
4. only then print the lines.

A crash after (1) or (2) leaves mirror bytes past the durable cursor: they are cut off on the
next start, then re-sent by the agent. A crash after (3) loses only the printing of that batch
(the mirror has it). So the mirror never skips or repeats a byte. A dropped connection is
noticed from the stream itself (the agent sends a heartbeat every few seconds; silence for
three of them, or a closed transport, means the link is dead) and the tailer reconnects with
backoff and resumes from the cursors.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outrig.agent.client import AgentCall, raise_for_result
from outrig.agent.reader import ChannelReader, take_events
from outrig.console import Reporter
from outrig.errors import (
    AuthenticationError,
    ConfigError,
    ConnectError,
    ConnectRefused,
    Interrupted,
    LinkLost,
    LocalWriteError,
    RemoteError,
)
from outrig.inventory import HostBook
from outrig.journal import (
    Journal,
    utc_text,
)
from outrig.logs.mirror import (
    MirrorStore,
    gap_lines,
    mirror_files,
    mirror_root,
    mirror_text,
    read_cursors,
    read_gaps,
    recent_cursor_sets,
)
from outrig.logs.tail import (
    Applied,
    Cursor,
    FramingError,
    StreamState,
    clean_display,
    decode_chunk,
)
from outrig.redaction import ordered, redact_text
from outrig.redeploy.record import run_host
from outrig.session import HostSession, Project, base_request
from outrig.text.layout import visible
from outrig.timing import fanout_deadline_for, follow_idle_limit, heartbeat_for, jittered

LOG_WINDOW = 32 << 20  # SSH receive window for the log channel (paramiko's default is 2 MiB)
BATCH_BYTES = 8 << 20  # commit (fsync + cursor write) at least this often while streaming
RESUMES = "tail-logs reconnects and resumes from its saved cursors."
COLOURS = (36, 33, 35, 32, 34, 31, 96, 93, 95, 92, 94, 91)  # ANSI foreground colours


# ----------------------------------------------------------------- the mirror instead of the box


def show_mirror(session: HostSession, printer: LinePrinter, run_id: str, exc: Exception, *,
                processes: list[str] | None, lines: int | None) -> TailResult | None:
    """What the local mirror holds of ``run_id`` (every line, or the last ``lines`` of each
    process; ``--grep`` applies), each process's lines in order, after a note on stderr that
    they come from the mirror, written up to when, and why the box was not read. None when
    the mirror holds nothing of the run (the box's error then stands)."""
    root = mirror_root(session.journal, session.host.name, run_id)
    store = MirrorStore(root)
    files = mirror_files(store) if root.is_dir() else {}
    if processes:
        files = {n: f for n, f in files.items() if n in processes}
    if not files:
        return None
    raw = read_cursors(store.cursor_file)
    since = raw.get("updated") if isinstance(raw, dict) else None
    if not isinstance(since, (int, float)):
        since = max(f.stat().st_mtime for each in files.values() for f, _ in each)
    reason = str(exc).split(". ")[0]
    session.reporter.info(
        f"{session.host.label()} could not be read ({reason}). Showing run {run_id}'s logs "
        f"from the local mirror {root}, as the last tail-logs wrote them at "
        f"{utc_text(since)}; nothing later is in it.")
    result = TailResult(run_id=run_id, mirror_dir=root, mirror_since=float(since))
    for line in gap_lines(read_gaps(raw)):
        session.reporter.warn(line)
    printer.names(list(files))
    # the box names the run's secrets in its run event; without the box, the deploy's plan
    # in the journal does (the values come from this shell, as for lines from the box)
    plan = (session.journal.run(run_id) or {}).get("plan")
    secrets = plan.get("secrets") if isinstance(plan, dict) else None
    printer.hide([str(k) for k in secrets or []])
    for name, each in files.items():
        text = mirror_text(each)
        batch = [(name, line) for line in (text if lines is None else text[-lines:] if lines
                                           else [])]
        printer.lines(batch)
        result.lines += len(batch)
    return result


# ------------------------------------------------------------------------------ output


class LinePrinter:
    """``process | line`` (coloured per process on a terminal), or JSON lines with --json.

    With ``host`` (tail-logs on several hosts) each line starts with the host, padded to
    ``host_width`` (``host | process | line``), and each JSON object has a ``host`` key."""

    def __init__(self, reporter: Reporter, grep: re.Pattern[str] | None,
                 sink: Callable[[str, str], None] | None = None, *, host: str | None = None,
                 host_width: int = 0) -> None:
        self.reporter = reporter
        self.grep = grep
        self.sink = sink
        self.host = host
        self.prefix = "" if host is None else f"{visible(host):<{host_width}} | "
        self.colour = reporter.colour
        self.width = 0
        self.colours: dict[str, int] = {}
        self.secrets: list[str] = []  # values to hide, longest first

    def hide(self, keys: list[str]) -> None:
        """Redact the values of these secrets (read from this shell, as deploy sent them)
        from every line shown or emitted as JSON (the tailer redacts the mirror with the
        same values)."""
        self.secrets = ordered([*(os.environ.get(k, "") for k in keys), *self.secrets])

    def names(self, names: list[str]) -> None:
        self.width = max([self.width, *(len(n) for n in names)])

    def lines(self, batch: list[tuple[str, str]]) -> None:
        out: list[str] = []
        redact = redact_text if self.secrets else None
        for name, line in batch:
            if redact is not None:
                line = redact(line, self.secrets)
            if self.grep is not None and not self.grep.search(line):
                continue
            if self.sink is not None:
                self.sink(name, line)
            if self.reporter.json_mode:
                doc = {"process": name, "line": line}
                out.append(json.dumps(doc if self.host is None else
                                      {"host": self.host, **doc}) + "\n")
            elif self.colour:
                code = self.colours.setdefault(name, COLOURS[len(self.colours) % len(COLOURS)])
                out.append(f"{self.prefix}\x1b[{code}m{name:<{self.width}}\x1b[0m | "
                           f"{visible(clean_display(line))}\n")
            else:
                out.append(f"{self.prefix}{name:<{self.width}} | "
                           f"{visible(clean_display(line))}\n")
        if out:
            self.reporter.out.write("".join(out))
            self.reporter.out.flush()


# ------------------------------------------------------------------------------ the tailer


@dataclass
class TailResult:
    run_id: str | None = None
    lines: int = 0
    bytes: int = 0
    reconnects: int = 0
    mirror_dir: Path | None = None
    cursors: dict[str, Cursor] = field(default_factory=dict)
    first_line_at: float | None = None  # seconds from start to the first line shown
    opens: dict[str, dict[str, Any]] = field(default_factory=dict)  # last open event each
    mirror_since: float | None = None  # shown from the local mirror, written up to then


class LogTailer:
    """Follow (or read once) the logs of one run; reconnect and resume until told to stop."""

    def __init__(self, session: HostSession, *, run_id: str | None = None,
                 playbook: str | None = None, processes: list[str] | None = None,
                 lines: int | None = None, follow: bool = True, grep: str | None = None,
                 stop: threading.Event | None = None, heartbeat: float | None = None,
                 idle_limit: float | None = None, give_up_after: float = 300.0,
                 max_seconds: float | None = None, backoff: float = 0.25,
                 sink: Callable[[str, str], None] | None = None,
                 host_label: str | None = None, host_width: int = 0,
                 first_answer_within: float | None = None) -> None:
        if lines is not None and lines < 0:
            raise ConfigError(f"--lines must be ≥ 0, not {lines}")
        pattern = None
        if grep is not None:
            try:
                pattern = re.compile(grep)
            except re.error as exc:
                raise ConfigError(f"--grep {grep!r} is not a valid regular expression: {exc}. "
                                  "Nothing was sent.") from None
        self.session = session
        self.journal = session.journal
        self.host_key = session.host.name
        self.run_id = run_id
        self.playbook = playbook
        self.processes = processes or None
        self.lines = lines
        self.follow = follow
        self.stop = stop or threading.Event()
        self.heartbeat = heartbeat
        self.idle_limit = idle_limit
        self.give_up_after = give_up_after
        # with several hosts: a box that never answered gives up sooner than one that did
        # (whose outage may be a reboot worth riding out), so one dead box in a group does
        # not hold a --no-follow for give_up_after
        self.first_answer_within = first_answer_within
        self.max_seconds = max_seconds
        self.printer = LinePrinter(session.reporter, pattern, sink, host=host_label,
                                   host_width=host_width)
        self.reporter = session.reporter
        self.store: MirrorStore | None = None
        self.streams: dict[str, StreamState] = {}
        self.result = TailResult()
        self.started = time.monotonic()
        self.first_call = True
        self.call_worked = False  # the current call reached the agent (reset the backoff)
        self.initial_backoff = backoff
        self.measured_rtt: float | None = None  # survives the transports a reconnect replaces
        self.resumed = False  # a cursor from an earlier tail-logs was loaded for this run
        self.noted_idle = False  # the "nothing new" line was printed
        self.mirror_secrets: tuple[bytes, ...] = ()  # this shell's values of secret_keys

    # -- events

    def _bind_run(self, run_id: str) -> None:
        """The agent named the run: open its mirror and load the durable cursors."""
        if self.store is not None:
            if run_id != self.result.run_id:
                raise FramingError(f"the agent switched runs ({self.result.run_id} → {run_id})",
                                   kind="framing")
            return
        self.result.run_id = run_id
        self.run_id = run_id  # reconnects resume this run even if a new one becomes current
        root = mirror_root(self.journal, self.host_key, run_id)
        self.store = MirrorStore(root)
        self.result.mirror_dir = root
        for name, cursor in self.store.load().items():
            self.streams[name] = StreamState(name, cursor, self.store.partial(name, cursor),
                                             self.mirror_secrets)
            self.resumed = True

    def _stream(self, name: str) -> StreamState:
        if name not in self.streams:
            self.streams[name] = StreamState(name, secrets=self.mirror_secrets)
        return self.streams[name]

    def _apply(self, event: dict[str, Any], shown: list[tuple[str, str]]) -> bool:
        """Apply one event; True when it changed the mirror (a commit is due)."""
        kind = event.get("event")
        if kind == "run":
            # the secrets first: the mirror is redacted with them from its first byte
            self.printer.hide([str(k) for k in event.get("secret_keys") or []])
            self.mirror_secrets = tuple(v.encode() for v in self.printer.secrets)
            for stream in self.streams.values():
                stream.secrets = self.mirror_secrets
            self._bind_run(str(event.get("run_id")))
            self.first_call = False  # later calls are resumes: --lines only for new logs
            self.call_worked = True
            names = [str(n) for n in event.get("processes") or []]
            self.printer.names(names)
            return False
        if kind in ("open", "chunk") and self.store is None:
            raise FramingError(f"{kind} event before the run was named", kind="framing")
        assert self.store is not None or kind not in ("open", "chunk")
        if kind == "open":
            name = str(event["process"])
            self.result.opens[name] = event
            self.printer.names([name])
            stream = self._stream(name)
            before = stream.pending
            applied = stream.on_open(int(event["inode"]), int(event["offset"]),
                                     int(event.get("display_from", event["offset"])),
                                     str(event.get("reason")))
            if applied.reset and event.get("reason") == "lines":  # skipped, not fetched
                assert self.store is not None
                held = before.offset if before is not None and \
                    before.inode == int(event["inode"]) else 0
                self.store.note_gap(name, int(event["inode"]), held, int(event["offset"]))
            if applied.reset:
                # A new segment starts: archive the old mirror file and make the new (empty)
                # segment durable at once, so a reconnect resumes from where it begins.
                assert self.store is not None and stream.pending is not None
                if applied.new_segment:
                    self.store.new_segment(name, stream.pending.segments)
                else:
                    self.store.drop(name)
                return True
            return False
        if kind == "chunk":
            chunk = decode_chunk(event)
            target = self.streams.get(chunk.process)
            if target is None:
                raise FramingError(f"chunk for {chunk.process} before its open event",
                                   kind="framing")
            applied = target.on_chunk(chunk)
            self._take(chunk.process, applied, shown)
            return bool(applied.mirror)
        if kind == "rotated":
            lost = " (the old file's unread tail could not be found on the box)" \
                if event.get("lost") else ""
            self.reporter.warn(f"{event.get('process')}: log rotated (inode "
                               f"{event.get('old_inode')} → {event.get('inode')}); following the "
                               f"new file{lost}")
        elif kind == "truncated":
            self.reporter.warn(f"{event.get('process')}: log truncated (was at byte "
                               f"{event.get('old_offset')}, now {event.get('size')} bytes); "
                               "starting again from its beginning")
        elif kind == "missing":
            self.reporter.info(f"{event.get('process')}: no log yet ({event.get('path')}); "
                               "waiting for it")
        elif kind == "warning":
            self.reporter.warn(str(event.get("msg")))
        elif kind == "heartbeat" and self.follow:
            self._note_if_nothing_new()  # the first idle beat: the agent has sent all it had
        return False

    def _note_if_nothing_new(self) -> None:
        """Say once, on stderr, that no line came and how to see older ones: an empty screen
        after a resume otherwise looks like a hang (follow) or a failure (--no-follow)."""
        if (self.noted_idle or self.result.run_id is None or self.result.lines
                or self.result.bytes or self.stop.is_set()):
            return
        self.noted_idle = True
        since = "since the last tail-logs" if self.resumed else "yet"
        where = f" or read the local mirror in {self.result.mirror_dir}" \
            if self.resumed and self.result.mirror_dir is not None else ""
        waiting = "; waiting for new lines" if self.follow else ""
        self.reporter.info(f"nothing new in the logs of run {self.result.run_id} {since}{waiting}. "
                           f"To see older lines, add --lines N (e.g. --lines 100){where}.")

    def _take(self, name: str, applied: Applied, shown: list[tuple[str, str]]) -> None:
        if applied.mirror:
            assert self.store is not None
            self.store.append(name, applied.mirror)
            self.result.bytes += len(applied.mirror)
        shown.extend((name, line) for line in applied.lines)

    def _commit(self) -> None:
        if self.store is None or self.result.run_id is None:
            return
        cursors = {n: s.pending for n, s in self.streams.items() if s.pending is not None}
        self.store.commit(self.host_key, self.result.run_id, cursors)
        for stream in self.streams.values():
            stream.commit()
        self.result.cursors = dict(cursors)

    def _show(self, shown: list[tuple[str, str]]) -> None:
        if not shown:
            return
        if self.result.first_line_at is None:
            self.result.first_line_at = time.monotonic() - self.started
        self.result.lines += len(shown)
        self.printer.lines(shown)

    # -- one agent call

    def _request(self) -> dict[str, Any]:
        rtt = self.session.transport.rtt
        cursors = recent_cursor_sets(self.journal, self.host_key, self.run_id)
        if self.store is not None and self.result.run_id is not None:
            cursors[self.result.run_id] = {n: s.cursor.wire() for n, s in self.streams.items()
                                           if s.cursor is not None}
        fields: dict[str, Any] = {
            "run_id": self.run_id, "playbook": self.playbook if self.run_id is None else None,
            "processes": self.processes, "follow": self.follow,
            "lines": self.lines, "lines_if_no_cursor": not self.first_call,
            "heartbeat": self.heartbeat or heartbeat_for(rtt), "cursors": cursors,
            "compress": True}
        if self.max_seconds is not None:
            fields["max_seconds"] = self.max_seconds
        return base_request(self.session.host, "follow", **fields)

    def _call(self) -> dict[str, Any] | None:
        """One follow exec. Returns its result; raises LinkLost when the link dies; None when
        asked to stop."""
        transport = self.session.transport
        request = self._request()
        heartbeat = float(request["heartbeat"])
        # Started as every op's agent is (the request in the command line when it fits);
        # stdin then stays open and unused: the agent ends when the workstation closes it.
        channel = AgentCall(transport).start(request, window_size=LOG_WINDOW)
        limit = self.idle_limit or follow_idle_limit(heartbeat, transport.rtt)
        reader = ChannelReader(channel, self.session.host, limit, poll=0.25,
                               batch=BATCH_BYTES, stop=self.stop, after=RESUMES)
        try:
            return self._read(reader)
        finally:
            channel.close()

    def _read(self, reader: ChannelReader) -> dict[str, Any] | None:
        """Apply the stream's events batch by batch (one commit per batch) until the result;
        None when stopped. The reader decides silence, a dead link and a crash."""
        buffer = bytearray()
        for data in reader.chunks():
            buffer += data
            result = self._process(buffer)
            if result is not None:
                return result
        if reader.stopped:
            return None
        raise reader.no_result()

    def _process(self, buffer: bytearray) -> dict[str, Any] | None:
        """Apply every complete event line in ``buffer`` (consumed in place); commit; print."""
        shown: list[tuple[str, str]] = []
        changed = False
        result: dict[str, Any] | None = None
        for event in take_events(buffer):
            if event.get("event") == "result":
                result = event
                break
            if event.get("event") == "output":  # a line that is not an event: say it
                self.reporter.warn(f"agent: {str(event.get('line'))[:200]}")
                continue
            changed |= self._apply(event, shown)
        if changed:
            self._commit()
        self._show(shown)
        return result

    # -- the loop

    def run(self) -> TailResult:
        """Stream until the agent is done (``--no-follow``) or ``stop`` is set."""
        backoff = self.initial_backoff
        outage_since: float | None = None
        ended = False
        try:
            while not self.stop.is_set():
                try:
                    result = self._call()
                except ConnectError as exc:
                    if not self._retryable(exc):
                        raise
                    if self.call_worked:  # it streamed before it broke: a fresh outage
                        self.call_worked = False
                        backoff, outage_since = self.initial_backoff, None
                    now = time.monotonic()
                    outage_since = outage_since or now
                    if now - outage_since > self._give_up_after():
                        rtt = self._known_rtt()
                        rtt_words = "no RTT measured yet" if rtt is None else \
                            f"measured RTT {rtt * 1000:.0f} ms"
                        raise ConnectError(
                            f"tail-logs gave up after {now - outage_since:.0f} s without a working"
                            f" connection to {self.session.host.label()} ({rtt_words}; "
                            f"last error: {exc})."
                            f" The mirror in {self.result.mirror_dir or 'the state dir'} is "
                            "complete up to the saved cursor; run tail-logs again to resume."
                        ) from None
                    self.reporter.warn(f"{exc}; reconnecting in {backoff:.1f}s")
                    self._reconnect(backoff)
                    backoff = min(backoff * 2, 10.0)
                    continue
                if result is None:
                    break
                raise_for_result(result, where=f"tail-logs on {self.session.host.label()}")
                backoff, outage_since = self.initial_backoff, None
                if result.get("reason") == "max_seconds" and self.follow:
                    continue  # the agent's lifetime bound: ask again on the same connection
                self._note_if_nothing_new()
                break
            ended = True
        finally:
            self._finish(failing=not ended)
        return self.result

    def _give_up_after(self) -> float:
        """How long an outage may last before tail-logs gives up on the box."""
        if self.first_answer_within is not None and self.result.run_id is None:
            return min(self.give_up_after, self.first_answer_within)
        return self.give_up_after

    def _retryable(self, exc: ConnectError) -> bool:
        """A lost link is always retried (the cursors make a resume exact), from before the
        first event on. A refused connection is retried once the box has answered in this
        command (it may be rebooting). A refused key, a changed host key or an unknown host
        fails at once. Decided on the error's type, never on its text."""
        if isinstance(exc, LinkLost):
            return True
        return isinstance(exc, ConnectRefused) and self.result.run_id is not None

    def _reconnect(self, delay: float) -> None:
        """Drop the dead connection and wait (with jitter); the next call connects afresh."""
        self.result.reconnects += 1
        self._known_rtt()
        try:
            self.session.transport.reconnect()
        except Exception:  # a dead transport may fail to close cleanly; it is gone either way
            pass
        self.stop.wait(jittered(delay))

    def _known_rtt(self) -> float | None:
        """The RTT measured in this command (kept across reconnects), else the journal's."""
        rtt = self.session.transport.best_rtt
        if rtt is not None:
            self.measured_rtt = rtt
        return self.measured_rtt

    def _finish(self, *, failing: bool = False) -> None:
        """Show unterminated last lines when not following, release the mirror files and
        note the RTT in the journal. The cursors are already saved (each commit wrote
        them), so a journal that cannot be written (a full disk) costs only the RTT note: a
        warning with the paragraph that says what to do, or nothing when the command is
        already failing (its own error, often the same full disk, is the one to show)."""
        if not self.follow:
            shown: list[tuple[str, str]] = []
            for name, stream in self.streams.items():
                shown.extend((name, line) for line in stream.flush())
            self._show(shown)
        if self.store is not None:
            self.store.close()
        rtt = self._known_rtt()
        if rtt is not None:
            try:
                self.journal.update_host(self.host_key, rtt=rtt)
            except LocalWriteError as exc:
                if not failing:
                    self.reporter.warn(f"the measured RTT was not recorded: {exc}")


# ------------------------------------------------------------------------------ entry points


def tail_logs(project: Project, host_spec: str, reporter: Reporter, *, run_id: str | None = None,
              playbook: str | None = None, processes: list[str] | None = None,
              lines: int | None = None, follow: bool = True, grep: str | None = None,
              journal: Journal | None = None,
              stop: threading.Event | None = None, book: HostBook | None = None,
              **tuning: Any) -> TailResult:
    """``inv tail-logs``. ``tuning`` passes LogTailer knobs (heartbeat, idle_limit, ...)."""
    if run_id is not None and playbook is not None:
        raise ConfigError("give at most one of --run and --playbook")
    # paramiko reports every reset socket through logging's last-resort stderr handler; a
    # reconnect is expected here and is reported by us, in one line.
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    # with --run, a box whose host file is gone is the address recorded with the run (its
    # mirror is shown when that box does not answer)
    journal = journal or Journal()
    book = book or HostBook(project.hosts_dir)
    host = run_host(book, journal, host_spec, run_id)[0] if run_id else book(host_spec)
    session = HostSession(project, host_spec, reporter, journal, host=host)
    mirror = run_id is not None and not follow
    if mirror:  # a box that is gone gives up at its fan-out deadline, not after minutes
        tuning.setdefault("first_answer_within",
                          fanout_deadline_for(session.host, session.transport.best_rtt)[0])
    try:
        return tail_on(session, run_id=run_id, playbook=playbook, processes=processes,
                       lines=lines, follow=follow, grep=grep, stop=stop, from_mirror=mirror,
                       **tuning)
    finally:
        session.close()


def tail_on(session: HostSession, *, run_id: str | None = None, playbook: str | None = None,
            processes: list[str] | None = None, lines: int | None = None,
            follow: bool = True, grep: str | None = None,
            stop: threading.Event | None = None, from_mirror: bool = False,
            **tuning: Any) -> TailResult:
    """:func:`tail_logs` on an open session (one host of ``tail-logs`` on several hosts:
    each has its own mirror and cursors, so exactly-once holds per host). Ends when the
    agent is done (``follow=False``), when ``stop`` is set, or on Ctrl-C
    (:class:`Interrupted`).

    ``from_mirror`` (``--run R --no-follow`` on one host): when the box cannot be reached,
    or no longer has the run, before it sent a line, show what the local mirror holds of
    the run instead (:func:`show_mirror`), saying so and since when."""
    session.warn_moved()  # its follow execs do not go through session.call
    tailer = LogTailer(session, run_id=run_id, playbook=playbook, processes=processes,
                       lines=lines, follow=follow, grep=grep, stop=stop, **tuning)
    try:
        try:
            return tailer.run()
        except (ConnectError, AuthenticationError, RemoteError, ConfigError) as exc:
            # ConfigError: the box cannot even be tried (its key file went with it)
            gone = not isinstance(exc, RemoteError) or exc.kind == "not_found"
            if not (from_mirror and gone and run_id is not None and not follow
                    and tailer.result.run_id is None):
                raise
            shown = show_mirror(session, tailer.printer, run_id, exc, processes=processes,
                                lines=lines)
            if shown is None:
                raise
            return shown
    except KeyboardInterrupt:
        # Ctrl-C is how one stops following; the cursors are saved (the tailer's own
        # clean-up ran). It still ends the command with 130, as Ctrl-C does everywhere.
        where = tailer.result.mirror_dir
        raise Interrupted(
            "tail-logs stopped (Ctrl-C); the lines shown are kept in the local mirror"
            + (f" {where}" if where is not None else "")
            + " and the next tail-logs resumes after them") from None


def logs(project: Project, host_spec: str, reporter: Reporter, *, run_id: str | None = None,
         playbook: str | None = None, processes: list[str] | None = None, lines: int = 50,
         journal: Journal | None = None) -> TailResult:
    """The last ``lines`` lines of each log, once (``tail-logs --no-follow --lines N``)."""
    return tail_logs(project, host_spec, reporter, run_id=run_id, playbook=playbook,
                     processes=processes, lines=lines, follow=False, journal=journal)

