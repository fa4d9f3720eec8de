"""The workstation side of the agent protocol (docs/agent-protocol.md).

One call = one exec: the bootstrap command with the agent bundle (the package remote/agent/ as
one compressed zip, see remote/agent/bundle.py) and the JSON request in its command line, or,
for requests carrying secrets, both written to stdin in a single write; then JSON-line events
read back until the ``result`` line (outrig/agent/reader.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from outrig.agent.reader import ChannelReader, Event, EventHandler
from outrig.agent_code import bundle as agent_bundle
from outrig.agent_code import encode_request
from outrig.console import one_line
from outrig.errors import LinkLost, RemoteError
from outrig.timing import agent_idle_limit
from outrig.transport import AgentChannel, LiveRequest, Transport, needs_own_channel

AGENT_DIR = Path(agent_bundle.__file__).resolve().parent  # remote/agent/ (outrig/_box/agent/)
# The fast path: bundle and request both travel in the exec'd command line. An SSH session
# channel has a zero send window until the server has started the command, so anything written
# to stdin waits one extra round trip for the window; the command line does not. Linux caps one
# argument (and sshd passes the whole command to the shell as one) at 128 KiB (MAX_ARG_STRLEN,
# 131072 bytes with its NUL), hence the limit on the command as sshd gets it (shlex-joined),
# a little below that; requests carrying secrets always use stdin so that no secret is ever
# visible in argv.
ARGV_LIMIT = 130_000
CANCEL_LINE = b"cancel\n"  # written to a deploying agent's stdin on Ctrl-C


@lru_cache(maxsize=1)
def agent_bundle_bytes() -> bytes:
    """The agent package as one zip (bundle.py); cached: it never changes in a run."""
    try:
        sources = agent_bundle.package_sources()
        key = _sources_key(sources)
        cached = _cached_bundle(key)
        if cached is not None:
            return cached
        bundle = agent_bundle.build_bundle(sources)
    except (OSError, KeyError) as exc:
        raise RemoteError(
            f"the remote agent in {AGENT_DIR} is missing or incomplete ({exc}): this outrig "
            "install is broken; reinstall it (pip install --force-reinstall outrig, or "
            "pip install -e . in a checkout)"
        ) from None
    _keep_bundle(BUNDLE_CACHE / f"outrig-bundle-{key}-{agent_bundle.digest_of(bundle)}.zip",
                 bundle)
    return bundle


# The built bundle of exactly these sources is kept beside the package's compiled modules:
# building it (parsing every module to strip it) costs a fresh `outrig` process about 0.15 s,
# several times what reading it back does. Named by the sources and by its own digest, so a
# damaged file is never sent.
BUNDLE_CACHE = AGENT_DIR / "__pycache__"


def _sources_key(sources: dict[str, bytes]) -> str:
    """Names one set of sources (names and contents)."""
    digest = hashlib.sha256()
    for name, data in sorted(sources.items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()[:20]


def _cached_bundle(key: str) -> bytes | None:
    """The kept bundle of these sources, if one is there whole."""
    for path in BUNDLE_CACHE.glob(f"outrig-bundle-{key}-*.zip"):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if path.stem.rsplit("-", 1)[-1] == agent_bundle.digest_of(data):
            return data
    return None


def _keep_bundle(path: Path, bundle: bytes) -> None:
    """Write the cache atomically and drop the bundles of older sources; best effort (a
    read-only install just builds the bundle in every process)."""
    try:
        path.parent.mkdir(exist_ok=True)
        temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temp.write_bytes(bundle)
        os.replace(temp, path)
        for old in path.parent.glob("outrig-bundle-*.zip"):
            if old != path:
                old.unlink(missing_ok=True)
    except OSError:
        pass


@lru_cache(maxsize=1)
def agent_payload() -> bytes:
    """The compressed bundle with its length line, as it goes on stdin."""
    packed = agent_bundle.pack(agent_bundle_bytes())
    return f"{len(packed)}\n".encode() + packed


@lru_cache(maxsize=1)
def agent_b64() -> str:
    """The compressed bundle in base64, for the command line."""
    packed = agent_payload()
    return base64.b64encode(packed[packed.index(b"\n") + 1:]).decode("ascii")


@lru_cache(maxsize=1)
def agent_digest() -> str:
    """Names the bundle's folder on the box (changes with every source change)."""
    return agent_bundle.digest_of(agent_bundle_bytes())


def agent_command(python: str, workdir: str = "") -> list[str]:
    """The command for the stdin path: the bundle (:func:`agent_payload`) then the request
    line follow on stdin. Without ``workdir`` the box runs the bundle from memory."""
    return agent_bundle.bootstrap_argv(python, agent_digest(), workdir, None, None)


def argv_command(python: str, request_json: bytes, workdir: str = "") -> list[str] | None:
    """The one-exec command carrying bundle and request, or None when it would be too long.
    ``workdir`` is the request's (where the box keeps the unpacked bundle)."""
    argv = agent_bundle.bootstrap_argv(python, agent_digest(), workdir, agent_b64(),
                                       encode_request(request_json))
    if len(shlex.join(argv)) > ARGV_LIMIT:
        return None
    return argv


class AgentCall:
    """Run one request on ``transport`` and collect its events."""

    def __init__(self, transport: Transport, *, idle_timeout: float | None = None) -> None:
        self.transport = transport
        self.idle_timeout = idle_timeout
        self.events: list[Event] = []

    def idle_limit(self) -> float:
        """The silence allowed on this call's channel (:func:`outrig.timing.agent_idle_limit`)."""
        if self.idle_timeout is not None:
            return self.idle_timeout
        return agent_idle_limit(self.transport.rtt)

    def reader(self, channel: AgentChannel, **options: Any) -> ChannelReader:
        """The reader of ``channel`` under this call's idle limit (see
        :mod:`outrig.agent.reader`)."""
        return ChannelReader(channel, self.transport.host, self.idle_limit(), **options)

    def start(self, request: dict[str, Any], *, window_size: int | None = None) -> AgentChannel:
        """Start the agent with ``request`` (as :func:`~outrig.session.base_request` built
        it), the one way every op and tail-logs' follow stream start it. The request rides in
        the command line when it fits and carries no secret; else bundle and request go on
        stdin, written at once after the exec (pipelined: no reply awaited). Either way the
        box runs the bundle kept unpacked in the request's workdir. A connector with a live
        agent on the box (the kept connection's) runs the request there instead, when it can:
        no exec at all (:meth:`~outrig.transport.Transport.start_agent`). ``window_size``: a larger
        receive window for bulk output. The caller may then stream more bytes to the agent's
        stdin (file frames) and reads its events and result with :meth:`reader`."""
        python = self.transport.host.python
        workdir = str(request.get("workdir") or "")
        encoded = json.dumps(request).encode()
        argv = None if request.get("secrets") else argv_command(python, encoded, workdir)
        command = argv or agent_command(python, workdir)
        live = None if needs_own_channel(op=request.get("op")) else LiveRequest(
            encoded + b"\n", python, workdir, agent_digest(),
            agent_b64() if argv is not None else None)
        channel = self.transport.start_agent(command, live, window_size=window_size)
        if argv is None and not channel.live:
            try:
                channel.write(agent_payload() + encoded + b"\n")
            except LinkLost as exc:
                # The request did not get through whole, so the agent cannot have acted on it.
                channel.close()
                exc.phase, exc.request_sent = "exec", False
                raise
            except BaseException:
                channel.close()
                raise
        return channel

    def run(self, request: dict[str, Any], on_event: EventHandler | None = None, *,
            on_interrupt: Callable[[], None] | None = None) -> Event:
        """Start the agent and read its result. With ``on_interrupt``, a first Ctrl-C writes
        ``cancel`` to the agent (which stops what it launched and answers) and keeps reading;
        a second one propagates."""
        channel = self.start(request)
        try:
            try:
                return self.reader(channel).result(on_event, self.events)
            except KeyboardInterrupt:
                if on_interrupt is None:
                    raise
                channel.write(CANCEL_LINE)  # first: a second Ctrl-C during the notice
                on_interrupt()                 # must find the cancel already sent
                return self.reader(channel).result(on_event, self.events)
        finally:
            channel.close()


def raise_for_result(result: Event, *, where: str) -> Event:
    """Turn an ``ok: false`` result into a :class:`RemoteError` with the agent's details.

    The message, the process name and each excerpt line are the box's text: shown with
    :func:`~outrig.console.one_line` (an agent's message is one paragraph; a newline in any
    of them would start a line that looks like outrig's own)."""
    if result.get("ok"):
        return result
    error = result.get("error") or {}
    message = one_line(error.get("message") or "the agent reported a failure without details")
    process = error.get("process")
    raise RemoteError(f"{where}: {message}", kind=str(error.get("kind") or "remote"),
                      excerpt=[one_line(x) for x in error.get("excerpt") or []],
                      exit_code=error.get("exit_code"),
                      process=None if process is None else one_line(process))
