"""Whether the box reaches a server: the hub's endpoint (``hub_download``) and a package index
(a failed ``provision`` install asks the network before it blames the pins).

A TCP connect, DNS included, within :data:`HUB_CONNECT_TIMEOUT_S`: a refused or unresolvable
server is told apart from a missing package or repo without waiting for a client's retries.
"""

from __future__ import annotations

import os
import socket
import urllib.parse
from typing import Optional, Tuple

from .events import bad_request

HUB_CONNECT_TIMEOUT_S = 5.0


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
    """Whether a TCP connection to ``host:port`` (the hub, a package index) succeeds, DNS
    included, within ``timeout``: (True, "") or (False, why not)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True, ""
    except OSError as exc:
        return False, f"{host}:{port}: {exc.strerror or exc}"
