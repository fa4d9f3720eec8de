"""The agent protocol as data, shared by both sides (docs/agent-protocol.md).

The version, the ops, each op's request fields (name, type, required) and the error kinds are
defined here once. The agent checks every request against :data:`REQUESTS` before it runs the
op (:func:`check_request`); the workstation imports this module as
``outrig._box.agent.protocol`` and checks each request the same way before it leaves
(``outrig/session.py:base_request``), so a misspelt or mistyped field fails at once, on the
workstation, with the field's name. The fields' finer rules (ranges, names, nested objects)
stay with the op that reads them. Stdlib only, Python 3.8.
"""

from __future__ import annotations

import base64
import zlib
from typing import Any, Dict, List, NamedTuple, Tuple

PROTOCOL_VERSION = 1
REQUEST_ENV = "OUTRIG_REQUEST"  # the request (argv path), handed from bootstrap to agent
SERVE_KEY = "serve"  # a request line {"serve": {...}} starts serve mode (serve.py), not an op


def encode_request(line: bytes) -> str:
    """A request line as it rides in argv (and in ``OUTRIG_REQUEST``): zlib, then base64."""
    return base64.b64encode(zlib.compress(line, 9)).decode("ascii")


def decode_request(text: str) -> bytes:
    """The inverse of :func:`encode_request`."""
    return zlib.decompress(base64.b64decode(text))

# Error kinds (``result.error.kind``). The workstation decides on these, never on text.
BAD_REQUEST = "bad_request"  # the request itself is wrong; nothing was touched
WORKDIR = "workdir"  # the workdir (or a file or cwd in it) cannot be made or written
DISK = "disk"  # the disk is full or read-only
LOCK = "lock"  # another outrig step holds the workdir (or environment) lock
PROC = "proc"  # /proc cannot prove which processes are ours: nothing started or stopped
GPU = "gpu"  # a requested GPU index does not exist
GPU_BUSY = "gpu_busy"  # a requested GPU is held by a process that is not this run's
GPU_STUCK = "gpu_stuck"  # GPU memory was not released after the old run stopped
GPU_UNHEALTHY = "gpu_unhealthy"  # a requested GPU is bad (gpu_judge.py); nothing touched
PORT_BUSY = "port_busy"  # a readiness port is taken by a foreign process
FATAL_LOG = "fatal_log"  # a process printed one of its ``fatal`` patterns
EXITED = "exited"  # a process exited before it was ready
TIMEOUT = "timeout"  # readiness not reached in time
MODEL_MISMATCH = "model_mismatch"  # the server serves another model than ``ready.model``
NOT_SERVING = "not_serving"  # ``ready.generate``: the first real request was refused (non-2xx)
NOT_FOUND = "not_found"  # no such run, playbook, process or model
CANCELLED = "cancelled"  # the workstation wrote ``cancel``; what was launched was stopped
DRIVER = "driver"  # provision: the NVIDIA driver does not meet ``requires``
PYTHON = "python"  # provision: no usable base interpreter
NO_INTERNET = "no_internet"  # the box cannot reach the package index or the hub
PIP = "pip"  # pip failed (its output is the excerpt)
AUTH = "auth"  # the hub refused the token (or needs one)
NO_HUB_CLIENT = "no_hub_client"  # no hub CLI in the chosen environment
HUB = "hub"  # another hub failure
DEST = "dest"  # hub_download's destination is not usable
TRANSFER = "transfer"  # a file transfer broke (frames, sizes, checksums, paths)
NO_SSH = "no_ssh"  # ssh or ssh-keygen missing on the box (box-to-box copies)
PEER = "peer"  # the peer box could not be reached or refused (ssh's message follows)
INTERNAL = "internal"  # an unexpected exception (the traceback's last line)
ERROR_KINDS: Tuple[str, ...] = (
    BAD_REQUEST, WORKDIR, DISK, LOCK, PROC, GPU, GPU_BUSY, GPU_STUCK, GPU_UNHEALTHY, PORT_BUSY,
    FATAL_LOG, EXITED, TIMEOUT, MODEL_MISMATCH, NOT_SERVING, NOT_FOUND, CANCELLED, DRIVER,
    PYTHON, NO_INTERNET, PIP, AUTH, NO_HUB_CLIENT, HUB, DEST, TRANSFER, NO_SSH, PEER, INTERNAL)


class Field(NamedTuple):
    """One request field: its JSON types (``str``, ``int``, ``num``, ``bool``, ``list``,
    ``dict``, ``null``; ``any`` for a free-form value) and whether the op needs it."""

    types: Tuple[str, ...]
    required: bool = False


def f(types: str, required: bool = False) -> Field:
    """``f("str|null")``: a field spec from its types joined with ``|``."""
    return Field(tuple(types.split("|")), required)


# Fields every request has (``base_request`` adds them).
COMMON: Dict[str, Field] = {
    "v": f("int"), "op": f("str", True), "workdir": f("str", True), "env": f("dict"),
    "host_label": f("str|null"),
}
_RUN = {"playbook": f("str|null"), "run_id": f("str|null")}
_TRANSFER = {"root": f("str", True), "expect": f("dict", True), "mark_staged": f("bool"),
             "source": f("str|null")}

# Each op's own fields, in the order ops were added (the order ``bad_request`` lists them).
REQUESTS: Dict[str, Dict[str, Field]] = {
    "deploy": {
        "playbook": f("str", True), "run_id": f("str", True), "processes": f("list", True),
        "secrets": f("dict"), "files": f("list|null"), "wait": f("bool"),
        "lock_timeout": f("num"), "progress_interval": f("num"), "settle": f("num"),
        "gpu_timeout": f("num"), "manifest": f("any"), "allow_unhealthy_gpu": f("bool"),
    },
    "cleanup": {
        **_RUN, "all": f("bool"), "dry_run": f("bool"), "lock_timeout": f("num"),
        "gpu_timeout": f("num"), "force_foreign": f("list|null"), "stop_grace": f("num|null"),
    },
    "status": {
        **_RUN, "log_lines": f("int"), "progress_bytes": f("int"), "markers": f("list"),
        "gpu_holders": f("bool"), "hang": f("dict|null"),
    },
    "logs": {**_RUN, "lines": f("int"), "processes": f("list|null")},
    "check": {},
    "model_facts": {"models": f("list"), "pythons": f("list"), "drafters": f("list")},
    "follow": {
        **_RUN, "processes": f("list|null"), "cursors": f("dict|null"), "lines": f("int|null"),
        "lines_if_no_cursor": f("bool"), "follow": f("bool"), "heartbeat": f("num"),
        "poll": f("num"), "max_seconds": f("num"), "stall_limit": f("num"),
        "chunk_bytes": f("int"), "compress": f("bool"),
    },
    "provision": {
        "environments": f("list", True), "requires": f("dict"), "dry_run": f("bool"),
        "progress_interval": f("num"), "lock_timeout": f("num"), "secrets": f("dict"),
    },
    "hub_download": {
        "probe_only": f("bool"), "repo_id": f("str"), "revision": f("str|null"),
        "kind": f("str|null"), "dest": f("str"), "allow_patterns": f("list"),
        "python": f("str|null"), "endpoint": f("str|null"), "secrets": f("dict"),
        "progress_interval": f("num"),
    },
    "mark_staged": {"root": f("str", True), "expect": f("dict", True), "source": f("str|null")},
    "manifest": {"items": f("list", True), "hash": f("bool")},
    "send_files": {"root": f("str", True), "files": f("list", True)},
    "recv_files": dict(_TRANSFER),
    "authorize_key": {"public_key": f("str", True), "tag": f("str", True)},
    "revoke_key": {"tag": f("str", True)},
    "peer_keygen": {"tag": f("str", True)},
    "peer_pull": {**_TRANSFER, "tag": f("str", True), "peer": f("dict", True),
                  "send": f("dict", True)},
    "checkpoints": {"save_path": f("str", True), "scheduler": f("bool"),
                    "max_steps": f("int|null")},
    "bench": {
        "base_url": f("str"), "model": f("str"), "prompts": f("list|null"),
        "prompts_path": f("str|null"), "conversations": f("list|null"), "requests": f("int"),
        "concurrency": f("int"), "max_tokens": f("int"), "temperature": f("num"),
        "timeout": f("num"), "settle": f("num"), "check_only": f("bool"),
        "progress_interval": f("num"), "chat_template_kwargs": f("dict|null"),
        "dataset": f("dict|null"),
    },
}
OPS: Tuple[str, ...] = tuple(REQUESTS)

# The simple results' fields (beyond ``event: result``, ``t`` and ``ok``), for the docs and
# the workstation's readers; deploy, cleanup, status and follow are in docs/agent-protocol.md.
RESULTS: Dict[str, Tuple[str, ...]] = {
    "check": ("workdir_writable", "disk_free_bytes", "python", "facts"),
    "model_facts": ("models", "envs"),
    "mark_staged": ("root", "files"),
    "manifest": ("items",),
    "send_files": ("bytes",),
    "recv_files": ("files", "bytes", "seconds"),
    "peer_pull": ("files", "bytes", "seconds"),
    "authorize_key": ("path", "tag"),
    "revoke_key": ("removed",),
    "peer_keygen": ("public_key", "has_ssh"),
    "checkpoints": ("save_path", "exists", "checkpoints", "others"),  # and "now" if it exists
    # bench with check_only: prompts, kinds, prompts_sha256
    "bench": ("prompts", "kinds", "sent", "failed", "errors", "completion_tokens", "seconds",
              "metrics_before", "metrics_after", "metric_reads", "per_request"),
}


def _type_of(value: Any) -> str:
    """The protocol's name for a JSON value's type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "num"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    return "dict" if isinstance(value, dict) else type(value).__name__


def _fits(value: Any, spec: Field) -> bool:
    """Whether ``value`` has one of the field's types (an int is also a ``num``)."""
    kind = _type_of(value)
    return "any" in spec.types or kind in spec.types or (kind == "int" and "num" in spec.types)


def request_problems(request: Any) -> List[str]:
    """Everything wrong with a request's shape, each naming the field: unknown op, unknown
    field, missing required field, wrong type. Empty when it fits the protocol."""
    if not isinstance(request, dict):
        return ["request: must be a JSON object"]
    op = request.get("op")
    if op not in REQUESTS:
        return [f"op: must be one of {', '.join(OPS)}"]
    fields = {**COMMON, **REQUESTS[op]}
    problems = []
    for name, spec in fields.items():
        if spec.required and name not in request:
            problems.append(f"{name}: required by op {op}")
    for name, value in request.items():
        found = fields.get(name)
        if found is None:
            problems.append(f"{name}: not a field of op {op} (it takes "
                            f"{', '.join(sorted(fields))})")
        elif not _fits(value, found):
            problems.append(f"{name}: must be {' or '.join(found.types)}, "
                            f"not {_type_of(value)}")
    return problems
