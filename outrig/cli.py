"""outrig's command line: the installed ``outrig`` command and ``inv`` in a checkout.

Both run the one :data:`ns` collection (``tasks.py`` re-exports it); ``outrig`` is an Invoke
:class:`~invoke.program.Program` the way Fabric builds ``fab``. Each task turns flags into one
call into ``outrig.ops``; errors come back as one paragraph that says what failed, where, and
the fix (no traceback), with exit status 2 for bad input (nothing was sent) and 1 for failures
on or while reaching the box. Run ``outrig --list`` for the tasks and ``outrig --help TASK``
for each flag; docs/cli.md is the reference.

Where values come from is :mod:`outrig.settings`; the program itself (parse errors, completion)
is :mod:`outrig.program`. What the tasks share (help texts, :func:`friendly`) is
:mod:`outrig.taskkit`; what a task does on several hosts is :mod:`outrig.fanout_tasks`; the
sandbox tasks are :mod:`outrig.sandbox_tasks`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from invoke.collection import Collection
from invoke.exceptions import Exit
from invoke.tasks import task

from outrig import __version__
from outrig.console import Reporter
from outrig.errors import ConfigError
from outrig.evaluate_tasks import evaluate
from outrig.fanout_tasks import (
    cleanup_hosts,
    deploy_hosts,
    fan_out,
    place_hosts,
    provision_hosts,
    stage_hosts,
    sync_hosts,
    tail_logs_hosts,
)
from outrig.program import OutrigConfig, OutrigProgram, remainder_argv
from outrig.sandbox_tasks import demo, sandbox_down, sandbox_up
from outrig.settings import Settings, parse_params, playbook_for, settings_for
from outrig.taskkit import (
    DEADLINE_HELP,
    FANOUT_JSON,
    GPUS_HELP,
    HOST_HELP,
    HOSTS_HELP,
    JSON_HELP,
    LONG_DEADLINE_HELP,
    MAX_PARALLEL_HELP,
    NO_KEEP_HELP,
    PARAM_HELP,
    PROJECT_HELP,
    friendly,
    make_reporter,
    number,
)
from outrig.transfer import STREAMS

__all__ = ["friendly", "make_collection", "ns", "program"]


JOB_RUN = ("; a multi-node job's id (or a node's run id) covers every node of it, no --host "
           "needed")

# ------------------------------------------------------------------------------------ tasks


@task(
    auto_shortflags=False,
    iterable=["param", "host"],
    help={
        "host": HOSTS_HELP,
        "playbook": "playbook name in playbooks/ (or a path to one); default: OUTRIG_PLAYBOOK, "
                    "playbook: in outrig.yaml, else the playbook of the host's current run",
        "param": PARAM_HELP,
        "test": "apply the playbook's test: overrides (fewer samples, one epoch)",
        "dry_run": "print the plan and stop; nothing is sent",
        "no_wait": "return as soon as every process is launched and recorded",
        "max_parallel": MAX_PARALLEL_HELP, "deadline": DEADLINE_HELP,
        "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
        "json": JSON_HELP + "; with several hosts one line per host " + FANOUT_JSON,
    },
)
@friendly
def deploy(c: Any, host: list[str] | None = None, playbook: str | None = None,
           param: list[str] | None = None, test: bool = False, dry_run: bool = False,
           no_wait: bool = False, max_parallel: str | None = None,
           deadline: str | None = None, project: str | None = None,
           no_keep: bool = False, json: bool = False) -> None:
    """Push files, stop the previous run, launch every process and wait until it is ready.

    With several hosts (--host a,b, a group, or all) the same playbook is deployed on every
    host at once, each as a run of its own (a sweep); one row per host with its run id and
    state.

    Examples:
        outrig deploy --host uk-node --playbook dflash-qwen36
        outrig deploy --playbook smoke --param steps=50 --dry-run
        outrig deploy --host sweep --playbook smoke
    """
    from outrig.nodes_tasks import deploy_job, multi_node_job
    from outrig.ops.deploy import deploy as run_deploy

    reporter = make_reporter(json)
    settings = settings_for(c, project, no_keep=no_keep)
    job = multi_node_job(settings, playbook, test=test, params=parse_params(param))
    if job is not None:  # nodes: N > 1: the selection is the job's nodes, not a sweep
        deploy_job(settings, host, job, reporter, dry_run=dry_run, wait=not no_wait,
                   params=parse_params(param))
        return
    hosts = settings.hosts(host)
    if len(hosts) > 1:
        name = playbook_for(settings, playbook, None, reporter, what="deploy")
        deploy_hosts(settings, hosts, reporter, name, test=test, dry_run=dry_run,
                     wait=not no_wait, params=parse_params(param),
                     max_parallel=max_parallel, deadline=deadline)
        return
    name = playbook_for(settings, playbook, hosts[0], reporter, what="deploy")
    run_deploy(settings.project, hosts[0], name, reporter, test=test, dry_run=dry_run,
               wait=not no_wait, params=parse_params(param))


@task(
    auto_shortflags=False,
    iterable=["param", "host"],
    help={"host": HOSTS_HELP, "playbook": "playbook name in playbooks/ (or a path); default "
          "as for deploy; with several hosts optional (say where it fits)", "param": PARAM_HELP,
          "test": "plan with the playbook's test: overrides",
          "max_parallel": MAX_PARALLEL_HELP, "deadline": DEADLINE_HELP,
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
          "json": JSON_HELP + "; with several hosts one line per host " + FANOUT_JSON},
)
@friendly
def plan(c: Any, host: list[str] | None = None, playbook: str | None = None,
         param: list[str] | None = None, test: bool = False, max_parallel: str | None = None,
         deadline: str | None = None, project: str | None = None, no_keep: bool = False,
         json: bool = False) -> None:
    """Show the plan (GPU map, full commands, env, start order); nothing is sent.

    With several hosts (--host GROUP) it asks each box instead, at once: which runs it holds
    (with their GPUs) and which GPUs are free, and with --playbook whether that playbook
    fits there now; one row per host.

    Example:
        outrig plan --host uk-node --playbook dflash-qwen36 --param epochs=2
        outrig plan --host sweep --playbook smoke
    """
    from outrig.nodes_tasks import deploy_job, multi_node_job
    from outrig.ops.deploy import show_plan

    reporter = make_reporter(json)
    settings = settings_for(c, project, no_keep=no_keep)
    job = multi_node_job(settings, playbook, test=test, params=parse_params(param))
    if job is not None:  # every node's plan, each against its own box; nothing is started
        deploy_job(settings, host, job, reporter, dry_run=True, wait=False,
                   params=parse_params(param))
        return
    hosts = settings.hosts(host)
    if len(hosts) > 1:
        place_hosts(settings, hosts, reporter, settings.value("playbook", playbook)[0],
                    test=test, params=parse_params(param), max_parallel=max_parallel,
                    deadline=deadline)
        return
    name = playbook_for(settings, playbook, hosts[0], reporter, what="plan")
    show_plan(settings.project, hosts[0], name, reporter, test=test,
              params=parse_params(param))


@task(
    auto_shortflags=False,
    iterable=["host"],
    help={"host": HOSTS_HELP, "run": "the run id to show (default: current runs)" + JOB_RUN,
          "playbook": "show the current run of this playbook",
          "lines": "log lines to show per process (default 5)", "gpus": GPUS_HELP,
          "max_parallel": MAX_PARALLEL_HELP, "deadline": DEADLINE_HELP,
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
          "json": JSON_HELP + "; with several hosts one line per host {host, ok, state, "
                  "seconds, error, result}"},
)
@friendly
def status(c: Any, host: list[str] | None = None, run: str | None = None,
           playbook: str | None = None, lines: str | None = None, gpus: bool = False,
           max_parallel: str | None = None, deadline: str | None = None,
           project: str | None = None, no_keep: bool = False, json: bool = False) -> None:
    """Show each process (running / exited with code / killed), readiness, GPUs, progress.

    One agent call: per process state, pid, uptime, readiness and the GPUs it holds; the
    trainer's step, loss, acceptance, speed and ETA parsed from its metric lines; the newest
    complete checkpoint; vLLM's /health and served model; the last lines of a failed process.

    With several hosts (--host a,b, a group, or all) every host is asked at once and the
    answer is one row per host (runs, GPUs free); hosts that fail or give no answer within
    their deadline are listed with the reason, and the exit status is then 1.

    Examples:
        outrig status --host uk-node
        outrig status --host all
    """
    from outrig.fanout import status_summary
    from outrig.nodes_tasks import job_id_for
    from outrig.ops.base import playbook_name
    from outrig.ops.status import status as run_status
    from outrig.ops.status import status_on

    count = int(number(lines, "lines", 5))
    settings = settings_for(c, project, no_keep=no_keep)
    reporter = make_reporter(json, gpus)
    job_id = job_id_for(run)
    if job_id is not None:  # a multi-node job: every node of it, whatever --host says
        from outrig.ops.nodes import nodes_status

        nodes_status(settings.project, job_id, reporter, log_lines=count)
        return
    hosts = settings.hosts(host)
    if len(hosts) == 1:
        run_status(settings.project, hosts[0], reporter, run_id=run, playbook=playbook,
                   log_lines=count)
        return
    name = playbook_name(settings.project, playbook)
    fan_out(settings, hosts,
            lambda session: status_on(session, run_id=run, playbook=name, log_lines=count),
            reporter, max_parallel=max_parallel, deadline=deadline,
            summarize=status_summary, what="status")


@task(
    auto_shortflags=False,
    iterable=["process", "host"],
    help={"host": HOSTS_HELP, "run": "run id (default: the current run)" + JOB_RUN,
          "playbook": "the current run of this playbook",
          "process": "only this process (repeat for several)",
          "lines": "start N lines before the end (default: resume from the saved cursor, or "
                   "from the beginning the first time)",
          "no_follow": "print what is there now and exit",
          "grep": "show only lines matching this regular expression (the mirror keeps all)",
          "max_parallel": "with several hosts and --no-follow: how many are read at once "
                          "(default 32; a follow reads every host at once)",
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
          "json": "JSON lines {process, line} instead of prefixed text (with several hosts "
                  "{host, process, line}, then one line per host {host, ok, state, ...})"},
)
@friendly
def tail_logs(c: Any, host: list[str] | None = None, run: str | None = None,
              playbook: str | None = None, process: list[str] | None = None,
              lines: str | None = None, no_follow: bool = False, grep: str | None = None,
              max_parallel: str | None = None, project: str | None = None,
              no_keep: bool = False, json: bool = False) -> None:
    """Follow every log of a run over one SSH channel, exactly once, into a local mirror.

    Lines are prefixed with the process name. The mirror is kept under
    ~/.local/state/outrig/logs/HOST/RUN/PROCESS.log with a cursor; a dropped link reconnects
    and resumes there, and so does the next tail-logs (no line lost or repeated). Stop with
    Ctrl-C. See docs/logs-and-status.md.

    With several hosts every line is prefixed with its host too (HOST | process | line) and
    comes as it arrives; a host that fails is named at the end with its reason (exit 1),
    the others' lines go on.

    Examples:
        outrig tail-logs --host uk-node
        outrig tail-logs --host uk-node --process trainer --lines 100 --grep global_step
        outrig tail-logs --host uk-node --no-follow --json
        outrig tail-logs --host sweep --process trainer
    """
    from outrig.nodes_tasks import job_id_for
    from outrig.ops.logs import tail_logs as run_tail

    count = None if lines is None else int(number(lines, "lines", 100))
    settings = settings_for(c, project, no_keep=no_keep)
    reporter = make_reporter(json)
    job_id = job_id_for(run)
    if job_id is not None:  # a multi-node job: every node's logs, prefixed with the node
        from outrig.ops.nodes import tail_nodes

        tail_nodes(settings.project, job_id, reporter, lines=count, follow=not no_follow,
                   grep=grep, processes=list(process or []))
        return
    hosts = settings.hosts(host)
    if len(hosts) == 1:
        run_tail(settings.project, hosts[0], reporter, run_id=run, playbook=playbook,
                 processes=list(process or []), lines=count, follow=not no_follow, grep=grep)
        return
    tail_logs_hosts(settings, hosts, reporter, run=run, playbook=playbook,
                    processes=list(process or []), lines=count, follow=not no_follow, grep=grep,
                    max_parallel=max_parallel)


@task(
    auto_shortflags=False,
    iterable=["force_foreign", "host"],
    help={"host": HOSTS_HELP, "run": "stop this run id" + JOB_RUN,
          "playbook": "stop this playbook's run",
          "all": "stop every outrig run on the box",
          "force_foreign": "also kill this pid that outrig did not start (repeat for several); "
                           "it is shown before it is killed",
          "dry_run": "show what would be signalled and who holds the GPUs; signal nothing",
          "timeout": "seconds to wait for GPU memory to come back (default 60)",
          "gpus": GPUS_HELP, "max_parallel": MAX_PARALLEL_HELP, "deadline": DEADLINE_HELP,
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
          "json": JSON_HELP + "; with several hosts one line per host {host, ok, state, "
                  "seconds, error, result}"},
)
@friendly
def cleanup(c: Any, host: list[str] | None = None, run: str | None = None,
            playbook: str | None = None, all: bool = False,
            force_foreign: list[str] | None = None, dry_run: bool = False,
            timeout: str | None = None, gpus: bool = False,
            max_parallel: str | None = None, deadline: str | None = None,
            project: str | None = None, no_keep: bool = False,
            json: bool = False) -> None:
    """Stop exactly what outrig started, then prove the GPUs are free (audit + wait).

    Exit status 0 only when nothing of ours is left and the GPU memory it held is back.
    Processes outrig did not start are listed, never killed, unless named with
    --force-foreign. With no --run, --playbook or --all it stops the runs that a migrate
    moved away from this box (fencing, docs/watch.md), and says so.

    Examples:
        outrig cleanup --host old-node
        outrig cleanup --host uk-node --playbook dflash-qwen36
        outrig cleanup --host uk-node --all --dry-run
        outrig cleanup --host uk-node --force-foreign 4711
        outrig cleanup --host all --all
    """
    from outrig.nodes_tasks import job_id_for
    from outrig.ops.cleanup import cleanup as run_cleanup

    seconds = float(number(timeout, "timeout", 60.0, whole=False))
    settings = settings_for(c, project, no_keep=no_keep)
    reporter = make_reporter(json, gpus)
    job_id = job_id_for(run)
    if job_id is not None:  # a multi-node job: its run on every node, nothing else
        from outrig.ops.nodes import stop_nodes

        if dry_run or force_foreign:
            raise ConfigError(f"--run {run} is the multi-node job {job_id}: cleanup stops its "
                              "run on every node and takes neither --dry-run nor "
                              "--force-foreign (to see one box first: outrig cleanup --host "
                              "NODE --all --dry-run). Nothing was stopped.")
        stop_nodes(settings.project, job_id, reporter, timeout=seconds)
        return
    hosts = settings.hosts(host)
    if len(hosts) == 1:
        run_cleanup(settings.project, hosts[0], reporter, run_id=run, playbook=playbook,
                    all_runs=all, force_foreign=list(force_foreign or []), dry_run=dry_run,
                    timeout=seconds)
        return
    cleanup_hosts(settings, hosts, reporter, playbook=playbook, all_runs=all,
                  run=run, force_foreign=list(force_foreign or []), dry_run=dry_run,
                  timeout=seconds, max_parallel=max_parallel, deadline=deadline)


@task(
    auto_shortflags=False,
    iterable=["host"],
    help={"host": HOSTS_HELP,
          "playbook": "playbook whose environments:/requires: to set up (default: "
                      "OUTRIG_PLAYBOOK or outrig.yaml, else the only playbook in playbooks/ "
                      "that has environments:)",
          "dry_run": "check the box and say what would be created or updated; install nothing",
          "max_parallel": MAX_PARALLEL_HELP, "deadline": LONG_DEADLINE_HELP,
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
          "json": JSON_HELP + "; with several hosts one line per host " + FANOUT_JSON},
)
@friendly
def provision(c: Any, host: list[str] | None = None, playbook: str | None = None,
              dry_run: bool = False, max_parallel: str | None = None,
              deadline: str | None = None, project: str | None = None,
              no_keep: bool = False, json: bool = False) -> None:
    """Idempotent environment set-up: the playbook's venvs with pinned packages.

    Checks python, the NVIDIA driver and free disk against requires:, then creates or updates
    each environment; what is already right is skipped (one exec to find out). Installed
    versions are recorded in the journal. See docs/provision.md.

    Examples:
        outrig provision --host new-node --playbook dflash-qwen36
        outrig provision --host new-node --playbook dflash-qwen36 --dry-run
    """
    from outrig.ops.provision import provision as run_provision

    settings = settings_for(c, project, no_keep=no_keep)
    hosts = settings.hosts(host)
    name = settings.value("playbook", playbook)[0]
    if len(hosts) == 1:
        run_provision(settings.project, hosts[0], make_reporter(json), playbook=name,
                      dry_run=dry_run)
        return
    provision_hosts(settings, hosts, make_reporter(json), name, dry_run=dry_run,
                    max_parallel=max_parallel, deadline=deadline)


@task(
    auto_shortflags=False,
    name="stage",
    iterable=["host"],
    help={"host": HOSTS_HELP, "max_parallel": MAX_PARALLEL_HELP,
          "deadline": LONG_DEADLINE_HELP,
          "playbook": "playbook whose model, data (and checkpoints) to "
          "stage (default: OUTRIG_PLAYBOOK or outrig.yaml)",
          "from_": "copy from this box (direct box-to-box when they can reach each other, "
                       "else relayed through this workstation)",
          "resume": "also put the newest complete checkpoint in place (from --from, "
                    "else from this workstation's mirror)",
          "streams": f"parallel streams for copies through the workstation (default {STREAMS})",
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
          "json": JSON_HELP + "; with several hosts one line per host " + FANOUT_JSON},
)
@friendly
def stage_(c: Any, host: list[str] | None = None, playbook: str | None = None,
           from_: str | None = None, resume: bool = False, streams: str | None = None,
           max_parallel: str | None = None, deadline: str | None = None,
           project: str | None = None, no_keep: bool = False, json: bool = False) -> None:
    """Put the model, data and (with --resume) a checkpoint on a box: fastest route, verified.

    A re-run moves nothing and costs one agent call (each folder carries a verified manifest).
    Routes: the box downloads hf: sources itself; --from copies box to box; folders on
    this workstation are pushed in parallel streams. Cut transfers resume.

    Examples:
        outrig stage --host new-node --playbook dflash-qwen36
        outrig stage --host new-node --playbook dflash-qwen36 --from uk-node --resume
    """
    from outrig.ops.stage import stage

    count = int(number(streams, "streams", STREAMS))
    reporter = make_reporter(json)
    settings = settings_for(c, project, no_keep=no_keep)
    hosts = settings.hosts(host)
    name = playbook_for(settings, playbook, None, reporter, what="stage")
    if len(hosts) == 1:
        stage(settings.project, hosts[0], name, reporter, from_host=from_, resume=resume,
              streams=count)
        return
    stage_hosts(settings, hosts, reporter, name, from_=from_, resume=resume,
                streams=count, max_parallel=max_parallel, deadline=deadline)


@task(
    auto_shortflags=False,
    iterable=["host"],
    help={"host": HOSTS_HELP, "playbook": "whose checkpoints (default: the playbook of the "
          "host's newest run that really ran)",
          "run": "take the playbook of this run id instead",
          "max_parallel": MAX_PARALLEL_HELP, "deadline": LONG_DEADLINE_HELP,
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
          "json": JSON_HELP + "; with several hosts one line per host " + FANOUT_JSON},
)
@friendly
def sync_checkpoints(c: Any, host: list[str] | None = None, playbook: str | None = None,
                     run: str | None = None, max_parallel: str | None = None,
                     deadline: str | None = None, project: str | None = None,
                     no_keep: bool = False, json: bool = False) -> None:
    """Pull new complete checkpoints from a box into this workstation's mirror.

    Only checkpoints that are complete (every file present, training_state.json readable, and
    logged as saved or followed by a later epoch) are pulled; ``interrupted/`` never is. Run
    it now and then: a dead box then loses at most the work since the last sync.

    Example:
        outrig sync-checkpoints --host uk-node
    """
    from outrig.ops.stage import sync_checkpoints as run_sync

    settings = settings_for(c, project, no_keep=no_keep)
    hosts = settings.hosts(host)
    if len(hosts) == 1:
        run_sync(settings.project, hosts[0], make_reporter(json), playbook=playbook, run_id=run)
        return
    sync_hosts(settings, hosts, make_reporter(json), playbook, run=run,
               max_parallel=max_parallel, deadline=deadline)


@task(
    auto_shortflags=False,
    help={"from_": "the old box (dead or alive): host file name, ssh alias or user@host:port",
          "to": "the new box", "playbook": "playbook to run on the new box (default: the old "
          "box's last playbook, or the member of its family that fits the new box best)",
          "run": "the run on the old box to move (default: its newest run that really ran)",
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP, "json": JSON_HELP},
)
@friendly
def migrate(c: Any, from_: str | None = None, to: str | None = None,
            playbook: str | None = None, run: str | None = None, project: str | None = None,
            no_keep: bool = False,
            json: bool = False) -> None:
    """Move a job to a fresh box and resume it from the newest complete checkpoint.

    Probes the old box several times before calling it dead; provisions and stages the new
    one; re-plans GPU placement for its hardware (old and new shown side by side); stops the
    old run if the box is alive and copies its checkpoint box to box, else uses this
    workstation's mirror; deploys with resume. See docs/migrate.md.

    Example:
        outrig migrate --from uk-node --to new-node
    """
    from outrig.ops.migrate import migrate as run_migrate

    if not from_ or not to:
        raise ConfigError("migrate needs both boxes: --from OLD --to NEW (host file names, "
                          "ssh aliases or user@host:port). Nothing was sent.")
    settings = settings_for(c, project, no_keep=no_keep)
    run_migrate(settings.project, from_, to, make_reporter(json), playbook=playbook, run_id=run)


@task(
    auto_shortflags=False,
    iterable=["spare"],
    help={"host": HOST_HELP,
          "playbook": "the playbook whose run to follow (its current run on the host)",
          "spare": "a box to move the job to if the host dies (repeat for several; the first "
                   "that passes check wins)",
          "run": "the run to follow (default: the playbook's current run on the host)" + JOB_RUN,
          "restarts": "after a crash on a healthy box, redeploy in place at most N times "
                      "(default 0: report and stop)",
          "threshold": "seconds with every health signal failing before the box may be "
                       "called dead (default 60; scaled up with the measured RTT)",
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP, "json": JSON_HELP},
)
@friendly
def watch(c: Any, host: str | None = None, playbook: str | None = None,
          spare: list[str] | None = None, run: str | None = None, restarts: str | None = None,
          threshold: str | None = None, project: str | None = None, no_keep: bool = False,
          json: bool = False) -> None:
    """Follow one run until it finishes; move it to a spare if its box dies.

    Judges the box from several signals (TCP, SSH banner, the agent's answer, the run's
    processes, log growth) with RTT-scaled limits, mirrors each new complete checkpoint, and
    on a confirmed death migrates to the first spare that passes check. A crash on a box
    that answers is reported, never migrated (--restarts N redeploys in place). Events go
    to the on_event hook; its state lives in the journal, so a restarted watch carries on.
    See docs/watch.md.

    Example:
        outrig watch --host uk-node --playbook dflash-qwen36 --spare new-node
    """
    from outrig.nodes_tasks import job_id_for
    from outrig.notify import Notifier
    from outrig.ops.watch import WatchOptions
    from outrig.ops.watch import watch as run_watch

    reporter = make_reporter(json)
    settings = settings_for(c, project, no_keep=no_keep)
    job_id = job_id_for(run)
    if job_id is not None:  # a multi-node job: one node failing stops the others
        from outrig.ops.nodes import watch_nodes

        if spare:
            raise ConfigError(f"--spare: {job_id} is a multi-node job, which watch does not "
                              "move (a node failing stops the others; deploy it again). "
                              "Drop --spare. Nothing was started.")
        watch_nodes(settings.project, job_id, reporter,
                    threshold=float(number(threshold, "threshold", 60, whole=False)))
        return
    host_spec = settings.host(host)
    name = playbook_for(settings, playbook, host_spec, reporter, what="watch")
    options = WatchOptions(spares=list(spare or []), run_id=run,
                           restarts=int(number(restarts, "restarts", 0)),
                           threshold=float(number(threshold, "threshold", 60, whole=False)))
    run_watch(settings.project, host_spec, name, reporter, options=options,
              notifier=Notifier(settings.on_event(), reporter))


@task(auto_shortflags=False, iterable=["host"],
      help={"host": HOSTS_HELP, "max_parallel": MAX_PARALLEL_HELP, "deadline": DEADLINE_HELP,
            "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
            "json": JSON_HELP + "; with several hosts one line per host {host, ok, state, "
                    "seconds, error, result}"})
@friendly
def check(c: Any, host: list[str] | None = None, max_parallel: str | None = None,
          deadline: str | None = None, project: str | None = None, no_keep: bool = False,
          json: bool = False) -> None:
    """Preflight: reach the box, measure RTT, check python3, GPUs, workdir and disk.

    Example:
        outrig check --host uk-node
        outrig check --host sweep --json
    """
    from outrig.fanout import check_summary
    from outrig.ops.check import check as run_check
    from outrig.ops.check import check_on

    settings = settings_for(c, project, no_keep=no_keep)
    hosts = settings.hosts(host)
    if len(hosts) == 1:
        run_check(settings.project, hosts[0], make_reporter(json))
        return
    fan_out(settings, hosts,
            lambda session: {**check_on(session), "rtt": session.transport.rtt},
            make_reporter(json), max_parallel=max_parallel, deadline=deadline,
            summarize=check_summary, what="check")


@task(name="exec", auto_shortflags=False,
      help={"host": HOST_HELP, "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
            "json": "capture the output and print one JSON object {host, command, exit_code, "
                    "stdout, stderr} when the command ends (the exit status stays the "
                    "command's)"})
@friendly
def exec_(c: Any, host: str | None = None, project: str | None = None, no_keep: bool = False,
          json: bool = False) -> None:
    """Run one command on the box, in the host's workdir with its env; output streams here.

    Everything after -- is the command, passed as words (no shell on the box parses it;
    for pipes say so: -- sh -c 'a | b'). The exit status is the command's own (255 when the
    box gave none). stdin is not forwarded.

    Examples:
        outrig exec --host uk-node -- nvidia-smi
        outrig exec -- ls -la runs
    """
    from outrig.ops.remote_exec import run_exec

    command = remainder_argv()
    settings = settings_for(c, project, no_keep=no_keep)
    host_spec = settings.host(host)
    if not json:
        code = run_exec(settings.project, host_spec, command)
    else:
        import io

        out, err = io.BytesIO(), io.BytesIO()
        code = run_exec(settings.project, host_spec, command, out=out, err=err)
        Reporter(json_mode=True).emit_json({
            "host": host_spec, "command": command, "exit_code": code,
            "stdout": out.getvalue().decode("utf-8", "replace"),
            "stderr": err.getvalue().decode("utf-8", "replace")})
    if code:
        raise Exit(code=code)


@task(
    auto_shortflags=False,
    help={"host": HOST_HELP,
          "process": "forward this process's port (from its ready: check in the run's plan)",
          "run": "the run whose process to use (default: the running run that has it)",
          "playbook": "the running run of this playbook",
          "remote_port": "forward this port on the box instead of a process's",
          "local_port": "listen here (default: the same number if free, else any free port)",
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
          "json": "print a JSON line {event: forwarding, url, ...} instead of text"},
)
@friendly
def forward(c: Any, host: str | None = None, process: str | None = None,
            run: str | None = None, playbook: str | None = None,
            remote_port: str | None = None, local_port: str | None = None,
            project: str | None = None, no_keep: bool = False, json: bool = False) -> None:
    """Forward a local port to a process's port on the box (e.g. the vLLM server).

    Prints the local URL, then serves until Ctrl-C. Each local connection is carried over
    outrig's SSH connection; when the link drops, the next connection reconnects, so the
    forward stays up across reconnects. Only 127.0.0.1 listens.

    Examples:
        outrig forward --process server
        outrig forward --host uk-node --remote-port 8000 --local-port 18000
    """
    from outrig.ops.forward import forward as run_forward

    remote = None if remote_port is None else int(number(remote_port, "remote-port", 8000))
    local = None if local_port is None else int(number(local_port, "local-port", 8000))
    settings = settings_for(c, project, no_keep=no_keep)
    run_forward(settings.project, settings.host(host), make_reporter(json), process=process,
                run_id=run, playbook=playbook, remote_port=remote, local_port=local)


@task(auto_shortflags=False,
      help={"host": HOST_HELP, "project": PROJECT_HELP,
            "json": "print the resolved ssh command as JSON {host, client, argv} and run "
                    "nothing"})
@friendly
def ssh(c: Any, host: str | None = None, project: str | None = None,
        json: bool = False) -> None:
    """Open a shell on the box (OpenSSH), in the host's workdir with its env.

    The client gets the same address, port, user, key and known_hosts as outrig's own
    connection.

    With words after --, runs that command there instead (as exec does, but through ssh,
    with a terminal whenever this one is a terminal: for htop, vim, watch).

    Examples:
        outrig ssh --host uk-node
        outrig ssh -- htop
    """
    from outrig.ops.shell import open_ssh

    settings = settings_for(c, project)
    if json:
        _print_ssh_argv(settings, settings.host(host), remainder_argv())
        return
    open_ssh(settings.project, settings.host(host), remainder_argv())


def _print_ssh_argv(settings: Settings, host_spec: str, command: list[str]) -> None:
    """``ssh --json``: what ``ssh`` would run (for scripts, or to see the key and port used);
    the terminal flag is left out, as there is no terminal to give the box then."""
    import shutil

    from outrig.inventory import resolve_host
    from outrig.ops.shell import ssh_argv

    resolved = resolve_host(host_spec, hosts_dir=settings.project.hosts_dir)
    Reporter(json_mode=True).emit_json({
        "host": host_spec, "client": shutil.which("ssh"),
        "argv": ssh_argv(resolved, command, tty=False)})


@task(auto_shortflags=False,
      help={"close": "stop the warm connections (all, or --host's)",
            "host": "with --close: only this host's (its host-file name or address)",
            "json": "print the list as JSON {connections: [...]}"})
@friendly
def connections(c: Any, close: bool = False, host: str | None = None,
                json: bool = False) -> None:
    """List the warm connections this user's commands left open, or close them.

    Each is a keeper process holding one box's SSH connection; it exits by itself after
    keep_seconds idle (10 minutes by default). --close stops them by the pid recorded.

    Examples:
        outrig connections
        outrig connections --close --host uk-node
    """
    from outrig.connectors.kept import close_keepers, keepers, wait_gone

    if host and not close:
        raise ConfigError("--host goes with --close (outrig connections lists every host). "
                          "Nothing was closed.")
    reporter = make_reporter(json)
    if close:
        closed = close_keepers(host)
        gone = [e for e in closed if wait_gone(int(e["pid"]), 10.0)]
        if json:
            reporter.emit_json({"closed": closed})
            return
        for entry in closed:
            state = "closed" if entry in gone else "asked to close"
            print(f"{state} {entry['host']} ({entry['name']}), pid {entry['pid']}")
        if not closed:
            print("no warm connection" + (f" to {host}" if host else "") + " was open")
        return
    found = keepers()
    if json:
        reporter.emit_json({"connections": found})
        return
    if not found:
        print("no warm connections")
        return
    print(f"{'HOST':<28} {'NAME':<16} {'PID':>8} {'AGE':>8} {'IDLE LEFT':>10}")
    for entry in found:
        print(f"{entry['host']:<28} {entry['name']:<16} {entry['pid']:>8} "
              f"{entry['age']:>7.0f}s {entry['idle_left']:>9.0f}s")


@task(auto_shortflags=False, help={"force": "overwrite outrig's starter files if present",
                                   "json": "print {project, wrote: [paths]} as JSON"})
@friendly
def init(c: Any, force: bool = False, json: bool = False) -> None:
    """Write a starter project here: outrig.yaml, hosts/box.yaml and playbooks/hello.yaml.

    Each file is commented; edit hosts/box.yaml to point at your box, then
    outrig check and outrig deploy. Existing files are never overwritten (without --force).

    Example:
        mkdir my-runs && cd my-runs && outrig init
    """
    from outrig.starter import write_starter

    written = write_starter(Path.cwd(), force=force)
    if json:
        Reporter(json_mode=True).emit_json({"project": str(Path.cwd()),
                                            "wrote": [str(p) for p in written]})
        return
    for path in written:
        print(f"wrote {path}")
    print("next: edit hosts/box.yaml (hostname, user, workdir), then `outrig check` and "
          "`outrig deploy`")


TASKS = (deploy, plan, status, tail_logs, cleanup, provision, stage_, sync_checkpoints,
         migrate, watch, evaluate, check, exec_, ssh, forward, connections, demo, sandbox_up,
         sandbox_down, init)


def make_collection(default_project: Path | None = None) -> Collection:
    """The task collection; ``default_project`` is the project used when none is found
    upward from the current folder (``tasks.py`` passes its checkout)."""
    collection = Collection(*TASKS)
    collection.configure({"project": str(default_project) if default_project else None})
    return collection


ns = make_collection()


program = OutrigProgram(name="outrig", binary="outrig", binary_names=["outrig"],
                        namespace=ns, version=__version__, config_class=OutrigConfig)
