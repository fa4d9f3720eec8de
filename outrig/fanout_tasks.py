"""The tasks' work on several hosts: what each command does with a ``--host`` selection of
more than one host (run by :mod:`outrig.cli` when the selection has several), each through
:func:`fan_out` (one op core per host at once, a row per host as it finishes;
:mod:`outrig.fanout`), except ``tail-logs``, whose lines stream from every host
(:func:`outrig.fanout.tail_hosts`). Flags that cannot apply to several hosts (a run id, a
pid) are refused here before any host is contacted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from outrig.console import Reporter
from outrig.errors import ConfigError, Interrupted
from outrig.settings import Settings
from outrig.taskkit import number

DEPLOY_WORK = 60.0  # seconds a deploy on several hosts allows for pushing files and launching
LONG_WORK = 3600.0  # provision, stage, sync-checkpoints: installs and copies (use --deadline)


def fan_out(settings: Settings, hosts: list[str], core: Callable[[Any], dict[str, Any]],
            reporter: Reporter, *, max_parallel: str | None, deadline: str | None,
            summarize: Callable[[dict[str, Any]], str], what: str,
            work: float = 0.0) -> None:
    """Run an op core on several hosts at once and show each host's row (or JSON line) as
    soon as it finishes; a failed host makes the exit status 1 (outrig/fanout.py)."""
    from outrig.fanout import MAX_PARALLEL, Rows, run_fanout

    bound = int(number(max_parallel, "max-parallel", MAX_PARALLEL))
    limit = None if deadline is None else float(number(deadline, "deadline", 60, whole=False))
    if limit is not None and limit <= 0:
        raise ConfigError(f"--deadline must be a positive number of seconds, not {deadline}")
    if bound < 1:
        raise ConfigError(f"--max-parallel must be at least 1, not {bound}")
    rows = Rows(reporter, hosts, summarize, what=what)
    rows.start()
    outcomes = run_fanout(settings.project, hosts, core, max_parallel=bound, work=work,
                          deadline=limit, on_outcome=rows.show)
    rows.finish(outcomes)


def deploy_hosts(settings: Settings, hosts: list[str], reporter: Reporter, name: str, *,
                 test: bool, dry_run: bool, wait: bool, params: dict[str, Any],
                 max_parallel: str | None, deadline: str | None) -> None:
    """``deploy`` on several hosts: the one place that decides what several hosts mean for
    a deploy. A single-node playbook runs on every host of the selection, each host its own
    run (its own run id and journal record), its deadline including the processes' ready
    waits. (A playbook whose job spans several nodes takes its nodes from the selection
    instead; that dispatch belongs here, before the fan-out.)"""
    from outrig.fanout import deploy_summary, deploy_work
    from outrig.ops.base import new_run_id
    from outrig.ops.deploy import deploy_on
    from outrig.playbook import find_playbook, load_job

    job = load_job(find_playbook(name, settings.project.playbooks_dir), test=test,
                   params=params)
    # A multi-node playbook is dispatched here, before the fan-out: its hosts are the job's
    # nodes, one run across them, not one run per host.
    ids: dict[str, str] = {}
    for spec in hosts:  # one id per host: runs started in the same second never collide
        while (run_id := new_run_id(job.name)) in ids.values():
            pass
        ids[spec] = run_id

    def core(session: Any) -> dict[str, Any]:
        result = deploy_on(session, job, dry_run=dry_run, wait=wait, params=params,
                           run_id=ids[session.host_spec])
        return {"run_id": result.plan.run_id, "playbook": result.plan.playbook,
                "status": result.status, "seconds": round(result.seconds, 3),
                "processes": result.processes or [{"process": p} for p in result.plan.order]}

    ready = deploy_work(settings.project, job, hosts) if wait and not dry_run else 0.0
    fan_out(settings, hosts, core, reporter, max_parallel=max_parallel, deadline=deadline,
            summarize=deploy_summary, what="deploy",
            work=0.0 if dry_run else DEPLOY_WORK + ready)


def place_hosts(settings: Settings, hosts: list[str], reporter: Reporter,
                playbook: str | None, *, test: bool, params: dict[str, Any],
                max_parallel: str | None, deadline: str | None) -> None:
    """``plan`` on several hosts: where the next run can go (outrig/placement.py)."""
    from outrig.placement import placement_on, placement_summary
    from outrig.playbook import find_playbook, load_job

    job = None if playbook is None else load_job(
        find_playbook(playbook, settings.project.playbooks_dir), test=test, params=params)
    fan_out(settings, hosts, lambda session: placement_on(session, job), reporter,
            max_parallel=max_parallel, deadline=deadline, summarize=placement_summary,
            what="plan")


def tail_logs_hosts(settings: Settings, hosts: list[str], reporter: Reporter, *,
                    run: str | None, playbook: str | None, processes: list[str],
                    lines: int | None, follow: bool, grep: str | None,
                    max_parallel: str | None) -> None:
    """``tail-logs`` on several hosts (outrig.fanout.tail_hosts); the flags are checked
    before any host is contacted."""
    import logging
    import re
    import threading

    from outrig.fanout import MAX_PARALLEL, FanOutFailed, tail_hosts
    from outrig.ops.base import playbook_name

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
    bound = int(number(max_parallel, "max-parallel", MAX_PARALLEL))
    if bound < 1:
        raise ConfigError(f"--max-parallel must be at least 1, not {bound}")
    logging.getLogger("paramiko").addHandler(logging.NullHandler())  # reconnects are ours
    stop = threading.Event()  # set by the first Ctrl-C (and by nothing else here)
    try:
        tail_hosts(settings.project, hosts, reporter, follow=follow, max_parallel=bound,
                   playbook=playbook_name(settings.project, playbook), processes=processes,
                   lines=lines, grep=grep, stop=stop)
    except FanOutFailed:
        if not stop.is_set():
            raise
    if stop.is_set():  # Ctrl-C ends every command with 130, a follow of several hosts too
        raise Interrupted("tail-logs stopped (Ctrl-C); each host's lines shown are kept in "
                          "its local mirror and the next tail-logs resumes after them")


def cleanup_hosts(settings: Settings, hosts: list[str], reporter: Reporter, *,
                  playbook: str | None, all_runs: bool, run: str | None,
                  force_foreign: list[str], dry_run: bool, timeout: float,
                  max_parallel: str | None, deadline: str | None) -> None:
    """``cleanup`` on several hosts at once: ``--all`` or ``--playbook`` only (a run id or
    a pid belongs to one box), checked before anything is sent."""
    from outrig.fanout import cleanup_summary
    from outrig.ops.base import playbook_name
    from outrig.ops.cleanup import check_selection, cleanup_on

    if run or force_foreign or not (all_runs or playbook):
        raise ConfigError(
            f"cleanup on several hosts ({', '.join(hosts)}) takes --all or --playbook NAME; "
            "a --run id or a --force-foreign pid belongs to one box, and fencing moved runs "
            "(no selection) is done one host at a time: pass that host alone. Nothing was "
            "sent.")
    check_selection(None, playbook, all_runs, [], timeout)
    name = playbook_name(settings.project, playbook)
    fan_out(settings, hosts,
            lambda session: cleanup_on(session, playbook=name, all_runs=all_runs,
                                       dry_run=dry_run, timeout=timeout),
            reporter, max_parallel=max_parallel, deadline=deadline,
            summarize=cleanup_summary, what="cleanup", work=timeout + 10)


def provision_hosts(settings: Settings, hosts: list[str], reporter: Reporter,
                    playbook: str | None, *, dry_run: bool, max_parallel: str | None,
                    deadline: str | None) -> None:
    """``provision`` on several hosts: the playbook's environments on each."""
    from outrig.fanout import provision_summary
    from outrig.ops.provision import pick_playbook, provision_on

    job = pick_playbook(settings.project, playbook)

    def core(session: Any) -> dict[str, Any]:
        result = provision_on(session, job, dry_run=dry_run)
        return {"playbook": job.name, "dry_run": result.dry_run, "checks": result.checks,
                "environments": result.environments, "seconds": round(result.seconds, 3)}

    fan_out(settings, hosts, core, reporter, max_parallel=max_parallel,
            deadline=deadline, summarize=provision_summary, what="provision",
            work=LONG_WORK)


def stage_hosts(settings: Settings, hosts: list[str], reporter: Reporter, playbook: str, *,
                from_: str | None, resume: bool, streams: int, max_parallel: str | None,
                deadline: str | None) -> None:
    """``stage`` on several hosts: each host stages the playbook's items (from ``from_``, a
    session of its own to that box per host, when given)."""
    from outrig.fanout import stage_summary
    from outrig.ops.base import HostSession
    from outrig.ops.stage import stage_on

    def core(session: Any) -> dict[str, Any]:
        src = HostSession(settings.project, from_, session.reporter, session.journal) \
            if from_ else None
        try:
            return stage_on(session, playbook, src=src, resume=resume, streams=streams)
        finally:
            if src is not None:
                src.close()

    fan_out(settings, hosts, core, reporter, max_parallel=max_parallel, deadline=deadline,
            summarize=stage_summary, what="stage", work=LONG_WORK)


def sync_hosts(settings: Settings, hosts: list[str], reporter: Reporter,
               playbook: str | None, *, run: str | None, max_parallel: str | None,
               deadline: str | None) -> None:
    """``sync-checkpoints`` on several hosts, into the one mirror, a host at a time."""
    if run is not None:
        raise ConfigError(f"sync-checkpoints on several hosts ({', '.join(hosts)}) takes "
                          "--playbook NAME or each host's newest run: a --run id belongs to "
                          "one box. Nothing was sent.")
    import threading

    from outrig.fanout import sync_summary
    from outrig.ops.stage import sync_checkpoints_on

    mirror = threading.Lock()

    def core(session: Any) -> dict[str, Any]:
        # the mirror is one folder per playbook family, shared by the hosts: one host
        # writes it at a time (and only ever moves it forward, docs/migrate.md)
        with mirror:
            return sync_checkpoints_on(session, playbook=playbook)

    fan_out(settings, hosts, core, reporter, max_parallel=max_parallel, deadline=deadline,
            summarize=sync_summary, what="sync-checkpoints", work=LONG_WORK)
