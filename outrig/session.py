"""The session layer under the ops: one box for as long as a command needs it.

What every op needs to reach a box lives here: where the project's files are
(:class:`Project`), the host and what is known about it (:func:`host_facts`, cached by
:func:`remember_facts`), the request body every agent call starts from
(:func:`base_request`), and :class:`HostSession`, which makes the calls and decides, from the
error's type and the op, when a call cut by a lost link is run again
(:func:`link_retry_allowed`). Running one op core on several sessions at once is
:mod:`outrig.fanout`; the run helpers the ops share (run ids, which run a command means) are
:mod:`outrig.ops.runs`.

Every command that reaches a box imports this module, and most of them plan nothing
(``status``, ``tail-logs``, ``exec``...), so the planner (and with it the recipes) is imported
where the facts for a plan are made (:func:`host_facts`), purely for start-up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outrig.agent.client import AgentCall, raise_for_result
from outrig.agent_code import BAD_REQUEST, PROTOCOL_VERSION, request_problems
from outrig.console import Reporter
from outrig.errors import LinkLost, RemoteError
from outrig.inventory import Host, HostBook
from outrig.journal import Journal
from outrig.moves import moved_line, moved_runs
from outrig.timing import retry_pause
from outrig.transport import Transport, transport_for

if TYPE_CHECKING:
    from outrig.plan import HostFacts


@dataclass
class Project:
    """The folder holding ``hosts/`` and ``playbooks/`` (where tasks.py is), and the
    command's setting for warm connections.

    ``keep_seconds``: how long a warm connection this command leaves waits idle (0: none),
    as :func:`outrig.cli.settings.settings_for` resolved it (``--no-keep``,
    ``OUTRIG_KEEP_SECONDS``, ``keep_seconds:`` in outrig.yaml); ``None``: not set by the
    command (the connector's own rule: ``OUTRIG_KEEP_SECONDS``, the host file, 10 minutes).
    Carried to the connector by :class:`HostSession`, so no global is needed."""

    root: Path
    keep_seconds: float | None = None

    @property
    def hosts_dir(self) -> Path:
        return self.root / "hosts"

    @property
    def playbooks_dir(self) -> Path:
        return self.root / "playbooks"


def host_facts(host: Host, journal: Journal) -> HostFacts:
    """GPU count declared in the host file wins; else what the box said last time."""
    from outrig.plan import HostFacts

    cached = journal.host_facts(host.name)
    memory = cached.get("gpu_memory_mib")
    if isinstance(host.gpus, int):
        return HostFacts(gpu_count=host.gpus, gpu_memory_mib=memory,
                         source=f"gpus: {host.gpus} in {host.source}")
    count = cached.get("gpu_count")
    if isinstance(count, int):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(cached.get("updated", 0)))
        return HostFacts(gpu_count=count, gpu_memory_mib=memory,
                         source=f"seen by nvidia-smi on {when}")
    return HostFacts(source="not known yet")


def base_request(host: Host, op: str, **fields: Any) -> dict[str, Any]:
    """The request for ``op`` on ``host``, checked against the protocol's table of ops and
    fields (remote/agent/protocol.py) before it leaves: a misspelt or mistyped field is
    refused here, naming it, not on the box after a round trip."""
    request = {"v": PROTOCOL_VERSION, "op": op, "workdir": host.workdir,
               "env": dict(host.env), **fields}
    problems = request_problems(request)
    if problems:
        raise RemoteError(f"outrig built a {op!r} request the agent would refuse: "
                          f"{'; '.join(problems)}. This is a bug in outrig; please report it "
                          "with the command you ran.", kind=BAD_REQUEST)
    return request


def remember_facts(journal: Journal, host: Host, event: dict[str, Any],
                   rtt: float | None) -> None:
    """Cache what the box said about itself, so the next plan can check GPU indices."""
    gpus = event.get("gpus")
    facts: dict[str, Any] = {"hostname": event.get("hostname"), "python": event.get("python"),
                             "boot_id": event.get("boot_id")}
    if isinstance(gpus, list) and not event.get("gpu_error"):
        facts["gpu_count"] = len(gpus)
        if gpus:
            facts["gpu_memory_mib"] = gpus[0].get("memory_total_mib")
            facts["gpu_name"] = gpus[0].get("name")
    if rtt is not None:
        facts["rtt"] = rtt
    journal.update_host(host.name, **facts)


# Ops that change nothing on the box (or, for cleanup, converge when run twice): after a link
# lost mid-call they are simply run again. deploy, stage and the rest are not: a cut there
# reports the true cause and the command that continues.
RERUN_SAFE_OPS = frozenset({"status", "check", "checkpoints", "manifest", "model_facts",
                            "cleanup"})
LINK_RETRIES = 3  # agent calls re-run per op after a lost link (each reconnects afresh)


def link_retry_allowed(op: str, exc: LinkLost) -> bool:
    """A link lost once the command was under way is retried when the agent cannot have
    received the request, or when the op is safe to run twice. Decided on the error's type
    and fields, never its text."""
    if exc.phase not in ("exec", "stream"):
        return False  # a handshake or channel-open failure: the transport already retried it
    return not exc.request_sent or op in RERUN_SAFE_OPS


class HostSession:
    """One box for as long as a command needs it: its host, connector, journal and reporter.

    A session is opened once per box and handed to each op's core (``status_on(session,
    ...)``, ``deploy_on(session, ...)``); a command that works on two boxes (migrate, stage
    ``--from``) holds one session for each. Opening sends nothing: the connector connects on
    the first agent call, and every later call reuses the connection. ``transport`` injects a
    connector (a test's recording); by default :func:`outrig.transport.transport_for` picks
    the one that serves the host."""

    def __init__(self, project: Project, host_spec: str, reporter: Reporter,
                 journal: Journal | None = None, *, host: Host,
                 transport: Transport | None = None) -> None:
        self.project = project
        self.reporter = reporter
        self.journal = journal or Journal()
        # ``host_spec``: the box as the user typed it, which messages and fix commands repeat
        self.host_spec = host_spec
        # ``host``: the box as the command's target resolved it once (a HostBook), or a box
        # whose host file is gone, at the address its runs' move record holds (redeploy)
        self.host = host
        self.last_events: list[dict[str, Any]] = []
        # set once the "moved" warning was given (or an op acts on the moved runs itself)
        self.moved_warned = False
        rtt_hint = self.journal.host_facts(self.host.name).get("rtt")
        self.transport: Transport = transport or transport_for(
            self.host, rtt_hint=rtt_hint if isinstance(rtt_hint, float) else None,
            notify=reporter.info, keep_seconds=project.keep_seconds)

    def facts(self) -> HostFacts:
        return host_facts(self.host, self.journal)

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """The body of an agent request for this box (workdir, env and ``fields``)."""
        return base_request(self.host, op, **fields)

    def call(self, op: str, *, stream: bool = True,
             handler: Callable[[dict[str, Any]], None] | None = None,
             on_interrupt: Callable[[], None] | None = None,
             **fields: Any) -> dict[str, Any]:
        """Run one agent op; events stream to the reporter (or to ``handler``, which an op uses
        to show its own live progress); a failed result raises."""
        # host_label lets the agent write fix commands the user can paste (--host as typed)
        request = base_request(self.host, op, host_label=self.host_spec, **fields)
        self.warn_moved()

        def on_event(event: dict[str, Any]) -> None:
            if event.get("event") == "facts":
                remember_facts(self.journal, self.host, event, self.transport.rtt)
            if event.get("event") == "runs":  # the box's run index: the journal follows it
                box_runs = event.get("runs")
                if isinstance(box_runs, list):
                    self.journal.reconcile(self.host.name,
                                           [r for r in box_runs if isinstance(r, dict)])
                return
            if handler is not None:
                handler(event)
            elif stream:
                self.reporter.event(event)

        retries = 0
        while True:
            call = AgentCall(self.transport)
            self.last_events = call.events  # also what a second Ctrl-C reports as launched
            try:
                result = call.run(request, on_event, on_interrupt=on_interrupt)
            except LinkLost as exc:
                if not link_retry_allowed(op, exc) or retries >= LINK_RETRIES:
                    raise
                retries += 1
                self.reconnect_after(exc, retries)
                continue
            self.last_events = call.events
            return raise_for_result(result, where=f"{op} on {self.host.label()}")

    def warn_moved(self) -> None:
        """Before the first agent call of the session: when a migrate moved a run away from
        this box and nothing has confirmed it stopped, say so and name the command that stops
        it. The box comes back from a lost link with that run still training; the user who
        reaches it must not take it for the job's live run (see :mod:`outrig.moves`)."""
        if self.moved_warned:
            return
        self.moved_warned = True
        for record in moved_runs(self.journal, self.host.name):
            self.reporter.warn(moved_line(record, self.host_spec))

    def reconnect_after(self, exc: LinkLost, retry: int) -> None:
        """Say what broke, drop the dead connection and wait an RTT-scaled pause; the next
        agent call connects afresh (through the connector's own bounded retries)."""
        pause = retry_pause(self.transport.best_rtt, retry)
        self.reporter.warn(f"{exc} Reconnecting in {pause:.1f} s (retry {retry} of "
                           f"{LINK_RETRIES}).")
        self.transport.reconnect()
        time.sleep(pause)

    def close(self) -> None:
        self.transport.close()
        self.reporter.close()


@contextmanager
def host_session(project: Project, host_spec: str, reporter: Reporter,
                 journal: Journal | None = None, *, host: Host | None = None,
                 book: HostBook | None = None) -> Iterator[HostSession]:
    """A session for the length of one op (the host-string entry points' way in): ``host``
    as given, else ``host_spec`` looked up in ``book`` (the command's target's, which
    resolved it once), else resolved here (an op called without a target: a test, another
    op)."""
    session = HostSession(project, host_spec, reporter, journal,
                          host=host or (book or HostBook(project.hosts_dir))(host_spec))
    try:
        yield session
    finally:
        session.close()
