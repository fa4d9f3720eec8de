"""The workdir's layout and safe file handling: paths, atomic writes, run pointers, folders
opened one by one so nothing escapes the workdir."""

from __future__ import annotations

import contextlib
import errno
import json
import os
from typing import Any, Dict, List, Optional

from .constants import FULL_DISK_ERRNOS, NAME_RE
from .events import AgentError, internal_error


class Layout:
    """Where things live under a workdir (one place, so every op agrees)."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.state = os.path.join(workdir, ".outrig")
        self.lock = os.path.join(self.state, "lock")
        self.wrap = os.path.join(self.state, "wrap.py")
        self.current_dir = os.path.join(self.state, "current")
        self.runs = os.path.join(workdir, "runs")

    def current(self, playbook: str) -> str:
        """The pointer file naming the current run of a playbook."""
        return os.path.join(self.current_dir, playbook)

    def run_dir(self, run_id: str) -> str:
        """The directory of one run (run.json, logs/, exit/)."""
        return os.path.join(self.runs, run_id)

    def run_json(self, run_id: str) -> str:
        """The run's manifest."""
        return os.path.join(self.run_dir(run_id), "run.json")


def fsync_dir(path: str) -> None:
    """Make a rename durable; best effort (some filesystems refuse O_RDONLY dir fsync)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write via a tmp file in the same dir + fsync + chmod + rename: readers never see halves."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)


def write_json_atomic(path: str, obj: Any) -> None:
    """run.json and friends: pretty enough for humans, written atomically."""
    write_atomic(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode("utf-8"))


def read_json(path: str) -> Any:
    """Parse a JSON file (errors propagate: callers decide if missing/corrupt is a warning)."""
    with open(path, "rb") as f:
        return json.loads(f.read().decode("utf-8"))


def workdir_error(layout: Layout) -> Optional[OSError]:
    """Create the workdir and .outrig/ and write a probe there; the error, or None."""
    probe = os.path.join(layout.state, f".probe.{os.getpid()}")
    try:
        os.makedirs(layout.state, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"ok")
    except OSError as exc:
        return exc
    finally:
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return None


def ensure_workdir(layout: Layout) -> None:
    """Create the workdir and .outrig/ and prove we can write there (``workdir`` error if not)."""
    exc = workdir_error(layout)
    if exc is not None and exc.errno in FULL_DISK_ERRNOS:
        raise internal_error(exc, layout.workdir)  # the disk, not the folder, is the problem
    if exc is not None:
        text = os.strerror(exc.errno) if exc.errno else str(exc)
        raise AgentError(
            "workdir", f"cannot create or write {layout.workdir}: {text} "
            f"({exc.filename or layout.state})."
            " Set workdir: in the host file to a folder this user can write (e.g. ~/outrig)"
        )


def read_pointer(layout: Layout, playbook: str) -> Optional[str]:
    """The run id the playbook's current pointer names, if any."""
    try:
        with open(layout.current(playbook), encoding="utf-8") as f:
            value = f.read().strip()
    except OSError:
        return None
    return value if NAME_RE.match(value) else None


def all_pointers(layout: Layout) -> Dict[str, str]:
    """playbook → run id for every current pointer."""
    try:
        names = sorted(os.listdir(layout.current_dir))
    except OSError:
        return {}
    out: Dict[str, str] = {}
    for name in names:
        if NAME_RE.match(name):
            run_id = read_pointer(layout, name)
            if run_id is not None:
                out[name] = run_id
    return out


def clear_pointers(layout: Layout, run_id: str) -> None:
    """Remove every current pointer that names this run (it has been stopped)."""
    for playbook, rid in all_pointers(layout).items():
        if rid == run_id:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(layout.current(playbook))


class WorkdirFolder:
    """The folder of a relative file path under the workdir, opened component by component
    without following symlinks (``workdir`` error naming the link when one is in the way)."""

    def __init__(self, workdir: str, rel: str, create: bool) -> None:
        self.fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._descend(workdir, rel, create)
        except BaseException:
            self.close()
            raise

    def _descend(self, workdir: str, rel: str, create: bool) -> None:
        """Open each folder of ``rel`` below the current one (made first when ``create``);
        without ``create`` a missing folder ends the walk: nothing below it can escape."""
        parts = [p for p in os.path.dirname(rel).split(os.sep) if p]
        for i, part in enumerate(parts):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=self.fd)
            try:
                fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self.fd)
            except FileNotFoundError:
                if create:
                    raise
                return
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                where = os.path.join(workdir, *parts[: i + 1])
                raise AgentError(
                    "workdir", f"files: {rel}: {where} is a symlink or not a folder on the box; "
                    "outrig writes files only inside the workdir, never through a link. Remove "
                    "it on the box or choose another path") from None
            os.close(self.fd)
            self.fd = fd

    def write(self, name: str, data: bytes, mode: int) -> None:
        """Write ``name`` in this folder atomically (tmp file + fsync + rename, no follow)."""
        tmp = f".{name}.tmp.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600,
                     dir_fd=self.fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise
        os.close(fd)
        os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        with contextlib.suppress(OSError):
            os.fsync(self.fd)

    def close(self) -> None:
        """Release the folder's descriptor."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def list_run_ids(layout: Layout) -> List[str]:
    """Run directories under runs/, sorted by name (run ids start with a timestamp)."""
    try:
        names = os.listdir(layout.runs)
    except OSError:
        return []
    return sorted(n for n in names if NAME_RE.match(n) and os.path.isdir(layout.run_dir(n)))


def nearest_existing(path: str) -> str:
    """The path itself or its closest existing ancestor (for statvfs and access checks)."""
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path
