"""outrig remote agent: the only code outrig runs on a box.

One file, standard library only, Python >= 3.8, Linux only (/proc). It is never installed:
each call sends it again and execs it (see docs/agent-protocol.md, which is the contract this
file implements). It reads exactly one JSON line (the request) from stdin, does the whole step
on the box and writes JSON-line events to stdout, flushed one by one. The last line is always a
``result`` event; the agent exits 0 whenever it printed one.

Ops: ``deploy``, ``cleanup``, ``status``, ``logs``, ``check``, ``model_facts``, ``follow``.
Also ``provision`` and ``hub_download`` (docs/provision.md).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import fcntl
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse
import zlib
from typing import IO, Any, Dict, Iterator, List, NamedTuple, Optional, Set, Tuple

PROTOCOL_VERSION = 1
OPS: Tuple[str, ...] = ("deploy", "cleanup", "status", "logs", "check", "model_facts", "follow")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
POLL_S = 0.05  # how often stop loops re-check /proc
TICK_S = 0.1  # how often the readiness loop looks at logs and exits
PROBE_EVERY_S = 0.5  # http/port readiness retry period (protocol: every 0.5 s)
PROBE_TIMEOUT_S = 1.0  # http/port readiness per-try timeout (protocol: 1 s)
KILL_WAIT_S = 10.0  # bounded wait for SIGKILLed processes to vanish (protocol: 10 s)
EXCERPT_LINES = 20
MAX_LINE_CHARS = 2000  # lines longer than this are cut in events (tqdm bars, JSON dumps)
TAIL_MAX_BYTES = 4 << 20  # never scan more than this backwards for a tail
FOLLOW_CHUNK = 1 << 20  # read at most this much new log per process per tick
DEFAULT_READY_TIMEOUT = 300.0
# A process without ``ready:`` must still be seen alive this long (and not have exited non-zero)
# before deploy says it started: a missing binary exits 127 in milliseconds, a bad import in
# about a second. Requests may set ``settle`` (seconds) to change it.
DEFAULT_SETTLE_S = 2.0
STOP_HEARTBEAT_S = 2.0
DEFAULT_STOP_GRACE = 10.0
CHILDREN_FIRST_LAUNCHER_S = 15.0  # after its workers are gone, the launcher's time to exit
MARKER_KEY = "OUTRIG_RUN"
PROCESS_KEY = "OUTRIG_PROCESS"
CGROUP_KEY = "OUTRIG_CGROUP_PROCS"  # read (and removed) by the wrapper
CGROUP_SWITCH = "OUTRIG_CGROUPS"  # "0" in the host's env: never create cgroups
DESCENDANTS_FILE = "descendants.json"
SWEEP_NAME = "(marker sweep)"
CGROUP_SWEEP_NAME = "(cgroup sweep)"

JSONDict = Dict[str, Any]

# The wrapper every process is started through. It is the session and group leader; it forwards
# SIGTERM/SIGINT/SIGHUP to the real process and records how it ended in the exit file, so that
# `status` can say "exited 1" instead of "gone". Python 3.8 compatible, stdlib only.
WRAP_SOURCE = r'''"""outrig process wrapper (written by remote/agent.py; do not edit).

Usage: python3 wrap.py EXIT_FILE -- ARGV...
Runs ARGV as a child in this process group, forwards SIGTERM, SIGINT and SIGHUP to it, waits,
then writes EXIT_FILE atomically as {"code": int|null, "signal": int|null, "ended": unix_time}
and exits with the child's code (128+N when the child died of signal N).
"""
import json
import os
import signal
import subprocess
import sys
import time


def write_exit(path, code, sig):
    data = json.dumps({"code": code, "signal": sig, "ended": time.time()}).encode()
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def leave_cgroup(procs_file):
    """Move back to the parent cgroup and remove this process's own one if nothing is left in
    it; a descendant still there keeps it (and is found there by cleanup)."""
    folder = os.path.dirname(procs_file)
    try:
        with open(os.path.join(os.path.dirname(folder), "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        os.rmdir(folder)
    except OSError:
        pass


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.stderr.write("usage: wrap.py EXIT_FILE -- ARGV...\n")
        return 2
    exit_file = sys.argv[1]
    argv = sys.argv[3:]
    state = {"child": None, "pending": []}

    def forward(signum, frame):
        child = state["child"]
        if child is None:
            state["pending"].append(signum)
        elif child.returncode is None:
            try:
                os.kill(child.pid, signum)
            except OSError:
                pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    # Join the process's own cgroup before starting anything: every descendant is then found
    # there, whatever it does to its session or environment. Best effort (the agent checks).
    procs_file = os.environ.pop("OUTRIG_CGROUP_PROCS", None)
    if procs_file:
        try:
            with open(procs_file, "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            pass
    try:
        child = subprocess.Popen(argv)
    except (OSError, ValueError) as exc:
        sys.stdout.write("outrig: cannot execute %r: %s\n" % (argv[0], exc))
        sys.stdout.flush()
        write_exit(exit_file, 127, None)
        if procs_file:
            leave_cgroup(procs_file)
        return 127
    state["child"] = child
    for signum in state["pending"]:
        forward(signum, None)
    rc = child.wait()
    if procs_file:
        leave_cgroup(procs_file)
    if rc < 0:
        write_exit(exit_file, None, -rc)
        return 128 - rc
    write_exit(exit_file, rc, None)
    return rc


if __name__ == "__main__":
    sys.exit(main())
'''


# --------------------------------------------------------------------------- errors and events


class AgentError(Exception):
    """An expected failure, reported as ``{"ok": false, "error": {...}}`` (protocol kinds)."""

    def __init__(
        self,
        kind: str,
        message: str,
        process: Optional[str] = None,
        excerpt: Optional[List[str]] = None,
        exit_code: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.process = process
        self.excerpt = list(excerpt or [])
        self.exit_code = exit_code

    def to_json(self) -> JSONDict:
        """The ``error`` object of a failed result (and of a failed run.json)."""
        return {
            "kind": self.kind,
            "message": self.message,
            "process": self.process,
            "excerpt": self.excerpt,
            "exit_code": self.exit_code,
        }


def bad_request(message: str) -> AgentError:
    """Shorthand: the request itself is wrong; nothing was touched."""
    return AgentError("bad_request", message)


class Emitter:
    """Writes one JSON event per line and flushes each, so the workstation sees progress live.

    If the channel is gone (the workstation disconnected), writes are dropped instead of
    aborting: the step still finishes and leaves run.json consistent on the box.
    """

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.broken = False

    def emit(self, event: str, **fields: Any) -> None:
        """Send ``{"event": event, "t": now, **fields}`` as one flushed line."""
        obj: JSONDict = {"event": event, "t": round(time.time(), 3)}
        obj.update(fields)
        if self.broken:
            return
        line = json.dumps(obj, default=str) + "\n"
        try:
            self.stream.write(line.encode("ascii"))
            self.stream.flush()
        except (OSError, ValueError):
            self.broken = True

    def step(self, msg: str) -> None:
        """A phase starts."""
        self.emit("step", msg=msg)

    def warning(self, msg: str) -> None:
        """Something the user should know about but that does not fail the step."""
        self.emit("warning", msg=msg)


# --------------------------------------------------------------------------- request validation


def _is_num(value: Any) -> bool:
    """JSON numbers, but not booleans (which Python counts as ints)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def get_dict(obj: JSONDict, key: str, where: str, required: bool = False) -> JSONDict:
    """An object field (missing/null → {} unless required)."""
    value = obj.get(key)
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"{where}{key}: must be an object")
    return value


def get_str(obj: JSONDict, key: str, where: str) -> str:
    """A required non-empty string field."""
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise bad_request(f"{where}{key}: must be a non-empty string")
    return value


def get_opt_str(obj: JSONDict, key: str, where: str) -> Optional[str]:
    """An optional string field (missing or null → None)."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise bad_request(f"{where}{key}: must be a non-empty string or null")
    return value


def get_bool(obj: JSONDict, key: str, where: str, default: bool) -> bool:
    """An optional boolean field."""
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"{where}{key}: must be true or false")
    return value


def get_num(obj: JSONDict, key: str, where: str, default: float, positive: bool = False) -> float:
    """An optional number field, >= 0 (or > 0 when ``positive``)."""
    value = obj.get(key)
    if value is None:
        return default
    if not _is_num(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise bad_request(f"{where}{key}: must be a number {bound}")
    return float(value)


def get_int(obj: JSONDict, key: str, where: str, default: int, lo: int, hi: int) -> int:
    """An optional integer field in [lo, hi]."""
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise bad_request(f"{where}{key}: must be an integer in [{lo}, {hi}]")
    return value


def get_str_dict(obj: JSONDict, key: str, where: str) -> Dict[str, str]:
    """An env-like mapping: keys are valid variable names, values strings without NUL.

    Error messages name keys only, never values (values may be secrets).
    """
    raw = get_dict(obj, key, where)
    out: Dict[str, str] = {}
    for k, v in raw.items():
        if not k or "=" in k or "\0" in k:
            raise bad_request(f"{where}{key}: invalid variable name {k!r}")
        if not isinstance(v, str) or "\0" in v:
            raise bad_request(f"{where}{key}.{k}: must be a string without NUL bytes")
        out[k] = v
    return out


def get_str_list(obj: JSONDict, key: str, where: str, nonempty: bool = False) -> List[str]:
    """A list of strings (missing/null → [] unless ``nonempty``)."""
    value = obj.get(key)
    if value is None and not nonempty:
        return []
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise bad_request(f"{where}{key}: must be a list of strings")
    if nonempty and not value:
        raise bad_request(f"{where}{key}: must not be empty")
    return list(value)


def get_name(obj: JSONDict, key: str, where: str) -> str:
    """A name that is also used as a file name (playbook, run id, process name)."""
    value = get_str(obj, key, where)
    if not NAME_RE.match(value):
        raise bad_request(
            f"{where}{key}: {value!r} must be 1-128 characters of letters, digits, '.', '_', '-'"
            " and start with a letter or digit"
        )
    return value


def get_opt_name(obj: JSONDict, key: str, where: str) -> Optional[str]:
    """An optional name (see :func:`get_name`)."""
    if obj.get(key) is None:
        return None
    return get_name(obj, key, where)


def compile_regex(pattern: str, field: str) -> re.Pattern[str]:
    """Compile a user regex, turning a syntax error into a bad_request naming the field."""
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise bad_request(f"{field}: invalid regex {pattern!r}: {exc}") from None


class ReadySpec:
    """When a process counts as ready. Every condition that is set must hold (usually one)."""

    def __init__(self, raw: JSONDict, where: str) -> None:
        self.http = get_opt_str(raw, "http", where)
        if self.http is not None and not self.http.startswith(("http://", "https://")):
            raise bad_request(f"{where}http: must be an http:// or https:// URL")
        self.log = get_opt_str(raw, "log", where)
        self.log_re = compile_regex(self.log, where + "log") if self.log is not None else None
        port = raw.get("port")
        self.port: Optional[int] = None
        if port is not None:
            self.port = get_int(raw, "port", where, 0, 1, 65535)
        self.exit = get_bool(raw, "exit", where, False)
        self.timeout = get_num(raw, "timeout", where, DEFAULT_READY_TIMEOUT, positive=True)
        # With http: the id that <scheme://host:port>/v1/models must serve (vLLM's data[0].id).
        self.model = get_opt_str(raw, "model", where)
        if self.model is not None and self.http is None:
            raise bad_request(f"{where}model: needs http (the server whose /v1/models to ask)")

    def kinds(self) -> List[str]:
        """The configured conditions, in a fixed order."""
        out = []
        if self.http is not None:
            out.append("http")
        if self.log is not None:
            out.append("log")
        if self.port is not None:
            out.append("port")
        if self.exit:
            out.append("exit")
        return out

    def describe(self) -> str:
        """Human text for timeout messages."""
        parts = []
        if self.http is not None:
            parts.append(f"http {self.http}")
        if self.log is not None:
            parts.append(f"log /{self.log}/")
        if self.port is not None:
            parts.append(f"port {self.port}")
        if self.exit:
            parts.append("exit 0")
        return ", ".join(parts) or "none"

    def to_json(self) -> JSONDict:
        """As recorded in the process record (and in run.json)."""
        return {
            "http": self.http,
            "log": self.log,
            "port": self.port,
            "exit": self.exit,
            "timeout": self.timeout,
            "model": self.model,
        }


class ProcSpec:
    """One process of a deploy request, validated."""

    def __init__(self, raw: Any, index: int) -> None:
        where = f"processes[{index}]."
        if not isinstance(raw, dict):
            raise bad_request(f"processes[{index}]: must be an object")
        self.name = get_name(raw, "name", where)
        self.argv = get_str_list(raw, "argv", where, nonempty=True)
        if any("\0" in a for a in self.argv):
            raise bad_request(f"{where}argv: arguments must not contain NUL bytes")
        self.env = get_str_dict(raw, "env", where)
        self.cwd = get_opt_str(raw, "cwd", where)
        if self.cwd is not None and ("\0" in self.cwd or (
                not self.cwd.startswith(("/", "~"))
                and os.path.normpath(self.cwd).split(os.sep)[0] == "..")):
            raise bad_request(f"{where}cwd: {self.cwd!r} leaves the workdir; give a folder "
                              "under it (relative) or an absolute path")
        gpus = raw.get("gpus")
        if gpus is None:
            gpus = []
        if not isinstance(gpus, list) or not all(
            isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus
        ):
            raise bad_request(f"{where}gpus: must be a list of GPU indices (integers >= 0)")
        self.gpus: List[int] = list(gpus)
        self.after = get_str_list(raw, "after", where)
        ready_raw = raw.get("ready")
        self.ready: Optional[ReadySpec] = None
        if ready_raw is not None:
            if not isinstance(ready_raw, dict):
                raise bad_request(f"{where}ready: must be an object or null")
            self.ready = ReadySpec(ready_raw, where + "ready.")
        self.fatal_src = get_str_list(raw, "fatal", where)
        self.fatal = [compile_regex(p, f"{where}fatal[{i}]") for i, p in enumerate(self.fatal_src)]
        self.stop_grace = get_num(raw, "stop_grace", where, DEFAULT_STOP_GRACE)
        # torchrun-style launchers: TERM the launcher's children (the ranks) first, so each
        # rank's interrupt save runs while its DataLoader workers are still alive (torchrun
        # itself would TERM each rank's whole process group and SIGKILL it 30 s later).
        self.stop_children_first = get_bool(raw, "stop_children_first", where, False)
        self.scratch = get_str_list(raw, "scratch", where)
        ckpt = raw.get("checkpoints")
        self.checkpoints: Optional[JSONDict] = None
        if ckpt is not None:
            if not isinstance(ckpt, dict):
                raise bad_request(f"{where}checkpoints: must be an object or null")
            self.checkpoints = {
                "path": get_str(ckpt, "path", where + "checkpoints."),
                "scheduler": get_bool(ckpt, "scheduler", where + "checkpoints.", True),
            }


class FileSpec:
    """One file to write under the workdir, decoded up front so bad data fails before any I/O."""

    def __init__(self, raw: Any, index: int) -> None:
        where = f"files[{index}]."
        if not isinstance(raw, dict):
            raise bad_request(f"files[{index}]: must be an object")
        path = get_str(raw, "path", where)
        norm = os.path.normpath(path)
        parts = norm.split(os.sep)
        if os.path.isabs(path) or norm in (".", "") or ".." in parts or "\0" in path:
            raise bad_request(f"{where}path: {path!r} must be a relative path inside the workdir")
        if parts[0] in (".outrig", "runs"):
            raise bad_request(f"{where}path: {path!r} is inside outrig's own '{parts[0]}/' dir")
        self.path = norm
        data = raw.get("data_b64")
        if not isinstance(data, str):
            raise bad_request(f"{where}data_b64: must be a base64 string")
        try:
            self.data = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(f"{where}data_b64: not valid base64") from None
        self.mode = get_int(raw, "mode", where, 0o644, 0, 0o7777)


def topo_order(procs: List[ProcSpec]) -> List[ProcSpec]:
    """Dependency order, stable with respect to the request order; cycles are a bad request."""
    names = [p.name for p in procs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise bad_request(f"processes: duplicate name(s) {', '.join(dup)}")
    for i, p in enumerate(procs):
        for dep in p.after:
            if dep not in names:
                raise bad_request(f"processes[{i}].after: unknown process {dep!r}")
            if dep == p.name:
                raise bad_request(f"processes[{i}].after: {p.name!r} cannot wait for itself")
    placed: List[ProcSpec] = []
    done: Set[str] = set()
    left = list(procs)
    while left:
        nxt = next((p for p in left if all(d in done for d in p.after)), None)
        if nxt is None:
            cyc = ", ".join(p.name for p in left)
            raise bad_request(f"processes: dependency cycle among {cyc}")
        placed.append(nxt)
        done.add(nxt.name)
        left.remove(nxt)
    return placed


class Request:
    """The common request fields, validated; op-specific fields are read by each op."""

    def __init__(self, raw: Any) -> None:
        if not isinstance(raw, dict):
            raise bad_request("request: must be a JSON object")
        self.raw: JSONDict = raw
        version = raw.get("v", PROTOCOL_VERSION)
        if version != PROTOCOL_VERSION:
            raise bad_request(f"v: unsupported protocol version {version!r} (agent speaks 1)")
        op = raw.get("op")
        if op not in OPS:
            raise bad_request(f"op: must be one of {', '.join(OPS)}")
        self.op: str = op
        # "~/outrig" (the default for hosts given as user@host or `local`) means the login
        # user's home on the box, which only the box knows.
        workdir = os.path.expanduser(get_str(raw, "workdir", ""))
        if not os.path.isabs(workdir) or "\0" in workdir:
            raise bad_request(f"workdir: {workdir!r} must be an absolute path (or start with ~)")
        self.workdir = os.path.normpath(workdir)
        self.env = get_str_dict(raw, "env", "")


def parse_request(line: bytes) -> Request:
    """Decode the single request line."""
    if not line.strip():
        raise bad_request("request: expected one JSON line on stdin, got nothing")
    try:
        raw = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad_request(f"request: not valid JSON: {exc}") from None
    return Request(raw)


def apply_env(env: Dict[str, str]) -> None:
    """Apply the host file's env to the agent itself, in order, expanding against the box env.

    Done first so it affects tool lookup (nvidia-smi on PATH) and every launched process.
    """
    for key, value in env.items():
        os.environ[key] = os.path.expandvars(value)


# --------------------------------------------------------------------------- files and paths


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


def clean_line(raw: bytes, secrets: Optional[List[str]] = None) -> str:
    """One log line for humans: decoded, last carriage-return segment (progress bars), secret
    values replaced (before the cap, so no prefix of one survives), capped."""
    text = raw.decode("utf-8", errors="replace").rstrip("\r")
    if "\r" in text:
        text = text.rsplit("\r", 1)[-1]
    if secrets:
        text = redact(text, secrets)
    if len(text) > MAX_LINE_CHARS:
        text = text[:MAX_LINE_CHARS] + "…"
    return text


def tail_lines(path: str, count: int, secrets: Optional[List[str]] = None) -> List[str]:
    """The last ``count`` lines of a file, reading blocks backwards from the end, with the
    ``secrets`` values redacted (every excerpt that leaves the log file goes through here).

    A multi-GB log is never read whole: at most TAIL_MAX_BYTES are scanned.
    """
    if count <= 0:
        return []
    chunks: List[bytes] = []
    pos = 0
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            pos = end
            newlines = 0
            while pos > 0 and newlines <= count and end - pos < TAIL_MAX_BYTES:
                size = min(8192, pos)
                pos -= size
                f.seek(pos)
                chunk = f.read(size)
                chunks.append(chunk)
                newlines += chunk.count(b"\n")
    except OSError:
        return []
    data = b"".join(reversed(chunks))
    if pos > 0 and b"\n" in data:
        data = data[data.index(b"\n") + 1 :]  # first line is probably cut
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [clean_line(x, secrets) for x in lines[-count:]]


class LogFollower:
    """Follows a log from a byte offset, yielding complete lines (partial last line kept)."""

    MAX_PARTIAL = 64 * 1024

    def __init__(self, path: str, offset: int, secrets: Optional[List[str]] = None) -> None:
        self.path = path
        self.secrets = secrets
        self.offset = offset
        self.partial = b""
        self.last_line = ""

    def read_new(self) -> List[str]:
        """New complete lines since the last call (at most FOLLOW_CHUNK bytes per call)."""
        try:
            with open(self.path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                if size < self.offset:  # truncated under us: start over
                    self.offset = 0
                    self.partial = b""
                if size == self.offset:
                    return []
                f.seek(self.offset)
                data = f.read(FOLLOW_CHUNK)
        except OSError:
            return []
        self.offset += len(data)
        data = self.partial + data
        pieces = data.split(b"\n")
        self.partial = pieces.pop()
        if len(self.partial) > self.MAX_PARTIAL:  # a huge line without newline: treat as a line
            pieces.append(self.partial)
            self.partial = b""
        lines = [clean_line(p, self.secrets) for p in pieces]
        for line in reversed(lines):
            if line.strip():
                self.last_line = line
                break
        return lines

    def flush(self) -> List[str]:
        """The unterminated last line as a line (the writer has exited)."""
        if not self.partial:
            return []
        line = clean_line(self.partial, self.secrets)
        self.partial = b""
        if line.strip():
            self.last_line = line
        return [line]

    def latest(self) -> str:
        """The most recent non-blank line seen (including an unfinished one)."""
        if self.partial.strip():
            return clean_line(self.partial, self.secrets)
        return self.last_line


# --------------------------------------------------------------------------- the box: facts, /proc


def boot_id() -> str:
    """This boot's id: pids and start ticks only mean something on the same boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _csv_int(text: str) -> Optional[int]:
    """An nvidia-smi number; "[N/A]", "N/A" and the like become None."""
    text = text.strip()
    if not text or "N/A" in text or text.startswith("["):
        return None
    try:
        return int(float(text))
    except ValueError:
        return None


GPU_QUERY = (
    "index,uuid,name,memory.total,memory.used,memory.free,utilization.gpu,pci.bus_id,"
    "driver_version"
)
APPS_QUERY = "pid,used_memory,gpu_uuid,process_name"


def run_nvidia_smi(args: List[str]) -> Tuple[Optional[str], Optional[str]]:
    """(stdout, None) or (None, why not). Found on the env-extended PATH; bounded to 10 s."""
    exe = shutil.which("nvidia-smi", path=os.environ.get("PATH", os.defpath))
    if exe is None:
        return None, "nvidia-smi not found on PATH"
    try:
        proc = subprocess.run(
            [exe, *args], stdin=subprocess.DEVNULL, capture_output=True, timeout=10, check=False
        )
    except subprocess.TimeoutExpired:
        return None, "nvidia-smi timed out after 10 s"
    except OSError as exc:
        return None, f"cannot run nvidia-smi: {exc}"
    out = proc.stdout.decode("utf-8", errors="replace")
    if proc.returncode != 0:
        why = (proc.stderr.decode("utf-8", errors="replace") + out).strip().splitlines()
        return None, f"nvidia-smi failed (exit {proc.returncode}): {why[0] if why else ''}".strip()
    return out, None


def parse_gpu_csv(text: str) -> List[JSONDict]:
    """Parse ``--query-gpu=GPU_QUERY --format=csv,noheader,nounits`` lines.

    The same 9-field form as the real H200 captures in tests/fixtures, so the fixtures are
    exactly what this function reads on a box. Names may contain commas: the fields after the
    name are counted from the right.
    """
    gpus: List[JSONDict] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 9:
            continue
        index = _csv_int(cells[0])
        if index is None:
            continue
        gpus.append(
            {
                "index": index,
                "uuid": cells[1],
                "name": ",".join(cells[2:-6]).strip(),
                "memory_total_mib": _csv_int(cells[-6]),
                "memory_used_mib": _csv_int(cells[-5]),
                "memory_free_mib": _csv_int(cells[-4]),
                "utilization_pct": _csv_int(cells[-3]),
                "pci_bus_id": cells[-2],
                "driver": cells[-1],
            }
        )
    return gpus


def query_gpus() -> Tuple[List[JSONDict], Optional[str]]:
    """GPUs as nvidia-smi reports them, or ([], why not)."""
    out, error = run_nvidia_smi([f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"])
    if out is None:
        return [], error
    return parse_gpu_csv(out), None


def gather_facts() -> JSONDict:
    """What the box is (the ``facts`` event)."""
    gpus, gpu_error = query_gpus()
    return {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "boot_id": boot_id(),
        "gpus": gpus,
        "gpu_error": gpu_error,
    }


class ProcStat(NamedTuple):
    """The fields of /proc/PID/stat that ownership decisions need."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    start_ticks: int
    state: str

    def live(self) -> bool:
        """Zombies still have a stat file but are not running (PID 1 may never reap them)."""
        return self.state not in ("Z", "X", "x")


def read_stat(pid: int) -> Optional[ProcStat]:
    """Parse /proc/PID/stat. comm may hold spaces and ')', so split after the last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        rest = data[data.rindex(b")") + 2 :].split()
        return ProcStat(
            pid=pid,
            ppid=int(rest[1]),
            pgid=int(rest[2]),
            sid=int(rest[3]),
            start_ticks=int(rest[19]),  # field 22 overall; rest starts at field 3
            state=rest[0].decode("ascii", errors="replace"),
        )
    except (ValueError, IndexError):
        return None


def pid_live(pid: int) -> bool:
    """The pid exists and is not a zombie."""
    st = read_stat(pid)
    return st is not None and st.live()


def scan_procs() -> Iterator[ProcStat]:
    """Every process visible in /proc (vanished ones are skipped)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit():
            st = read_stat(int(name))
            if st is not None:
                yield st


def read_markers(pid: int) -> Tuple[Optional[str], Optional[str]]:
    """(OUTRIG_RUN, OUTRIG_PROCESS) from /proc/PID/environ; unreadable → (None, None)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None, None
    run: Optional[str] = None
    proc: Optional[str] = None
    run_prefix = (MARKER_KEY + "=").encode()
    proc_prefix = (PROCESS_KEY + "=").encode()
    for entry in data.split(b"\0"):
        if entry.startswith(run_prefix):
            run = entry[len(run_prefix) :].decode("utf-8", errors="replace")
        elif entry.startswith(proc_prefix):
            proc = entry[len(proc_prefix) :].decode("utf-8", errors="replace")
    return run, proc


def own_lineage() -> Set[int]:
    """The agent and all its ancestors: never signalled, whatever their environment says."""
    out = {0, 1, os.getpid()}
    pid = os.getppid()
    while pid > 1 and pid not in out:
        out.add(pid)
        st = read_stat(pid)
        if st is None:
            break
        pid = st.ppid
    return out


def proc_problem() -> Optional[str]:
    """Why /proc cannot prove ownership here (hidden or not mounted), or None when it can.

    Every ownership rule reads /proc (stat for pid, group, session and start time; environ for
    the markers). If the agent cannot read its own entries it cannot read its children's
    either, and must neither start what it could not stop nor call anything stopped."""
    pid = os.getpid()
    if read_stat(pid) is None:
        return f"/proc/{pid}/stat (the agent's own) is unreadable: /proc is hidden or not mounted"
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            f.read(1)
    except OSError as exc:
        return f"/proc/{pid}/environ (the agent's own) is unreadable ({exc.strerror})"
    return None


def require_proc(doing: str) -> None:
    """Raise a ``proc`` error (saying what was not done) when /proc cannot prove ownership."""
    problem = proc_problem()
    if problem is not None:
        raise AgentError(
            "proc", f"{problem}, so outrig cannot prove which processes are its own and "
            f"{doing}. Run the agent where /proc is mounted and shows this user's processes "
            "(hidepid= must not hide them from it), then run the command again")


# --------------------------------------------------------------------------- cgroups
#
# Where the box allows it (cgroup v2, a writable cgroup folder for this user), each process
# is started in a cgroup of its own, ``outrig+<run>+<process>``, next to the agent's: every
# descendant is in it whatever it does to its session, group or environment, so cleanup finds
# (and cgroup.kill kills) them all. Elsewhere the record says ``cgroup: null`` and the other
# rules (group, session, marker, descendants seen) apply.


def cgroup_base() -> Optional[str]:
    """The agent's own cgroup v2 folder if this user may create cgroups in it, else None."""
    if os.environ.get(CGROUP_SWITCH, "1").strip() == "0":
        return None
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            own = next((ln.strip()[3:] for ln in f if ln.startswith("0::")), None)
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            mounts = [ln.split() for ln in f]
    except OSError:
        return None
    if own is None:
        return None
    for fields in mounts:
        if "-" not in fields:
            continue
        tail = fields[fields.index("-") + 1:]
        if not tail or tail[0] != "cgroup2":
            continue
        root, point = fields[3], fields[4]
        if root != "/" and not own.startswith(root):
            continue
        rel = own[len(root):] if root != "/" else own
        base = os.path.join(point, rel.lstrip("/"))
        if os.path.isdir(base) and os.access(base, os.W_OK):
            return base
    return None


def cgroup_name(run_id: str, name: str) -> str:
    """The folder name of a process's cgroup (checked again before it is ever used).

    ``+`` is in no run id or process name, so the run's prefix is unambiguous."""
    return f"outrig+{run_id}+{name}"


def run_cgroups(run_id: str) -> List[str]:
    """Every cgroup of a run next to the agent's (found without run.json: a corrupt one)."""
    base = cgroup_base()
    try:
        names = os.listdir(base) if base is not None else []
    except OSError:
        return []
    prefix = cgroup_name(run_id, "")
    return [os.path.join(base or "", n) for n in sorted(names)
            if n.startswith(prefix) and NAME_RE.match(n[len(prefix):])]


def make_cgroup(run_id: str, name: str) -> Optional[str]:
    """Create the process's cgroup; None where the box does not allow it."""
    base = cgroup_base()
    if base is None:
        return None
    path = os.path.join(base, cgroup_name(run_id, name))
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except OSError:
        return None
    return path


def record_cgroup(run_id: str, rec: JSONDict) -> Optional[str]:
    """The cgroup a record names, only if it is the one outrig would have made for it."""
    path = rec.get("cgroup")
    if not isinstance(path, str) or os.path.basename(path) != cgroup_name(run_id, rec["name"]):
        return None
    return path if os.path.isdir(path) else None


def cgroup_pids(path: str) -> Set[int]:
    """The pids in a cgroup now (empty when it is gone or unreadable)."""
    try:
        with open(os.path.join(path, "cgroup.procs"), encoding="ascii") as f:
            return {int(x) for x in f.read().split() if x.isdigit()}
    except OSError:
        return set()


def cgroup_kill(path: str) -> bool:
    """SIGKILL everything in the cgroup at once (cgroup.kill, Linux 5.14+); False if absent."""
    try:
        with open(os.path.join(path, "cgroup.kill"), "w", encoding="ascii") as f:
            f.write("1")
    except OSError:
        return False
    return True


def remove_cgroup(path: str) -> None:
    """Remove an emptied cgroup (best effort: it may still hold a process stuck in D)."""
    with contextlib.suppress(OSError):
        os.rmdir(path)


# --------------------------------------------------------------------------- lock


class FileLock:
    """An fcntl.flock on ``path``, polled until ``timeout``.

    The holder writes its pid and op into the file, so a waiting agent can name it. The fd is
    not inheritable, so launched processes never hold the lock.
    """

    def __init__(self, path: str, op: str, timeout: float, busy: str) -> None:
        self.path = path
        self.op = op
        self.timeout = timeout
        self.busy = busy  # what it means that someone else holds it, and what to do
        self.fd: Optional[int] = None
        self.unrecorded: Optional[str] = None  # what could not be written (full disk)

    def __enter__(self) -> FileLock:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    os.close(fd)
                    raise
            if time.monotonic() >= deadline:
                holder = self._holder(fd)
                os.close(fd)
                raise AgentError(
                    "lock", f"{self.path} is held by {holder}; waited {self.timeout:g} s"
                            f" ({self.busy})")
            time.sleep(0.1)
        info = {"pid": os.getpid(), "op": self.op, "since": round(time.time(), 3)}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        except OSError as exc:
            # A full disk must not stop a cleanup: the flock itself is held; only the note of
            # who holds it (for a waiting agent's message) is lost.
            self.unrecorded = f"the lock holder in {self.path} ({exc.strerror or exc})"
        self.fd = fd
        return self

    @staticmethod
    def _holder(fd: int) -> str:
        """Who holds the lock, from what it wrote into the file."""
        try:
            raw = os.pread(fd, 4096, 0).decode("utf-8", errors="replace").strip()
            info = json.loads(raw)
            if isinstance(info, dict):
                since = info.get("since")
                when = ""
                if _is_num(since):
                    when = f" since {time.strftime('%H:%M:%S', time.localtime(since))}"
                return f"pid {info.get('pid')} (op {info.get('op')}{when})"
        except (OSError, ValueError):
            pass
        return "an unknown process"

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)  # still holding the lock: nobody else's content
            os.close(self.fd)  # releases the flock
            self.fd = None


class WorkdirLock(FileLock):
    """``<workdir>/.outrig/lock``: one deploy/cleanup at a time per workdir."""

    def __init__(self, layout: Layout, op: str, timeout: float) -> None:
        super().__init__(layout.lock, op, timeout,
                         "another deploy or cleanup is running on this workdir")


# --------------------------------------------------------------------------- stopping


class Stopper:
    """Stops runs exactly as the protocol says, signalling only what is proven ours.

    ``popens`` are children of this agent (launched in this call): they are polled while
    waiting so they do not linger as zombies.
    """

    def __init__(self, out: Emitter, popens: Optional[Dict[int, subprocess.Popen[bytes]]] = None,
                 layout: Optional[Layout] = None):
        self.out = out
        self.popens = popens if popens is not None else {}
        self.layout = layout  # where descendants seen are recorded (None: kept in memory)
        # run id -> {(pid, start ticks): process name}: every process proven ours so far,
        # so one that later leaves its parent, group and session is still known.
        self.seen: Dict[str, Dict[Tuple[int, int], str]] = {}
        self.protected = own_lineage()
        self.boot = boot_id()
        self.marker_cache: Dict[Tuple[int, int], Tuple[Optional[str], Optional[str]]] = {}
        # What a stop could not write (a full disk must never keep it from killing).
        self.unrecorded: List[str] = []
        own_pgid = os.getpgid(0)
        self.protected_groups = {own_pgid}
        for pid in self.protected:
            st = read_stat(pid)
            if st is not None:
                self.protected_groups.add(st.pgid)

    # -- small helpers

    def reap(self) -> None:
        """Collect exited children of this agent (never blocks)."""
        for popen in self.popens.values():
            popen.poll()

    def markers(self, st: ProcStat) -> Tuple[Optional[str], Optional[str]]:
        """Markers of a process, cached per (pid, start ticks): environ is read once."""
        key = (st.pid, st.start_ticks)
        if key not in self.marker_cache:
            self.marker_cache[key] = read_markers(st.pid)
        return self.marker_cache[key]

    def kill(self, pid: int, sig: int) -> None:
        """Signal one proven-ours pid; vanished pids and permission errors are ignored."""
        if pid in self.protected or pid <= 1:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)

    def killpg(self, pgid: int, sig: int) -> None:
        """Signal a proven-ours group, unless the agent or an ancestor is in it."""
        if pgid <= 1 or pgid in self.protected_groups:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def leader_state(self, rec: JSONDict) -> str:
        """``alive`` (ticks match), ``reused`` (pid is someone else's) or ``gone``."""
        if rec.get("boot_id") and rec.get("boot_id") != self.boot:
            return "gone"
        st = read_stat(rec["pid"])
        if st is None:
            return "gone"
        if st.start_ticks != rec["start_ticks"]:
            return "reused"
        return "alive" if st.live() else "gone"

    def members(self, run_id: str, rec: JSONDict, leader: str) -> Set[int]:
        """Live processes of this record other than its leader, by the ownership rules.

        Ours: in the leader's group or session (started after it), carrying its markers, in
        its cgroup, a child of a process already proven ours (a setsid child that cleared
        its environment), or seen as ours before with the same pid and start time. What is
        found is recorded, so it stays ours after its parent is gone."""
        pid = rec["pid"]
        ticks = rec["start_ticks"]
        same_boot = not rec.get("boot_id") or rec.get("boot_id") == self.boot
        procs = {st.pid: st for st in scan_procs()
                 if st.pid not in self.protected and st.live()}
        out: Set[int] = set()
        for st in procs.values():
            if st.pid == pid:
                continue
            if (
                same_boot
                and leader != "reused"
                and (st.pgid == pid or st.sid == pid)
                and st.start_ticks >= ticks
            ):
                out.add(st.pid)
                continue
            run, name = self.markers(st)
            if run == run_id and name == rec["name"]:
                out.add(st.pid)
        cgroup = record_cgroup(run_id, rec) if same_boot else None
        if cgroup is not None:
            out |= {p for p in cgroup_pids(cgroup) if p in procs and p != pid}
        seen = self.seen_of(run_id)
        out |= {p for (p, t), name in seen.items()
                if name == rec["name"] and p in procs and procs[p].start_ticks == t}
        roots = set(out) | ({pid} if leader == "alive" else set())
        out |= self.descendants(roots, procs) - {pid}
        self.remember(run_id, rec["name"], {procs[p] for p in out if p in procs})
        return out

    @staticmethod
    def descendants(roots: Set[int], procs: Dict[int, ProcStat]) -> Set[int]:
        """Every live process whose parent chain reaches one of ``roots`` (proven ours)."""
        children: Dict[int, List[int]] = {}
        for st in procs.values():
            children.setdefault(st.ppid, []).append(st.pid)
        found: Set[int] = set()
        todo = list(roots)
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in found and child not in roots:
                    found.add(child)
                    todo.append(child)
        return found

    def seen_path(self, run_id: str) -> Optional[str]:
        """runs/<id>/descendants.json, when this stopper knows the workdir."""
        if self.layout is None:
            return None
        return os.path.join(self.layout.run_dir(run_id), DESCENDANTS_FILE)

    def seen_of(self, run_id: str) -> Dict[Tuple[int, int], str]:
        """The processes of a run seen as ours before (this boot), loaded once per run."""
        if run_id not in self.seen:
            table: Dict[Tuple[int, int], str] = {}
            path = self.seen_path(run_id)
            data: Any = None
            if path is not None:
                with contextlib.suppress(OSError, ValueError):
                    data = read_json(path)
            if isinstance(data, dict) and data.get("boot_id") == self.boot:
                for item in data.get("processes") or []:
                    if (isinstance(item, dict) and isinstance(item.get("pid"), int)
                            and isinstance(item.get("start_ticks"), int)
                            and isinstance(item.get("process"), str)):
                        table[(item["pid"], item["start_ticks"])] = item["process"]
            self.seen[run_id] = table
        return self.seen[run_id]

    def remember(self, run_id: str, name: str, found: Set[ProcStat]) -> None:
        """Record processes proven ours by pid and start time (best effort on disk)."""
        table = self.seen_of(run_id)
        new = {(st.pid, st.start_ticks) for st in found} - set(table)
        if not new:
            return
        for key in new:
            table[key] = name
        path = self.seen_path(run_id)
        if path is None or not os.path.isdir(os.path.dirname(path)):
            return
        items = [{"pid": p, "start_ticks": t, "process": n} for (p, t), n in sorted(table.items())]
        try:
            write_json_atomic(path, {"boot_id": self.boot, "processes": items})
        except OSError as exc:
            self.unrecorded.append(f"the processes seen of run {run_id} in {path} "
                                   f"({exc.strerror or exc})")

    def marked(self, run_id: str) -> Set[int]:
        """Every live process carrying OUTRIG_RUN=run_id (not the agent or its ancestors)."""
        out: Set[int] = set()
        for st in scan_procs():
            if st.pid in self.protected or not st.live():
                continue
            if self.markers(st)[0] == run_id:
                out.add(st.pid)
        return out

    # -- the procedure

    def stop_record(self, run_id: str, rec: JSONDict) -> JSONDict:
        """Stop one recorded process: TERM the leader, wait grace, KILL group/session/marked."""
        t0 = time.monotonic()
        pid: int = rec["pid"]
        grace_raw = rec.get("stop_grace")
        grace = DEFAULT_STOP_GRACE
        if isinstance(grace_raw, (int, float)) and grace_raw >= 0:
            grace = float(grace_raw)
        leader = self.leader_state(rec)
        how = "gone"
        stragglers: Set[int] = set()
        if leader == "reused":
            return self._stopped(run_id, rec["name"], "reused", t0, 0)
        killed_leader = False
        # Known before the leader is signalled: a child that left its session is reparented
        # when its parent exits, and is then found only because it was seen here.
        self.members(run_id, rec, leader)
        if leader == "alive" and rec.get("stop_children_first"):
            self.stop_children_first(run_id, rec, grace, t0)
        if leader == "alive":
            self.kill(pid, signal.SIGTERM)
            # Children-first left the launcher with nothing to wait for; it still gets at least
            # the launcher part of the grace to exit by itself.
            deadline = max(t0 + grace, time.monotonic() + CHILDREN_FIRST_LAUNCHER_S)
            next_beat = t0 + STOP_HEARTBEAT_S
            while self.leader_state(rec) == "alive" and time.monotonic() < deadline:
                self.reap()
                if time.monotonic() >= next_beat:
                    # A trainer may take minutes to save its interrupt checkpoint; keep the
                    # workstation informed (and its dead-link detector quiet) meanwhile.
                    next_beat += STOP_HEARTBEAT_S
                    self.out.emit(
                        "stopping", process=rec["name"], run_id=run_id,
                        elapsed=round(time.monotonic() - t0, 1), grace=grace,
                    )
                time.sleep(POLL_S)
            self.reap()
            if self.leader_state(rec) == "alive":
                how = "kill"
                killed_leader = True
                rest = self.members(run_id, rec, "alive")  # counted before killpg hides them
                stragglers |= rest
                self.kill_cgroup(run_id, rec)
                self.killpg(pid, signal.SIGKILL)
                self.kill(pid, signal.SIGKILL)
                for other in rest:
                    self.kill(other, signal.SIGKILL)
            else:
                how = "term"
        deadline = time.monotonic() + KILL_WAIT_S
        while True:
            self.reap()
            state = self.leader_state(rec)
            rest = self.members(run_id, rec, state)
            if not rest and state != "alive":
                break
            if time.monotonic() >= deadline:
                left = sorted(rest | ({pid} if state == "alive" else set()))
                self.out.warning(
                    f"{rec['name']} (run {run_id}): pids {left} still alive {KILL_WAIT_S:g} s"
                    " after SIGKILL (stuck in the kernel?)"
                )
                break
            how = "kill"
            self.kill_cgroup(run_id, rec)
            if state == "alive":
                killed_leader = True
                self.killpg(pid, signal.SIGKILL)
                self.kill(pid, signal.SIGKILL)
            for other in rest:
                self.kill(other, signal.SIGKILL)
            stragglers |= rest
            time.sleep(POLL_S)
        if killed_leader:
            self._note_killed(rec)
        cgroup = record_cgroup(run_id, rec)
        if cgroup is not None and not cgroup_pids(cgroup):
            remove_cgroup(cgroup)
        return self._stopped(run_id, rec["name"], how, t0, len(stragglers))

    def kill_cgroup(self, run_id: str, rec: JSONDict) -> None:
        """SIGKILL the record's whole cgroup at once, unless the agent itself is in it."""
        cgroup = record_cgroup(run_id, rec)
        if cgroup is not None and not (cgroup_pids(cgroup) & self.protected):
            cgroup_kill(cgroup)

    def launched_children(self, rec: JSONDict) -> List[int]:
        """The children of the wrapper's child: with torchrun as the command, its ranks.

        Found by parent pid and proven ours by the run marker (each rank runs in a session
        of its own, so group and session do not reach it)."""
        pid = rec["pid"]
        procs = [st for st in scan_procs() if st.live() and st.pid not in self.protected]
        commands = {st.pid for st in procs if st.ppid == pid}
        run_id = rec.get("_run_id")
        out: List[int] = []
        for st in procs:
            if st.ppid in commands and self.markers(st)[0] == run_id:
                out.append(st.pid)
        return sorted(out)

    def stop_children_first(self, run_id: str, rec: JSONDict, grace: float,
                            t0: float) -> None:
        """SIGTERM the launcher's children themselves (not their groups) and wait for them.

        torchrun, given SIGTERM, signals each rank's whole process group (the DataLoader
        workers die first and the rank's interrupt save fails on them) and SIGKILLs the ranks
        30 s later unless --shutdown-timeout (torch 2.13 has it, 2.11 does not) says otherwise.
        Signalling the ranks directly lets speculators' handler save ``interrupted/`` with its
        workers alive; torchrun then sees its workers exit and ends by itself."""
        rec = dict(rec, _run_id=run_id)
        children = self.launched_children(rec)
        if not children:
            return
        self.out.step(f"{rec['name']}: SIGTERM to {len(children)} launched worker(s) "
                      f"{children} first (they save before exiting)")
        for child in children:
            self.kill(child, signal.SIGTERM)
        deadline = t0 + grace
        next_beat = time.monotonic() + STOP_HEARTBEAT_S
        while time.monotonic() < deadline:
            self.reap()
            left = [c for c in children if pid_live(c)]
            if not left:
                # torchrun notices its workers' exit on its own poll; a SIGTERM before that
                # makes it raise SignalException and exit 1 after a clean save. Give it its
                # moment to exit 0 by itself.
                until = time.monotonic() + CHILDREN_FIRST_LAUNCHER_S
                while time.monotonic() < until and self.leader_state(rec) == "alive":
                    self.reap()
                    time.sleep(POLL_S)
                return
            if time.monotonic() >= next_beat:
                next_beat += STOP_HEARTBEAT_S
                self.out.emit("stopping", process=rec["name"], run_id=run_id,
                              elapsed=round(time.monotonic() - t0, 1), grace=grace,
                              waiting_for=left)
            time.sleep(POLL_S)

    def _note_killed(self, rec: JSONDict) -> None:
        """The wrapper was SIGKILLed so it wrote no exit file: write one saying so."""
        path = rec.get("exit_file")
        if isinstance(path, str) and not os.path.exists(path):
            try:
                write_json_atomic(
                    path, {"code": None, "signal": 9, "ended": time.time(), "by": "outrig"}
                )
            except OSError as exc:
                self.unrecorded.append(f"the exit file {path} ({exc.strerror or exc})")

    def _stopped(self, run_id: str, name: str, how: str, t0: float, stragglers: int) -> JSONDict:
        """Emit ``stopped`` and return the per-process cleanup record."""
        seconds = round(time.monotonic() - t0, 2)
        self.out.emit(
            "stopped", process=name, run_id=run_id, how=how, seconds=seconds, stragglers=stragglers
        )
        return {"process": name, "how": how, "seconds": seconds, "stragglers": stragglers}

    def sweep(self, run_id: str, grace: float) -> Optional[JSONDict]:
        """Stop whatever still carries the run's marker (TERM, grace, KILL); None if nothing."""
        found = self.marked(run_id)
        if not found:
            return None
        t0 = time.monotonic()
        for pid in found:
            self.kill(pid, signal.SIGTERM)
        deadline = t0 + grace
        how = "term"
        seen = set(found)
        while time.monotonic() < deadline:
            self.reap()
            if not self.marked(run_id):
                break
            time.sleep(POLL_S)
        deadline = time.monotonic() + KILL_WAIT_S
        while True:
            self.reap()
            left = self.marked(run_id)
            if not left:
                break
            if time.monotonic() >= deadline:
                self.out.warning(f"run {run_id}: pids {sorted(left)} survived SIGKILL")
                break
            how = "kill"
            seen |= left
            for pid in left:
                self.kill(pid, signal.SIGKILL)
            time.sleep(POLL_S)
        return self._stopped(run_id, SWEEP_NAME, how, t0, len(seen))

    def stop_run(
        self, run_id: str, records: Optional[List[JSONDict]], sweep_grace: float
    ) -> List[JSONDict]:
        """Stop a run's records in reverse start order, then sweep its marker and cgroups."""
        results: List[JSONDict] = []
        for rec in reversed(records or []):
            results.append(self.stop_record(run_id, rec))
        swept = self.sweep(run_id, sweep_grace)
        if swept is not None:
            results.append(swept)
        swept = self.sweep_cgroups(run_id)
        if swept is not None:
            results.append(swept)
        return results

    def sweep_cgroups(self, run_id: str) -> Optional[JSONDict]:
        """Kill what is left in the run's cgroups (a record was reused or unreadable) and
        remove them; None when they were all empty."""
        t0 = time.monotonic()
        killed: Set[int] = set()
        for path in run_cgroups(run_id):
            pids = cgroup_pids(path) - self.protected
            if pids and not (cgroup_pids(path) & self.protected):
                killed |= pids
                if not cgroup_kill(path):
                    for pid in pids:
                        self.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + KILL_WAIT_S
                while cgroup_pids(path) and time.monotonic() < deadline:
                    self.reap()
                    time.sleep(POLL_S)
                if cgroup_pids(path):
                    self.out.warning(f"run {run_id}: pids {sorted(cgroup_pids(path))} in "
                                     f"{path} survived SIGKILL")
            remove_cgroup(path)
        if not killed:
            return None
        return self._stopped(run_id, CGROUP_SWEEP_NAME, "kill", t0, len(killed))


def valid_record(rec: Any) -> bool:
    """A process record we can act on (pid, ticks, name of the right types)."""
    return (
        isinstance(rec, dict)
        and isinstance(rec.get("name"), str)
        and isinstance(rec.get("pid"), int)
        and not isinstance(rec.get("pid"), bool)
        and rec["pid"] > 1
        and isinstance(rec.get("start_ticks"), int)
        and not isinstance(rec.get("start_ticks"), bool)
    )


def load_run(layout: Layout, run_id: str, out: Emitter) -> Optional[JSONDict]:
    """run.json of a run, or None with a warning when it is missing or corrupt."""
    path = layout.run_json(run_id)
    try:
        run = read_json(path)
    except FileNotFoundError:
        out.warning(f"run {run_id}: {path} is missing; sweeping for its marker only")
        return None
    except (OSError, ValueError) as exc:
        out.warning(f"run {run_id}: {path} is unreadable ({exc}); sweeping for its marker only")
        return None
    if not isinstance(run, dict) or not isinstance(run.get("processes"), list):
        out.warning(f"run {run_id}: {path} is corrupt; sweeping for its marker only")
        return None
    return run


def stop_run_by_id(
    layout: Layout, run_id: str, stopper: Stopper, out: Emitter, sweep_grace: Optional[float]
) -> JSONDict:
    """Stop one run (by its run.json, or by marker only), mark it stopped, clear pointers."""
    run = load_run(layout, run_id, out)
    records: List[JSONDict] = []
    if run is not None:
        for rec in run["processes"]:
            if valid_record(rec):
                records.append(rec)
            else:
                out.warning(f"run {run_id}: skipping a malformed process record")
    grace = sweep_grace
    if grace is None:
        graces = [float(r["stop_grace"]) for r in records if _is_num(r.get("stop_grace"))]
        grace = max(graces) if graces else DEFAULT_STOP_GRACE
    results = stopper.stop_run(run_id, records, grace)
    for rec in records:
        scratch = rec.get("scratch")
        for folder in scratch if isinstance(scratch, list) else []:
            if isinstance(folder, str):
                clear_scratch(layout, folder, out)
    if run is not None:
        run["status"] = "stopped"
        run["stopped_at"] = round(time.time(), 3)
        try:
            write_json_atomic(layout.run_json(run_id), run)
        except OSError as exc:
            out.warning(f"run {run_id}: cannot update run.json: {exc}")
            stopper.unrecorded.append(
                f"run {run_id} stopped in {layout.run_json(run_id)} ({exc.strerror or exc})")
    clear_pointers(layout, run_id)
    # known: the box had a record of it (else only its marker was swept; an unknown id is
    # reported as such instead of as "stopped")
    return {"run_id": run_id, "processes": results, "known": run is not None}


def clear_scratch(layout: Layout, folder: str, out: Emitter) -> None:
    """Delete the files (not the folder) of a process's scratch folder once it is stopped.

    vLLM's hidden-state connector writes ``<path>/<request>.safetensors`` (+ ``.lock``) that
    the trainer deletes after reading; a crash leaves them (about 0.5 GB each). Only folders
    inside the workdir are touched, resolved through symlinks, so a playbook value can never
    make this delete anything else."""
    real = os.path.realpath(folder)
    root = os.path.realpath(layout.workdir)
    if not real.startswith(root + os.sep):
        out.warning(f"scratch folder {folder} is outside the workdir {layout.workdir}; "
                    "left as it is")
        return
    removed = 0
    freed = 0
    for dirpath, _dirs, names in os.walk(real):
        for name in names:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                size = os.lstat(path).st_size
                os.unlink(path)
                removed += 1
                freed += size
    if removed:
        out.step(f"cleared {removed} file(s), {freed / 1e9:.2f} GB, from {folder}")


# --------------------------------------------------------------------------- readiness probes


def probe_http(url: str) -> bool:
    """GET returns 2xx within 1 s (proxies ignored: the URL is on the box)."""
    import urllib.request  # lazily: ~20 ms of imports that most calls never need

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=PROBE_TIMEOUT_S) as resp:
            return 200 <= int(resp.status) < 300
    except Exception:  # URLError, HTTPError, timeouts, resets, bad status lines...
        return False


def probe_port(port: int) -> bool:
    """A TCP connect to 127.0.0.1:port succeeds within 1 s."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def probe_served_model(url: str) -> Optional[str]:
    """``data[0].id`` of ``/v1/models`` on the origin of ``url`` (vLLM's served model id), or
    None when it does not answer (yet) with a model list."""
    import urllib.request  # lazily: ~20 ms of imports that most calls never need

    parts = urllib.parse.urlsplit(url)
    models_url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/v1/models", "", ""))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(models_url, timeout=PROBE_TIMEOUT_S) as resp:
            data = json.loads(resp.read(1 << 20).decode("utf-8"))
        first = data["data"][0]["id"]
    except Exception:  # not up, not JSON, empty list: not ready yet
        return None
    return first if isinstance(first, str) else None


def read_exit_file(path: str) -> Optional[Tuple[Optional[int], Optional[int]]]:
    """(code, signal) from a wrapper's exit file, or None if absent/unreadable."""
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    code = data.get("code")
    sig = data.get("signal")
    return (
        code if isinstance(code, int) and not isinstance(code, bool) else None,
        sig if isinstance(sig, int) and not isinstance(sig, bool) else None,
    )


# --------------------------------------------------------------------------- deploy


class Watch:
    """A process launched in this call, and what we know about its readiness.

    ``kinds`` are the conditions that make it ready; a process without ``ready:`` gets the
    single condition ``alive``: still running after the settle window. ``finished`` is set
    when it exited with code 0 before it was ready and nothing waits for it (a resumed
    trainer with nothing left to do): done, not failed."""

    def __init__(
        self, spec: ProcSpec, popen: subprocess.Popen[bytes], record: JSONDict, log_offset: int,
        settle: float = DEFAULT_SETTLE_S, secrets: Optional[List[str]] = None,
    ) -> None:
        self.spec = spec
        self.popen = popen
        self.record = record
        self.follower = LogFollower(record["log"], log_offset, secrets)
        self.t0 = time.monotonic()
        kinds = spec.ready.kinds() if spec.ready is not None else []
        self.kinds = kinds or ["alive"]
        self.settle = settle
        self.met: Set[str] = set()
        self.ready = False
        self.finished = False
        self.ended = False
        self.next_probe = 0.0
        self.probes = 0

    @property
    def done(self) -> bool:
        """Nothing more to wait for: ready, or finished (exited 0 before it was ready)."""
        return self.ready or self.finished

    @property
    def limit(self) -> float:
        """Seconds this process may take to be done: its ready timeout, or the settle window."""
        if self.spec.ready is not None and self.spec.ready.kinds():
            return self.spec.ready.timeout
        return self.settle

    def elapsed(self) -> float:
        """Seconds since launch."""
        return round(time.monotonic() - self.t0, 2)

    def exit_status(self) -> Tuple[Optional[int], Optional[int]]:
        """(code, signal) of the ended process: the exit file, else the wrapper's own status."""
        status = read_exit_file(self.record["exit_file"])
        if status is not None:
            return status
        rc = self.popen.returncode
        if rc is None:
            return None, None
        return (rc, None) if rc >= 0 else (None, -rc)


class CancelWatch:
    """The workstation's Ctrl-C during a deploy: a ``cancel`` line on the agent's stdin.

    Only that line cancels. EOF (the link dropped, the workstation went away) does not: a
    deploy whose workstation vanished still completes, as before. Read without blocking, once
    a tick, from fd 0 (the request, if it came on stdin, was read whole before)."""

    def __init__(self) -> None:
        self.open = True
        self.seen = b""

    def requested(self) -> bool:
        if not self.open:
            return False
        try:
            import select

            ready, _, _ = select.select([0], [], [], 0)
            if not ready:
                return False
            data = os.read(0, 4096)
        except (OSError, ValueError):
            self.open = False
            return False
        if not data:
            self.open = False
            return False
        self.seen = (self.seen + data)[-64:]
        return b"cancel\n" in self.seen


CANCEL_MESSAGE = "deploy cancelled from the workstation (Ctrl-C)"


class Deployment:
    """Steps 6-9 of a deploy: create the run, launch in order, wait, record."""

    def __init__(
        self,
        layout: Layout,
        out: Emitter,
        run: JSONDict,
        procs: List[ProcSpec],
        secrets: Dict[str, str],
        wait: bool,
        progress_interval: float,
        settle: float = DEFAULT_SETTLE_S,
    ) -> None:
        self.layout = layout
        self.out = out
        self.run = run
        self.run_id: str = run["run_id"]
        self.run_dir = layout.run_dir(self.run_id)
        self.procs = procs
        self.secrets = secrets
        self.hidden = [v for v in secrets.values() if v]  # values redacted from every excerpt
        self.wait = wait
        self.progress_interval = progress_interval
        self.settle = settle
        self.needed = {dep for p in procs for dep in p.after}  # processes others wait for
        self.cancel = CancelWatch()
        self.popens: Dict[int, subprocess.Popen[bytes]] = {}
        self.watches: Dict[str, Watch] = {}
        self.order: List[str] = []

    def save(self) -> None:
        """Rewrite run.json atomically (after every change the workstation might need)."""
        write_json_atomic(os.path.join(self.run_dir, "run.json"), self.run)

    def execute(self) -> List[JSONDict]:
        """Launch everything in dependency order, waiting where needed; return the records,
        each with its ``outcome``: ``ready``, ``finished`` (exited 0 before it was ready,
        nothing waits for it) or ``launched`` (not waited for)."""
        for spec in topo_order(self.procs):
            if spec.after:
                self.wait_for(set(spec.after))
            if self.cancel.requested():
                raise AgentError("cancelled", CANCEL_MESSAGE)
            self.launch(spec)
        if self.wait:
            self.wait_for(set(self.watches))
        else:
            self.wait_for(self.needed)
        for watch in self.watches.values():
            watch.record.setdefault("outcome", "launched")
        return [self.watches[n].record for n in self.order]

    def all_finished(self) -> bool:
        """Every process exited 0 before it was ready: the run has nothing left running."""
        return bool(self.watches) and all(w.finished for w in self.watches.values())

    def process_env(self, spec: ProcSpec, cgroup: Optional[str] = None) -> Dict[str, str]:
        """Agent env + process env + secrets + the run markers (markers win)."""
        env = dict(os.environ)
        env.update(spec.env)
        env.update(self.secrets)
        env[MARKER_KEY] = self.run_id
        env[PROCESS_KEY] = spec.name
        env.pop(CGROUP_KEY, None)
        if cgroup is not None:
            env[CGROUP_KEY] = os.path.join(cgroup, "cgroup.procs")
        return env

    def resolve_cwd(self, spec: ProcSpec) -> str:
        """null → workdir; relative → under workdir (not through a symlink out of it);
        created if missing."""
        cwd = self.layout.workdir
        if spec.cwd is not None:
            cwd = os.path.normpath(os.path.join(self.layout.workdir, spec.cwd))
        try:
            os.makedirs(cwd, exist_ok=True)
        except OSError as exc:
            raise AgentError(
                "workdir", f"cannot create cwd {cwd} for {spec.name}: {exc.strerror}", spec.name
            ) from None
        if spec.cwd is not None and not os.path.isabs(os.path.expanduser(spec.cwd)):
            real = os.path.realpath(cwd)
            root = os.path.realpath(self.layout.workdir)
            if os.path.commonpath([real, root]) != root:
                raise AgentError(
                    "workdir", f"cwd {spec.cwd!r} of {spec.name} resolves to {real}, outside the "
                    f"workdir {root} (a symlink on the box leads out of it). Remove the link or "
                    "give that folder as an absolute cwd", spec.name)
        return cwd

    def launch(self, spec: ProcSpec) -> None:
        """Start one process through the wrapper in its own session; record it at once."""
        log = os.path.join(self.run_dir, "logs", f"{spec.name}.log")
        exit_file = os.path.join(self.run_dir, "exit", f"{spec.name}.json")
        cwd = self.resolve_cwd(spec)
        if spec.checkpoints is not None:
            quarantine_checkpoints(spec.checkpoints["path"], spec.checkpoints["scheduler"],
                                   self.out)
        self.out.step(f"launching {spec.name}")
        cgroup = make_cgroup(self.run_id, spec.name)
        with open(log, "ab") as logf:
            offset = logf.seek(0, os.SEEK_END)
            popen = subprocess.Popen(
                [sys.executable, self.layout.wrap, exit_file, "--", *spec.argv],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=self.process_env(spec, cgroup),
                close_fds=True,
                start_new_session=True,
            )
        self.popens[popen.pid] = popen
        # Not yet polled, so even a wrapper that already died is a zombie whose stat is readable.
        st = read_stat(popen.pid)
        if st is None:
            # Without its start time nothing could ever prove this process ours: stop it now,
            # while it is our unreaped child (its pid and group cannot be reused yet).
            with contextlib.suppress(OSError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.kill()
            popen.wait()
            raise AgentError("proc", f"/proc/{popen.pid}/stat of {spec.name} was unreadable "
                             "right after launch (/proc hidden?), so outrig cannot prove it "
                             "its own; it was killed at once", spec.name)
        record: JSONDict = {
            "name": spec.name,
            "pid": popen.pid,
            "pgid": st.pgid,
            "sid": st.sid,
            "start_ticks": st.start_ticks,
            "boot_id": boot_id(),
            "argv": list(spec.argv),
            "env_keys": [*sorted(set(spec.env) | set(self.secrets)), MARKER_KEY, PROCESS_KEY],
            # names only: status reads the values from the live process to redact its log tail
            "secret_keys": sorted(self.secrets),
            "cwd": cwd,
            "gpus": list(spec.gpus),
            "cgroup": cgroup,  # the wrapper joins it before starting the command
            "log": log,
            "exit_file": exit_file,
            "started_at": round(time.time(), 3),
            "stop_grace": spec.stop_grace,
            "stop_children_first": spec.stop_children_first,
            "scratch": [os.path.expanduser(d) for d in spec.scratch],
            "ready": spec.ready.to_json() if spec.ready is not None else None,
        }
        self.run["processes"].append(record)
        self.save()
        self.order.append(spec.name)
        watch = Watch(spec, popen, record, offset, self.settle, self.hidden)
        self.watches[spec.name] = watch
        self.out.emit("launched", process=spec.name, pid=popen.pid, pgid=st.pgid, sid=st.sid)

    def fail(self, watch: Watch, kind: str, message: str, code: Optional[int]) -> AgentError:
        """An error about one process, with its last log lines; secret values are redacted
        from both, since the error goes to the terminal, run.json and the journal."""
        excerpt = tail_lines(watch.record["log"], EXCERPT_LINES, self.hidden)
        return AgentError(kind, redact(message, self.hidden), watch.spec.name, excerpt, code)

    def mark_ready(self, watch: Watch) -> None:
        """Every readiness condition holds: record it and tell the workstation."""
        watch.ready = True
        watch.record["outcome"] = "ready"
        self.out.emit("ready", process=watch.spec.name, elapsed=watch.elapsed(),
                      via="+".join(watch.kinds))

    def mark_finished(self, watch: Watch) -> None:
        """Exited 0 before it was ready and nothing waits for it: done, not failed. A resumed
        trainer with nothing left to do logs that training is complete and exits 0."""
        watch.finished = True
        watch.record.update({"outcome": "finished", "exit_code": 0,
                             "ended_at": round(time.time(), 3)})
        self.save()
        self.out.emit("finished", process=watch.spec.name, elapsed=watch.elapsed(),
                      exit_code=0, last_line=watch.follower.latest())

    def early_exit(self, watch: Watch, code: Optional[int], sig: Optional[int]) -> None:
        """The process ended before it was ready: finished when it exited 0 and its readiness
        is not needed by a process after it, else an ``exited`` error."""
        spec = watch.spec
        waiting = sorted(p.name for p in self.procs if spec.name in p.after)
        alive_only = watch.kinds == ["alive"]
        if code == 0 and sig is None and (alive_only or not waiting):
            self.mark_finished(watch)
            return
        what = f"exited with code {code}" if sig is None else f"was killed by signal {sig}"
        if alive_only:
            message = (f"{spec.name} {what} {watch.elapsed():g} s after it started, so it "
                       f"never ran (it has no ready: check; a process must stay up "
                       f"{watch.settle:g} s to count as started)")
        else:
            message = f"{spec.name} {what} before it was ready"
            if code == 0 and sig is None:
                message += (f"; {', '.join(waiting)} waits for it (after:), so it had to be "
                            f"ready ({spec.ready.describe() if spec.ready else 'none'})")
        if code in (126, 127):
            message += ". Exit 126/127: the program could not be run; check the command " \
                       "and PATH on the box"
        raise self.fail(watch, "exited", message, code)

    def scan_lines(self, watch: Watch, lines: List[str]) -> None:
        """Fatal patterns (raise ``fatal_log``) and the log readiness regex, line by line."""
        spec = watch.spec
        log_re = spec.ready.log_re if spec.ready is not None else None
        for line in lines:
            for rx in spec.fatal:
                if rx.search(line):
                    raise self.fail(
                        watch,
                        "fatal_log",
                        f"{spec.name} logged a fatal line (matches /{rx.pattern}/): {line}",
                        None,
                    )
            if log_re is not None and log_re.search(line):
                watch.met.add("log")

    def check(self, watch: Watch) -> None:
        """One look at a launched process: fatal lines, readiness, early exit (raises)."""
        spec = watch.spec
        ready = spec.ready
        # Poll before reading: whatever the process wrote before it exited is then in the file.
        exited = not watch.ended and watch.popen.poll() is not None
        self.scan_lines(watch, watch.follower.read_new())
        while exited:  # drain the rest, including an unterminated last line
            more = watch.follower.read_new()
            if not more:
                self.scan_lines(watch, watch.follower.flush())
                break
            self.scan_lines(watch, more)
        if exited:
            watch.ended = True
            code, sig = watch.exit_status()
            watch.record["exit_code"] = code
            if "exit" in watch.kinds and code == 0:
                watch.met.add("exit")
            elif watch.ready and code == 0:
                return  # a process that was ready may end well (its work was short)
            elif watch.ready:
                what = f"exited with code {code}" if sig is None else f"was killed by signal {sig}"
                raise self.fail(watch, "exited", f"{spec.name} {what} after it was ready", code)
            elif "exit" in watch.kinds:  # a one-shot that failed: decided as before
                what = f"exited with code {code}" if sig is None else f"was killed by signal {sig}"
                raise self.fail(watch, "exited", f"{spec.name} {what} before it was ready", code)
            else:
                self.early_exit(watch, code, sig)
                return
        if watch.done:
            return
        now = time.monotonic()
        if "alive" in watch.kinds and now - watch.t0 >= watch.settle:
            watch.met.add("alive")
        if ready is not None and ("http" in watch.kinds or "port" in watch.kinds) \
                and now >= watch.next_probe:
            # Probe soon after launch, then back off to the steady period: a server that is
            # up in 100 ms should not cost a whole period (half a second of every deploy).
            watch.probes += 1
            watch.next_probe = now + min(PROBE_EVERY_S, 0.05 * (2 ** (watch.probes - 1)))
            if (
                ready.http is not None
                and "http" not in watch.met
                and probe_http(ready.http)
                and (ready.model is None or self.served_model_ok(watch, ready.http, ready.model))
            ):
                watch.met.add("http")
            if ready.port is not None and "port" not in watch.met and probe_port(ready.port):
                watch.met.add("port")
        if all(k in watch.met for k in watch.kinds):
            self.mark_ready(watch)
        elif watch.ended:
            code, _ = watch.exit_status()
            raise self.fail(watch, "exited", f"{spec.name} exited before it was ready", code)

    def served_model_ok(self, watch: Watch, url: str, expected: str) -> bool:
        """True when /v1/models serves ``expected``; another id is an error right away (the
        trainer would die on it minutes later); no answer yet means keep waiting."""
        served = probe_served_model(url)
        if served is None:
            return False
        if served != expected:
            raise self.fail(
                watch,
                "model_mismatch",
                f"{watch.spec.name} serves model id {served!r} at /v1/models, but "
                f"{expected!r} is expected (the trainer's --verifier-name-or-path must equal it;"
                " do not pass --served-model-name)",
                None,
            )
        return True

    def wait_for(self, names: Set[str]) -> None:
        """Wait until every named process is ready (or finished), watching all launched ones
        meanwhile."""
        next_beat = time.monotonic() + self.progress_interval
        while True:
            for name in self.order:
                self.check(self.watches[name])
            pending = [self.watches[n] for n in self.order if n in names]
            pending = [w for w in pending if not w.done]
            if not pending:
                return
            now = time.monotonic()
            for w in pending:
                if w.spec.ready is not None and "alive" not in w.kinds \
                        and now - w.t0 >= w.limit:
                    raise self.fail(
                        w,
                        "timeout",
                        f"{w.spec.name} not ready after {w.spec.ready.timeout:g} s"
                        f" (waiting for {w.spec.ready.describe()})",
                        None,
                    )
            if self.cancel.requested():
                raise AgentError("cancelled", CANCEL_MESSAGE)
            if now >= next_beat:
                next_beat = now + self.progress_interval
                for w in pending:
                    self.out.emit(
                        "waiting",
                        process=w.spec.name,
                        elapsed=w.elapsed(),
                        timeout=w.limit,
                        last_line=w.follower.latest(),
                    )
            time.sleep(TICK_S)


def expand_home_workdir(procs: List[ProcSpec], raw: str, workdir: str) -> None:
    """A ``~/...`` workdir is rendered into commands as written (the workstation does not know
    the box's home); there is no shell to expand it, so the agent does it here."""
    if not raw.startswith("~"):
        return
    pattern = re.compile(re.escape(raw.rstrip("/")) + r"(?=/|$)")
    for spec in procs:
        spec.argv = [pattern.sub(lambda _m: workdir, arg) for arg in spec.argv]
        spec.env = {key: pattern.sub(lambda _m: workdir, value)
                    for key, value in spec.env.items()}
        if spec.cwd:
            spec.cwd = pattern.sub(lambda _m: workdir, spec.cwd)


LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1", "[::1]")


def ready_ports(spec: ProcSpec) -> List[int]:
    """Local ports a process will listen on, as its readiness check names them."""
    ports: List[int] = []
    ready = spec.ready
    if ready is None:
        return ports
    if ready.port is not None:
        ports.append(ready.port)
    if ready.http is not None:
        parts = urllib.parse.urlsplit(ready.http)
        if (parts.hostname or "") in LOCAL_HOSTS:
            ports.append(parts.port or (443 if parts.scheme == "https" else 80))
    return ports


def listening_pids(port: int) -> List[int]:
    """Pids with a socket listening on ``port`` (from /proc/net/tcp{,6} and /proc/*/fd)."""
    inodes: Set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    wanted = {f"socket:[{inode}]" for inode in inodes}
    pids: List[int] = []
    for st in scan_procs():
        fd_dir = f"/proc/{st.pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(os.path.join(fd_dir, fd)) in wanted:
                    pids.append(st.pid)
                    break
    return sorted(pids)


def check_ports_free(layout: Layout, procs: List[ProcSpec], previous: Optional[str],
                     stopper: Stopper, host_label: str) -> None:
    """``port_busy`` when a port a process will serve on is already taken by anything but the
    run being replaced: its readiness check would otherwise talk to the stale server."""
    owners: Optional[Owners] = None
    for spec in procs:
        for port in ready_ports(spec):
            if not probe_port(port):
                continue
            pids = listening_pids(port)
            if owners is None:
                owners = Owners(layout, stopper)
            others = [pid for pid in pids
                      if previous is None or (owners.owner(pid) or {}).get("run_id") != previous]
            if pids and not others:
                continue  # the run this deploy replaces holds it; it is stopped first
            who = "; ".join(
                f"pid {pid} ({info.get('user') or '?'}, "
                f"{str(info.get('cmdline') or info.get('comm') or '?')[:120]})"
                for pid, info in ((pid, describe_pid(pid)) for pid in others)
            ) or "a process this user cannot see"
            fix = (f"inv cleanup --host {host_label} --force-foreign "
                   + " ".join(str(pid) for pid in others)) if others else "stop it"
            raise AgentError(
                "port_busy",
                f"port {port}, where {spec.name} is to answer, is already taken by {who}; its "
                "readiness check would talk to that process instead. Nothing was stopped or "
                f"started. Free the port ({fix}) or give {spec.name} another port.",
                spec.name,
            )


def check_gpus(procs: List[ProcSpec], gpus: List[JSONDict]) -> None:
    """Every GPU index a process names must exist (only when the box reports GPUs)."""
    if not gpus:
        return
    have = sorted(g["index"] for g in gpus)
    if have == list(range(have[0], have[-1] + 1)):
        span = f"{have[0]}-{have[-1]}" if len(have) > 1 else str(have[0])
    else:
        span = ",".join(str(i) for i in have)
    for p in procs:
        for idx in p.gpus:
            if idx not in have:
                raise AgentError(
                    "gpu",
                    f"process {p.name} wants GPU {idx} but the box has {len(have)} ({span});"
                    " nothing was stopped or started. Use GPUs that exist there (or a playbook"
                    " of the same family made for this box)",
                    p.name,
                )


def check_gpus_free(audit: JSONDict, needed: Set[int], previous: Optional[str],
                    host_label: str) -> None:
    """``gpu_busy`` when a GPU the deploy needs is held by anything but ``previous``."""
    blockers = [
        h for h in audit["holders"]
        if h.get("gpu_index") in needed
        and not (h.get("owner") and h["owner"]["run_id"] == previous)
    ]
    if not blockers:
        return
    foreign = sorted({h["pid"] for h in blockers if not h.get("owner")})
    other_runs = sorted({h["owner"]["run_id"] for h in blockers if h.get("owner")})
    fixes = []
    if other_runs:
        fixes += [f"inv cleanup --host {host_label} --run {rid}" for rid in other_runs]
    if foreign:
        fixes.append(f"inv cleanup --host {host_label} --force-foreign "
                     + " ".join(str(p) for p in foreign)
                     + "  (only if you are sure they may die)")
    raise AgentError(
        "gpu_busy",
        f"GPU(s) {', '.join(str(i) for i in sorted(needed))} needed by this deploy are held by "
        f"{len(blockers)} other process(es): " + "; ".join(holder_line(h) for h in blockers)
        + ". Nothing was stopped or started. To free them: " + " ; ".join(fixes)
        + ", or give this playbook other GPUs.",
    )


def write_files(layout: Layout, files: List[FileSpec], out: Emitter) -> None:
    """Step 4: wrap.py and the request's files, each atomically (``workdir`` error naming it).

    The request's files are written through folders opened one by one with O_NOFOLLOW under
    the workdir, so a symlinked folder on the box can never carry a file out of it."""
    for f in files:  # refuse every escape before writing anything
        with contextlib.closing(WorkdirFolder(layout.workdir, f.path, create=False)):
            pass
    try:
        write_atomic(layout.wrap, WRAP_SOURCE.encode("utf-8"), 0o644)
    except OSError as exc:
        raise AgentError("workdir", f"cannot write {layout.wrap}: {exc.strerror or exc}") from None
    if files:
        out.step(f"writing {len(files)} file{'s' if len(files) != 1 else ''}")
    for f in files:
        try:
            with contextlib.closing(WorkdirFolder(layout.workdir, f.path, create=True)) as folder:
                folder.write(os.path.basename(f.path), f.data, f.mode)
        except OSError as exc:
            path = os.path.join(layout.workdir, f.path)
            raise AgentError("workdir", f"cannot write {path}: {exc.strerror or exc}") from None


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


def op_deploy(req: Request, out: Emitter) -> JSONDict:
    """Push files, stop the previous run of the playbook, launch, wait; see the protocol."""
    raw = req.raw
    playbook = get_name(raw, "playbook", "")
    run_id = get_name(raw, "run_id", "")
    secrets = get_str_dict(raw, "secrets", "")
    files_raw = raw.get("files") or []
    if not isinstance(files_raw, list):
        raise bad_request("files: must be a list")
    files = [FileSpec(f, i) for i, f in enumerate(files_raw)]
    procs_raw = raw.get("processes")
    if not isinstance(procs_raw, list):
        raise bad_request("processes: must be a list")
    procs = [ProcSpec(p, i) for i, p in enumerate(procs_raw)]
    topo_order(procs)  # validate names and dependencies now, before touching anything
    expand_home_workdir(procs, str(raw.get("workdir") or ""), req.workdir)
    wait = get_bool(raw, "wait", "", True)
    lock_timeout = get_num(raw, "lock_timeout", "", 10.0)
    progress = get_num(raw, "progress_interval", "", 1.0, positive=True)
    settle = max(0.0, get_num(raw, "settle", "", DEFAULT_SETTLE_S))
    gpu_timeout = get_num(raw, "gpu_timeout", "", GPU_WAIT_DEFAULT_S, positive=True)
    host_label = get_opt_str(raw, "host_label", "") or "HOST"
    layout = Layout(req.workdir)
    if os.path.lexists(layout.run_dir(run_id)):
        raise bad_request(f"run_id: {run_id} already exists in {layout.runs}")
    require_proc("started nothing (it could not stop what it starts)")
    ensure_workdir(layout)
    needs_gpus = any(p.gpus for p in procs)
    facts_box: List[JSONDict] = []
    facts_thread = threading.Thread(target=lambda: facts_box.append(gather_facts()), daemon=True)
    facts_thread.start()
    if needs_gpus:  # GPU indices and holders must be known before anything is touched
        facts_thread.join(30)
        facts: JSONDict = (facts_box[0] if facts_box
                           else {"gpus": [], "gpu_error": "nvidia-smi hung"})
        out.emit("facts", **facts)
        check_gpus(procs, facts["gpus"])
    else:  # nvidia-smi can take seconds on a real box: let it run while we launch
        facts = {"gpus": []}  # no GPU is named: nothing to check

    with WorkdirLock(layout, "deploy", lock_timeout):
        previous = read_pointer(layout, playbook)
        check_ports_free(layout, procs, previous, Stopper(out), host_label)
        needed = {g for p in procs for g in p.gpus}
        before: Optional[JSONDict] = None
        if needed and facts["gpus"]:
            # Refuse *before* stopping or writing anything when a GPU we need is held by
            # anything but the run this deploy replaces.
            before = gpu_audit(layout, Stopper(out, layout=layout))
            check_gpus_free(before, needed, previous, host_label)
        write_files(layout, files, out)
        if previous is not None:
            out.step(f"stopping previous run {previous}")
            stopper = Stopper(out, layout=layout)
            stop_run_by_id(layout, previous, stopper, out, None)
            if before is not None:
                release = wait_gpus_released(layout, stopper, out, {previous}, before,
                                             gpu_timeout)
                verdict = release["verdict"]
                if not verdict["released"]:
                    raise AgentError("gpu_stuck", f"{verdict.get('message')} Nothing was "
                                     "started.")
        run_dir = layout.run_dir(run_id)
        try:
            os.makedirs(run_dir)
            os.makedirs(os.path.join(run_dir, "logs"))
            os.makedirs(os.path.join(run_dir, "exit"))
        except FileExistsError:
            raise bad_request(f"run_id: {run_id} already exists in {layout.runs}") from None
        run: JSONDict = {
            "v": PROTOCOL_VERSION,
            "run_id": run_id,
            "playbook": playbook,
            "marker": f"{MARKER_KEY}={run_id}",
            "created": round(time.time(), 3),
            "status": "launching",
            "processes": [],
            "manifest": raw.get("manifest"),
        }
        deployment = Deployment(layout, out, run, procs, secrets, wait, progress, settle)
        deployment.save()
        write_atomic(layout.current(playbook), (run_id + "\n").encode())
        try:
            records = deployment.execute()
        except BaseException as exc:
            error = exc if isinstance(exc, AgentError) else internal_error(exc)
            out.step(f"deploy failed ({error.kind}); stopping what was launched")
            stopper = Stopper(out, deployment.popens, layout)
            launched = [r for r in run["processes"] if valid_record(r)]
            graces = [float(r["stop_grace"]) for r in launched] or [DEFAULT_STOP_GRACE]
            stopper.stop_run(run_id, launched, max(graces))
            run["status"] = "failed"
            run["error"] = error.to_json()
            deployment.save()
            raise
        run["status"] = "finished" if deployment.all_finished() else "running"
        run["ready_at"] = round(time.time(), 3)  # the deploy succeeded: this run really ran
        deployment.save()
    if not needs_gpus:
        facts_thread.join(15)
        if facts_box:
            out.emit("facts", **facts_box[0])
    return {"run_id": run_id, "run_dir": run_dir, "processes": records,
            "status": run["status"]}


# --------------------------------------------------------------------------- GPU audit
#
# Who holds which GPU, and is it ours? nvidia-smi --query-compute-apps gives (pid, memory,
# gpu uuid); it shows the executable, not vLLM's renamed titles, so titles come from
# /proc/PID/comm. In containers nvidia-smi often cannot see pids at all: an open
# /dev/nvidia<N> file descriptor (from /proc/PID/fd) is then the only sign of a holder.

NVIDIA_DEV_RE = re.compile(r"^/dev/nvidia(\d+)$")
GPU_WAIT_DEFAULT_S = 60.0
GPU_WAIT_BEAT_S = 2.0


def query_compute_apps() -> Tuple[List[JSONDict], Optional[str]]:
    """[{pid, used_mib, gpu_uuid, process_name}] from nvidia-smi, or ([], why not)."""
    out, error = run_nvidia_smi(
        [f"--query-compute-apps={APPS_QUERY}", "--format=csv,noheader,nounits"]
    )
    if out is None:
        return [], error
    return parse_compute_apps(out), None


def parse_compute_apps(text: str) -> List[JSONDict]:
    """Parse ``pid, used_memory, gpu_uuid, process_name`` CSV lines (noheader, nounits).

    nvidia-smi's process_name is the executable path, not vLLM's renamed title; titles come
    from /proc/PID/comm (see describe_pid). A path may contain commas: it is the rest.
    """
    apps: List[JSONDict] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 3:
            continue
        pid = _csv_int(cells[0])
        if pid is None:
            continue
        apps.append({"pid": pid, "used_mib": _csv_int(cells[1]), "gpu_uuid": cells[2],
                     "process_name": ",".join(cells[3:]).strip() or None})
    return apps


def nvidia_fd_holders() -> Dict[int, List[int]]:
    """pid → /dev/nvidia<N> minor numbers it has open (unreadable processes are skipped)."""
    out: Dict[int, List[int]] = {}
    for st in scan_procs():
        if not st.live():
            continue
        fd_dir = f"/proc/{st.pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        minors: Set[int] = set()
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            match = NVIDIA_DEV_RE.match(target)
            if match:
                minors.add(int(match.group(1)))
        if minors:
            out[st.pid] = sorted(minors)
    return out


def describe_pid(pid: int) -> JSONDict:
    """What a person needs to recognise a process: user, title, command line."""
    info: JSONDict = {"pid": pid, "user": None, "comm": None, "cmdline": None}
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        info["uid"] = uid
        try:
            import pwd

            info["user"] = pwd.getpwuid(uid).pw_name
        except (KeyError, ImportError):
            info["user"] = str(uid)
    except OSError:
        pass
    with contextlib.suppress(OSError), open(f"/proc/{pid}/comm", encoding="utf-8",
                                            errors="replace") as f:
        info["comm"] = f.read().strip()
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
        raw = b" ".join(f.read().replace(b"\0", b" ").split())  # no newlines in messages
        info["cmdline"] = raw.decode("utf-8", errors="replace")[:300]
    st = read_stat(pid)
    if st is not None:
        info["state"] = st.state
        info["pgid"] = st.pgid
    return info


class Owners:
    """Maps live pids to (run_id, process name) for every run recorded in the workdir.

    Built once per audit from the run manifests plus the markers, with the same rules the
    Stopper uses, so "ours" means the same thing in the audit and in cleanup.
    """

    def __init__(self, layout: Layout, stopper: Stopper) -> None:
        self.by_pid: Dict[int, Tuple[str, str]] = {}
        self.playbook_of: Dict[str, str] = {}
        for run_id in list_run_ids(layout):
            try:
                run = read_json(layout.run_json(run_id))
            except (OSError, ValueError):
                continue
            if not isinstance(run, dict):
                continue
            self.playbook_of[run_id] = str(run.get("playbook") or "?")
            for rec in run.get("processes") or []:
                if not valid_record(rec):
                    continue
                state = stopper.leader_state(rec)
                if state == "alive":
                    self.by_pid[rec["pid"]] = (run_id, rec["name"])
                if state != "reused":
                    for pid in stopper.members(run_id, rec, state):
                        self.by_pid.setdefault(pid, (run_id, rec["name"]))
        for st in scan_procs():
            if st.live() and st.pid not in self.by_pid and st.pid not in stopper.protected:
                run, name = stopper.markers(st)
                if run is not None:
                    self.by_pid[st.pid] = (run, name or "?")

    def owner(self, pid: int) -> Optional[JSONDict]:
        found = self.by_pid.get(pid)
        if found is None:
            return None
        return {"run_id": found[0], "process": found[1],
                "playbook": self.playbook_of.get(found[0])}


def gpu_audit(layout: Layout, stopper: Stopper) -> JSONDict:
    """Every GPU and every process holding one, each classified as ours (which run) or foreign."""
    # The two nvidia-smi queries run side by side: each costs 0.1-0.5 s on a real box.
    apps_box: List[Tuple[List[JSONDict], Optional[str]]] = []
    worker = threading.Thread(target=lambda: apps_box.append(query_compute_apps()), daemon=True)
    worker.start()
    gpus, gpu_error = query_gpus()
    fds = nvidia_fd_holders()
    worker.join(15)
    apps, apps_error = apps_box[0] if apps_box and not gpu_error else ([], None)
    owners = Owners(layout, stopper)
    by_uuid = {g["uuid"]: g for g in gpus}
    holders: List[JSONDict] = []
    seen: Set[int] = set()
    for app in apps:
        gpu = by_uuid.get(app["gpu_uuid"])
        holder = describe_pid(app["pid"])
        holder.update(
            gpu_index=gpu["index"] if gpu else None,
            gpu_uuid=app["gpu_uuid"],
            used_mib=app["used_mib"],
            source="nvidia-smi",
            owner=owners.owner(app["pid"]),
        )
        holders.append(holder)
        seen.add(app["pid"])
    for pid, minors in sorted(fds.items()):
        if pid in seen or pid in stopper.protected:
            continue
        holder = describe_pid(pid)
        holder.update(gpu_index=None, gpu_uuid=None, used_mib=None, devices=minors,
                      source="fd", owner=owners.owner(pid))
        holders.append(holder)
    return {"gpus": gpus, "holders": holders, "error": gpu_error or apps_error}


def holder_line(h: JSONDict) -> str:
    """``GPU 0: pid 812 (alice, python3 train.py, 10240 MiB)`` for messages."""
    where = f"GPU {h['gpu_index']}" if h.get("gpu_index") is not None else (
        "/dev/nvidia" + ",".join(str(m) for m in h.get("devices") or []))
    mem = f", {h['used_mib']} MiB" if h.get("used_mib") is not None else ""
    title = h.get("cmdline") or h.get("comm") or "?"
    if h.get("comm") and h.get("cmdline") and not str(h["cmdline"]).startswith(str(h["comm"])):
        title = f"[{h['comm']}] {title}"
    owner = h.get("owner")
    whose = f"run {owner['run_id']} process {owner['process']}" if owner else "not outrig's"
    return f"{where}: pid {h['pid']} ({h.get('user') or '?'}, {title[:120]}{mem}; {whose})"


def wait_gpus_released(
    layout: Layout,
    stopper: Stopper,
    out: Emitter,
    run_ids: Set[str],
    before: JSONDict,
    timeout: float,
    extra_pids: Optional[Set[int]] = None,
) -> JSONDict:
    """Wait (bounded) until no process of ``run_ids`` (or ``extra_pids``) holds a GPU and the
    memory they held is back. Returns the final audit plus a verdict and numbers."""
    extra = set(extra_pids or set())

    def ours(h: JSONDict) -> bool:
        owner = h.get("owner")
        return bool(owner and owner["run_id"] in run_ids) or h["pid"] in extra

    held_before: Dict[int, int] = {}
    for h in before["holders"]:
        if ours(h) and h.get("gpu_index") is not None and h.get("used_mib"):
            held_before[h["gpu_index"]] = held_before.get(h["gpu_index"], 0) + h["used_mib"]
    used_before = {g["index"]: g.get("memory_used_mib") or 0 for g in before["gpus"]}
    t0 = time.monotonic()
    if not any(ours(h) for h in before["holders"]):
        # Nothing of ours held a GPU before the stop, so nothing of ours can hold one now:
        # skip a second audit (two nvidia-smi runs, a /proc scan) on the common CPU-only path.
        return {"audit": before, "verdict": {
            "released": True, "seconds": 0.0, "held_before_mib": {}, "freed_mib": {},
            "still_holding": [], "memory_not_back_mib": {}, "stuck_in_kernel": []}}
    next_beat = t0 + GPU_WAIT_BEAT_S
    while True:
        stopper.reap()
        after = gpu_audit(layout, stopper)
        left = [h for h in after["holders"] if ours(h) and read_stat(h["pid"]) is not None]
        used_after = {g["index"]: g.get("memory_used_mib") or 0 for g in after["gpus"]}
        missing: Dict[int, int] = {}
        for index, held in held_before.items():
            total = next((g.get("memory_total_mib") or 0 for g in after["gpus"]
                          if g["index"] == index), 0)
            slack = max(256, total // 50)
            expected = used_before.get(index, 0) - held
            if used_after.get(index, 0) > expected + slack:
                missing[index] = used_after.get(index, 0) - expected
        if not left and not missing:
            break
        if time.monotonic() - t0 >= timeout:
            break
        if time.monotonic() >= next_beat:
            next_beat += GPU_WAIT_BEAT_S
            out.emit("gpu_wait", elapsed=round(time.monotonic() - t0, 1), timeout=timeout,
                     holders=len(left), missing_mib=sum(missing.values()))
        time.sleep(0.5)
    stuck = [h for h in left if (h.get("state") or "") == "D"]
    freed = {
        index: max(0, used_before.get(index, 0) - used_after.get(index, 0))
        for index in held_before
    }
    verdict: JSONDict = {
        "released": not left and not missing,
        "seconds": round(time.monotonic() - t0, 2),
        "held_before_mib": held_before,
        "freed_mib": freed,
        "still_holding": left,
        "memory_not_back_mib": missing,
        "stuck_in_kernel": [h["pid"] for h in stuck],
    }
    if left:
        verdict["message"] = (
            f"{len(left)} process(es) of ours still hold a GPU after {timeout:g} s: "
            + "; ".join(holder_line(h) for h in left)
            + (". Processes in D state are stuck in the kernel (usually the GPU driver): only "
               "a reboot frees them." if stuck else "")
        )
    elif missing:
        verdict["message"] = (
            "no process of ours holds a GPU any more, but memory did not come back on "
            + ", ".join(f"GPU {i} ({mib} MiB)" for i, mib in sorted(missing.items()))
            + f" within {timeout:g} s. Look at `nvidia-smi`; if no process is listed, the "
            "driver is holding it (a process stuck in D state): only a reboot frees it."
        )
    return {"audit": after, "verdict": verdict}


def force_kill_foreign(pids: List[int], stopper: Stopper, out: Emitter,
                       grace: float = 10.0) -> List[JSONDict]:
    """Kill exactly the pids the user listed with --force-foreign, after saying what each is."""
    results: List[JSONDict] = []
    targets: List[Tuple[int, int]] = []
    for pid in pids:
        st = read_stat(pid)
        info = describe_pid(pid)
        if st is None or not st.live():
            results.append({**info, "how": "gone"})
            continue
        if pid in stopper.protected or pid <= 1:
            results.append({**info, "how": "refused",
                            "why": "it is the agent, its SSH session or init"})
            out.warning(f"--force-foreign {pid}: refused: it is the agent, its SSH session or "
                        "init")
            continue
        out.emit("force_kill", pid=pid, user=info.get("user"), comm=info.get("comm"),
                 cmdline=info.get("cmdline"))
        stopper.kill(pid, signal.SIGTERM)
        targets.append((pid, st.start_ticks))
    deadline = time.monotonic() + grace
    t0 = time.monotonic()
    pending = list(targets)
    while pending and time.monotonic() < deadline:
        pending = [(p, t) for p, t in pending if _same_live(p, t)]
        time.sleep(POLL_S)
    for pid, ticks in targets:
        how = "term"
        if _same_live(pid, ticks):
            stopper.kill(pid, signal.SIGKILL)
            how = "kill"
        end = time.monotonic() + KILL_WAIT_S
        while _same_live(pid, ticks) and time.monotonic() < end:
            time.sleep(POLL_S)
        results.append({**describe_pid(pid), "pid": pid, "how": how,
                        "seconds": round(time.monotonic() - t0, 2),
                        "alive": _same_live(pid, ticks)})
    return results


def _same_live(pid: int, ticks: int) -> bool:
    st = read_stat(pid)
    return st is not None and st.start_ticks == ticks and st.live()


# --------------------------------------------------------------------------- other ops


def op_cleanup(req: Request, out: Emitter) -> JSONDict:
    """Stop the chosen run(s): run_id, else the playbook's current run, else (all) every run.

    Around the stop: a GPU audit before (who holds what, ours or foreign), the optional
    ``force_foreign`` pids the user named, then a bounded wait until no process of the stopped
    runs holds a GPU and the memory they held is back. ``dry_run`` only reports.
    """
    raw = req.raw
    playbook = get_opt_name(raw, "playbook", "")
    run_id = get_opt_name(raw, "run_id", "")
    everything = get_bool(raw, "all", "", False)
    dry_run = get_bool(raw, "dry_run", "", False)
    lock_timeout = get_num(raw, "lock_timeout", "", 10.0)
    gpu_timeout = get_num(raw, "gpu_timeout", "", GPU_WAIT_DEFAULT_S, positive=True)
    force = raw.get("force_foreign") or []
    if not isinstance(force, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in force
    ):
        raise bad_request("force_foreign: must be a list of positive pids")
    sweep_grace: Optional[float] = None
    if raw.get("stop_grace") is not None:  # extension: grace for the marker sweep
        sweep_grace = get_num(raw, "stop_grace", "", DEFAULT_STOP_GRACE)
    if run_id is None and playbook is None and not everything and not force:
        raise bad_request("cleanup: give run_id, playbook, all: true or force_foreign")
    layout = Layout(req.workdir)
    require_proc("cleanup stopped nothing (what was launched may still be running)")
    stopper = Stopper(out, layout=None if dry_run else layout)  # a dry run records nothing
    workdir_for_cleanup(layout, stopper)
    before = gpu_audit(layout, stopper)
    if run_id is not None:
        targets = [run_id]
    elif playbook is not None:
        current = read_pointer(layout, playbook)
        if current is None:
            out.warning(f"playbook {playbook} has no current run; nothing to stop")
        targets = [current] if current is not None else []
    elif everything:
        targets = runs_to_stop(layout)
    else:
        targets = []
    if dry_run:
        return {"dry_run": True, "runs": [would_stop(layout, rid, stopper) for rid in targets],
                "force_foreign": [describe_pid(p) for p in force], "gpus_before": before}
    with cleanup_lock(layout, lock_timeout, stopper):
        runs = []
        for rid in targets:
            out.step(f"stopping run {rid}")
            runs.append(stop_run_by_id(layout, rid, stopper, out, sweep_grace))
        forced = force_kill_foreign(force, stopper, out) if force else []
    if targets or force:
        out.step("checking that the GPUs are released")
    release = wait_gpus_released(layout, stopper, out, set(targets), before, gpu_timeout,
                                 extra_pids=set(force))
    unproven = unproven_holders(layout, targets, release["audit"], stopper)
    host_label = get_opt_str(raw, "host_label", "") or "HOST"
    if unproven:
        verdict = release["verdict"]
        verdict["released"] = False
        verdict["unproven"] = unproven
        verdict["message"] = (
            (str(verdict["message"]) + " " if verdict.get("message") else "")
            + f"{len(unproven)} process(es) started while the run was up hold its GPUs, and "
            "outrig cannot prove whether they are its own (no group, session, cgroup, marker "
            "or parent of the run leads to them), so they were left running: "
            + "; ".join(holder_line(h) for h in unproven)
            + f". If they are the run's, stop them with: inv cleanup --host {host_label} "
            "--force-foreign "
            + " ".join(str(h["pid"]) for h in unproven))
    if stopper.unrecorded:
        out.warning("stopped, but could not record: " + "; ".join(stopper.unrecorded))
    return {"runs": runs, "forced": forced, "gpus_before": before,
            "gpus_after": release["audit"], "gpu": release["verdict"],
            "not_recorded": list(stopper.unrecorded)}


FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)


def workdir_for_cleanup(layout: Layout, stopper: Stopper) -> None:
    """Like ensure_workdir, but a full (or read-only) workdir does not stop a cleanup.

    The job that filled the disk is exactly what the user needs to stop; everything cleanup
    writes (run.json status, exit files, the lock note) is bookkeeping it can do without."""
    exc = workdir_error(layout)
    if exc is None:
        return
    if exc.errno not in FULL_DISK_ERRNOS or not os.path.isdir(layout.workdir):
        ensure_workdir(layout)  # raises the usual ``workdir`` error
        return
    stopper.out.warning(f"{layout.workdir} is not writable ({exc.strerror}): stopping anyway;"
                        " what cleanup records there may be lost")


@contextlib.contextmanager
def cleanup_lock(layout: Layout, timeout: float, stopper: Stopper) -> Iterator[None]:
    """The workdir lock for cleanup; a lock file that cannot be created (full disk) is noted
    and the stop goes on unlocked (a deploy cannot write there either)."""
    lock = WorkdirLock(layout, "cleanup", timeout)
    try:
        lock.__enter__()
    except OSError as exc:
        if exc.errno not in FULL_DISK_ERRNOS:
            raise
        stopper.unrecorded.append(f"the workdir lock {layout.lock} ({exc.strerror or exc}): "
                                  "stopped without holding it")
        yield
        return
    try:
        if lock.unrecorded:
            stopper.unrecorded.append(lock.unrecorded)
        yield
    finally:
        lock.__exit__(None, None, None)


def unproven_holders(layout: Layout, run_ids: List[str], audit: JSONDict,
                     stopper: Stopper) -> List[JSONDict]:
    """GPU holders that may be the stopped runs' but cannot be proven so.

    A process holding one of a run's GPUs, started after the run's first process (same boot),
    owned by no run: a child that cleared its markers and left the session, whose parent is
    gone. It is not killed (it cannot be proven ours), but cleanup must not call this done."""
    gpus: Set[int] = set()
    first: Optional[int] = None
    for run_id in run_ids:
        run: Any = None
        with contextlib.suppress(OSError, ValueError):
            run = read_json(layout.run_json(run_id))
        records = run.get("processes") if isinstance(run, dict) else None
        for rec in records if isinstance(records, list) else []:
            if not valid_record(rec) or rec.get("boot_id") not in (None, stopper.boot):
                continue
            first = rec["start_ticks"] if first is None else min(first, rec["start_ticks"])
            gpus |= {g for g in rec.get("gpus") or [] if isinstance(g, int)}
    if first is None or not gpus:
        return []
    out: List[JSONDict] = []
    for h in audit.get("holders") or []:
        if h.get("owner") is not None or h["pid"] in stopper.protected:
            continue
        on = {h["gpu_index"]} if h.get("gpu_index") is not None else set(h.get("devices") or [])
        st = read_stat(h["pid"])
        if on & gpus and st is not None and st.live() and st.start_ticks >= first:
            out.append(h)
    return out


def would_stop(layout: Layout, run_id: str, stopper: Stopper) -> JSONDict:
    """Dry run: what stopping ``run_id`` would signal (leaders, group members, marked)."""
    run = None
    with contextlib.suppress(OSError, ValueError):
        run = read_json(layout.run_json(run_id))
    procs: List[JSONDict] = []
    if isinstance(run, dict):
        for rec in run.get("processes") or []:
            if not valid_record(rec):
                continue
            state = stopper.leader_state(rec)
            members = sorted(stopper.members(run_id, rec, state)) if state != "reused" else []
            procs.append({"process": rec["name"], "pid": rec["pid"], "leader": state,
                          "members": members})
    return {"run_id": run_id, "processes": procs, "marked": sorted(stopper.marked(run_id)),
            "known": isinstance(run, dict)}


def list_run_ids(layout: Layout) -> List[str]:
    """Run directories under runs/, sorted by name (run ids start with a timestamp)."""
    try:
        names = os.listdir(layout.runs)
    except OSError:
        return []
    return sorted(n for n in names if NAME_RE.match(n) and os.path.isdir(layout.run_dir(n)))


def runs_to_stop(layout: Layout) -> List[str]:
    """For ``all``: every run not already ``stopped`` (unreadable ones too), newest first."""
    ids = set(all_pointers(layout).values())
    for rid in list_run_ids(layout):
        try:
            run = read_json(layout.run_json(rid))
            if isinstance(run, dict) and run.get("status") == "stopped":
                continue
        except (OSError, ValueError):
            pass
        ids.add(rid)
    return sorted(ids, reverse=True)


def run_secrets(run: JSONDict, stopper: Stopper) -> List[str]:
    """The values of a run's secrets, read from its live processes' environments (the box keeps
    only their names, ``secret_keys``), so that log text shipped from the box is redacted. A run
    whose processes are all gone yields nothing here; the workstation redacts with its own."""
    values: Set[str] = set()
    for rec in run.get("processes") or []:
        keys = rec.get("secret_keys") if isinstance(rec, dict) else None
        if not keys or not valid_record(rec) or stopper.leader_state(rec) != "alive":
            continue
        try:
            with open(f"/proc/{rec['pid']}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        for item in environ:
            key, _, value = item.decode("utf-8", "replace").partition("=")
            if key in keys and value:
                values.add(value)
    return sorted(values, key=len, reverse=True)


def run_secret_keys(run: JSONDict) -> List[str]:
    """Names of the secrets a run's processes were given (never their values)."""
    keys: Set[str] = set()
    for rec in run.get("processes") or []:
        names = rec.get("secret_keys") if isinstance(rec, dict) else None
        if isinstance(names, list):
            keys.update(k for k in names if isinstance(k, str))
    return sorted(keys)


def process_state(rec: JSONDict, stopper: Stopper, log_lines: int,
                  secrets: Optional[List[str]] = None) -> JSONDict:
    """One process's state for ``status``: running / exited / killed / gone."""
    now = time.time()
    state = "gone"
    exit_code: Optional[int] = None
    sig: Optional[int] = None
    uptime: Optional[float] = None
    ready: Optional[bool] = None
    if valid_record(rec) and stopper.leader_state(rec) == "alive":
        state = "running"
        started = rec.get("started_at")
        if isinstance(started, (int, float)):
            uptime = round(now - started, 1)
        spec = rec.get("ready")
        if isinstance(spec, dict):
            checks = []
            if isinstance(spec.get("http"), str):
                checks.append(probe_http(spec["http"]))
            port = spec.get("port")
            if isinstance(port, int) and not isinstance(port, bool):
                checks.append(probe_port(port))
            if checks:
                ready = all(checks)
    else:
        exit_file = rec.get("exit_file")
        status = read_exit_file(exit_file) if isinstance(exit_file, str) else None
        if status is not None:
            exit_code, sig = status
            state = "killed" if sig is not None else "exited"
    log = rec.get("log")
    return {
        "name": rec.get("name"),
        "pid": rec.get("pid"),
        "state": state,
        "exit_code": exit_code,
        "signal": sig,
        "uptime": uptime,
        "ready": ready,
        "log_tail": tail_lines(log, log_lines, secrets) if isinstance(log, str) else [],
    }


def resolve_run(layout: Layout, playbook: Optional[str], run_id: Optional[str]) -> str:
    """The run named by run_id, else by the playbook's current pointer (``not_found``)."""
    if run_id is not None:
        if not os.path.isdir(layout.run_dir(run_id)):
            raise AgentError("not_found", f"no run {run_id} in {layout.runs}")
        return run_id
    assert playbook is not None
    current = read_pointer(layout, playbook)
    if current is None:
        raise AgentError("not_found", f"playbook {playbook} has no current run in {layout.workdir}")
    return current


def op_status(req: Request, out: Emitter) -> JSONDict:
    """What runs and how each process is doing, with a short log tail."""
    raw = req.raw
    playbook = get_opt_name(raw, "playbook", "")
    run_id = get_opt_name(raw, "run_id", "")
    log_lines = get_int(raw, "log_lines", "", 5, 0, 10000)
    # Extensions for `inv status` (docs/logs-and-status.md): raw progress text, GPU holders.
    progress_bytes = get_int(raw, "progress_bytes", "", 0, 0, 1 << 20)
    markers = get_str_list(raw, "markers", "")
    want_gpus = get_bool(raw, "gpu_holders", "", False)
    layout = Layout(req.workdir)
    require_proc("cannot tell which of its processes run")
    if run_id is not None or playbook is not None:
        targets = [(playbook, resolve_run(layout, playbook, run_id))]
    else:
        targets = [(pb, rid) for pb, rid in all_pointers(layout).items()]
    stopper = Stopper(out, layout=layout)
    runs = []
    for pb, rid in targets:
        run = load_run(layout, rid, out)
        if run is None:
            unknown: JSONDict = {"run_id": rid, "playbook": pb, "status": "unknown"}
            unknown.update({"created": None, "processes": []})
            runs.append(unknown)
            continue
        procs = []
        hidden = run_secrets(run, stopper)
        for rec in run["processes"]:
            if valid_record(rec) and stopper.leader_state(rec) == "alive":
                stopper.members(rid, rec, "alive")  # recorded as seen, for a later cleanup
            if isinstance(rec, dict):
                proc_state = process_state(rec, stopper, log_lines, hidden)
                proc_state.update(status_extras(rec, proc_state, progress_bytes, markers,
                                                hidden))
                procs.append(proc_state)
        runs.append(
            {
                "run_id": rid,
                "playbook": run.get("playbook", pb),
                "status": run.get("status"),
                "created": run.get("created"),
                "error": run.get("error"),
                "secret_keys": run_secret_keys(run),
                "processes": procs,
            }
        )
    if not want_gpus:
        return {"facts": gather_facts(), "runs": runs}
    audit = gpu_audit(layout, stopper)
    facts = gather_facts()
    return {"facts": facts, "runs": runs, "gpu_holders": audit["holders"],
            "gpu_audit_error": audit["error"]}


def op_logs(req: Request, out: Emitter) -> JSONDict:
    """The last N lines of the run's process logs (read from the end of each file)."""
    raw = req.raw
    playbook = get_opt_name(raw, "playbook", "")
    run_id = get_opt_name(raw, "run_id", "")
    if playbook is None and run_id is None:
        raise bad_request("logs: give run_id or playbook")
    lines = get_int(raw, "lines", "", 50, 0, 1000000)
    wanted: Optional[List[str]] = None
    if raw.get("processes") is not None:
        wanted = get_str_list(raw, "processes", "")
    layout = Layout(req.workdir)
    rid = resolve_run(layout, playbook, run_id)
    run = load_run(layout, rid, out)
    paths: Dict[str, str] = {}
    hidden = run_secrets(run, Stopper(out)) if run is not None else []
    if run is not None:
        for rec in run["processes"]:
            if isinstance(rec, dict) and isinstance(rec.get("name"), str):
                log = rec.get("log")
                paths[rec["name"]] = log if isinstance(log, str) else ""
    else:  # fall back to whatever logs exist
        logs_dir = os.path.join(layout.run_dir(rid), "logs")
        try:
            for fname in sorted(os.listdir(logs_dir)):
                if fname.endswith(".log"):
                    paths[fname[: -len(".log")]] = os.path.join(logs_dir, fname)
        except OSError:
            pass
    if wanted is not None:
        unknown = [n for n in wanted if n not in paths]
        if unknown:
            have = ", ".join(sorted(paths)) or "none"
            raise AgentError(
                "not_found", f"run {rid} has no process {', '.join(unknown)} (it has {have})"
            )
        paths = {n: paths[n] for n in wanted}
    return {"run_id": rid, "secret_keys": run_secret_keys(run) if run is not None else [],
            "logs": {n: tail_lines(p, lines, hidden) if p else [] for n, p in paths.items()}}


def nearest_existing(path: str) -> str:
    """The path itself or its closest existing ancestor (for statvfs and access checks)."""
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def op_check(req: Request, out: Emitter) -> JSONDict:
    """Facts, whether the workdir is writable, free disk, python version. Creates nothing."""
    facts = gather_facts()
    out.emit("facts", **facts)
    base = nearest_existing(req.workdir)
    writable = False
    if os.path.isdir(req.workdir):
        probe = os.path.join(req.workdir, f".outrig-probe.{os.getpid()}")
        try:
            with open(probe, "wb") as f:
                f.write(b"ok")
            os.unlink(probe)
            writable = True
        except OSError:
            writable = False
    elif os.path.isdir(base):
        writable = os.access(base, os.W_OK | os.X_OK)
    try:
        st = os.statvfs(base)
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = 0
    return {
        "workdir_writable": writable,
        "disk_free_bytes": free,
        "python": platform.python_version(),
        "facts": facts,
    }


# --------------------------------------------------------------------------- model_facts


def hf_cache_snapshot(model_id: str) -> Optional[str]:
    """The local snapshot dir of a hub id in the HF cache (refs/main, else the newest)."""
    cache = os.environ.get("HF_HUB_CACHE")
    if not cache:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.path.expanduser("~"), ".cache", "huggingface")
        cache = os.path.join(home, "hub")
    repo = os.path.join(cache, "models--" + model_id.replace("/", "--"))
    snapshots = os.path.join(repo, "snapshots")
    try:
        with open(os.path.join(repo, "refs", "main")) as f:
            ref = f.read().strip()
        if ref and os.path.isdir(os.path.join(snapshots, ref)):
            return os.path.join(snapshots, ref)
    except OSError:
        pass
    try:
        dirs = [os.path.join(snapshots, d) for d in os.listdir(snapshots)]
    except OSError:
        return None
    dirs = [d for d in dirs if os.path.isdir(d)]
    return max(dirs, key=os.path.getmtime) if dirs else None


def model_report(model: str) -> JSONDict:
    """Layer count and weight bytes of one model, read from its files (nothing is loaded).

    ``model`` is an absolute path, or a hub id looked up in the HF cache. Layers come from
    config.json (``text_config`` for vision-language models); weight bytes from
    model.safetensors.index.json's ``metadata.total_size``, else the *.safetensors sizes.
    """
    path = model if os.path.isabs(model) else hf_cache_snapshot(model)
    report: JSONDict = {"model": model, "path": path, "exists": False,
                        "num_hidden_layers": None, "weight_bytes": None, "problems": []}
    if path is None or not os.path.isdir(path):
        return report
    report["exists"] = True
    try:
        config = read_json(os.path.join(path, "config.json"))
        layers = config.get("num_hidden_layers")
        text = config.get("text_config")
        if not isinstance(layers, int) and isinstance(text, dict):
            layers = text.get("num_hidden_layers")
        vocab = config.get("vocab_size")
        if not isinstance(vocab, int) and isinstance(text, dict):
            vocab = text.get("vocab_size")
        if isinstance(vocab, int) and not isinstance(vocab, bool):
            report["vocab_size"] = vocab
        hidden = config.get("hidden_size")
        if not isinstance(hidden, int) and isinstance(text, dict):
            hidden = text.get("hidden_size")
        if isinstance(hidden, int) and not isinstance(hidden, bool):
            report["hidden_size"] = hidden
        if isinstance(layers, int) and not isinstance(layers, bool):
            report["num_hidden_layers"] = layers
        else:
            report["problems"].append("config.json has no num_hidden_layers")
    except (OSError, ValueError, AttributeError) as exc:
        report["problems"].append(f"config.json unreadable: {exc}")
    try:
        index = read_json(os.path.join(path, "model.safetensors.index.json"))
        total = index["metadata"]["total_size"]
        if isinstance(total, int) and total > 0:
            report["weight_bytes"] = total
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if report["weight_bytes"] is None:
        try:
            sizes = [os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)
                     if n.endswith(".safetensors")]
        except OSError:
            sizes = []
        if sizes:
            report["weight_bytes"] = sum(sizes)
    return report


# Run by each probed interpreter: package versions from their metadata and whether torchrun
# takes --shutdown-timeout, read from torch's own source text. Nothing is imported that would
# cost seconds (torch itself is only located, not imported).
ENV_PROBE_SOURCE = r"""
import json, os, sys
out = {"python": sys.executable, "versions": {}, "torchrun_shutdown_timeout": None}
try:
    from importlib import metadata
    for dist in ("torch", "speculators", "transformers", "vllm"):
        try:
            out["versions"][dist] = metadata.version(dist)
        except Exception:
            pass
except Exception:
    pass
try:
    import importlib.util
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.submodule_search_locations:
        run_py = os.path.join(list(spec.submodule_search_locations)[0], "distributed", "run.py")
        with open(run_py, encoding="utf-8", errors="replace") as f:
            out["torchrun_shutdown_timeout"] = "--shutdown-timeout" in f.read()
except Exception:
    pass
print(json.dumps(out))
"""


def env_report(python: str) -> JSONDict:
    """Versions of torch, speculators, transformers and vllm in one interpreter's env."""
    report: JSONDict = {"python": python, "found": False, "versions": {},
                        "torchrun_shutdown_timeout": None, "problems": []}
    try:
        proc = subprocess.run([python, "-c", ENV_PROBE_SOURCE], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        report["problems"].append(f"cannot run {python}: {exc}")
        return report
    try:
        data = json.loads(proc.stdout.decode("utf-8", errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        err = proc.stderr.decode("utf-8", errors="replace").strip()[-300:]
        report["problems"].append(f"{python} exited {proc.returncode}: {err}")
        return report
    report.update(found=True, versions=data.get("versions") or {},
                  torchrun_shutdown_timeout=data.get("torchrun_shutdown_timeout"))
    return report


def op_model_facts(req: Request, out: Emitter) -> JSONDict:
    """Read-only: the box's facts, each requested model's layers, size and existence, and the
    package versions of each requested interpreter."""
    models = get_str_list(req.raw, "models", "")
    pythons = get_str_list(req.raw, "pythons", "")
    if not models and not pythons:
        raise bad_request("models: list at least one model (or pythons: an interpreter)")
    facts = gather_facts()
    out.emit("facts", **facts)
    return {"models": [model_report(m) for m in models],
            "envs": [env_report(p) for p in pythons]}


# --------------------------------------------------------------------------- provision, hub
#
# ``op: provision`` makes the playbook's Python environments exist on the box with their pinned
# versions, and checks python, driver and disk against the playbook's ``requires:``. Finding out
# what is already right costs one subprocess per environment (its interpreter lists what it has
# installed), so a re-run on a provisioned box is one exec and a fraction of a second.
# ``op: hub_download`` makes the box fetch a model or data set from the hub itself (with the HF
# token from ``secrets`` in the child's environment only), so 50 GB never cross the slow link.
# Both stream child output as throttled ``progress`` events (docs/provision.md).

VERSION_CLAUSE_RE = re.compile(r"^(===|==|!=|~=|>=|<=|>|<)\s*([A-Za-z0-9.*+!_-]+)$")
REQUIREMENT_RE = re.compile(
    r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(\[[^\]]*\])?\s*(.*)$")
HUB_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
CHILD_EXCERPT_KEEP = 200  # lines of child output kept for error classification
PROVISION_LOCK_DEFAULT_S = 30.0
HUB_CONNECT_TIMEOUT_S = 5.0

# What the environment's own interpreter says it has: every installed distribution (first on
# sys.path wins, as for import), its version, and whether pip is there. Python 3.8+.
ENV_CHECK_SCRIPT = r"""
import json, re, sys
import importlib.util
packages = {}
try:
    from importlib import metadata
    for dist in metadata.distributions():
        try:
            name = dist.metadata["Name"]
        except Exception:
            name = None
        if name:
            packages.setdefault(re.sub(r"[-_.]+", "-", name).lower(), dist.version)
except ImportError:
    pass
print(json.dumps({"python": "%d.%d.%d" % sys.version_info[:3], "packages": packages,
                  "pip": importlib.util.find_spec("pip") is not None}))
"""
# The base interpreter a venv would be made from: its version, and whether ``-m venv`` can work
# (Debian and Ubuntu ship ensurepip separately, in python3-venv / python3.X-venv).
BASE_PROBE_SCRIPT = r"""
import json, sys
try:
    import venv, ensurepip
    ok = True
except ImportError:
    ok = False
print(json.dumps({"python": "%d.%d.%d" % sys.version_info[:3],
                  "short": "%d.%d" % sys.version_info[:2], "venv": ok}))
"""

NO_INTERNET_PATTERNS = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "nodename nor servname",
    "Network is unreachable",
    "No route to host",
    "Connection refused",
    "ConnectTimeoutError",
    "Connection timed out",
    "Max retries exceeded",
    "connection broken by",
    "Could not fetch URL",
    "Read timed out",
    "ProxyError",
    "ConnectionError",
    "We couldn't connect to",
    "OfflineModeIsEnabled",
)
DISK_PATTERNS = ("No space left on device", "[Errno 28]", "Disk quota exceeded")


def version_key(text: str) -> Optional[Tuple[Tuple[int, ...], int, str]]:
    """An orderable key for a version string: release numbers (trailing zeros dropped), then
    pre-release (-1) < final (0) < post (1), then the rest. A local label (``+cu130``) is
    dropped. Good enough for pins and driver/python versions; not full PEP 440."""
    public = text.strip().lower().split("+", 1)[0]
    if public.startswith("v"):
        public = public[1:]
    match = re.match(r"^(\d+(?:\.\d+)*)(.*)$", public)
    if match is None:
        return None
    release = [int(x) for x in match.group(1).split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    rest = match.group(2).lstrip(".-_")
    tag = 0 if not rest else (1 if rest.startswith(("post", "rev")) else -1)
    return tuple(release), tag, rest


def version_satisfies(version: str, spec: str) -> Optional[bool]:
    """Whether ``version`` meets ``spec`` (``>=3.10``, ``==0.33.0``, ``>=1,<2``, ``==2.*``);
    None when either cannot be read."""
    have = version_key(version)
    if have is None:
        return None
    for clause in [c.strip() for c in spec.split(",") if c.strip()]:
        match = VERSION_CLAUSE_RE.match(clause)
        if match is None:
            return None
        op, want_text = match.group(1), match.group(2)
        if op == "===":
            if version.strip() != want_text:
                return False
            continue
        if want_text.endswith(".*"):
            parts = want_text[:-2].split(".")
            if op not in ("==", "!=") or not all(x.isdigit() for x in parts):
                return None
            want_rel = [int(x) for x in parts]
            have_rel = list(have[0]) + [0] * len(want_rel)
            if (have_rel[: len(want_rel)] == want_rel) != (op == "=="):
                return False
            continue
        want = version_key(want_text)
        if want is None:
            return None
        if op == "==" and "+" in want_text:
            ok = version.strip().lower() == want_text.lower()
        elif op == "==":
            ok = have == want
        elif op == "!=":
            ok = have != want
        elif op == ">=":
            ok = have >= want
        elif op == "<=":
            ok = have <= want
        elif op == ">":
            ok = have > want
        elif op == "<":
            ok = have < want
        else:  # ~=: >= want, and the same release prefix without its last number
            prefix_len = max(1, len(want[0]) - 1)
            padded = list(have[0]) + [0] * max(0, prefix_len - len(have[0]))
            ok = have >= want and padded[:prefix_len] == list(want[0][:prefix_len])
        if not ok:
            return False
    return True


def normalize_dist(name: str) -> str:
    """PEP 503 name normalization (``Foo_Bar`` → ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


class Requirement(NamedTuple):
    """One ``packages:`` entry as far as checking it goes: name and version specifier."""

    text: str
    name: str  # normalized
    spec: str  # "" when any version will do (or a direct URL)


def parse_requirement(text: str, where: str) -> Requirement:
    """``vllm==0.33.0``, ``torch>=2.9,<2.15``, ``pkg[extra]==1``, ``pkg @ URL``, ``pkg; marker``."""
    body = text.split(";", 1)[0].strip()
    match = REQUIREMENT_RE.match(body)
    if match is None or text.strip().startswith("-"):
        raise bad_request(
            f"{where}: {text!r} is not a requirement like 'vllm==0.33.0' (pip options go in "
            "pip_args)"
        )
    rest = match.group(3).strip()
    if rest.startswith("@"):
        rest = ""
    elif rest and version_satisfies("1", rest) is None:
        raise bad_request(f"{where}: cannot read the version specifier {rest!r} of {text!r}")
    return Requirement(text=text.strip(), name=normalize_dist(match.group(1)), spec=rest)


class EnvSpec:
    """One environment of a provision request, validated."""

    def __init__(self, raw: Any, index: int) -> None:
        where = f"environments[{index}]."
        if not isinstance(raw, dict):
            raise bad_request(f"environments[{index}]: must be an object")
        self.name = get_name(raw, "name", where)
        path = os.path.expanduser(get_str(raw, "path", where))
        if not os.path.isabs(path) or "\0" in path:
            raise bad_request(f"{where}path: {path!r} must be an absolute path (or start with ~)")
        self.path = os.path.normpath(path)
        self.python = get_opt_str(raw, "python", where) or "python3"
        self.packages = [parse_requirement(p, f"{where}packages")
                         for p in get_str_list(raw, "packages", where)]
        self.index_url = get_opt_str(raw, "index_url", where)
        self.extra_index_urls = get_str_list(raw, "extra_index_urls", where)
        self.find_links = get_str_list(raw, "find_links", where)
        self.no_index = get_bool(raw, "no_index", where, False)
        self.pip_args = get_str_list(raw, "pip_args", where)

    @property
    def env_python(self) -> str:
        """The environment's own interpreter."""
        return os.path.join(self.path, "bin", "python")

    def pip_argv(self) -> List[str]:
        """``pip install`` with this environment's index options and every package."""
        argv = [self.env_python, "-m", "pip", "install", "--disable-pip-version-check",
                "--no-input"]
        if self.index_url:
            argv += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            argv += ["--extra-index-url", url]
        for link in self.find_links:
            argv += ["--find-links", link]
        if self.no_index:
            argv.append("--no-index")
        return argv + self.pip_args + [p.text for p in self.packages]


def redact(line: str, secrets: List[str]) -> str:
    """A line with every secret value replaced by ``***`` (a child may echo its environment)."""
    for value in secrets:
        if value and value in line:
            line = line.replace(value, "***")
    return line


def run_streaming(argv: List[str], out: Emitter, interval: float, fields: JSONDict,
                  env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
                  secrets: Optional[List[str]] = None) -> Tuple[int, List[str]]:
    """Run a child with stdout+stderr merged, splitting its output on ``\\n`` and ``\\r`` (tqdm
    and pip redraw bars with ``\\r``), and emit ``progress`` events at most every ``interval``
    seconds with the newest line; also when it is silent, so the workstation knows the link is
    alive during a long wheel build. Returns (exit code, the last lines)."""
    import collections
    import select

    hidden = [s for s in (secrets or []) if s]
    started = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, cwd=cwd)
    except OSError as exc:
        return 127, [f"cannot run {argv[0]}: {exc.strerror or exc}"]
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    lines: Any = collections.deque(maxlen=CHILD_EXCERPT_KEEP)
    pending = b""
    last_emit = started
    last_line = ""
    eof = False
    while not eof:
        ready, _, _ = select.select([fd], [], [], min(interval, 0.5))
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                eof = True
            pending += chunk
            parts = re.split(rb"[\r\n]", pending)
            pending = b"" if eof else parts.pop()
            for part in parts:
                text = clean_line(part, hidden).strip()
                if text:
                    lines.append(text)
                    last_line = text
        now = time.monotonic()
        if now - last_emit >= interval and not eof:
            last_emit = now
            out.emit("progress", elapsed=round(now - started, 1), line=last_line, **fields)
    code = proc.wait()
    return code, list(lines)


def classify_child_failure(lines: List[str]) -> Optional[str]:
    """``no_internet`` or ``disk`` when the output says so, else None."""
    text = "\n".join(lines)
    if any(p in text for p in DISK_PATTERNS):
        return "disk"
    if any(p in text for p in NO_INTERNET_PATTERNS):
        return "no_internet"
    return None


def probe_json(argv: List[str], timeout: float = 60.0) -> Tuple[Optional[JSONDict], str]:
    """Run a small probe that prints one JSON object: (object, "") or (None, why not)."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} did not answer within {timeout:g} s"
    except OSError as exc:
        return None, f"cannot run {argv[0]}: {exc.strerror or exc}"
    text = proc.stdout.decode("utf-8", errors="replace").strip()
    if proc.returncode == 0 and text:
        try:
            data = json.loads(text.splitlines()[-1])
            if isinstance(data, dict):
                return data, ""
        except ValueError:
            pass
    err = (proc.stderr.decode("utf-8", errors="replace") + text).strip().splitlines()
    return None, f"{argv[0]} failed (exit {proc.returncode}): {err[-1] if err else 'no output'}"


def inspect_env(env: EnvSpec) -> JSONDict:
    """What the environment has now: {exists, python, pip, versions, wrong: {pkg: have|None},
    error}. One subprocess (the environment's interpreter), none when it does not exist."""
    state: JSONDict = {"exists": False, "python": None, "pip": False, "versions": {},
                       "wrong": {}, "error": None}
    if not os.path.exists(env.env_python):
        state["wrong"] = {p.name: None for p in env.packages}
        return state
    state["exists"] = True
    data, why = probe_json([env.env_python, "-c", ENV_CHECK_SCRIPT])
    if data is None:
        state["error"] = why
        state["wrong"] = {p.name: None for p in env.packages}
        return state
    listed = data.get("packages")
    installed: JSONDict = listed if isinstance(listed, dict) else {}
    state["python"] = data.get("python")
    state["pip"] = bool(data.get("pip"))
    for req in env.packages:
        have = installed.get(req.name)
        if isinstance(have, str):
            state["versions"][req.name] = have
        good = isinstance(have, str) and (not req.spec or version_satisfies(have, req.spec) is True)
        if not good:
            state["wrong"][req.name] = have if isinstance(have, str) else None
    return state


def parse_requires(raw: JSONDict) -> JSONDict:
    """``requires: {python, driver, disk_gb}``, validated."""
    req = get_dict(raw, "requires", "")
    out: JSONDict = {"python": get_opt_str(req, "python", "requires."),
                     "driver": get_opt_str(req, "driver", "requires."),
                     "disk_gb": None}
    for key in ("python", "driver"):
        spec = out[key]
        if spec is not None and version_satisfies("1", spec) is None:
            raise bad_request(f"requires.{key}: cannot read {spec!r}; write it like '>=3.10'")
    if req.get("disk_gb") is not None:
        out["disk_gb"] = get_num(req, "disk_gb", "requires.", 0.0, positive=True)
    unknown = sorted(set(req) - {"python", "driver", "disk_gb"})
    if unknown:
        raise bad_request(f"requires: unknown key(s) {', '.join(unknown)}; known: python, "
                          "driver, disk_gb")
    return out


def check_driver(spec: Optional[str], gpus: List[JSONDict], gpu_error: Optional[str]) -> JSONDict:
    """The NVIDIA driver against ``requires.driver`` (``driver`` error when it falls short)."""
    version = next((str(g.get("driver")) for g in gpus if g.get("driver")), None)
    check: JSONDict = {"driver": version, "required": spec, "ok": True}
    if spec is None:
        return check
    if version is None:
        raise AgentError(
            "driver",
            f"the playbook requires NVIDIA driver {spec} but nvidia-smi gave no driver version "
            f"({gpu_error or 'no GPUs listed'}); install the NVIDIA driver (and make nvidia-smi "
            "reachable through the host file's env: PATH) on the box, or use another box",
        )
    if version_satisfies(version, spec) is not True:
        raise AgentError(
            "driver",
            f"NVIDIA driver {version} on the box is older than the playbook requires ({spec}); "
            "use a box with a newer driver (CUDA wheels such as torch+cu130 need it) or relax "
            "requires.driver if you know the stack runs on this one",
        )
    return check


def check_disk(paths: List[str], need_gb: Optional[float]) -> List[JSONDict]:
    """Free space where each environment (and the workdir) will live, one entry per filesystem."""
    seen: Set[int] = set()
    checks: List[JSONDict] = []
    for path in paths:
        base = nearest_existing(path)
        try:
            st = os.stat(base)
            usage = shutil.disk_usage(base)
        except OSError:
            continue
        if st.st_dev in seen:
            continue
        seen.add(st.st_dev)
        free_gb = usage.free / 1e9
        entry = {"path": path, "checked_at": base, "free_gb": round(free_gb, 1),
                 "required_gb": need_gb}
        checks.append(entry)
        if need_gb is not None and free_gb < need_gb:
            raise AgentError(
                "disk",
                f"only {free_gb:.1f} GB free at {base} (for {path}); the playbook requires "
                f"{need_gb:g} GB (requires.disk_gb). Free space (old venvs, HF cache, "
                "checkpoints) or rent a box with a larger disk; nothing was installed",
            )
    return checks


def python_error(env: EnvSpec, message: str) -> AgentError:
    """A ``python`` error for one environment."""
    return AgentError("python", f"environment {env.name}: {message}", process=env.name)


def check_base_python(env: EnvSpec, spec: Optional[str]) -> JSONDict:
    """The interpreter a new venv is made from: it must run, meet ``requires.python`` and have
    a working venv module."""
    exe = env.python if os.sep in env.python else shutil.which(env.python)
    if exe is None or not os.path.exists(exe):
        raise python_error(env, f"no interpreter {env.python!r} on the box; install it "
                                "(e.g. apt-get install -y python3.12 python3.12-venv) or set "
                                f"environments.{env.name}.python to one that exists")
    data, why = probe_json([exe, "-c", BASE_PROBE_SCRIPT])
    if data is None:
        raise python_error(env, f"{env.python} does not run: {why}")
    version = str(data.get("python"))
    if spec is not None and version_satisfies(version, spec) is not True:
        raise python_error(env, f"{env.python} is Python {version}, the playbook requires "
                                f"{spec} (requires.python); install a newer Python (e.g. "
                                f"apt-get install -y python3.12 python3.12-venv) and set "
                                f"environments.{env.name}.python to it")
    if not data.get("venv"):
        short = data.get("short") or "3"
        raise python_error(env, f"{env.python} (Python {version}) cannot create virtual "
                                f"environments: its ensurepip/venv module is missing. On "
                                f"Debian/Ubuntu: apt-get install -y python{short}-venv "
                                "(or python3-venv)")
    return {"python": version, "executable": exe}


class PathLock(FileLock):
    """An flock on ``<dir>/.<name>.outrig-lock`` beside an environment, so two provisions never
    pip-install into the same venv at once (pip would corrupt it)."""

    def __init__(self, path: str, timeout: float) -> None:
        parent, base = os.path.split(path)
        super().__init__(os.path.join(parent, f".{base}.outrig-lock"), "provision", timeout,
                         "another provision is installing here; let it finish, then run "
                         "provision again")


def unreachable_index(env: EnvSpec) -> Optional[str]:
    """Why the environment's main package index cannot be reached (TCP connect, 5 s), or None.

    pip reports a refused or unresolvable index only at debug level when it does not retry
    (``--retries 0``), and then says just "No matching distribution", so a failed install asks
    the network directly before blaming the pins."""
    if env.no_index:
        return None
    url = env.index_url or os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return None
    try:
        port = parsed.port or (80 if parsed.scheme == "http" else 443)
    except ValueError:
        return None
    ok, why = hub_reachable(parsed.hostname, port)
    return None if ok else why


def pip_failure(env: EnvSpec, code: int, lines: List[str]) -> AgentError:
    """Why pip failed, as ``no_internet``, ``disk`` or ``pip``, with a fix."""
    excerpt = lines[-EXCERPT_LINES:]
    kind = classify_child_failure(lines)
    offline = unreachable_index(env) if kind is None else None
    if offline is not None:
        kind = "no_internet"
        excerpt = [*excerpt, f"(outrig: cannot connect to the index: {offline})"]
    where = env.index_url or ("find_links only" if env.no_index else "PyPI")
    if kind == "disk":
        return AgentError("disk", f"environment {env.name}: the disk filled up while pip "
                                  f"installed into {env.path}; free space and run provision "
                                  "again (pip resumes with what is already there)",
                          process=env.name, excerpt=excerpt, exit_code=code)
    if kind == "no_internet":
        return AgentError("no_internet", f"environment {env.name}: pip cannot reach the package "
                                         f"index ({where}) from the box. Check the box's network "
                                         "(DNS, proxy: set HTTPS_PROXY in the host file's env:), "
                                         "or point index_url at a reachable mirror, or pre-build "
                                         "wheels and use find_links + no_index: true",
                          process=env.name, excerpt=excerpt, exit_code=code)
    missing = []
    for line in lines:
        match = re.search(r"No matching distribution found for (\S+)", line)
        if match and match.group(1) not in missing:
            missing.append(match.group(1))
    if missing:
        hint = (f"it is not in find_links ({', '.join(env.find_links) or 'none'}) and no_index "
                "is set" if env.no_index else f"the index ({where}) has no such version")
        return AgentError("pip", f"environment {env.name}: pip found no distribution for "
                                 f"{', '.join(missing)}: {hint}. Check the name and the pin, or "
                                 "add the index/wheel that has it",
                          process=env.name, excerpt=excerpt, exit_code=code)
    return AgentError("pip", f"environment {env.name}: pip install into {env.path} failed (exit "
                             f"{code}); see its last lines below", process=env.name,
                      excerpt=excerpt, exit_code=code)


def provision_env(env: EnvSpec, requires: JSONDict, out: Emitter, interval: float,
                  dry_run: bool, lock_timeout: float) -> JSONDict:
    """Check one environment; create or update it unless it is already right."""
    started = time.monotonic()
    state = inspect_env(env)
    report: JSONDict = {"name": env.name, "path": env.path, "python": state["python"],
                        "versions": dict(state["versions"]), "seconds": 0.0,
                        "missing": dict(state["wrong"])}
    if state["error"] is not None:
        raise python_error(env, f"the venv at {env.path} is broken ({state['error']}); remove "
                                f"it (rm -rf {env.path}) and run provision again")
    if (requires.get("python") and state["exists"]
            and version_satisfies(str(state["python"]), requires["python"]) is not True):
            raise python_error(env, f"the venv at {env.path} runs Python {state['python']}, the "
                                    f"playbook requires {requires['python']}; remove it (rm -rf "
                                    f"{env.path}), set environments.{env.name}.python to a "
                                    "newer interpreter and run provision again")
    if not state["wrong"] and state["exists"]:
        report["status"] = "ok"
        report["seconds"] = round(time.monotonic() - started, 2)
        return report
    if dry_run:
        if not state["exists"]:
            report["base"] = check_base_python(env, requires.get("python"))
        report["status"] = "would_update" if state["exists"] else "would_create"
        report["seconds"] = round(time.monotonic() - started, 2)
        return report
    fields: JSONDict = {"env": env.name}
    child_env = dict(os.environ)
    child_env.update({"PIP_NO_INPUT": "1", "PYTHONUNBUFFERED": "1",
                      "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    child_env.pop("PYTHONHOME", None)
    with PathLock(env.path, lock_timeout):
        state = inspect_env(env)  # someone may have finished it while we waited for the lock
        created = not state["exists"]
        if created:
            base = check_base_python(env, requires.get("python"))
            out.step(f"{env.name}: creating venv {env.path} (Python {base['python']})")
            code, lines = run_streaming([base["executable"], "-m", "venv", env.path], out,
                                        interval, {**fields, "phase": "venv"}, env=child_env)
            if code != 0:
                if classify_child_failure(lines) == "disk":
                    raise AgentError("disk", f"environment {env.name}: no space left creating "
                                             f"{env.path}; free space and run provision again",
                                     process=env.name, excerpt=lines[-EXCERPT_LINES:])
                text = "\n".join(lines)
                if "ensurepip" in text:
                    raise python_error(env, f"{env.python} cannot create virtual environments "
                                            "(ensurepip is missing). On Debian/Ubuntu: apt-get "
                                            "install -y python3-venv (or python3.X-venv)")
                raise AgentError("python", f"environment {env.name}: '{env.python} -m venv "
                                           f"{env.path}' failed (exit {code})",
                                 process=env.name, excerpt=lines[-EXCERPT_LINES:],
                                 exit_code=code)
        if state["wrong"] or created:
            wrong = ", ".join(f"{n} ({v or 'missing'})" for n, v in sorted(state["wrong"].items()))
            out.step(f"{env.name}: pip install {len(env.packages)} package(s)"
                     + (f"; needed: {wrong}" if wrong and not created else ""))
            if env.packages:
                code, lines = run_streaming(env.pip_argv(), out, interval,
                                            {**fields, "phase": "pip"}, env=child_env)
                if code != 0:
                    raise pip_failure(env, code, lines)
            state = inspect_env(env)
            if state["wrong"]:
                bad = ", ".join(f"{n} is {v or 'not installed'}"
                                for n, v in sorted(state["wrong"].items()))
                raise AgentError("pip", f"environment {env.name}: pip finished but {bad}, not "
                                        "what the playbook pins; another requirement may pull a "
                                        "different version (see pip's resolver output with "
                                        "--dry-run locally) — align the pins",
                                 process=env.name)
    report.update(status="created" if created else "updated", python=state["python"],
                  versions=dict(state["versions"]), missing={},
                  seconds=round(time.monotonic() - started, 2))
    return report


def op_provision(req: Request, out: Emitter) -> JSONDict:
    """Check python/driver/disk against ``requires``; make every environment right."""
    raw = req.raw
    envs_raw = raw.get("environments") or []
    if not isinstance(envs_raw, list):
        raise bad_request("environments: must be a list")
    envs = [EnvSpec(e, i) for i, e in enumerate(envs_raw)]
    names = [e.name for e in envs]
    if len(set(names)) != len(names):
        raise bad_request("environments: names must be unique")
    requires = parse_requires(raw)
    dry_run = get_bool(raw, "dry_run", "", False)
    interval = get_num(raw, "progress_interval", "", 1.0, positive=True)
    lock_timeout = get_num(raw, "lock_timeout", "", PROVISION_LOCK_DEFAULT_S)
    facts = gather_facts()
    out.emit("facts", **facts)
    checks: JSONDict = {"python": {"agent": platform.python_version(),
                                   "required": requires["python"]}}
    if (requires["python"] and not envs
            and version_satisfies(platform.python_version(), requires["python"]) is not True):
            raise AgentError("python", f"the box's Python is {platform.python_version()}, the "
                                       f"playbook requires {requires['python']}; install a newer "
                                       "Python or set python: in the host file")
    checks["driver"] = check_driver(requires["driver"], facts["gpus"], facts["gpu_error"])
    checks["disk"] = check_disk([req.workdir, *[e.path for e in envs]], requires["disk_gb"])
    reports: List[JSONDict] = []
    for env in envs:
        try:
            report = provision_env(env, requires, out, interval, dry_run, lock_timeout)
        except AgentError as exc:
            out.emit("environment", name=env.name, path=env.path, status="failed",
                     versions={}, seconds=None, error=exc.kind)
            raise
        out.emit("environment", **report)
        reports.append(report)
    return {"dry_run": dry_run, "checks": checks, "environments": reports}


def hub_endpoint(override: Optional[str]) -> Tuple[str, int, str]:
    """(host, port, url) of the hub: the request's ``endpoint``, else $HF_ENDPOINT, else
    https://huggingface.co."""
    url = override or os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    parsed = urllib.parse.urlsplit(url if "://" in url else f"https://{url}")
    host = parsed.hostname or "huggingface.co"
    try:
        port = parsed.port or (80 if parsed.scheme == "http" else 443)
    except ValueError:
        raise bad_request(f"endpoint: cannot read a port in {url!r}") from None
    return host, port, url


def hub_reachable(host: str, port: int, timeout: float = HUB_CONNECT_TIMEOUT_S) -> Tuple[bool, str]:
    """Whether a TCP connection to the hub succeeds (DNS + connect) within ``timeout``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True, ""
    except OSError as exc:
        return False, f"{host}:{port}: {exc.strerror or exc}"


def find_hub_client(python: Optional[str]) -> Optional[Tuple[str, str]]:
    """(path, flavour) of the hub CLI: ``hf`` (huggingface_hub ≥ 0.34), else the older
    ``huggingface-cli``; next to the given interpreter (its venv's bin, not resolving the
    symlink) first, then on PATH."""
    dirs: List[str] = []
    if python:
        exe = python if os.sep in python else shutil.which(python)
        if exe:
            dirs.append(os.path.dirname(os.path.abspath(exe)))
    for name in ("hf", "huggingface-cli"):
        for d in dirs:
            cand = os.path.join(d, name)
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                return cand, name
    for name in ("hf", "huggingface-cli"):
        found = shutil.which(name, path=os.environ.get("PATH", os.defpath))
        if found:
            return found, name
    return None


def hub_failure(repo: str, kind: str, code: int, lines: List[str], has_token: bool,
                endpoint: str) -> AgentError:
    """Map the hub CLI's output to ``auth`` / ``not_found`` / ``no_internet`` / ``disk`` /
    ``hub`` with a fix."""
    text = "\n".join(lines)
    excerpt = lines[-EXCERPT_LINES:]
    what = f"{'dataset' if kind == 'dataset' else 'model'} {repo}"
    token_hint = ("the HF_TOKEN sent was refused or lacks access: check it on "
                  "huggingface.co/settings/tokens and accept the repo's licence with that account"
                  if has_token else "no HF_TOKEN was sent: export HF_TOKEN on the workstation "
                  "(it travels over the SSH channel only)")
    if any(p in text for p in DISK_PATTERNS):
        return AgentError("disk", f"the disk filled up downloading {what}; free space and run "
                                  "again (the download resumes)", excerpt=excerpt, exit_code=code)
    missing = re.search(r"RepositoryNotFoundError|Repository Not Found|RevisionNotFound|"
                        r"Revision Not Found|EntryNotFound|\b404\b", text)
    if not missing and re.search(r"\b40[13]\b|GatedRepoError|Invalid (user )?token|"
                                 r"Invalid credentials|Unauthorized|Forbidden|"
                                 r"Access to model .* is restricted", text):
        return AgentError("auth", f"the hub refused access to {what}: {token_hint}",
                          excerpt=excerpt, exit_code=code)
    if missing:
        extra = "" if has_token else (" (a private or gated repo also looks like this without "
                                      "HF_TOKEN)")
        return AgentError("not_found", f"{what} (or that revision) does not exist on "
                                       f"{endpoint}{extra}; check the id, the revision and, for "
                                       "a data set, use hf-dataset:", excerpt=excerpt,
                          exit_code=code)
    if any(p in text for p in NO_INTERNET_PATTERNS):
        return AgentError("no_internet", f"the box lost its connection to {endpoint} while "
                                         f"downloading {what}; run again to resume, or stage it "
                                         "through another route", excerpt=excerpt,
                          exit_code=code)
    return AgentError("hub", f"downloading {what} failed (exit {code}); see the last lines",
                      excerpt=excerpt, exit_code=code)


def dir_totals(path: str) -> Tuple[int, int]:
    """(files, bytes) under ``path``, not counting the hub client's own ``.cache`` folder."""
    files = total = 0
    for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not (root == path and d == ".cache")]
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
                files += 1
    return files, total


def op_hub_download(req: Request, out: Emitter) -> JSONDict:
    """Fetch a hub repo into ``dest`` on the box with the hub's own CLI (token from secrets)."""
    raw = req.raw
    probe_only = get_bool(raw, "probe_only", "", False)
    secrets = get_str_dict(raw, "secrets", "")
    python = get_opt_str(raw, "python", "") or sys.executable
    host, port, url = hub_endpoint(get_opt_str(raw, "endpoint", ""))
    reachable, why = hub_reachable(host, port)
    client = find_hub_client(python)
    result: JSONDict = {"hub_reachable": reachable, "endpoint": url,
                        "client": client[0] if client else None,
                        "client_kind": client[1] if client else None}
    if probe_only:
        result["reach_error"] = why or None
        return result
    repo = get_str(raw, "repo_id", "")
    if not HUB_REPO_RE.match(repo):
        raise bad_request(f"repo_id: {repo!r} is not a hub id like 'Qwen/Qwen3-8B'")
    revision = get_opt_str(raw, "revision", "")
    kind = raw.get("kind") or "model"
    if kind not in ("model", "dataset"):
        raise bad_request("kind: must be 'model' or 'dataset'")
    dest = os.path.normpath(os.path.expanduser(get_str(raw, "dest", "")))
    if not os.path.isabs(dest):
        raise bad_request(f"dest: {dest!r} must be an absolute path (or start with ~)")
    patterns = get_str_list(raw, "allow_patterns", "")
    interval = get_num(raw, "progress_interval", "", 1.0, positive=True)
    if not reachable:
        raise AgentError("no_internet", f"the box cannot reach the hub ({why}; tried for "
                                        f"{HUB_CONNECT_TIMEOUT_S:g} s). Stage {repo} another way "
                                        "(from another host or through the workstation), or fix "
                                        "the box's network / HF_ENDPOINT")
    if client is None:
        raise AgentError("no_hub_client", f"no hub client on the box: neither 'hf' nor "
                                          f"'huggingface-cli' next to {python} or on PATH. Add "
                                          "huggingface_hub to an environment of the playbook "
                                          "(environments: ... packages: [huggingface_hub==X]), "
                                          "run `inv provision`, and pass that environment's "
                                          "python")
    exe, flavour = client
    argv = [exe, "download", repo, "--local-dir", dest]
    if revision:
        argv += ["--revision", revision]
    if kind == "dataset":
        argv += ["--repo-type", "dataset"]
    if patterns:  # hf (typer) repeats the option; huggingface-cli (argparse) takes a list
        if flavour == "hf":
            for pattern in patterns:
                argv += ["--include", pattern]
        else:
            argv += ["--include", *patterns]
    try:
        os.makedirs(dest, exist_ok=True)
    except OSError as exc:
        raise AgentError("dest", f"cannot create {dest}: {exc.strerror}; pick a writable path "
                                 "or fix its permissions") from None
    env = dict(os.environ)
    env.pop("HF_HUB_OFFLINE", None)  # a launch setting; this step exists to go online
    env.pop("TRANSFORMERS_OFFLINE", None)
    env.update(secrets)  # HF_TOKEN: in the child's environment only, never argv or events
    env["PYTHONUNBUFFERED"] = "1"
    out.step(f"downloading {kind} {repo}{'@' + revision if revision else ''} into {dest} "
             f"with {flavour}")
    started = time.monotonic()
    code, lines = run_streaming(argv, out, interval, {"repo_id": repo, "phase": "hub"},
                                env=env, secrets=list(secrets.values()))
    if code != 0:
        raise hub_failure(repo, kind, code, lines, bool(secrets.get("HF_TOKEN")), url)
    files, total = dir_totals(dest)
    result.update(repo_id=repo, revision=revision, kind=kind, dest=dest, files=files,
                  bytes=total, seconds=round(time.monotonic() - started, 2))
    return result


PROVISION_OPS = {"provision": op_provision, "hub_download": op_hub_download}
OPS = OPS + tuple(PROVISION_OPS)


# --------------------------------------------------------------------------- follow (tail-logs)
#
# ``op: follow`` streams several logs of one run over this one channel as framed chunks. The
# position of every byte is (inode, offset), and the *workstation* keeps the cursor: the agent
# holds no state between calls, so a call that resumes from a cursor continues exactly after the
# last byte the workstation made durable (docs/logs-and-status.md). Chunks are raw bytes, never
# lines: line splitting, display and the local mirror are the workstation's business.

FOLLOW_CHUNK_DEFAULT = 256 * 1024  # bytes per chunk event (before base64)
FOLLOW_SCAN_MAX = 64 << 20  # --lines: never scan more than this backwards from the end
FOLLOW_GAP_FILL = 1 << 20  # --lines with a cursor at most this far behind: fill the gap instead
FOLLOW_COMPRESS_MIN = 4096  # smaller chunks are not worth zlib's header and CPU
FOLLOW_ROTATE_QUIET_S = 1.0  # a rotated-away file must be quiet this long before we switch
FOLLOW_RESCAN_S = 1.0  # how often the run's process list is re-read (processes launched later)
PROGRESS_SCAN_MAX = 16 << 20  # status: how far back to look for marker lines


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


def resolve_follow_run(layout: Layout, playbook: Optional[str], run_id: Optional[str]) -> str:
    """run_id, else the playbook's current run, else the box's only current run."""
    if run_id is not None or playbook is not None:
        return resolve_run(layout, playbook, run_id)
    pointers = all_pointers(layout)
    if len(pointers) == 1:
        return next(iter(pointers.values()))
    if not pointers:
        raise AgentError("not_found", f"no current run in {layout.workdir}; give a run id")
    listing = ", ".join(f"{pb} → {rid}" for pb, rid in sorted(pointers.items()))
    raise bad_request(f"several current runs ({listing}); say which with a run id or playbook")


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
            assert t.f is not None
            tail_start, scanned = offset_of_last_lines(t.f, st.st_size, self.lines)
            display_from = tail_start
            if reason != "cursor" or not tail_start - FOLLOW_GAP_FILL <= start:
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
        import threading

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
    rid = resolve_follow_run(layout, playbook, run_id)
    return Follower(out, layout, rid, raw).run()


# --------------------------------------------------------------------------- status extras
#
# What ``status`` adds for the workstation's progress parser and GPU table. The agent stays
# dumb: it ships raw text (the log's last bytes, the last line holding a marker) and facts
# (checkpoint dirs, HTTP answers); outrig/progress.py on the workstation does the parsing.


def tail_text(path: str, nbytes: int) -> str:
    """The last ``nbytes`` of a file as text, starting at a line boundary when possible."""
    if nbytes <= 0:
        return ""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - nbytes)
            f.seek(start)
            data = f.read(nbytes)
    except OSError:
        return ""
    if start > 0 and b"\n" in data:
        data = data[data.index(b"\n") + 1 :]
    return data.decode("utf-8", errors="replace")


def last_lines_containing(path: str, needles: List[str], scan_max: int = PROGRESS_SCAN_MAX,
                          secrets: Optional[List[str]] = None) -> Dict[str, Optional[str]]:
    """For each literal needle, the last line of the file containing it (scanning backwards,
    at most ``scan_max`` bytes, secret values redacted), or None."""
    found: Dict[str, Optional[str]] = {n: None for n in needles}
    todo = [n.encode("utf-8") for n in needles]
    if not todo:
        return found
    try:
        with open(path, "rb") as f:
            pos = f.seek(0, os.SEEK_END)
            carry = b""
            scanned = 0
            while todo and pos > 0 and scanned < scan_max:
                block = min(256 * 1024, pos)
                pos -= block
                f.seek(pos)
                data = f.read(block) + carry
                scanned += block
                lines = data.split(b"\n")
                carry = lines[0] if pos > 0 else b""
                body = lines[1:] if pos > 0 else lines
                for line in reversed(body):
                    for needle in list(todo):
                        if needle in line:
                            found[needle.decode("utf-8")] = clean_line(line, secrets)
                            todo.remove(needle)
    except OSError:
        pass
    return found


def argv_option(argv: List[str], flag: str) -> Optional[str]:
    """The value of ``--flag X`` or ``--flag=X`` in an argv (last one wins), or None."""
    value: Optional[str] = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


# speculators 0.9 ``maybe_save_checkpoint`` (train/trainer.py) writes, into ``<save>/<epoch>/``
# and in this order: config.json + model.safetensors (save_pretrained), optimizer_state_dict.pt,
# scheduler_state_dict.pt (not with --scheduler-type none), training_state.json, then the
# ``epoch<E>_step<K>``/``epoch<E>_end`` symlink and the "Checkpoint saved to" log line. With
# --checkpoint-freq < 1 the same folder is rewritten in place several times per epoch, and the
# trainer resumes from the highest integer folder without checking it (checkpointer.py
# ``_get_previous_epoch``). So a folder is complete only when training_state.json, written
# last, is at least as new as every other file of the set and names the folder's epoch.
CKPT_FILES = ("config.json", "optimizer_state_dict.pt", "training_state.json")
CKPT_MODEL = ("model.safetensors", "model.safetensors.index.json")
CKPT_SCHEDULER = "scheduler_state_dict.pt"
CKPT_STATE = "training_state.json"


def checkpoint_verdict(epoch: int, files: Dict[str, JSONDict], state: Any, scheduler: bool,
                       max_steps: Optional[int]) -> Tuple[bool, str, Optional[str]]:
    """(complete, why, note) for one numbered checkpoint folder; see the rule above."""
    wanted = list(CKPT_FILES) + ([CKPT_SCHEDULER] if scheduler else [])
    missing = [n for n in wanted if n not in files]
    if not any(n in files for n in CKPT_MODEL):
        missing.insert(0, "model.safetensors")
    if missing:
        return False, f"missing {', '.join(missing)}", None
    if not isinstance(state, dict) or not isinstance(state.get("epoch"), int):
        return False, "training_state.json does not parse (being written?)", None
    if state["epoch"] != epoch:
        return False, (f"training_state.json names epoch {state['epoch']}, not {epoch}"), None
    stamp = float(files[CKPT_STATE]["mtime"])
    model_files = [n for n in files if n.endswith(".safetensors")] + [
        n for n in CKPT_MODEL if n in files]
    newer = sorted({n for n in wanted + model_files
                    if n in files and float(files[n]["mtime"]) > stamp})
    if newer:
        return False, (f"{', '.join(newer)} newer than training_state.json: a save into this "
                       "folder started and did not finish"), None
    step = state.get("local_step")
    where = (f"epoch {epoch}, step {step}" if isinstance(step, int) and step > 0
             else f"end of epoch {epoch}")
    note = None
    total = state.get("global_step")
    if (max_steps is not None and isinstance(total, int) and total >= max_steps
            and not (isinstance(step, int) and step > 0)):
        note = (f"training stopped at --max-steps {max_steps} (global step {total}); "
                f"speculators saved it as the end of epoch {epoch}, so a resume starts "
                f"epoch {epoch + 1}")
    return True, f"complete ({where}, global step {total})", note


def checkpoint_entry(full: str, scheduler: bool, max_steps: Optional[int]) -> JSONDict:
    """One numbered folder: files with sizes and mtimes, training state and the verdict."""
    name = os.path.basename(full)
    files: Dict[str, JSONDict] = {}
    for rel in walk_files(full):
        with contextlib.suppress(OSError):
            st = os.stat(os.path.join(full, rel))
            files[rel] = {"size": st.st_size, "mtime": st.st_mtime}
    state: Any = None
    with contextlib.suppress(OSError, ValueError):
        if files.get(CKPT_STATE, {}).get("size", 1 << 20) <= 65536:
            state = read_json(os.path.join(full, CKPT_STATE))
    complete, why, note = checkpoint_verdict(int(name), files, state, scheduler, max_steps)
    return {"name": name, "epoch": int(name), "path": full,
            "files": {k: v["size"] for k, v in files.items()},
            "mtimes": {k: v["mtime"] for k, v in files.items()},
            "newest_mtime": max((v["mtime"] for v in files.values()), default=0.0),
            "training_state": state if isinstance(state, dict) else None,
            "complete": complete, "why": why, "note": note}


def quarantine_checkpoints(save: str, scheduler: bool, out: Emitter) -> List[str]:
    """Move incomplete numbered folders aside before the trainer starts.

    speculators resumes from the highest integer folder without checking it, so a folder left
    half-written by a killed save would be loaded (or crash the load). Renamed to
    ``<N>.incomplete-<unix time>``, it is kept for inspection and skipped by the trainer
    (non-integer names are ignored there)."""
    moved: List[str] = []
    try:
        names = os.listdir(save)
    except OSError:
        return moved
    for name in sorted(names, key=lambda n: int(n) if n.isdigit() else -1):
        full = os.path.join(save, name)
        if not name.isdigit() or os.path.islink(full) or not os.path.isdir(full):
            continue
        entry = checkpoint_entry(full, scheduler, None)
        if entry["complete"]:
            continue
        target = f"{full}.incomplete-{int(time.time())}"
        try:
            os.rename(full, target)
        except OSError as exc:
            raise AgentError("workdir", f"checkpoint {full} is incomplete ({entry['why']}) "
                             f"and cannot be moved aside ({exc.strerror}); the trainer would "
                             f"resume from it. Move or delete it by hand, then deploy again"
                             ) from None
        moved.append(target)
        out.warning(f"checkpoint {full} is incomplete ({entry['why']}); moved it to "
                    f"{target} so the trainer resumes from the newest complete one")
    return moved


def newest_checkpoint(save: str, scheduler: bool = True,
                      max_steps: Optional[int] = None) -> Optional[JSONDict]:
    """The highest complete ``<save>/<int>/`` (what a resume should start from)."""
    try:
        names = os.listdir(save)
    except OSError:
        return None
    numbered = sorted((int(n) for n in names if n.isdigit()
                       and os.path.isdir(os.path.join(save, n))
                       and not os.path.islink(os.path.join(save, n))), reverse=True)
    interrupted = os.path.isdir(os.path.join(save, "interrupted"))
    incomplete: List[JSONDict] = []
    for epoch in numbered:
        entry = checkpoint_entry(os.path.join(save, str(epoch)), scheduler, max_steps)
        if not entry["complete"]:
            incomplete.append({"name": entry["name"], "why": entry["why"]})
            continue
        state_mtime = entry["mtimes"].get(CKPT_STATE)
        return {"save_path": save, "path": entry["path"], "name": entry["name"],
                "count": len(numbered), "mtime": round(state_mtime, 3) if state_mtime else None,
                "training_state": entry["training_state"], "interrupted": interrupted,
                "incomplete": incomplete, "note": entry["note"]}
    return {"save_path": save, "path": None, "count": 0, "interrupted": interrupted,
            "incomplete": incomplete}


def http_get(url: str, timeout: float = PROBE_TIMEOUT_S) -> Tuple[Optional[int], bytes, str]:
    """(status code or None, body (≤ 64 KiB), error text) of a GET; proxies ignored."""
    import urllib.error
    import urllib.request  # lazily: ~20 ms of imports that most calls never need

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            return int(resp.status), resp.read(65536), ""
    except urllib.error.HTTPError as exc:
        return int(exc.code), b"", ""
    except Exception as exc:  # refused, timeout, reset, bad status line...
        return None, b"", str(getattr(exc, "reason", exc))[:200]


def server_facts(ready_url: str, argv: List[str]) -> JSONDict:
    """/health and the served model ids for an HTTP process that looks like vLLM."""
    from urllib.parse import urlsplit

    parts = urlsplit(ready_url)
    base = f"{parts.scheme}://{parts.netloc}"
    facts: JSONDict = {"url": ready_url, "health": None, "health_error": None, "models": None}
    looks_vllm = parts.path.rstrip("/") in ("/health", "/v1/models") or any(
        "vllm" in a for a in argv)
    if not looks_vllm:
        return facts
    code, _, err = http_get(base + "/health")
    facts["health"], facts["health_error"] = code, err or None
    code, body, _ = http_get(base + "/v1/models")
    if code == 200:
        try:
            data = json.loads(body.decode("utf-8"))
            facts["models"] = [str(m.get("id")) for m in data.get("data") or []
                               if isinstance(m, dict)]
        except (ValueError, AttributeError):
            facts["models"] = None
    return facts


def status_extras(rec: JSONDict, state: JSONDict, progress_bytes: int,
                  markers: List[str], secrets: Optional[List[str]] = None) -> JSONDict:
    """Fields ``status`` adds to one process: record facts, raw progress text, checkpoint,
    and for a running HTTP server its /health and model ids."""
    raw_argv = rec.get("argv")
    argv = [str(a) for a in raw_argv] if isinstance(raw_argv, list) else []
    extra: JSONDict = {"pgid": rec.get("pgid"), "gpus": rec.get("gpus") or [],
                       "started_at": rec.get("started_at"), "argv": argv}
    log = rec.get("log")
    if progress_bytes > 0 and isinstance(log, str):
        extra["tail_text"] = redact(tail_text(log, progress_bytes), secrets or [])
        extra["markers"] = (last_lines_containing(log, markers, secrets=secrets)
                            if markers else {})
    save = argv_option(argv, "--save-path")
    if save is not None:
        raw_cwd = rec.get("cwd")
        cwd = raw_cwd if isinstance(raw_cwd, str) else "/"
        max_steps = argv_option(argv, "--max-steps")
        extra["checkpoint"] = newest_checkpoint(
            os.path.normpath(os.path.join(cwd, save)),
            argv_option(argv, "--scheduler-type") != "none",
            int(max_steps) if max_steps is not None and max_steps.isdigit() else None)
    spec = rec.get("ready")
    if state.get("state") == "running" and isinstance(spec, dict) and isinstance(
            spec.get("http"), str):
        extra["server"] = server_facts(spec["http"], argv)
    return extra


# --------------------------------------------------------------------------- run index

RUN_INDEX_OPS = ("deploy", "cleanup", "status", "logs", "check")  # ops that report runs
RUN_INDEX_MAX = 100  # newest run directories reported per call


def run_truth(run: JSONDict, stopper: Stopper) -> Tuple[str, bool, int]:
    """(state, ran, live processes) of one run as the box sees it now.

    run.json says what the deploy or cleanup that last touched it recorded; a cut deploy leaves
    ``launching`` and a crash after the deploy leaves ``running``. The processes decide:
    anything of it alive is ``running``; otherwise its exit files say ``finished`` (every
    process exited 0), ``exited`` (one failed or was killed) or ``gone`` (no exit recorded:
    the box rebooted or the wrapper was killed). ``stopped`` and ``failed`` stay. ``ran``: the
    deploy succeeded (``ready_at``), or something of it is still running."""
    recorded = str(run.get("status") or "unknown")
    records = [r for r in run.get("processes") or [] if valid_record(r)]
    live = sum(1 for r in records if stopper.leader_state(r) == "alive")
    ran = bool(run.get("ready_at")) or recorded in ("running", "finished") or live > 0
    if recorded in ("stopped", "failed") or (live == 0 and not records):
        return recorded, ran, live
    if live:
        return "running", ran, live
    codes = []
    for rec in records:
        path = rec.get("exit_file")
        status = read_exit_file(path) if isinstance(path, str) else None
        codes.append(status)
    if any(c is None for c in codes):
        return "gone", ran, 0
    if all(c is not None and c[0] == 0 and c[1] is None for c in codes):
        return "finished", ran, 0
    return "exited", ran, 0


def run_index(layout: Layout, stopper: Stopper) -> List[JSONDict]:
    """The newest runs in the workdir with their true state (see :func:`run_truth`), so that
    the workstation's journal can follow the box, which is the truth, on every contact."""
    dated = []
    for rid in list_run_ids(layout):
        with contextlib.suppress(OSError):
            dated.append((os.stat(layout.run_dir(rid)).st_mtime, rid))
    out: List[JSONDict] = []
    for _, rid in sorted(dated, reverse=True)[:RUN_INDEX_MAX]:
        try:
            run = read_json(layout.run_json(rid))
        except (OSError, ValueError):
            run = None
        if not isinstance(run, dict) or not isinstance(run.get("processes"), list):
            out.append({"run_id": rid, "status": "unknown", "ran": False, "live": 0})
            continue
        state, ran, live = run_truth(run, stopper)
        out.append({"run_id": rid, "playbook": run.get("playbook"), "status": state,
                    "recorded": run.get("status"), "created": run.get("created"),
                    "ready_at": run.get("ready_at"), "stopped_at": run.get("stopped_at"),
                    "ran": ran, "live": live})
    return out


def report_runs(req: Optional[Request], out: Emitter) -> None:
    """Emit the ``runs`` event (the run index) before the result of the ops that touch runs,
    whether they succeeded or not; the index never makes an op fail."""
    if req is None or req.op not in RUN_INDEX_OPS:
        return
    if proc_problem() is not None:
        return  # without /proc every run would look gone: no index rather than a false one
    layout = Layout(req.workdir)
    if not os.path.isdir(layout.runs):
        return
    try:
        runs = run_index(layout, Stopper(out))
    except (OSError, ValueError) as exc:
        out.warning(f"could not list the runs in {layout.runs}: {exc}")
        return
    out.emit("runs", workdir=layout.workdir, runs=runs)


# --------------------------------------------------------------------------- main


def internal_error(exc: BaseException, workdir: Optional[str] = None) -> AgentError:
    """An unexpected exception as an ``internal`` error: the traceback's last line.

    A full or read-only disk is not a bug: whatever op was writing (deploy's logs and run
    records, a transfer, a lock) gets the same ``disk`` error naming the cause and the way
    out, and cleanup is said to work on a full disk (it records what it can)."""
    if isinstance(exc, OSError) and exc.errno in FULL_DISK_ERRNOS:
        where = exc.filename or workdir or "the workdir"
        return AgentError("disk", f"the box's disk is full or read-only writing {where} "
                          f"({os.strerror(exc.errno)}). Free space there (df -h; old runs' "
                          "logs and hidden-state files are the usual suspects); `inv cleanup` "
                          "still stops running processes on a full disk")
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return AgentError("internal", last)


# --------------------------------------------------------------------------- transfers
#
# Moving model weights, data and checkpoints between boxes and the workstation. One framing
# for every route (box → workstation → box, box → box over ssh, workstation → box):
#   b"C" + {"path", "offset", "length"} + b"\n" + <length raw bytes>   a chunk of a file
#   b"D" + {"path", "size", "sha256"} + b"\n"                          that file is complete
#   b"Z" + {} + b"\n"                                                  end of stream
# Receivers write ``<path>.outrig-part`` at the chunk's offset and rename it only after the
# size and sha256 match, so a cut transfer resumes from the part file's size and a half
# written file is never mistaken for a complete one. Manifests (path, size, sha256) decide
# what is already present; sha256 sums are cached per (size, mtime) in .outrig-manifest.json.

TRANSFER_CHUNK = 1 << 20
PART_SUFFIX = ".outrig-part"
MANIFEST_CACHE = ".outrig-manifest.json"
STAGED_MARK = ".outrig-staged.json"
KEY_TAG = "outrig-transfer:"
CHECKPOINT_FILES = (
    "config.json",
    "model.safetensors",
    "optimizer_state_dict.pt",
    "scheduler_state_dict.pt",
    "training_state.json",
)


def _safe_rel(root: str, rel: str) -> str:
    """``root/rel``, refusing absolute paths and ``..`` (a manifest must stay in its root)."""
    if not rel or rel.startswith("/") or "\0" in rel or ".." in rel.split("/"):
        raise bad_request(f"path {rel!r} must be relative and stay inside {root}")
    return os.path.join(root, rel)


def _is_internal(name: str) -> bool:
    return name.startswith(".outrig-") or name.endswith(PART_SUFFIX)


def sha256_file(path: str, prefix_only: Optional[int] = None) -> str:
    import hashlib

    digest = hashlib.sha256()
    left = prefix_only
    with open(path, "rb") as f:
        while True:
            want = TRANSFER_CHUNK if left is None else min(TRANSFER_CHUNK, left)
            if want == 0:
                break
            block = f.read(want)
            if not block:
                break
            digest.update(block)
            if left is not None:
                left -= len(block)
    return digest.hexdigest()


def walk_files(root: str) -> List[str]:
    """Relative paths of regular files under root (symlinks to files followed), sorted."""
    out: List[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not _is_internal(d))
        for name in filenames:
            if _is_internal(name):
                continue
            full = os.path.join(dirpath, name)
            if os.path.isfile(full):
                out.append(os.path.relpath(full, root))
    return sorted(out)


def dir_manifest(root: str, want_hash: bool, out: Emitter,
                 cache_path: Optional[str] = None) -> JSONDict:
    """path → {size, sha256?}; sha256 sums come from the cache when size and mtime match.
    The cache is ``root/.outrig-manifest.json`` unless ``cache_path`` names another file (the
    workstation keeps its own out of the user's folders)."""
    if cache_path is None:
        cache_path = os.path.join(root, MANIFEST_CACHE)
    else:
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(cache_path), exist_ok=True)
    try:
        cache = read_json(cache_path)
        if not isinstance(cache, dict):
            cache = {}
    except (OSError, ValueError):
        cache = {}
    files: Dict[str, JSONDict] = {}
    partial: Dict[str, int] = {}
    changed = False
    hashed_bytes = 0
    last_beat = time.monotonic()
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            if name.endswith(PART_SUFFIX):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root)[: -len(PART_SUFFIX)]
                with contextlib.suppress(OSError):
                    partial[rel] = os.path.getsize(full)
    for rel in walk_files(root):
        st = os.stat(os.path.join(root, rel))
        # mtime travels so the copy keeps it: a checkpoint's completeness is judged by which
        # of its files was written last (checkpoint_verdict), and a copy must not change that
        entry: JSONDict = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
        if want_hash:
            cached = cache.get(rel)
            if (isinstance(cached, dict) and cached.get("size") == st.st_size
                    and cached.get("mtime_ns") == st.st_mtime_ns and cached.get("sha256")):
                entry["sha256"] = cached["sha256"]
            else:
                entry["sha256"] = sha256_file(os.path.join(root, rel))
                cache[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                              "sha256": entry["sha256"]}
                changed = True
                hashed_bytes += st.st_size
                if time.monotonic() - last_beat > 2:
                    last_beat = time.monotonic()
                    out.emit("progress", what=f"hashing {root}", bytes=hashed_bytes)
        files[rel] = entry
    if changed:
        with contextlib.suppress(OSError):
            write_json_atomic(cache_path, cache)
    return {"files": files, "partial": partial}


def staged_record(root: str) -> Optional[JSONDict]:
    """The stage mark, if every file it lists is still there with the same size and mtime."""
    try:
        mark = read_json(os.path.join(root, STAGED_MARK))
    except (OSError, ValueError):
        return None
    if not isinstance(mark, dict) or not isinstance(mark.get("files"), dict):
        return None
    for rel, info in mark["files"].items():
        try:
            st = os.stat(os.path.join(root, rel))
        except OSError:
            return None
        if st.st_size != info.get("size") or st.st_mtime_ns != info.get("mtime_ns"):
            return None
    return mark


def op_manifest(req: Request, out: Emitter) -> JSONDict:
    """What is at each path: files with size (and sha256), partial files, the stage mark."""
    raw = req.raw
    items = raw.get("items")
    if not isinstance(items, list):
        raise bad_request("items: must be a list of {name, path}")
    want_hash = get_bool(raw, "hash", "", True)
    results = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise bad_request(f"items[{i}]: must be an object")
        name = get_str(item, "name", f"items[{i}].")
        path = os.path.expanduser(get_str(item, "path", f"items[{i}]."))
        entry: JSONDict = {"name": name, "path": path, "exists": os.path.isdir(path)}
        if entry["exists"]:
            mark = staged_record(path)
            entry["staged"] = mark is not None
            entry["source"] = mark.get("source") if mark else None
            if mark is not None and not get_bool(item, "verify", "", False):
                entry["files"] = {rel: {"size": info["size"], "sha256": info.get("sha256")}
                                  for rel, info in mark["files"].items()}
                entry["partial"] = {}
            else:
                entry.update(dir_manifest(path, want_hash, out))
            entry["total_bytes"] = sum(f["size"] for f in entry["files"].values())
        elif os.path.exists(path):
            raise AgentError("workdir", f"{path} exists but is not a directory")
        results.append(entry)
    return {"items": results}


def write_frame(stream: IO[bytes], tag: bytes, header: JSONDict, data: bytes = b"") -> None:
    stream.write(tag + json.dumps(header).encode("ascii") + b"\n")
    if data:
        stream.write(data)


def send_frames(root: str, files: List[JSONDict], stream: IO[bytes]) -> int:
    """Write the frames for ``files`` ({path, offset}) under ``root``; return bytes sent."""
    import hashlib

    sent = 0
    for entry in files:
        rel = entry["path"]
        offset = int(entry.get("offset") or 0)
        full = _safe_rel(root, rel)
        size = os.path.getsize(full)
        if offset > size:
            offset = 0
        digest = hashlib.sha256()
        with open(full, "rb") as f:
            if offset:
                left = offset
                while left:  # the prefix the receiver already has: hash it, don't send it
                    block = f.read(min(TRANSFER_CHUNK, left))
                    if not block:
                        break
                    digest.update(block)
                    left -= len(block)
            position = offset
            while True:
                block = f.read(TRANSFER_CHUNK)
                if not block:
                    break
                digest.update(block)
                write_frame(stream, b"C", {"path": rel, "offset": position,
                                           "length": len(block)}, block)
                position += len(block)
                sent += len(block)
        write_frame(stream, b"D", {"path": rel, "size": position, "sha256": digest.hexdigest()})
        stream.flush()
    write_frame(stream, b"Z", {})
    stream.flush()
    return sent


def op_send_files(req: Request, out: Emitter) -> JSONDict:
    """Stream frames of the requested files to stdout (the JSON result follows the Z frame)."""
    raw = req.raw
    root = os.path.expanduser(get_str(raw, "root", ""))
    files = raw.get("files")
    if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
        raise bad_request("files: must be a list of {path, offset}")
    for f in files:
        _safe_rel(root, str(f.get("path") or ""))
        if not os.path.isfile(os.path.join(root, str(f["path"]))):
            raise AgentError("not_found", f"{os.path.join(root, str(f['path']))} does not exist "
                             "(the source changed since its manifest was read)")
    sent = send_frames(root, files, out.stream)
    return {"bytes": sent}


class FrameReceiver:
    """Consumes frames into ``root`` (part files, verify, rename); reports progress."""

    def __init__(self, root: str, expect: Dict[str, JSONDict], out: Emitter) -> None:
        self.root = root
        self.expect = expect
        self.out = out
        self.bytes = 0
        self.files: List[str] = []
        self.started = time.monotonic()
        self.last_beat = self.started
        self.total = sum(int(e.get("size") or 0) for e in expect.values())

    def _part(self, rel: str) -> str:
        full = _safe_rel(self.root, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        return full + PART_SUFFIX

    def consume(self, reader: IO[bytes]) -> JSONDict:
        while True:
            line = reader.readline()
            if not line:
                raise AgentError("transfer", "the stream ended before its end mark (the "
                                 "sender died or the link was cut); run the same command "
                                 "again to resume from what was received")
            tag, body = line[:1], line[1:]
            if tag == b"{":  # the sender's own result line: it failed before finishing
                try:
                    err = json.loads(line).get("error") or {}
                except ValueError:
                    err = {}
                raise AgentError("transfer", f"the sender failed: {err.get('message', line)}")
            header = json.loads(body)
            if tag == b"C":
                self._chunk(reader, header)
            elif tag == b"D":
                self._done(header)
            elif tag == b"Z":
                return {"files": self.files, "bytes": self.bytes,
                        "seconds": round(time.monotonic() - self.started, 3)}
            else:
                raise AgentError("transfer", f"unexpected frame {tag!r} in the stream")

    def _chunk(self, reader: IO[bytes], header: JSONDict) -> None:
        rel, offset, length = header["path"], int(header["offset"]), int(header["length"])
        if rel not in self.expect:
            raise AgentError("transfer", f"the sender sent {rel}, which was not asked for")
        part = self._part(rel)
        fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.lseek(fd, offset, os.SEEK_SET)
            left = length
            while left:
                block = reader.read(min(left, TRANSFER_CHUNK))
                if not block:
                    raise AgentError("transfer", "the stream was cut in the middle of a chunk; "
                                     "run the same command again to resume")
                view = memoryview(block)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                left -= len(block)
                self.bytes += len(block)
        finally:
            os.close(fd)
        now = time.monotonic()
        if now - self.last_beat >= 1.0:
            self.last_beat = now
            rate = self.bytes / max(1e-6, now - self.started)
            self.out.emit("progress", what=rel, bytes=self.bytes, total=self.total,
                          rate=round(rate))

    def _done(self, header: JSONDict) -> None:
        rel = header["path"]
        part = self._part(rel)
        final = _safe_rel(self.root, rel)
        want = self.expect.get(rel) or {}
        if not os.path.exists(part):  # an empty file sends no chunk
            open(part, "wb").close()
        size = os.path.getsize(part)
        digest = sha256_file(part)
        if size != header["size"] or digest != header["sha256"] or (
                want.get("sha256") and want["sha256"] != digest) or (
                want.get("size") is not None and want["size"] != size):
            os.unlink(part)
            raise AgentError("transfer", f"{rel}: received {size} bytes with sha256 {digest[:12]}"
                             f"…, expected {want.get('size', header['size'])} bytes "
                             f"{str(want.get('sha256') or header['sha256'])[:12]}…; the part "
                             "file was removed, run the command again")
        keep_mtime(part, want)
        with open(part, "rb") as f:
            os.fsync(f.fileno())
        os.replace(part, final)
        fsync_dir(os.path.dirname(final))
        self.files.append(rel)
        self.out.emit("file", path=rel, size=size)


def keep_mtime(path: str, info: JSONDict) -> None:
    """Give a received file its source's mtime (as ``cp -p`` would), when the source sent it."""
    mtime = info.get("mtime_ns")
    if isinstance(mtime, int) and mtime > 0:
        os.utime(path, ns=(mtime, mtime))


def mark_staged(root: str, expect: Dict[str, JSONDict], source: Optional[str]) -> None:
    """Record that ``root`` holds exactly ``expect``, verified: a re-run is one exec.

    Files that were already present (same size and sha256, so not sent) get the source's
    mtime here too, so the folder's file times match the source's as a whole."""
    files: Dict[str, JSONDict] = {}
    cache: Dict[str, JSONDict] = {}
    for rel, info in expect.items():
        keep_mtime(os.path.join(root, rel), info)
        st = os.stat(os.path.join(root, rel))
        files[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                      "sha256": info.get("sha256")}
        if info.get("sha256"):
            cache[rel] = dict(files[rel])
    write_json_atomic(os.path.join(root, STAGED_MARK),
                      {"source": source, "files": files, "staged_at": round(time.time(), 3)})
    with contextlib.suppress(OSError, ValueError):
        old = read_json(os.path.join(root, MANIFEST_CACHE))
        if isinstance(old, dict):
            old.update(cache)
            cache = old
    with contextlib.suppress(OSError):
        write_json_atomic(os.path.join(root, MANIFEST_CACHE), cache)


def _expect(raw: JSONDict) -> Dict[str, JSONDict]:
    expect = raw.get("expect")
    if not isinstance(expect, dict) or not all(isinstance(v, dict) for v in expect.values()):
        raise bad_request("expect: must map relative paths to {size, sha256}")
    return expect


def _finish_receive(root: str, raw: JSONDict, expect: Dict[str, JSONDict]) -> None:
    if get_bool(raw, "mark_staged", "", False):
        missing = [rel for rel in expect if not os.path.isfile(os.path.join(root, rel))]
        if missing:
            raise AgentError("transfer", f"{len(missing)} file(s) still missing in {root}, "
                             f"e.g. {missing[0]}")
        mark_staged(root, expect, get_opt_str(raw, "source", ""))


def op_recv_files(req: Request, out: Emitter) -> JSONDict:
    """Receive frames on stdin into ``root``; the request itself came in argv."""
    raw = req.raw
    root = os.path.expanduser(get_str(raw, "root", ""))
    expect = _expect(raw)
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as exc:
        raise AgentError("workdir", f"cannot create {root}: {exc.strerror}") from None
    receiver = FrameReceiver(root, expect, out)
    result = receiver.consume(sys.stdin.buffer) if expect else {"files": [], "bytes": 0}
    _finish_receive(root, raw, expect)
    return result


def _authorized_keys() -> str:
    """The file this box's sshd reads keys from: ~/.ssh/authorized_keys unless the host's
    env names another with OUTRIG_AUTHORIZED_KEYS (an sshd with its own AuthorizedKeysFile)."""
    return os.path.expanduser(os.environ.get("OUTRIG_AUTHORIZED_KEYS")
                              or "~/.ssh/authorized_keys")


def op_authorize_key(req: Request, out: Emitter) -> JSONDict:
    """Let a peer box pull files from this one: a restricted, tagged authorized_keys line."""
    raw = req.raw
    key = get_str(raw, "public_key", "").strip()
    tag = get_name(raw, "tag", "")
    if not re.match(r"^(ssh-ed25519|ecdsa-sha2-nistp256|ssh-rsa) [A-Za-z0-9+/=]+$",
                    " ".join(key.split()[:2])):
        raise bad_request("public_key: not an OpenSSH public key line")
    path = _authorized_keys()
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    _purge_keys(path, None, max_age=6 * 3600)
    line = f"restrict {' '.join(key.split()[:2])} {KEY_TAG}{tag}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a", encoding="ascii") as f:
        f.write(line)
    return {"path": path, "tag": tag}


def _purge_keys(path: str, tag: Optional[str], max_age: Optional[float] = None) -> int:
    """Remove our tagged lines (one tag, or any older than ``max_age``); keep everything else."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return 0
    keep: List[str] = []
    removed = 0
    for line in lines:
        match = re.search(re.escape(KEY_TAG) + r"(\S+)\s*$", line)
        drop = False
        if match:
            if tag is not None and match.group(1) == tag:
                drop = True
            elif max_age is not None:
                stamp = match.group(1).split("-", 1)[0]
                drop = stamp.isdigit() and time.time() - int(stamp) > max_age
        if drop:
            removed += 1
        else:
            keep.append(line)
    if removed:
        write_atomic(path, "".join(keep).encode("utf-8"), 0o600)
    return removed


def op_revoke_key(req: Request, out: Emitter) -> JSONDict:
    tag = get_name(req.raw, "tag", "")
    return {"removed": _purge_keys(_authorized_keys(), tag)}


def _transfer_dir(req: Request, tag: str) -> str:
    return os.path.join(Layout(req.workdir).state, "transfer", tag)


def op_peer_keygen(req: Request, out: Emitter) -> JSONDict:
    """A throwaway key for pulling from a peer box (kept in the workdir, deleted after)."""
    tag = get_name(req.raw, "tag", "")
    folder = _transfer_dir(req, tag)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    key = os.path.join(folder, "id_ed25519")
    if not os.path.exists(key):
        exe = shutil.which("ssh-keygen")
        if exe is None:
            raise AgentError("no_ssh", "ssh-keygen is not installed on this box, so it cannot "
                             "pull from the other box directly (install openssh-client); "
                             "outrig will copy through the workstation instead")
        subprocess.run([exe, "-q", "-t", "ed25519", "-N", "", "-C", f"{KEY_TAG}{tag}",
                        "-f", key], check=True, stdin=subprocess.DEVNULL, capture_output=True)
    with open(key + ".pub", encoding="ascii") as f:
        return {"public_key": f.read().strip(), "has_ssh": shutil.which("ssh") is not None}


def op_peer_pull(req: Request, out: Emitter) -> JSONDict:
    """Pull files straight from a peer box over ssh, with the key from peer_keygen.

    The peer runs this same agent's ``send_files`` (the agent's own source travels in the
    command line) and its frames are consumed here exactly as a relayed stream would be.
    """
    raw = req.raw
    tag = get_name(raw, "tag", "")
    root = os.path.expanduser(get_str(raw, "root", ""))
    expect = _expect(raw)
    peer = get_dict(raw, "peer", "", required=True)
    host = get_str(peer, "host", "peer.")
    port = get_int(peer, "port", "peer.", 22, 1, 65535)
    user = get_opt_str(peer, "user", "peer.")
    known = get_str(peer, "known_hosts", "peer.")
    peer_python = get_str(peer, "python", "peer.")
    send_request = get_dict(raw, "send", "", required=True)
    agent_b64 = globals().get("OUTRIG_AGENT_B64")
    if not isinstance(agent_b64, str):
        raise bad_request("peer_pull must be sent through the command-line bootstrap")
    folder = _transfer_dir(req, tag)
    key = os.path.join(folder, "id_ed25519")
    known_file = os.path.join(folder, "known_hosts")
    write_atomic(known_file, (known.strip() + "\n").encode("ascii"), 0o600)
    packed = base64.b64encode(zlib.compress(json.dumps(send_request).encode(), 9)).decode()
    boot = ("import sys,zlib,base64;d=lambda s:zlib.decompress(base64.b64decode(s));"
            "exec(compile(d(sys.argv[1]),'outrig-agent','exec'),"
            "{'__name__':'__main__','OUTRIG_REQUEST':d(sys.argv[2])})")
    remote = " ".join(shlex.quote(x) for x in [peer_python, "-c", boot, agent_b64, packed])
    exe = shutil.which("ssh")
    if exe is None:
        raise AgentError("no_ssh", "ssh is not installed on this box (install openssh-client)")
    argv = [exe, "-i", key, "-p", str(port), "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_file}",
            "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=10",
            "-o", "ServerAliveCountMax=3", "-o", "IdentitiesOnly=yes",
            f"{user}@{host}" if user else host, remote]
    os.makedirs(root, exist_ok=True)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        result = FrameReceiver(root, expect, out).consume(proc.stdout)
    except AgentError as exc:
        proc.kill()
        err = proc.stderr.read().decode("utf-8", errors="replace").strip().splitlines()
        raise AgentError(exc.kind if not err else "peer", exc.message
                         + (f" (ssh said: {err[-1]})" if err else "")) from None
    finally:
        with contextlib.suppress(OSError):
            proc.stdout.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
    _finish_receive(root, raw, expect)
    return result


def op_checkpoints(req: Request, out: Emitter) -> JSONDict:
    """The save folder's checkpoint dirs with their files, sizes, mtimes and verdicts."""
    raw = req.raw
    save = os.path.expanduser(get_str(raw, "save_path", ""))
    scheduler = get_bool(raw, "scheduler", "", True)
    max_steps_raw = raw.get("max_steps")
    max_steps = int(max_steps_raw) if isinstance(max_steps_raw, int) else None
    try:
        names = sorted(os.listdir(save))
    except OSError:
        return {"save_path": save, "exists": False, "checkpoints": [], "others": []}
    found: List[JSONDict] = []
    others: List[str] = []
    for name in names:
        full = os.path.join(save, name)
        if os.path.islink(full) or not os.path.isdir(full):
            continue
        if not name.isdigit():
            others.append(name)
            continue
        found.append(checkpoint_entry(full, scheduler, max_steps))
    return {"save_path": save, "exists": True, "checkpoints": found, "others": others,
            "now": time.time()}


def op_mark_staged(req: Request, out: Emitter) -> JSONDict:
    """After a parallel copy: check every expected file is in place, then write the mark."""
    raw = req.raw
    root = os.path.expanduser(get_str(raw, "root", ""))
    expect = _expect(raw)
    wrong = []
    for rel, info in expect.items():
        full = _safe_rel(root, rel)
        if not os.path.isfile(full) or os.path.getsize(full) != info.get("size"):
            wrong.append(rel)
    if wrong:
        raise AgentError("transfer", f"{len(wrong)} file(s) missing or of the wrong size in "
                         f"{root}, e.g. {wrong[0]}; run the command again")
    mark_staged(root, expect, get_opt_str(raw, "source", ""))
    return {"root": root, "files": len(expect)}


TRANSFER_OPS = {
    "mark_staged": op_mark_staged,
    "manifest": op_manifest,
    "send_files": op_send_files,
    "recv_files": op_recv_files,
    "authorize_key": op_authorize_key,
    "revoke_key": op_revoke_key,
    "peer_keygen": op_peer_keygen,
    "peer_pull": op_peer_pull,
    "checkpoints": op_checkpoints,
}
OPS = OPS + tuple(TRANSFER_OPS)


def dispatch(req: Request, out: Emitter) -> JSONDict:
    """Apply the host env, then run the op."""
    apply_env(req.env)
    if req.op in PROVISION_OPS:
        return PROVISION_OPS[req.op](req, out)
    if req.op in TRANSFER_OPS:
        return TRANSFER_OPS[req.op](req, out)
    if req.op == "deploy":
        return op_deploy(req, out)
    if req.op == "cleanup":
        return op_cleanup(req, out)
    if req.op == "status":
        return op_status(req, out)
    if req.op == "logs":
        return op_logs(req, out)
    if req.op == "follow":
        return op_follow(req, out)
    if req.op == "model_facts":
        return op_model_facts(req, out)
    return op_check(req, out)


def main() -> None:
    """Read one request line, run it, always finish with a ``result`` line."""
    out = Emitter(sys.stdout.buffer)
    req: Optional[Request] = None
    try:
        # The bootstrap may hand the request over in argv (no stdin round trip; see
        # docs/agent-protocol.md); otherwise exactly one line from stdin, which may stay open.
        preset = globals().get("OUTRIG_REQUEST")
        line = preset if isinstance(preset, bytes) else sys.stdin.buffer.readline()
        req = parse_request(line)
        result = dispatch(req, out)
        report_runs(req, out)
        out.emit("result", ok=True, **result)
    except AgentError as exc:
        report_runs(req, out)
        out.emit("result", ok=False, error=exc.to_json())
    except (Exception, KeyboardInterrupt) as exc:
        error = internal_error(exc, req.workdir if req is not None else None)
        if error.kind == "internal":
            traceback.print_exc(file=sys.stderr)
        out.emit("result", ok=False, error=error.to_json())


if __name__ == "__main__":
    main()
