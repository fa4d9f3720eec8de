"""What every op needs: where the project's files are, the host, its facts, a connection."""

from __future__ import annotations

import os
import secrets as _secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outrig.agent_client import AgentCall, raise_for_result
from outrig.agent_code import BAD_REQUEST, PROTOCOL_VERSION, request_problems
from outrig.console import Reporter
from outrig.errors import LinkLost, RemoteError
from outrig.inventory import Host, resolve_host
from outrig.journal import Journal
from outrig.plan import HostFacts
from outrig.timing import retry_pause
from outrig.transport import Transport, transport_for


@dataclass
class Project:
    """The folder holding ``hosts/`` and ``playbooks/`` (where tasks.py is), and the
    command's setting for warm connections.

    ``keep_seconds``: how long a warm connection this command leaves waits idle (0: none),
    as :func:`outrig.settings.settings_for` resolved it (``--no-keep``,
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


def playbook_name(project: Project, value: str | None) -> str | None:
    """``--playbook`` as cleanup, status and tail-logs need it: the name runs are filed under.

    deploy and plan take a name or a path; a path here would otherwise reach the box as a
    name and be refused there, so a path is read for the ``name:`` it deploys as."""
    if value is None or not ("/" in value or value.endswith((".yaml", ".yml"))):
        return value
    from outrig.playbook import find_playbook, load_job

    return load_job(find_playbook(value, project.playbooks_dir)).name


def new_run_id(playbook: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{playbook}-{stamp}-{_secrets.token_hex(2)}"


def host_facts(host: Host, journal: Journal) -> HostFacts:
    """GPU count declared in the host file wins; else what the box said last time."""
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
                 journal: Journal | None = None, *, transport: Transport | None = None) -> None:
        self.project = project
        self.reporter = reporter
        self.journal = journal or Journal()
        self.host_spec = host_spec
        self.host = resolve_host(host_spec, hosts_dir=project.hosts_dir)
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
        reaches it must not take it for the job's live run (see :mod:`outrig.fencing`)."""
        if self.moved_warned:
            return
        self.moved_warned = True
        from outrig.fencing import moved_line, moved_runs

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
                 journal: Journal | None = None) -> Iterator[HostSession]:
    """A session for the length of one op (the host-string entry points' way in)."""
    session = HostSession(project, host_spec, reporter, journal)
    try:
        yield session
    finally:
        session.close()


def secret_values(names: list[str]) -> dict[str, str]:
    """Read the playbook's secrets from this environment; a missing one is a ConfigError."""
    from outrig.errors import ConfigError

    missing = [name for name in names if not os.environ.get(name)]
    if missing:
        raise ConfigError(
            f"secret{'s' if len(missing) > 1 else ''} {', '.join(missing)} (listed under "
            "secrets: in the playbook) not set in this shell; export it before deploying. "
            "Nothing was sent."
        )
    return {name: os.environ[name] for name in names}


def run_ran(record: dict[str, Any]) -> bool:
    """Whether a journal run really ran: its deploy succeeded (or the box saw it running)."""
    return bool(record.get("ran")) or (record.get("ran") is None
                                       and record.get("status") in ("running", "finished"))


def _run_line(record: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(record.get("created") or 0)))
    return (f"{record.get('run_id')} (playbook {record.get('playbook')}, "
            f"{record.get('status')}, created {when})")


def pick_host_run(journal: Journal, host: str, *, run_id: str | None = None,
                  playbook: str | None = None) -> tuple[dict[str, Any], str]:
    """The host's run that ``migrate`` and ``sync-checkpoints`` act on, and why it was chosen.

    ``run_id`` picks one outright. Otherwise the newest run (of ``playbook``, if given) that
    really ran (see :func:`run_ran`; the journal follows the box's run records on every
    contact): a failed deploy, a cut one or one that never reached the box made no
    checkpoints. When runs of different playbooks are running on the host at once there is no
    single answer: a :class:`ConfigError` names them and the flag that picks one."""
    from outrig.errors import ConfigError

    runs = journal.runs(host=host, playbook=playbook)
    if run_id is not None:
        chosen = next((r for r in runs if r.get("run_id") == run_id), None)
        if chosen is None:
            have = "; ".join(_run_line(r) for r in runs[:8]) or "none"
            raise ConfigError(f"the journal has no run {run_id} on {host} (it has: {have})")
        return chosen, f"run {_run_line(chosen)}, named with --run"
    ran = [r for r in runs if run_ran(r)]
    scope = f"of playbook {playbook} " if playbook else ""
    if not ran:
        seen = "; ".join(_run_line(r) for r in runs[:8])
        raise ConfigError(
            f"no run {scope}on {host} in the journal ever ran"
            + (f" (recorded: {seen})" if seen else "")
            + "; pass --playbook NAME to say which playbook's checkpoints to use")
    running = [r for r in ran if r.get("status") == "running"]
    if len({r.get("playbook") for r in running}) > 1:
        choices = "; ".join(_run_line(r) for r in running)
        raise ConfigError(
            f"runs of {len(running)} playbooks are running on {host}: {choices}. Say which "
            "one: --run RUN_ID" + (" or --playbook NAME" if playbook is None else ""))
    chosen = running[0] if running else ran[0]
    skipped = [r for r in runs if r is not chosen
               and float(r.get("created") or 0) > float(chosen.get("created") or 0)]
    why = (f"run {_run_line(chosen)}: the newest run {scope}on {host} that "
           + ("is running" if running else "ran"))
    if skipped:
        why += "; passed over: " + ", ".join(
            f"{r.get('run_id')} ({r.get('status')}, {'ran' if run_ran(r) else 'never ran'})"
            for r in skipped)
    return chosen, why
