"""The local mirror of a run's logs on the workstation: ``<state>/logs/<host>/<run>/``, one
``<process>.log`` per process (plus the segments archived at a rotation, a truncation or a
``--lines`` jump) and ``cursors.json``, where each log was read up to on the box.

``tail-logs`` (:mod:`outrig.ops.logs`) writes it in a crash-safe order (bytes, fsync, then
the cursors) and resumes from it; ``tail-logs --run R --no-follow`` shows it when the box is
gone. Here are the files and their durable cursors, without any network: the pure rules of
cursors and segments are :mod:`outrig.logs.tail`'s. Every local write failure (a full disk,
permissions) is a :class:`~outrig.errors.LocalWriteError`, so the tailer stops instead of
reconnecting.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from outrig.errors import LocalWriteError
from outrig.journal import (
    PRIVATE_FILE,
    Journal,
    atomic_write_json,
    make_private_dir,
    read_json,
    safe_name,
)
from outrig.logs.tail import MAX_PARTIAL, Cursor, partial_tail

CURSOR_SETS = 8  # how many recent runs' cursors a request carries when the run is not given


def mirror_write_failed(path: Path, exc: OSError) -> LocalWriteError:
    """A local write of the mirror failed: name the file and the fix (never a reconnect)."""
    return LocalWriteError(
        f"tail-logs cannot write or read its local mirror {path} ({exc.strerror or exc}). "
        "This is this workstation, not the link: free space there (or set XDG_STATE_HOME to a "
        "disk with room), then run tail-logs again; it resumes from the last saved cursor.")


def read_cursors(path: Path) -> Any:
    """A cursors file's JSON (None when absent); a local I/O error stops tail-logs."""
    try:
        return read_json(path)
    except OSError as exc:
        raise mirror_write_failed(path, exc) from None


class MirrorStore:
    """The mirrors and cursors of one run of one host (``<state>/logs/<host>/<run>/``).

    Every local write failure (a full disk, permissions) becomes a
    :class:`~outrig.errors.LocalWriteError`, so the tailer stops instead of reconnecting."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cursor_file = root / "cursors.json"
        self.handles: dict[str, Any] = {}
        self.dirty: set[str] = set()
        # byte ranges of a remote log the mirror lacks (a --lines jump over more than the
        # agent fills), per process: saved with the cursors, said wherever the mirror is shown
        self.gaps: dict[str, list[dict[str, int]]] = {}

    def path(self, name: str) -> Path:
        return self.root / f"{name}.log"

    def load(self) -> dict[str, Cursor]:
        """Durable cursors; mirror bytes past a cursor (a crash before the commit) are cut."""
        raw = read_cursors(self.cursor_file)
        procs = raw.get("processes") if isinstance(raw, dict) else None
        self.gaps = read_gaps(raw)
        out: dict[str, Cursor] = {}
        for name, entry in (procs or {}).items():
            cursor = Cursor.from_json(entry)
            if cursor is None:
                continue
            path = self.path(str(name))
            want = cursor.size
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                size = -1
            except OSError as exc:
                raise mirror_write_failed(path, exc) from None
            if size < want:  # the mirror lost bytes (deleted by hand?): start a fresh segment
                continue
            if size > want:
                try:
                    with open(path, "r+b") as handle:
                        handle.truncate(want)
                        handle.flush()
                        os.fsync(handle.fileno())
                except OSError as exc:
                    raise mirror_write_failed(path, exc) from None
            out[str(name)] = cursor
        return out

    def partial(self, name: str, cursor: Cursor) -> bytes:
        """The mirror's unterminated last line: the next resume continues it on screen."""
        size = cursor.size
        if size <= 0:
            return b""
        with open(self.path(name), "rb") as handle:
            handle.seek(max(0, size - MAX_PARTIAL - 1))
            data = handle.read()
        if size > MAX_PARTIAL + 1 and b"\n" not in data:
            return b""
        return partial_tail(data)

    def new_segment(self, name: str, segments: int) -> None:
        """Archive the current mirror as ``<name>.log.<k>`` (rotation, truncation, jump)."""
        self.close(name)
        current = self.path(name)
        try:
            if current.exists() and current.stat().st_size > 0:
                current.rename(self.root / f"{name}.log.{segments}")
        except OSError as exc:
            raise mirror_write_failed(current, exc) from None

    def drop(self, name: str) -> None:
        """Delete a mirror whose stream starts again from nothing."""
        self.close(name)
        try:
            self.path(name).unlink(missing_ok=True)
        except OSError as exc:
            raise mirror_write_failed(self.path(name), exc) from None

    def append(self, name: str, data: bytes) -> None:
        try:
            handle = self.handles.get(name)
            if handle is None:
                make_private_dir(self.root)
                fd = os.open(self.path(name), os.O_WRONLY | os.O_APPEND | os.O_CREAT
                             | os.O_CLOEXEC, PRIVATE_FILE)  # what processes print: 0600
                handle = os.fdopen(fd, "ab")  # kept open while streaming
                self.handles[name] = handle
            handle.write(data)
        except OSError as exc:
            raise mirror_write_failed(self.path(name), exc) from None
        self.dirty.add(name)

    def commit(self, host: str, run_id: str, cursors: dict[str, Cursor]) -> None:
        """fsync every mirror written since the last commit, then write the cursors."""
        for name in sorted(self.dirty):
            handle = self.handles[name]
            try:
                handle.flush()
                os.fsync(handle.fileno())
            except OSError as exc:
                raise mirror_write_failed(self.path(name), exc) from None
        self.dirty.clear()
        try:
            atomic_write_json(self.cursor_file, {
                "v": 1, "host": host, "run_id": run_id, "updated": time.time(),
                "processes": {n: c.to_json() for n, c in sorted(cursors.items())},
                **({"gaps": self.gaps} if self.gaps else {})})
        except OSError as exc:
            raise mirror_write_failed(self.cursor_file, exc) from None

    def note_gap(self, name: str, inode: int, start: int, end: int) -> None:
        """The mirror of ``name`` lacks bytes ``[start, end)`` of the remote file ``inode``
        (saved with the next commit)."""
        if end > start:
            self.gaps.setdefault(name, []).append({"inode": inode, "from": start, "to": end})

    def close(self, name: str | None = None) -> None:
        names = [name] if name is not None else list(self.handles)
        for n in names:
            handle = self.handles.pop(n, None)
            if handle is not None:
                try:
                    handle.close()
                except OSError:  # the buffered bytes past the last commit are re-sent anyway
                    pass


def read_gaps(raw: Any) -> dict[str, list[dict[str, int]]]:
    """The gaps a cursors file records (see :meth:`MirrorStore.note_gap`)."""
    gaps = raw.get("gaps") if isinstance(raw, dict) else None
    out: dict[str, list[dict[str, int]]] = {}
    for name, items in (gaps or {}).items() if isinstance(gaps, dict) else []:
        kept = [{k: int(item[k]) for k in ("inode", "from", "to")} for item in items or []
                if isinstance(item, dict) and all(isinstance(item.get(k), int)
                                                  for k in ("inode", "from", "to"))]
        if kept:
            out[str(name)] = kept
    return out


def gap_lines(gaps: dict[str, list[dict[str, int]]]) -> list[str]:
    """One line per process whose mirror has gaps: which bytes are missing, and why."""
    return [f"the mirror of {name}'s log lacks bytes "
            + ", ".join(f"{g['from']}–{g['to']}" for g in items)
            + " of it (a tail-logs --lines N jumped over more than the 64 MiB it fills in); "
            "what is there is shown" for name, items in sorted(gaps.items())]


def mirror_root(journal: Journal, host: str, run_id: str) -> Path:
    return journal.root / "logs" / safe_name(host) / safe_name(run_id)


def recent_cursor_sets(journal: Journal, host: str, run_id: str | None) -> dict[str, Any]:
    """Cursors to send: those of ``run_id``, else of the host's most recently tailed runs (the
    agent picks the set of the run it resolves; one exec, no extra round trip)."""
    base = journal.root / "logs" / safe_name(host)
    if run_id is not None:
        roots = [base / safe_name(run_id)]
    else:
        roots = sorted((p.parent for p in base.glob("*/cursors.json")),
                       key=lambda p: (p / "cursors.json").stat().st_mtime, reverse=True)
        roots = roots[:CURSOR_SETS]
    sets: dict[str, Any] = {}
    for root in roots:
        raw = read_cursors(root / "cursors.json")
        if not isinstance(raw, dict) or not isinstance(raw.get("run_id"), str):
            continue
        procs = {}
        for name, entry in (raw.get("processes") or {}).items():
            cursor = Cursor.from_json(entry)
            if cursor is not None:
                procs[str(name)] = cursor.wire()
        sets[raw["run_id"]] = procs
    return sets


def mirror_files(store: MirrorStore) -> dict[str, list[tuple[Path, int | None]]]:
    """Each process's mirror files, oldest segment first (``<name>.log.<k>``, archived at a
    rotation or truncation), then the current one with how many of its bytes the durable
    cursor covers (None: no cursor, the whole file)."""
    raw = read_cursors(store.cursor_file)
    procs = raw.get("processes") if isinstance(raw, dict) else None
    out: dict[str, list[tuple[Path, int | None]]] = {}
    for path in sorted(store.root.glob("*.log")):
        name = path.name[: -len(".log")]
        segments = sorted((p for p in store.root.glob(f"{glob_escape(name)}.log.*")
                           if p.name.rsplit(".", 1)[-1].isdigit()),
                          key=lambda p: int(p.name.rsplit(".", 1)[-1]))
        cursor = Cursor.from_json((procs or {}).get(name)) if procs else None
        upto = None if cursor is None else cursor.size  # the mirror's own bytes (redacted)
        out[name] = [(p, None) for p in segments] + [(path, upto)]
    return out


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def mirror_text(files: list[tuple[Path, int | None]]) -> list[str]:
    """The lines of one process's mirror files (up to the cursor in the current one)."""
    lines: list[str] = []
    for path, upto in files:
        try:
            with open(path, "rb") as handle:
                data = handle.read() if upto is None else handle.read(max(0, upto))
        except OSError as exc:
            raise mirror_write_failed(path, exc) from None
        lines += data.decode("utf-8", errors="replace").splitlines()
    return lines
