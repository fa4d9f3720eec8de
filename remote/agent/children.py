"""The child processes that ``provision`` and ``hub_download`` run (pip, uv, venv, the hub
CLI, small interpreter probes), and what their output says when they fail.

A child's output is streamed as throttled ``progress`` events (:func:`run_streaming`), so the
workstation sees a long wheel build or download alive; a probe prints one JSON object
(:func:`probe_json`); a failure is read off the last lines as ``disk`` or ``no_internet``
(:func:`classify_child_failure`, from :data:`DISK_PATTERNS` and :data:`NO_INTERNET_PATTERNS`)
before the op blames its own inputs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from typing import Any, Dict, List, Optional, Tuple

from .constants import JSONDict
from .events import Emitter
from .installers import UV_NO_INTERNET_PATTERNS
from .logs import clean_line

CHILD_EXCERPT_KEEP = 200  # lines of child output kept for error classification

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
    *UV_NO_INTERNET_PATTERNS,
)
DISK_PATTERNS = ("No space left on device", "[Errno 28]", "Disk quota exceeded")


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
