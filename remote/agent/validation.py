"""Request validation: typed getters that name the bad field, the process/file/readiness
specs of a deploy, and the common :class:`Request` (version and op from protocol.py)."""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from typing import Any, Dict, List, Optional, Set

from .constants import DEFAULT_READY_TIMEOUT, DEFAULT_STOP_GRACE, NAME_RE, JSONDict
from .events import bad_request
from .protocol import OPS, PROTOCOL_VERSION


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
        # With http and model: once they hold, one real request (POST /v1/completions,
        # max_tokens 1) must be answered 2xx; /health alone says nothing about the engine.
        self.generate = get_bool(raw, "generate", where, False)
        if self.generate and self.model is None:
            raise bad_request(f"{where}generate: needs model (the id to send the request for) "
                              "and http")

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
        if self.generate:
            parts.append("an answered /v1/completions request")
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
            "generate": self.generate,
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
