"""What a command acts on: one host, a sweep of hosts, or a multi-node job (a :class:`Target`).

``--host``, ``--run`` and ``--playbook`` are resolved once, here, before anything is sent,
into one of three kinds:

* :class:`OneHost`: one box, driven with the op's own output (tables, progress, JSON).
* :class:`Sweep`: several hosts (``--host a,b``, a group, ``all``), the same work on each at
  once, each host a row of its own (:mod:`outrig.cli.sweep`).
* :class:`NodeJob`: one job across several boxes, a playbook with ``nodes:`` > 1
  (:mod:`outrig.ops.nodes`): the playbook decides, so ``deploy`` and ``plan`` load it first
  (once; the target holds it) and a playbook that lists its nodes needs no ``--host`` at
  all; ``status``, ``cleanup``, ``tail-logs`` and ``watch`` with the ``--run`` id of a job
  (its job id, or one node's run id) cover every node of it, whatever ``--host`` says.

A task then calls :meth:`Target.run` with what it does for each kind it accepts, and the
target calls the one that applies. This is the one place that tells the kinds apart; the
model is fabric's ``Group`` (a single host is a group of one: ``hosts`` is always the list
of hosts; ``ThreadingGroup`` is the sweep; a sweep's :class:`~outrig.fanout.FanOutFailed`
is ``GroupException``).

Every command that takes ``--host`` imports this module, and most of them load no playbook
(``status``, ``tail-logs``, ``exec`` without ``--playbook``), so the playbook models (and
with them the recipes) are imported where a playbook is resolved or loaded
(:func:`playbook_identity`, :func:`_load`), purely for start-up.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from outrig.cli.flags import number
from outrig.cli.settings import Settings, playbook_for
from outrig.console import Reporter
from outrig.errors import ConfigError
from outrig.fanout import MAX_PARALLEL
from outrig.inventory import Host, HostBook
from outrig.journal import Journal
from outrig.session import Project

if TYPE_CHECKING:
    from outrig.playbook import Job


def fanout_parallel(max_parallel: str | None) -> int:
    """``--max-parallel`` of a command that asks several boxes at once (default 32), a
    clear exit-2 error below 1."""
    bound = int(number(max_parallel, "max-parallel", MAX_PARALLEL))
    if bound < 1:
        raise ConfigError(f"--max-parallel must be at least 1, not {bound}")
    return bound


def fanout_limits(max_parallel: str | None,
                  deadline: str | None) -> tuple[int, float | None]:
    """``--max-parallel`` and ``--deadline`` (None: from each host's RTT) of a command that
    asks several boxes at once, as clear exit-2 errors; the deadline is checked first."""
    bound = int(number(max_parallel, "max-parallel", MAX_PARALLEL))
    limit = None if deadline is None else float(number(deadline, "deadline", 60, whole=False))
    if limit is not None and limit <= 0:
        raise ConfigError(f"--deadline must be a positive number of seconds, not {deadline}")
    if bound < 1:
        raise ConfigError(f"--max-parallel must be at least 1, not {bound}")
    return bound, limit


@dataclass
class Target(ABC):
    """What one command acts on, resolved from its flags before anything is sent.

    ``hosts``: the host specs as the command selected them (one host: a list of one; a
    multi-node playbook's ``--host`` selection may be empty, the playbook then lists its
    nodes). ``job``: the playbook, loaded once, when resolving needed it (deploy, plan).
    ``playbook_name``: ``--playbook`` resolved to the name its runs are filed under
    (:func:`outrig.playbook.resolve_playbook`; docs/cli.md, "Which run a command means"),
    the one value every lookup of a playbook's runs uses; None without ``--playbook``."""

    settings: Settings
    reporter: Reporter
    hosts: list[str]
    job: Job | None = None
    playbook_name: str | None = None
    # each host spec resolved once for the command (resolve); the ops take the Host, or
    # the book itself where they check several hosts against each other. Given when the
    # selection was checked through it (a group or a list: :func:`select`)
    _book: HostBook | None = field(default=None, repr=False, compare=False, kw_only=True)

    @property
    def project(self) -> Project:
        return self.settings.project

    @property
    def book(self) -> HostBook:
        """The command's hosts, each resolved once (:class:`~outrig.inventory.HostBook`)."""
        if self._book is None:
            self._book = HostBook(self.project.hosts_dir)
        return self._book

    def resolve(self, spec: str) -> Host:
        """``spec`` (a host file, an alias, user@host:port) as a :class:`Host`, resolved once
        for this command (no network); messages keep repeating ``spec`` as typed."""
        return self.book(spec)

    @property
    def playbook(self) -> Job:
        """The loaded playbook of a target resolved by :func:`select_deploy` (a plan on
        several hosts may have none: then use :attr:`job`)."""
        assert self.job is not None, "this target was resolved without a playbook"
        return self.job

    @abstractmethod
    def run(self, *, host: Callable[[OneHost], object],
            sweep: Callable[[Sweep], object] | None = None,
            job: Callable[[NodeJob], object] | None = None) -> None:
        """Do the command's work for this kind of target: ``host`` on one host, ``sweep`` on
        several, ``job`` on a multi-node job. A command passes the kinds it accepts; the
        resolving function it called yields no other."""


@dataclass
class OneHost(Target):
    """One host: the op's own entry point, with its full output."""

    @property
    def spec(self) -> str:
        """The host as ``--host`` named it (a host file, an alias, user@host:port)."""
        return self.hosts[0]

    @property
    def host(self) -> Host:
        """The one host, resolved (:meth:`Target.resolve`)."""
        return self.resolve(self.spec)

    def run(self, *, host: Callable[[OneHost], object],
            sweep: Callable[[Sweep], object] | None = None,
            job: Callable[[NodeJob], object] | None = None) -> None:
        host(self)


@dataclass
class Sweep(Target):
    """Several hosts, the same work on each at once (each host its own run, session and
    row). ``max_parallel`` and ``deadline`` are the flags as given, read only when the sweep
    runs (a single host ignores them)."""

    max_parallel: str | None = None
    deadline: str | None = None

    def limits(self) -> tuple[int, float | None]:
        """``--max-parallel`` (default 32) and ``--deadline`` (None: from each host's RTT),
        as clear exit-2 errors when they make no sense."""
        return fanout_limits(self.max_parallel, self.deadline)

    def parallel(self) -> int:
        """``--max-parallel`` alone (``tail-logs``, which has no deadline)."""
        return fanout_parallel(self.max_parallel)

    def run(self, *, host: Callable[[OneHost], object],
            sweep: Callable[[Sweep], object] | None = None,
            job: Callable[[NodeJob], object] | None = None) -> None:
        assert sweep is not None, "a sweep was resolved for a command that runs on one host"
        sweep(self)


@dataclass
class NodeJob(Target):
    """A multi-node job: a playbook with ``nodes:`` > 1 about to be deployed or planned
    (:attr:`job` loaded, :attr:`hosts` the ``--host`` selection of its nodes), or a job the
    journal records, named by ``--run`` (:attr:`job_id`; its nodes are in its record)."""

    job_id: str | None = None

    @property
    def recorded_id(self) -> str:
        """The id of the recorded job that ``--run`` named."""
        assert self.job_id is not None, "this job target is a playbook, not a recorded job"
        return self.job_id

    def run(self, *, host: Callable[[OneHost], object],
            sweep: Callable[[Sweep], object] | None = None,
            job: Callable[[NodeJob], object] | None = None) -> None:
        assert job is not None, "a multi-node job was resolved for a command without one"
        job(self)


# ---------------------------------------------------------------------------- resolving


def select(settings: Settings, reporter: Reporter, host: list[str] | None, *,
           run: str | None = None, playbook: str | None = None,
           max_parallel: str | None = None, deadline: str | None = None) -> Target:
    """The target of a command that takes a ``--host`` selection: the multi-node job a
    ``--run`` id names (``status``, ``cleanup``, ``tail-logs``; pass no ``run`` where a run
    id is only ever one box's), else the hosts of ``--host`` (one host, or a sweep), with
    ``--playbook`` resolved (:func:`playbook_identity`)."""
    name = playbook_identity(settings, playbook)
    job_id = job_id_for(run)
    if job_id is not None:
        return NodeJob(settings, reporter, [], job_id=job_id, playbook_name=name)
    recorded = run_box(run) if not [v for v in host or [] if v] else None
    if recorded is not None:  # --run without --host: the box the journal files the run under
        return OneHost(settings, reporter, [recorded], playbook_name=name)
    book = HostBook(settings.project.hosts_dir)
    hosts = settings.hosts(host, book=book)
    if len(hosts) == 1:
        return OneHost(settings, reporter, hosts, playbook_name=name, _book=book)
    return Sweep(settings, reporter, hosts, playbook_name=name, max_parallel=max_parallel,
                 deadline=deadline, _book=book)


def select_one(settings: Settings, reporter: Reporter, host: str | None,
               run: str | None, playbook: str | None = None) -> OneHost | NodeJob:
    """The target of ``watch``: the multi-node job its ``--run`` names, else its one host."""
    job_id = job_id_for(run)
    if job_id is not None:
        return NodeJob(settings, reporter, [], job_id=job_id,
                       playbook_name=playbook_identity(settings, playbook))
    return one_host(settings, reporter, host, playbook)


def one_host(settings: Settings, reporter: Reporter, host: str | None,
             playbook: str | None = None) -> OneHost:
    """The target of a command that runs on one host only (``evaluate``, ``exec``,
    ``forward``, ``ssh``, and ``watch`` on a run of one box): a selection of several is
    refused, naming the flag, before anything is sent."""
    return OneHost(settings, reporter, [settings.host(host)],
                   playbook_name=playbook_identity(settings, playbook))


def playbook_identity(settings: Settings, playbook: str | None) -> str | None:
    """``--playbook`` (a file name, a path or a ``name:``) as the name its runs are filed
    under: the one resolution every command uses (:func:`outrig.playbook.resolve_playbook`).
    A name no file of this project has is kept as it is: a run deployed from another
    checkout is found by it."""
    if playbook is None:
        return None
    from outrig.playbook import resolve_playbook

    return resolve_playbook(playbook, settings.project.playbooks_dir).name


def select_deploy(settings: Settings, reporter: Reporter, host: list[str] | None,
                  playbook: str | None, *, what: str, test: bool, params: dict[str, Any],
                  sweep_needs_playbook: bool, max_parallel: str | None = None,
                  deadline: str | None = None) -> Target:
    """The target of ``deploy`` and ``plan``, with the playbook loaded once.

    A playbook named by ``--playbook``, ``OUTRIG_PLAYBOOK`` or ``playbook:`` in outrig.yaml
    is loaded first: with ``nodes:`` > 1 the selection is the job's nodes, not a sweep. On
    several hosts the playbook is the named one (``sweep_needs_playbook``: deploy asks for
    one; plan without one shows each host's runs and GPUs); on one host it may also be the
    playbook of the host's current run (:func:`outrig.cli.settings.playbook_for`)."""
    name, _ = settings.value("playbook", playbook)
    job = None if name is None else _load(settings, str(name), test=test, params=params)
    book = HostBook(settings.project.hosts_dir)
    if job is not None and job.spec.nodes > 1:
        return NodeJob(settings, reporter, node_selection(settings, host, job, book), job=job,
                       playbook_name=job.name, _book=book)
    hosts = settings.hosts(host, book=book)
    if len(hosts) > 1:
        if sweep_needs_playbook:  # says where the name came from, or asks for one
            playbook_for(settings, playbook, None, reporter, what=what)
        return Sweep(settings, reporter, hosts, job=job,
                     playbook_name=None if job is None else job.name,
                     max_parallel=max_parallel, deadline=deadline, _book=book)
    name = playbook_for(settings, playbook, hosts[0], reporter, what=what, book=book)
    if job is None:  # the playbook of the host's current run
        job = _load(settings, name, test=test, params=params)
    return OneHost(settings, reporter, hosts, job=job, playbook_name=job.name, _book=book)


def _load(settings: Settings, name: str, *, test: bool, params: dict[str, Any]) -> Job:
    from outrig.playbook import find_playbook, load_job

    return load_job(find_playbook(name, settings.project.playbooks_dir), test=test,
                    params=params)


def node_selection(settings: Settings, host: list[str] | None, job: Job,
                   book: HostBook | None = None) -> list[str]:
    """The ``--host`` selection for a job's nodes: as given (expanded, in order), or empty
    when none is given and the playbook lists its nodes (:func:`outrig.ops.nodes.
    select_nodes` then takes the playbook's list and checks the count either way)."""
    if not [v for v in host or [] if v] and job.spec.node_hosts:
        return []
    return settings.hosts(host, book=book)


def run_box(run: str | None) -> str | None:
    """The host name the journal files run ``run`` under (None: no ``--run``, or a run the
    journal does not know): ``--run R`` without ``--host`` means R's own box, not the
    configured default host. Its host file may be gone since: the ops then reach the box at
    the address recorded with the run (:func:`outrig.redeploy.record.run_host`)."""
    if run is None:
        return None
    host = (Journal().run(run) or {}).get("host")
    return host if isinstance(host, str) and host else None


def job_id_for(run: str | None) -> str | None:
    """The job a ``--run`` id names (a job id or one of its nodes' run ids), else None (an
    ordinary run id, or no ``--run``). ``--playbook`` alone never selects a job: with a
    ``--host`` it means that box's current run, as before."""
    if run is None:
        return None
    # at call time: ops.nodes pulls in every op, which a command without --run never needs
    from outrig.ops.nodes import find_job

    found = find_job(Journal(), run)
    return None if found is None else str(found[0].get("job_id"))
