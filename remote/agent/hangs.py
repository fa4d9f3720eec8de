"""What ``status`` samples on the box for the workstation's hang judge (outrig/hang/judge.py).

One sample per running process, taken when the request asks for it (``hang``: the metric
names to read and the canary's deadline): the box's clock, the log's size and modification
time, whether every live process of its tree is stopped (state T), and for an HTTP server
(a process with ``ready.http``) the named counters of its metrics page, summed over their
labels (vLLM has one series per engine), and the canary's answer. The agent judges nothing:
every bound and count lives on the workstation.
"""

from __future__ import annotations

import os
import re
import time
from typing import Dict, List, Optional

from .constants import JSONDict
from .events import bad_request
from .probes import probe_completion
from .procs import read_stat
from .validation import Request

METRICS_BYTES = 1 << 20  # a vLLM page with many engines is ~100 KiB; more is not read
METRICS_TIMEOUT_S = 2.0


def hang_request(req: Request) -> Optional[JSONDict]:
    """The request's ``hang`` field, checked (None: no samples wanted)."""
    raw = req.raw.get("hang")
    if raw is None:
        return None
    names = raw.get("metrics", [])
    path = raw.get("metrics_path", "/metrics")
    canary = raw.get("canary", 0)
    if (not isinstance(names, list) or not all(isinstance(n, str) for n in names)
            or not isinstance(path, str) or not path.startswith("/")
            or not isinstance(canary, (int, float)) or isinstance(canary, bool)
            or not 0 <= canary <= 600):
        raise bad_request("status: hang must be {metrics: [names], metrics_path: '/...', "
                          "canary: seconds 0-600}")
    return {"metrics": names, "metrics_path": path, "canary": float(canary)}


def hang_sample(rec: JSONDict, tree: List[int], wanted: JSONDict) -> JSONDict:
    """One process's sample (module docstring); ``tree``: its live processes but the
    leader, as status found them."""
    sample: JSONDict = {"t": time.time(), "kind": "worker", "log_bytes": None,
                        "log_mtime": None, "stopped": _stopped([rec.get("pid"), *tree])}
    log = rec.get("log")
    if isinstance(log, str):
        try:
            st = os.stat(log)
            sample["log_bytes"], sample["log_mtime"] = st.st_size, st.st_mtime
        except OSError:
            pass
    spec = rec.get("ready")
    url = spec.get("http") if isinstance(spec, dict) else None
    if not isinstance(url, str):
        return sample
    sample["kind"] = "server"
    if wanted["metrics"]:
        sample["metrics"], sample["metrics_error"] = read_metrics(
            _origin(url) + wanted["metrics_path"], wanted["metrics"])
    model = spec.get("model") if isinstance(spec, dict) else None
    if wanted["canary"] > 0 and isinstance(model, str):
        began = time.monotonic()
        code, text = probe_completion(url, model, wanted["canary"])
        took = round(time.monotonic() - began, 2)
        sample["canary"] = {"ok": code == 200, "seconds": took,
                            "why": "" if code == 200 else f"HTTP {code}: {text[:120]}"
                            if code is not None else text[:160]}
    return sample


def _stopped(pids: List[object]) -> bool:
    states = []
    for pid in pids:
        st = read_stat(pid) if isinstance(pid, int) and not isinstance(pid, bool) else None
        if st is not None and st.live():
            states.append(st.state)
    return bool(states) and all(s in ("T", "t") for s in states)


def _origin(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def read_metrics(url: str, names: List[str]) -> tuple[Optional[Dict[str, float]], Optional[str]]:
    """({name: sum over its series} for the names the page has, error) from a Prometheus
    text page; proxies ignored (the URL is on the box)."""
    import urllib.request  # lazily: ~20 ms of imports that most calls never need

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=METRICS_TIMEOUT_S) as resp:
            text = resp.read(METRICS_BYTES).decode("utf-8", "replace")
    except Exception as exc:  # refused, timeout, 404, reset: no counters this time
        return None, str(getattr(exc, "reason", exc))[:200]
    return parse_metrics(text, names), None


def parse_metrics(text: str, names: List[str]) -> Dict[str, float]:
    """The named metrics of a Prometheus text page, each summed over its labelled series
    (``name{engine="0"} 12`` and ``name{engine="1"} 30`` give 42)."""
    wanted = set(names)
    found: Dict[str, float] = {}
    for line in text.splitlines():
        match = _SERIES.match(line)
        if match is None or match.group(1) not in wanted:
            continue
        try:
            value = float(match.group(2))
        except ValueError:
            continue
        if value == value:  # NaN is no count
            found[match.group(1)] = found.get(match.group(1), 0.0) + value
    return found


# ``name{labels} value [timestamp]`` or ``name value``; a label value may hold spaces and
# braces, so the labels run to the last ``}`` before the value
_SERIES = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{.*\})?\s+(\S+)")
