"""The box downloads from the hub itself: a building block for ``inv stage`` / ``migrate``.

Routing 50 GB of weights over a 240 ms link through the workstation is the slowest path there
is; a rented box usually has a fat pipe to the hub. :func:`hub_probe` tells the caller whether
that route is open (TCP connect to the hub within 5 s, and which hub CLI the box has), and
:func:`hub_download` runs it. The HF token is read from this shell's ``HF_TOKEN`` and sent only
in the request's ``secrets`` (the client then uses the stdin path: never argv); the agent puts
it into the CLI's environment and nowhere else. See docs/provision.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from outrig.formats.hub_source import HubSource
from outrig.session import HostSession

TOKEN_ENV = "HF_TOKEN"


def hub_probe(session: HostSession, *, python: str | None = None,
              endpoint: str | None = None) -> dict[str, Any]:
    """``{hub_reachable, endpoint, client, client_kind, reach_error}``; downloads nothing."""
    fields: dict[str, Any] = {"probe_only": True}
    if python:
        fields["python"] = python
    if endpoint:
        fields["endpoint"] = endpoint
    return session.call("hub_download", stream=False, **fields)


def hub_download(session: HostSession, source: HubSource, dest: str, *,
                 python: str | None = None, allow_patterns: list[str] | None = None,
                 token: str | None = None, endpoint: str | None = None,
                 handler: Callable[[dict[str, Any]], None] | None = None,
                 progress_interval: float = 1.0) -> dict[str, Any]:
    """Download ``source`` into ``dest`` (absolute, on the box) with the box's hub CLI.

    ``token`` defaults to this shell's ``HF_TOKEN`` (absent: public repos only). ``python`` is
    the interpreter whose venv holds huggingface_hub (its ``bin/hf`` is used); default: the
    agent's, then PATH. ``progress`` events (``line``, ``elapsed``) go to ``handler`` when
    given, else to the reporter. Returns the agent's result: ``files``, ``bytes``, ``seconds``,
    ``client``, ``hub_reachable``... Raises RemoteError with kind ``auth``, ``not_found``,
    ``no_internet``, ``no_hub_client``, ``disk`` or ``hub``.
    """
    fields: dict[str, Any] = {**source.request(), "dest": dest,
                              "progress_interval": progress_interval}
    if python:
        fields["python"] = python
    if allow_patterns:
        fields["allow_patterns"] = list(allow_patterns)
    if endpoint:
        fields["endpoint"] = endpoint
    secret = token if token is not None else os.environ.get(TOKEN_ENV)
    if secret:
        fields["secrets"] = {TOKEN_ENV: secret}
    return session.call("hub_download", handler=handler, **fields)
