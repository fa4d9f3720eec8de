"""Readiness probes (http, port, served model) and the wrapper's exit files."""

from __future__ import annotations

import json
import socket
from typing import Optional, Tuple

from .constants import COMPLETION_TIMEOUT_S, PROBE_TIMEOUT_S
from .layout import read_json


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
    import urllib.parse
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


def probe_completion(url: str, model: str, timeout: float = COMPLETION_TIMEOUT_S
                     ) -> Tuple[Optional[int], str]:
    """POST one tiny ``/v1/completions`` (``max_tokens: 1``) for ``model`` on the origin of
    ``url``: (HTTP status, first 300 bytes of the body), or (None, why) when nothing answered.

    vLLM answers /health before it has run a single request: a server whose engine dies at the
    first one (an unsupported attention shape on CPU, for example) looks ready to /health and
    /v1/models. Only an answered request shows the engine really runs."""
    import urllib.error
    import urllib.parse
    import urllib.request  # lazily: ~20 ms of imports that most calls never need

    parts = urllib.parse.urlsplit(url)
    target = urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/v1/completions", "", ""))
    body = json.dumps({"model": model, "prompt": [0], "max_tokens": 1,
                       "temperature": 0}).encode()
    request = urllib.request.Request(target, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as resp:
            return int(resp.status), resp.read(300).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        try:
            text = exc.read(300).decode("utf-8", "replace")
        except Exception:  # the body may be cut with the connection
            text = ""
        return int(exc.code), text
    except Exception as exc:  # refused, timeout, reset: no answer yet
        return None, str(getattr(exc, "reason", exc))[:200]


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
