"""The ``follow`` op (tail-logs): stream several logs of one run as framed chunks; the
workstation keeps the cursor, the agent holds no state between calls."""

from __future__ import annotations

import base64
import contextlib
import os
import threading
import time
from typing import IO, Any, Dict, List, NamedTuple, Optional, Tuple

from .constants import NAME_RE, JSONDict
from .events import AgentError, Emitter, bad_request
from .layout import Layout, read_json
from .runs import resolve_run, run_secret_keys, the_current_run
from .stopping import Stopper
from .validation import Request, get_bool, get_int, get_num, get_opt_name, get_str_list

#
# ``op: follow`` streams several logs of one run over this one channel as framed chunks. The
# position of every byte is (inode, offset), and the *workstation* keeps the cursor: the agent
# holds no state between calls, so a call that resumes from a cursor continues exactly after the
# last byte the workstation made durable (docs/logs-and-status.md). Chunks are raw bytes, never
# lines: line splitting, display and the local mirror are the workstation's business.

FOLLOW_CHUNK_DEFAULT = 256 * 1024  # bytes per chunk event (before base64)
FOLLOW_SCAN_MAX = 64 << 20  # --lines: never scan more than this backwards from the end
FOLLOW_GAP_FILL = 64 << 20  # --lines: a mirror at most this far behind is filled, not skipped
FOLLOW_COMPRESS_MIN = 4096  # smaller chunks are not worth zlib's header and CPU
FOLLOW_ROTATE_QUIET_S = 1.0  # a rotated-away file must be quiet this long before we switch
FOLLOW_RESCAN_S = 1.0  # how often the run's process list is re-read (processes launched later)


def offset_of_last_lines(f: IO[bytes], size: int, count: int,
                         limit: int = FOLLOW_SCAN_MAX) -> Tuple[int, int]:
    """(offset where the last ``count`` lines start, bytes read to find it).

    Reads 64 KiB blocks backwards from the end, so a 5 GB log costs a few blocks, not 5 GB. An
    unterminated last line counts as a line (like ``tail -n``). If ``limit`` bytes are scanned
    without finding enough lines, the start is the first line boundary inside the scanned part.
    """
    if count <= 0 or size <= 0:
        return max(size, 0), 0
    f.seek(size - 1)
    scanned = 1
    pos = size - 1 if f.read(1) == b"\n" else size
    need = count
    first_boundary: Optional[int] = None
    while pos > 0:
        block = min(65536, pos)
        f.seek(pos - block)
        data = f.read(block)
        scanned += len(data)
        idx = len(data)
        while True:
            idx = data.rfind(b"\n", 0, idx)
            if idx < 0:
                break
            first_boundary = pos - block + idx + 1
            need -= 1
            if need == 0:
                return pos - block + idx + 1, scanned
        pos -= block
        if scanned >= limit and pos > 0:
            return (first_boundary if first_boundary is not None else pos), scanned
    return 0, scanned


def find_inode(directory: str, inode: int) -> Optional[str]:
    """A file in ``directory`` with this inode (a log renamed by rotation), or None."""
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    for name in names:
        path = os.path.join(directory, name)
        try:
            if os.stat(path).st_ino == inode:
                return path
        except OSError:
            continue
    return None


class FollowCursor(NamedTuple):
    """Where the workstation's durable copy of one log ends."""

    inode: int
    offset: int


def parse_follow_cursors(raw: Any) -> Dict[str, Dict[str, FollowCursor]]:
    """``{run_id: {process: {"inode": int, "offset": int}}}`` (bad entries are a bad_request)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise bad_request("cursors: must be an object {run_id: {process: {inode, offset}}}")
    out: Dict[str, Dict[str, FollowCursor]] = {}
    for rid, procs in raw.items():
        if not isinstance(procs, dict):
            raise bad_request(f"cursors.{rid}: must be an object")
        per: Dict[str, FollowCursor] = {}
        for name, cur in procs.items():
            where = f"cursors.{rid}.{name}."
            if not isinstance(cur, dict):
                raise bad_request(f"cursors.{rid}.{name}: must be an object")
            inode = get_int(cur, "inode", where, -1, 0, 2**63)
            offset = get_int(cur, "offset", where, -1, 0, 2**63)
            if inode < 0 or offset < 0:
                raise bad_request(f"{where}inode/offset: both are required")
            per[str(name)] = FollowCursor(inode, offset)
        out[str(rid)] = per
    return out


def resolve_follow_run(layout: Layout, playbook: Optional[str], run_id: Optional[str],
                       out: Emitter) -> str:
    """run_id, else the playbook's current run, else the one current run that is live
    (:func:`the_current_run`)."""
    if run_id is not None or playbook is not None:
        return resolve_run(layout, playbook, run_id)
    return the_current_run(layout, Stopper(out, layout=layout))


class Tail:
    """One log being followed: an open file, its inode and the next offset to send."""

    def __init__(self, name: str, path: str) -> None:
        self.name = name
        self.path = path
        self.f: Optional[IO[bytes]] = None
        self.inode = 0
        self.offset = 0
        self.said_missing = False
        self.opened_once = False
        self.rotated_at: Optional[float] = None  # when the path started naming another file
        self.last_data = time.monotonic()

    def close(self) -> None:
        if self.f is not None:
            with contextlib.suppress(OSError):
                self.f.close()
            self.f = None


class Follower:
    """The ``follow`` loop: open, resume, read, detect rotation/truncation, heartbeat."""

    def __init__(self, out: Emitter, layout: Layout, run_id: str, raw: JSONDict) -> None:
        self.out = out
        self.layout = layout
        self.run_id = run_id
        self.logs_dir = os.path.join(layout.run_dir(run_id), "logs")
        self.cursors = parse_follow_cursors(raw.get("cursors")).get(run_id, {})
        lines = raw.get("lines")
        self.lines: Optional[int] = None
        if lines is not None:
            self.lines = get_int(raw, "lines", "", 0, 0, 10**9)
        self.lines_if_no_cursor = get_bool(raw, "lines_if_no_cursor", "", False)
        self.follow = get_bool(raw, "follow", "", True)
        self.heartbeat = get_num(raw, "heartbeat", "", 2.0, positive=True)
        self.poll = get_num(raw, "poll", "", 0.1, positive=True)
        self.max_seconds = get_num(raw, "max_seconds", "", 3600.0, positive=True)
        self.stall_limit = get_num(raw, "stall_limit", "", 120.0, positive=True)
        self.chunk = get_int(raw, "chunk_bytes", "", FOLLOW_CHUNK_DEFAULT, 1024, 16 << 20)
        self.compress = get_bool(raw, "compress", "", True)
        self.wanted: Optional[List[str]] = None
        if raw.get("processes") is not None:
            self.wanted = get_str_list(raw, "processes", "")
            for name in self.wanted:
                if not NAME_RE.match(name):
                    raise bad_request(f"processes: {name!r} is not a process name")
        self.tails: Dict[str, Tail] = {}
        self.last_emit = time.monotonic()
        self.emitting_since: Optional[float] = None
        self.next_rescan = 0.0

    # -- events

    def emit(self, event: str, **fields: Any) -> None:
        """Emit and remember when we last spoke (heartbeats fill silences)."""
        self.emitting_since = time.monotonic()
        self.out.emit(event, **fields)
        self.emitting_since = None
        self.last_emit = time.monotonic()

    def watchdog(self) -> None:
        """Exit if one write has blocked too long: the workstation is gone but sshd has not
        noticed yet, and an agent must never outlive its reader by hours."""
        while True:
            time.sleep(min(5.0, self.stall_limit / 4))
            since = self.emitting_since
            if since is not None and time.monotonic() - since > self.stall_limit:
                os._exit(3)

    def reader_gone(self) -> bool:
        """stdin at EOF: sshd closed the channel, nobody reads what we write any more."""
        try:
            import select

            ready, _, _ = select.select([0], [], [], 0)
            if ready and os.read(0, 65536) == b"":
                return True
        except (OSError, ValueError):
            return True
        return False

    # -- which processes

    def known_names(self) -> List[str]:
        """Process names of the run: run.json records plus any ``logs/*.log``."""
        names: List[str] = []
        try:
            run = read_json(self.layout.run_json(self.run_id))
            for rec in run.get("processes") or [] if isinstance(run, dict) else []:
                if isinstance(rec, dict) and isinstance(rec.get("name"), str):
                    names.append(rec["name"])
        except (OSError, ValueError):
            pass
        try:
            for fname in sorted(os.listdir(self.logs_dir)):
                if fname.endswith(".log") and fname[:-4] not in names:
                    names.append(fname[:-4])
        except OSError:
            pass
        return [n for n in names if NAME_RE.match(n)]

    def run_record(self) -> JSONDict:
        """The run's run.json ({} while it cannot be read)."""
        try:
            run = read_json(self.layout.run_json(self.run_id))
        except (OSError, ValueError):
            return {}
        return run if isinstance(run, dict) else {}

    def run_status(self) -> Optional[str]:
        return self.run_record().get("status")

    def rescan(self) -> None:
        """Add tails for processes that appeared (launched after us, when not filtered)."""
        names = self.wanted if self.wanted is not None else self.known_names()
        for name in names:
            if name not in self.tails:
                self.tails[name] = Tail(name, os.path.join(self.logs_dir, f"{name}.log"))

    # -- one log

    def open_tail(self, t: Tail) -> None:
        """Open the log, choose the start offset (cursor, --lines or 0) and say so."""
        try:
            f = open(t.path, "rb")  # noqa: SIM115 - kept open across ticks
        except FileNotFoundError:
            if not t.said_missing:
                t.said_missing = True
                self.emit("missing", process=t.name, path=t.path)
            return
        except OSError as exc:
            raise AgentError("not_found", f"cannot open {t.path}: {exc.strerror}", t.name) \
                from None
        st = os.fstat(f.fileno())
        t.f, t.inode = f, st.st_ino
        first = not t.opened_once
        t.opened_once = True
        cursor = self.cursors.get(t.name) if first else None
        reason = "start" if first else "created"
        start = 0
        if cursor is not None:
            if cursor.inode == st.st_ino and cursor.offset <= st.st_size:
                start, reason = cursor.offset, "cursor"
            elif cursor.inode == st.st_ino:
                self.emit("truncated", process=t.name, inode=st.st_ino, old_offset=cursor.offset,
                          size=st.st_size)
                reason = "truncated"
            else:
                old = find_inode(self.logs_dir, cursor.inode)
                if old is not None and os.path.getsize(old) >= cursor.offset:
                    # Rotated while we were away: finish the old file first, then switch.
                    f.close()
                    t.f = open(old, "rb")  # noqa: SIM115
                    t.inode = cursor.inode
                    t.rotated_at = time.monotonic()
                    start, reason = cursor.offset, "cursor"
                    st = os.fstat(t.f.fileno())
                else:
                    self.emit("rotated", process=t.name, old_inode=cursor.inode, inode=st.st_ino,
                              lost=True)
                    reason = "rotated"
        display_from = start
        scanned = 0
        if self.lines_if_no_cursor and cursor is not None and reason == "cursor":
            pass  # a resume: never jump over bytes the workstation has not seen
        elif first and self.lines is not None and t.inode == st.st_ino:
            # --lines N: show the last N lines, but send every byte the workstation's mirror
            # lacks (from its cursor, or from byte 0 the first time) so that the mirror holds
            # the whole log; only a head bigger than FOLLOW_GAP_FILL is skipped (a jump,
            # which the workstation records as a gap in its mirror)
            assert t.f is not None
            tail_start, scanned = offset_of_last_lines(t.f, st.st_size, self.lines)
            display_from = tail_start
            if not tail_start - FOLLOW_GAP_FILL <= start:
                start, reason = tail_start, "lines"
            else:
                start = min(start, tail_start)
        t.offset = start
        self.emit("open", process=t.name, path=t.path, inode=t.inode, offset=start,
                  size=st.st_size, display_from=display_from, reason=reason, scanned=scanned)

    def read_some(self, t: Tail) -> int:
        """Send up to one chunk from the tail's offset; returns the bytes sent."""
        assert t.f is not None
        try:
            data = os.pread(t.f.fileno(), self.chunk, t.offset)
        except OSError:
            return 0
        if not data:
            return 0
        fields: JSONDict = {"process": t.name, "inode": t.inode, "offset": t.offset,
                            "size": len(data)}
        payload = data
        if self.compress and len(data) >= FOLLOW_COMPRESS_MIN:
            import zlib

            packed = zlib.compress(data, 1)
            if len(packed) < len(data) * 0.9:
                payload = packed
                fields["z"] = True
        fields["data_b64"] = base64.b64encode(payload).decode("ascii")
        self.emit("chunk", **fields)
        t.offset += len(data)
        t.last_data = time.monotonic()
        return len(data)

    def check_file(self, t: Tail) -> None:
        """At the end of the open file: truncated? rotated (the path names another file)?"""
        assert t.f is not None
        try:
            size = os.fstat(t.f.fileno()).st_size
        except OSError:
            size = t.offset
        if size < t.offset:
            self.emit("truncated", process=t.name, inode=t.inode, old_offset=t.offset, size=size)
            t.offset = 0
            self.emit("open", process=t.name, path=t.path, inode=t.inode, offset=0, size=size,
                      display_from=0, reason="truncated", scanned=0)
            return
        try:
            path_inode: Optional[int] = os.stat(t.path).st_ino
        except OSError:
            path_inode = None
        if path_inode is None or path_inode == t.inode:
            t.rotated_at = None
            return
        now = time.monotonic()
        if t.rotated_at is None:
            t.rotated_at = now
        # The writer may still append to the renamed file for a moment: switch only once it
        # has been quiet, so its last lines are not lost.
        if now - max(t.rotated_at, t.last_data) < FOLLOW_ROTATE_QUIET_S:
            return
        old = t.inode
        t.close()
        t.rotated_at = None
        try:
            f = open(t.path, "rb")  # noqa: SIM115
        except OSError:
            return  # gone again; the next tick retries through open_tail
        st = os.fstat(f.fileno())
        t.f, t.inode, t.offset = f, st.st_ino, 0
        self.emit("rotated", process=t.name, old_inode=old, inode=t.inode, lost=False)
        self.emit("open", process=t.name, path=t.path, inode=t.inode, offset=0, size=st.st_size,
                  display_from=0, reason="rotated", scanned=0)

    # -- the loop

    def cursors_now(self) -> JSONDict:
        return {n: {"inode": t.inode, "offset": t.offset}
                for n, t in self.tails.items() if t.opened_once}

    def run(self) -> JSONDict:

        threading.Thread(target=self.watchdog, name="follow-watchdog", daemon=True).start()
        if self.wanted is not None:
            known = self.known_names()
            unknown = [n for n in self.wanted if n not in known]
            if unknown and self.run_status() != "launching":
                have = ", ".join(known) or "none"
                raise AgentError(
                    "not_found",
                    f"run {self.run_id} has no process {', '.join(unknown)} (it has {have})")
        self.rescan()
        # secret_keys: the workstation redacts their values from what it prints (the stream
        # itself carries exact bytes, so the local mirror and offsets stay true)
        record = self.run_record()
        self.emit("run", run_id=self.run_id, processes=sorted(self.tails),
                  status=record.get("status"), logs_dir=self.logs_dir,
                  secret_keys=run_secret_keys(record))
        started = time.monotonic()
        reason = "eof"
        try:
            while True:
                now = time.monotonic()
                if self.follow and now >= self.next_rescan:
                    self.next_rescan = now + FOLLOW_RESCAN_S
                    self.rescan()
                sent = 0
                for t in list(self.tails.values()):
                    if t.f is None:
                        self.open_tail(t)
                        if t.f is None:
                            continue
                    n = self.read_some(t)
                    sent += n
                    if n == 0:
                        self.check_file(t)
                if self.out.broken:
                    reason = "reader_gone"
                    break
                if sent:
                    continue  # more may be waiting: drain before sleeping
                if not self.follow:
                    break
                if time.monotonic() - started >= self.max_seconds:
                    reason = "max_seconds"
                    break
                if self.reader_gone():
                    reason = "reader_gone"
                    break
                if time.monotonic() - self.last_emit >= self.heartbeat:
                    self.emit("heartbeat", cursors=self.cursors_now())
                time.sleep(self.poll)
        finally:
            for t in self.tails.values():
                t.close()
        return {"run_id": self.run_id, "cursors": self.cursors_now(), "reason": reason}


def op_follow(req: Request, out: Emitter) -> JSONDict:
    """Stream the run's logs as framed chunks from the client's cursors (see Follower)."""
    raw = req.raw
    playbook = get_opt_name(raw, "playbook", "")
    run_id = get_opt_name(raw, "run_id", "")
    layout = Layout(req.workdir)
    rid = resolve_follow_run(layout, playbook, run_id, out)
    return Follower(out, layout, rid, raw).run()
