"""The workstation side of the agent protocol (docs/agent-protocol.md).

One call = one exec: the bootstrap command, then the zlib-compressed agent source and one JSON
request written to stdin in a single write, then JSON-line events read back until the
``result`` line. Events go to a callback as they arrive (live progress); the result is returned
or raised as :class:`RemoteError`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from outrig.errors import LinkLost, RemoteError
from outrig.reader import ChannelReader, Event, EventHandler
from outrig.timing import agent_idle_limit
from outrig.transport import AgentChannel, Transport


def find_agent() -> Path:
    """Where the box agent's source is: inside the installed package (a wheel ships
    remote/agent.py as ``outrig/_box/agent.py``) or beside the package in a checkout."""
    here = Path(__file__).resolve().parent
    candidates = (here / "_box" / "agent.py", here.parent / "remote" / "agent.py")
    return next((path for path in candidates if path.is_file()), candidates[-1])


AGENT_PATH = find_agent()
BOOTSTRAP = (
    "import sys,zlib;"
    "sys.version_info<(3,8) and sys.exit('outrig agent needs Python >= 3.8, this is '"
    "+sys.version.split()[0]);"
    "n=int(sys.stdin.buffer.readline());"
    "exec(compile(zlib.decompress(sys.stdin.buffer.read(n)),'outrig-agent','exec'))"
)
# The fast path: agent and request both travel in the exec'd command line. An SSH session
# channel has a zero send window until the server has started the command, so anything written
# to stdin waits one extra round trip for the window; the command line does not. Linux caps one
# argument (and sshd passes the whole command to the shell as one) at 128 KiB, hence the limit;
# requests carrying secrets always use stdin so that no secret is ever visible in argv.
BOOTSTRAP_ARGV = "\n".join([
    "import sys,zlib,base64,os,marshal",
    "sys.version_info<(3,8) and sys.exit('outrig agent needs Python >= 3.8, this is '"
    "+sys.version.split()[0])",
    "d=lambda s:zlib.decompress(base64.b64decode(s))",
    # Compiling the agent costs ~50 ms a call; keep its code object per (source, Python).
    "p=os.path.expanduser('~/.cache/outrig/agent-%s-%s.bin'%(sys.argv[3],"
    "sys.implementation.cache_tag))",
    "try:",
    " c=marshal.loads(open(p,'rb').read())",
    "except Exception:",
    " c=compile(d(sys.argv[1]),'outrig-agent','exec')",
    " try:",
    "  os.makedirs(os.path.dirname(p),exist_ok=True);t='%s.%d'%(p,os.getpid())",
    "  open(t,'wb').write(marshal.dumps(c));os.replace(t,p)",
    " except Exception:",
    "  pass",
    "exec(c,{'__name__':'__main__','OUTRIG_REQUEST':d(sys.argv[2]),"
    "'OUTRIG_AGENT_B64':sys.argv[1]})",
])
ARGV_LIMIT = 120_000
CANCEL_LINE = b"cancel\n"  # written to a deploying agent's stdin on Ctrl-C
PROTOCOL_VERSION = 1


@lru_cache(maxsize=1)
def agent_payload() -> bytes:
    """The compressed agent source with its length line (cached: it never changes in a run)."""
    try:
        source = AGENT_PATH.read_bytes()
    except FileNotFoundError:
        raise RemoteError(
            f"the remote agent {AGENT_PATH} is missing: this outrig install is incomplete; "
            "reinstall it (pip install --force-reinstall outrig, or pip install -e . in a "
            "checkout)"
        ) from None
    packed = zlib.compress(source, 9)
    return f"{len(packed)}\n".encode() + packed


@lru_cache(maxsize=1)
def agent_b64() -> str:
    """The agent source, compressed and base64-encoded for the command line."""
    packed = agent_payload()
    return base64.b64encode(packed[packed.index(b"\n") + 1:]).decode("ascii")


@lru_cache(maxsize=1)
def agent_digest() -> str:
    """Names the box-side cache of the compiled agent (changes with every source change)."""
    return hashlib.sha256(AGENT_PATH.read_bytes()).hexdigest()[:20]


def agent_command(python: str) -> list[str]:
    return [python, "-S", "-c", BOOTSTRAP]  # -S: no site-packages; the agent is stdlib only


def argv_command(python: str, request_json: bytes) -> list[str] | None:
    """The one-exec command carrying agent and request, or None when it would be too long."""
    request = base64.b64encode(zlib.compress(request_json, 9)).decode("ascii")
    argv = [python, "-S", "-c", BOOTSTRAP_ARGV, agent_b64(), request, agent_digest()]
    if sum(len(part) + 3 for part in argv) > ARGV_LIMIT:
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
        """The reader of ``channel`` under this call's idle limit (see :mod:`outrig.reader`)."""
        return ChannelReader(channel, self.transport.host, self.idle_limit(), **options)

    def start(self, request: dict[str, Any], *, window_size: int | None = None) -> AgentChannel:
        """Start the agent with ``request``; the caller may then stream more bytes to its
        stdin (file frames) and reads its events and result with :meth:`reader`."""
        host = self.transport.host
        body = {"v": PROTOCOL_VERSION, **request}
        encoded = json.dumps(body).encode()
        argv = None if body.get("secrets") else argv_command(host.python, encoded)
        channel = self.transport.start(argv or agent_command(host.python), window_size=window_size)
        if argv is None:
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
    """Turn an ``ok: false`` result into a :class:`RemoteError` with the agent's details."""
    if result.get("ok"):
        return result
    error = result.get("error") or {}
    message = str(error.get("message") or "the agent reported a failure without details")
    process = error.get("process")
    raise RemoteError(f"{where}: {message}", kind=str(error.get("kind") or "remote"),
                      excerpt=[str(x) for x in error.get("excerpt") or []],
                      exit_code=error.get("exit_code"), process=process)
