"""What each command does on a sweep (a ``--host`` selection of several hosts, a
:class:`~outrig.cli.targets.Sweep`): its op core on every host at once through
:func:`fan_out` (one session per host, a row per host as it finishes; :mod:`outrig.fanout`,
:mod:`outrig.cli.rows`), except ``tail-logs``, whose lines stream from every host
(:func:`outrig.ops.tail_hosts.tail_hosts`). Flags that cannot apply to several hosts (a run
id, a pid) are refused here before any host is contacted.

The op cores are imported when a sweep runs, not with the command line: a command on one host
never needs them, and ``outrig --list`` stays quick.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from outrig.cli.rows import (
    Rows,
    Summary,
    check_summary,
    cleanup_summary,
    deploy_summary,
    provision_summary,
    stage_summary,
    status_summary,
    sync_summary,
)
from outrig.cli.targets import Sweep
from outrig.errors import ConfigError, Interrupted, OutrigError
from outrig.fanout import Core, FanOutFailed, run_fanout
from outrig.inventory import Host, HostBook
from outrig.journal import Journal
from outrig.ops.runs import new_run_id
from outrig.session import HostSession, Project

if TYPE_CHECKING:
    from outrig.playbook import Job

DEPLOY_WORK = 60.0  # seconds a deploy on several hosts allows for pushing files and launching
LONG_WORK = 3600.0  # provision, stage, sync-checkpoints: installs and copies (use --deadline)


def fan_out(sweep: Sweep, core: Core, *, summarize: Summary, what: str,
            work: float = 0.0) -> None:
    """Run an op core on every host of the sweep at once and show each host's row (or JSON
    line) as soon as it finishes; a failed host makes the exit status 1."""
    bound, limit = sweep.limits()
    rows = Rows(sweep.reporter, sweep.hosts, summarize, what=what)
    rows.start()
    outcomes = run_fanout(sweep.project, sweep.hosts, core, max_parallel=bound, work=work,
                          deadline=limit, on_outcome=rows.show, book=sweep.book)
    rows.finish(outcomes)


def status_hosts(sweep: Sweep, *, run: str | None, log_lines: int) -> None:
    """``status`` on several hosts: each box's runs and GPUs, a row per host (of the
    sweep's ``--playbook``, resolved in the target)."""
    from outrig.ops.status import status_on

    name = sweep.playbook_name
    fan_out(sweep, lambda session: status_on(session, run_id=run, playbook=name,
                                             log_lines=log_lines),
            summarize=status_summary, what="status")


def check_hosts(sweep: Sweep) -> None:
    """``check`` on several hosts: each box's preflight and its RTT."""
    from outrig.ops.check import check_on

    fan_out(sweep, lambda session: {**check_on(session), "rtt": session.transport.rtt},
            summarize=check_summary, what="check")


def deploy_hosts(sweep: Sweep, *, dry_run: bool, wait: bool, params: dict[str, Any],
                 allow_unhealthy_gpu: bool = False) -> None:
    """``deploy`` on several hosts: the sweep's one-node playbook runs on every host, each
    host its own run (its own run id and journal record), its deadline including the
    processes' ready waits. (A playbook whose job spans several nodes is a
    :class:`~outrig.cli.targets.NodeJob` instead: its hosts are the job's nodes.)"""
    from outrig.ops.deploy import deploy_on

    job = sweep.playbook
    ids: dict[str, str] = {}
    for spec in sweep.hosts:  # one id per host: runs started in the same second never collide
        while (run_id := new_run_id(job.name)) in ids.values():
            pass
        ids[spec] = run_id

    def core(session: HostSession) -> dict[str, Any]:
        result = deploy_on(session, job, dry_run=dry_run, wait=wait, params=params,
                           run_id=ids[session.host_spec],
                           allow_unhealthy_gpu=allow_unhealthy_gpu)
        return {"run_id": result.plan.run_id, "playbook": result.plan.playbook,
                "status": result.status, "seconds": round(result.seconds, 3),
                "processes": result.processes or [{"process": p} for p in result.plan.order]}

    ready = deploy_work(sweep.project, job, sweep.hosts, book=sweep.book) \
        if wait and not dry_run else 0.0
    fan_out(sweep, core, summarize=deploy_summary, what="deploy",
            work=0.0 if dry_run else DEPLOY_WORK + ready)


def deploy_work(project: Project, job: Job, hosts: Sequence[str], *,
                book: Callable[[str], Host] | None = None) -> float:
    """Seconds a deploy waits on the box for its processes to be ready (the sum of their
    ready timeouts, as they start one after another), the largest over the hosts' plans;
    added to each host's deadline. A plan that cannot be made here (facts not known yet)
    counts the playbook's own processes. ``book``: the sweep's hosts, resolved once."""
    from outrig.ops.deploy import plan_job

    resolve = book or HostBook(project.hosts_dir)
    journal = Journal()
    most = sum(p.ready.timeout for p in job.spec.processes.values() if p.ready is not None)
    for spec in hosts:
        try:
            plan = plan_job(job, resolve(spec), journal)
        except OutrigError:
            continue
        most = max(most, sum(p.ready.timeout for p in plan.processes.values()
                             if p.ready is not None))
    return float(most)


def place_hosts(sweep: Sweep) -> None:
    """``plan`` on several hosts: where the next run can go (outrig/ops/placement.py), for the
    sweep's playbook when one was named."""
    from outrig.ops.placement import placement_on, placement_summary

    job = sweep.job
    fan_out(sweep, lambda session: placement_on(session, job), summarize=placement_summary,
            what="plan")


def tail_logs_hosts(sweep: Sweep, *, run: str | None, processes: list[str],
                    lines: int | None, follow: bool, grep: str | None) -> None:
    """``tail-logs`` on several hosts (outrig.ops.tail_hosts); the flags are checked
    before any host is contacted."""
    import logging
    import re
    import threading

    from outrig.ops.tail_hosts import tail_hosts

    hosts = sweep.hosts
    if run is not None:
        raise ConfigError(f"tail-logs on several hosts ({', '.join(hosts)}) takes --playbook "
                          "NAME or the current runs: a --run id belongs to one box. Nothing "
                          "was sent.")
    if lines is not None and lines < 0:
        raise ConfigError(f"--lines must be ≥ 0, not {lines}")
    if grep is not None:
        try:
            re.compile(grep)
        except re.error as exc:
            raise ConfigError(f"--grep {grep!r} is not a valid regular expression: {exc}. "
                              "Nothing was sent.") from None
    bound = sweep.parallel()
    logging.getLogger("paramiko").addHandler(logging.NullHandler())  # reconnects are ours
    stop = threading.Event()  # set by the first Ctrl-C (and by nothing else here)
    try:
        tail_hosts(sweep.project, hosts, sweep.reporter, follow=follow, max_parallel=bound,
                   playbook=sweep.playbook_name, processes=processes,
                   lines=lines, grep=grep, stop=stop)
    except FanOutFailed:
        if not stop.is_set():
            raise
    if stop.is_set():  # Ctrl-C ends every command with 130, a follow of several hosts too
        raise Interrupted("tail-logs stopped (Ctrl-C); each host's lines shown are kept in "
                          "its local mirror and the next tail-logs resumes after them")


def cleanup_hosts(sweep: Sweep, *, all_runs: bool, run: str | None,
                  force_foreign: list[str], dry_run: bool, timeout: float) -> None:
    """``cleanup`` on several hosts at once: ``--all`` or ``--playbook`` only (a run id or
    a pid belongs to one box), checked before anything is sent."""
    from outrig.ops.cleanup import check_selection, cleanup_on

    if run or force_foreign or not (all_runs or sweep.playbook_name):
        raise ConfigError(
            f"cleanup on several hosts ({', '.join(sweep.hosts)}) takes --all or --playbook "
            "NAME; a --run id or a --force-foreign pid belongs to one box, and fencing moved "
            "runs (no selection) is done one host at a time: pass that host alone. Nothing "
            "was sent.")
    name = sweep.playbook_name
    check_selection(None, name, all_runs, [], timeout)
    fan_out(sweep, lambda session: cleanup_on(session, playbook=name, all_runs=all_runs,
                                              dry_run=dry_run, timeout=timeout),
            summarize=cleanup_summary, what="cleanup", work=timeout + 10)


def provision_hosts(sweep: Sweep, playbook: str | None, *, dry_run: bool) -> None:
    """``provision`` on several hosts: the playbook's environments on each."""
    from outrig.ops.provision import pick_playbook, provision_on

    job = pick_playbook(sweep.project, playbook)

    def core(session: HostSession) -> dict[str, Any]:
        result = provision_on(session, job, dry_run=dry_run)
        return {"playbook": job.name, "dry_run": result.dry_run, "checks": result.checks,
                "environments": result.environments, "seconds": round(result.seconds, 3)}

    fan_out(sweep, core, summarize=provision_summary, what="provision", work=LONG_WORK)


def stage_hosts(sweep: Sweep, playbook: str, *, from_: str | None, resume: bool,
                streams: int) -> None:
    """``stage`` on several hosts: each host stages the playbook's items (from ``from_``, a
    session of its own to that box per host, when given)."""
    from outrig.ops.stage import stage_on

    def core(session: HostSession) -> dict[str, Any]:
        src = HostSession(sweep.project, from_, session.reporter, session.journal,
                          host=sweep.book(from_)) if from_ else None
        try:
            return stage_on(session, playbook, src=src, resume=resume, streams=streams)
        finally:
            if src is not None:
                src.close()

    fan_out(sweep, core, summarize=stage_summary, what="stage", work=LONG_WORK)


def sync_hosts(sweep: Sweep, playbook: str | None, *, run: str | None) -> None:
    """``sync-checkpoints`` on several hosts, into the one mirror, a host at a time."""
    if run is not None:
        raise ConfigError(f"sync-checkpoints on several hosts ({', '.join(sweep.hosts)}) "
                          "takes --playbook NAME or each host's newest run: a --run id "
                          "belongs to one box. Nothing was sent.")
    import threading

    from outrig.ops.stage import sync_checkpoints_on

    mirror = threading.Lock()

    def core(session: HostSession) -> dict[str, Any]:
        # the mirror is one folder per playbook family, shared by the hosts: one host
        # writes it at a time (and only ever moves it forward, docs/migrate.md)
        with mirror:
            return sync_checkpoints_on(session, playbook=playbook)

    fan_out(sweep, core, summarize=sync_summary, what="sync-checkpoints", work=LONG_WORK)
