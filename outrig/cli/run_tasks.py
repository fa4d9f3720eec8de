"""The tasks on a run: start it (``deploy``, after ``plan``), look at it (``status``,
``tail-logs``), stop it (``cleanup``), guard it (``watch``), and keep it going elsewhere
(``sync-checkpoints``, ``migrate``).

Each task parses its flags, resolves what it acts on into a :class:`~outrig.cli.targets.
Target` (one host, a sweep of hosts, or a multi-node job) and hands the target what it does
for each kind; the work itself is one call into ``outrig.ops`` (a sweep's is
:mod:`outrig.cli.sweep`). The ops, the targets and the sweeps (and through them the console,
the planner, the recipes and the playbook models) are imported inside each task, purely for
start-up: ``outrig --version``, ``--list`` and ``--help`` load none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outrig.cli.flags import (
    DEADLINE_HELP,
    FANOUT_JSON,
    GPUS_HELP,
    HOST_HELP,
    HOSTS_HELP,
    JOB_RUN,
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
from outrig.cli.settings import parse_params, playbook_for, settings_for
from outrig.cli.taskspec import TaskContext, task
from outrig.errors import ConfigError

if TYPE_CHECKING:
    from outrig.cli.targets import NodeJob, OneHost

# the agent's own limits (remote/agent/status.py, follow.py): refused here, before connecting
STATUS_LINES_MAX = 10000
TAIL_LINES_MAX = 10**9


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
        "allow_unhealthy_gpu": "place processes on GPUs whose health is bad (uncorrectable "
                               "ECC errors, a pending or failed row remap, a fatal Xid) "
                               "or cannot be read (a driver that fails or hangs); refused "
                               "by default, nothing started",
        "max_parallel": MAX_PARALLEL_HELP, "deadline": DEADLINE_HELP,
        "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
        "json": JSON_HELP + "; with several hosts one line per host " + FANOUT_JSON,
    },
)
@friendly
def deploy(c: TaskContext, host: list[str] | None = None, playbook: str | None = None,
           param: list[str] | None = None, test: bool = False, dry_run: bool = False,
           no_wait: bool = False, allow_unhealthy_gpu: bool = False,
           max_parallel: str | None = None, deadline: str | None = None,
           project: str | None = None, no_keep: bool = False, json: bool = False) -> None:
    """Push files, stop the previous run, launch every process and wait until it is ready.

    A GPU the box reports sick (uncorrectable ECC errors, a pending or failed row remap, a
    fatal Xid in the kernel log) is not given to a process, nor is any GPU of a box whose
    driver fails or hangs: the deploy is refused, naming the GPU, the reason and the fix,
    before anything is stopped or started (--allow-unhealthy-gpu overrides; see outrig
    check for each GPU's health).

    With several hosts (--host a,b, a group, or all) the same playbook is deployed on every
    host at once, each as a run of its own (a sweep); one row per host with its run id and
    state.

    Examples:
        outrig deploy --host uk-node --playbook dflash-qwen36
        outrig deploy --playbook smoke --param steps=50 --dry-run
        outrig deploy --host sweep --playbook smoke
    """
    from outrig.cli.sweep import deploy_hosts
    from outrig.cli.targets import select_deploy
    from outrig.ops.deploy import deploy_on
    from outrig.session import host_session

    reporter = make_reporter(json)
    settings = settings_for(c, project, no_keep=no_keep)
    params = parse_params(param)
    target = select_deploy(settings, reporter, host, playbook, what="deploy", test=test,
                           params=params, sweep_needs_playbook=True,
                           max_parallel=max_parallel, deadline=deadline)

    def on_host(one: OneHost) -> None:
        with host_session(one.project, one.spec, reporter, book=one.book) as session:
            deploy_on(session, one.playbook, dry_run=dry_run, wait=not no_wait, params=params,
                      allow_unhealthy_gpu=allow_unhealthy_gpu)

    def on_job(job: NodeJob) -> None:
        """Node 0 first, every node ready, or every node stopped and the failing node named."""
        from outrig.ops.nodes import deploy_nodes

        deploy_nodes(job.project, job.hosts, job.playbook, reporter, book=job.book,
                     dry_run=dry_run, wait=not no_wait, params=params,
                     allow_unhealthy_gpu=allow_unhealthy_gpu)

    target.run(host=on_host, job=on_job,
               sweep=lambda sweep: deploy_hosts(sweep, dry_run=dry_run, wait=not no_wait,
                                                params=params,
                                                allow_unhealthy_gpu=allow_unhealthy_gpu))


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
def plan(c: TaskContext, host: list[str] | None = None, playbook: str | None = None,
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
    from outrig.cli.sweep import place_hosts
    from outrig.cli.targets import select_deploy
    from outrig.ops.deploy import show_plan

    reporter = make_reporter(json)
    settings = settings_for(c, project, no_keep=no_keep)
    params = parse_params(param)
    target = select_deploy(settings, reporter, host, playbook, what="plan", test=test,
                           params=params, sweep_needs_playbook=False,
                           max_parallel=max_parallel, deadline=deadline)

    def on_job(job: NodeJob) -> None:
        """Every node's plan, each against its own box; nothing is started."""
        from outrig.ops.nodes import deploy_nodes

        deploy_nodes(job.project, job.hosts, job.playbook, reporter, book=job.book,
                     dry_run=True, wait=False, params=params)

    target.run(host=lambda one: show_plan(one.host, one.playbook, reporter),
               sweep=place_hosts, job=on_job)


@task(
    auto_shortflags=False,
    iterable=["host"],
    help={"host": HOSTS_HELP, "run": "the run id to show (default: current runs); without "
          "--host, on the box the journal records for it" + JOB_RUN,
          "playbook": "show the current run of this playbook",
          "lines": "log lines to show per process (default 5)", "gpus": GPUS_HELP,
          "follow": "a live view: refresh in place until Ctrl-C, on one connection (plain "
                    "lines, no cursor movement, when stdout is not a terminal; with --json "
                    "one document per refresh)",
          "every": "seconds between refreshes with --follow (default 2)",
          "max_parallel": MAX_PARALLEL_HELP, "deadline": DEADLINE_HELP,
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
          "json": JSON_HELP + "; with several hosts one line per host {host, ok, state, "
                  "seconds, error, result}"},
)
@friendly
def status(c: TaskContext, host: list[str] | None = None, run: str | None = None,
           playbook: str | None = None, lines: str | None = None, gpus: bool = False,
           follow: bool = False, every: str | None = None,
           max_parallel: str | None = None, deadline: str | None = None,
           project: str | None = None, no_keep: bool = False, json: bool = False) -> None:
    """Show each process (running / exited with code / killed), readiness, GPUs, progress.

    Each GPU's health is judged too: a bad one is a warning, and one that turned bad since
    the last look is reported as gpu_unhealthy (--gpus: a health column per GPU).

    One agent call: per process state, pid, uptime, readiness and the GPUs it holds; the
    trainer's step, loss, acceptance, speed and ETA parsed from its metric lines; the newest
    complete checkpoint; vLLM's /health and served model; the last lines of a failed process.

    With several hosts (--host a,b, a group, or all) every host is asked at once and the
    answer is one row per host (runs, GPUs free); hosts that fail or give no answer within
    their deadline are listed with the reason, and the exit status is then 1.

    With --follow it is a live view of one box: the same status refreshed in place every
    2 s (--every) on one connection, until Ctrl-C (exit 130).

    Examples:
        outrig status --host uk-node
        outrig status --host all
        outrig status --host uk-node --follow
    """
    from outrig.cli.sweep import status_hosts
    from outrig.cli.targets import select
    from outrig.ops.status import status as run_status

    count = int(number(lines, "lines", 5, least=0, most=STATUS_LINES_MAX))
    pause = number(every, "every", 2, whole=False, least=0.2, most=3600)
    if every is not None and not follow:
        raise ConfigError("--every is the pause of --follow; add --follow (or leave --every "
                          "out). Nothing was contacted.")
    settings = settings_for(c, project, no_keep=no_keep)
    reporter = make_reporter(json, gpus)
    target = select(settings, reporter, host, run=run, playbook=playbook,
                    max_parallel=max_parallel, deadline=deadline)
    if follow:
        from outrig.ops.status_follow import follow_status

        def several(_: object) -> None:
            raise ConfigError("--follow shows one box; give one --host (for several, "
                              "`outrig status --host a,b` once, or one --follow each). "
                              "Nothing was contacted.")

        target.run(host=lambda one: follow_status(
            one.project, one.spec, reporter, run_id=run, playbook=one.playbook_name,
            log_lines=count, every=pause, book=one.book), sweep=several, job=several)
        return

    def on_job(job: NodeJob) -> None:  # a multi-node job: every node of it, whatever --host says
        from outrig.ops.node_control import nodes_status

        nodes_status(job.project, job.recorded_id, reporter, log_lines=count)

    target.run(
        host=lambda one: run_status(one.project, one.spec, reporter, run_id=run,
                                    playbook=one.playbook_name, log_lines=count,
                                    book=one.book),
        sweep=lambda sweep: status_hosts(sweep, run=run, log_lines=count),
        job=on_job)


@task(
    auto_shortflags=False,
    iterable=["process", "host"],
    help={"host": HOSTS_HELP, "run": "run id (default: the current run); without --host, on "
          "the box the journal records for it (its mirror when that box is gone)" + JOB_RUN,
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
def tail_logs(c: TaskContext, host: list[str] | None = None, run: str | None = None,
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
    from outrig.cli.sweep import tail_logs_hosts
    from outrig.cli.targets import select
    from outrig.ops.logs import tail_logs as run_tail

    count = None if lines is None else int(number(lines, "lines", 100, least=0,
                                                  most=TAIL_LINES_MAX))
    settings = settings_for(c, project, no_keep=no_keep)
    reporter = make_reporter(json)
    processes = list(process or [])
    target = select(settings, reporter, host, run=run, playbook=playbook,
                    max_parallel=max_parallel)

    def on_job(job: NodeJob) -> None:  # a multi-node job: every node's logs, prefixed with it
        from outrig.ops.node_control import tail_nodes

        tail_nodes(job.project, job.recorded_id, reporter, lines=count, follow=not no_follow,
                   grep=grep, processes=processes)

    target.run(
        host=lambda one: run_tail(one.project, one.spec, reporter, run_id=run,
                                  playbook=one.playbook_name, processes=processes,
                                  lines=count, follow=not no_follow, grep=grep,
                                  book=one.book),
        sweep=lambda sweep: tail_logs_hosts(sweep, run=run, processes=processes, lines=count,
                                            follow=not no_follow, grep=grep),
        job=on_job)


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
def cleanup(c: TaskContext, host: list[str] | None = None, run: str | None = None,
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
    from outrig.cli.sweep import cleanup_hosts
    from outrig.cli.targets import select
    from outrig.ops.cleanup import cleanup as run_cleanup

    seconds = float(number(timeout, "timeout", 60.0, whole=False))
    settings = settings_for(c, project, no_keep=no_keep)
    reporter = make_reporter(json, gpus)
    foreign = list(force_foreign or [])
    target = select(settings, reporter, host, run=run, playbook=playbook,
                    max_parallel=max_parallel, deadline=deadline)

    def on_job(job: NodeJob) -> None:  # a multi-node job: its run on every node, nothing else
        from outrig.ops.node_control import stop_nodes

        if dry_run or force_foreign:
            raise ConfigError(f"--run {run} is the multi-node job {job.recorded_id}: cleanup "
                              "stops its run on every node and takes neither --dry-run nor "
                              "--force-foreign (to see one box first: outrig cleanup --host "
                              "NODE --all --dry-run). Nothing was stopped.")
        stop_nodes(job.project, job.recorded_id, reporter, timeout=seconds)

    target.run(
        host=lambda one: run_cleanup(one.project, one.spec, reporter, run_id=run,
                                     playbook=one.playbook_name, all_runs=all,
                                     force_foreign=foreign, dry_run=dry_run, timeout=seconds,
                                     book=one.book),
        sweep=lambda sweep: cleanup_hosts(sweep, all_runs=all, run=run,
                                          force_foreign=foreign, dry_run=dry_run,
                                          timeout=seconds),
        job=on_job)


@task(
    auto_shortflags=False,
    iterable=["spare"],
    help={"host": HOST_HELP,
          "playbook": "the playbook whose run to follow (its current run on the host)",
          "spare": "a box to move the job to if the host dies (repeat for several; the first "
                   "that passes check and has no bad GPU wins); 'auto' rents one through the "
                   "provider of spares: in outrig.yaml (the default when that is set); for a "
                   "multi-node job, at least one box per node (a,b: new node 0 first; each move "
                   "takes the next N, the rest wait for the next one), or auto to rent "
                   "them at every move",
          "run": "the run to follow (default: the playbook's current run on the host)" + JOB_RUN,
          "restarts": "after a crash or a hang on a healthy box, redeploy in place at most "
                      "N times (default 0: report and stop, or move a hung run to a spare)",
          "threshold": "seconds with every health signal failing before the box may be "
                       "called dead (default 60; scaled up with the measured RTT)",
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP, "json": JSON_HELP},
)
@friendly
def watch(c: TaskContext, host: str | None = None, playbook: str | None = None,
          spare: list[str] | None = None, run: str | None = None, restarts: str | None = None,
          threshold: str | None = None, project: str | None = None, no_keep: bool = False,
          json: bool = False) -> None:
    """Follow one run until it finishes; restart or move it if it hangs or its box dies.

    Judges the box from several signals (TCP, SSH banner, the agent's answer, the run's
    processes, log growth) with RTT-scaled limits, mirrors each new complete checkpoint, and
    on a confirmed death migrates to the first spare that passes check (a spare with a bad
    GPU is skipped). A crash on a box that answers is reported, never migrated (--restarts
    N redeploys in place). A process that lives but does no work (a silent log, idle GPUs,
    vLLM's counters frozen with requests queued, a stopped process), confirmed as the
    playbook's hang: section says, is a hung event, then a restart, else a move. A GPU
    turning bad during the run (uncorrectable ECC errors, a row remap, a fatal Xid) is a
    gpu_unhealthy event. With the playbook's evaluate.during_training, each new complete
    checkpoint is evaluated on vLLM (on GPUs set aside, or a second box) while training goes
    on, one at a time, and its acceptance length printed. Events go to the on_event hook; its
    state lives in the journal, so a restarted watch carries on. See docs/watch.md.

    A multi-node job (--run JOB): a node failing stops the others; with --spare, a node
    that stops answering moves the whole job to the spares, one per node (the job's
    checkpoints are mirrored as it goes), and the moved job is watched the same way while
    spares last (auto rents at every move). See docs/scale-out.md.

    Examples:
        outrig watch --host uk-node --playbook dflash-qwen36 --spare new-node
        outrig watch --run pair-20260101-120000-ab12 --spare spare-a,spare-b
    """
    from outrig.cli.targets import playbook_identity, select_one
    from outrig.ops.watch import watch as run_watch
    from outrig.ops.watch_record import WatchOptions
    from outrig.watching.notify import Notifier

    reporter = make_reporter(json)
    settings = settings_for(c, project, no_keep=no_keep)
    target = select_one(settings, reporter, host, run)

    def on_host(one: OneHost) -> None:
        # the name the playbook's runs are filed under (docs/cli.md, "Which run a command
        # means"); the playbook of the host's current run when none is given or configured
        name = playbook_identity(settings, playbook_for(settings, playbook, one.spec,
                                                        reporter, what="watch",
                                                        book=one.book))
        assert name is not None
        from outrig.providers.spares import spares_for_watch

        options = WatchOptions(spares=spares_for_watch(one.project, list(spare or []), name),
                               run_id=run,
                               restarts=(None if restarts is None
                                         else int(number(restarts, "restarts", 0))),
                               threshold=float(number(threshold, "threshold", 60,
                                                      whole=False)))
        run_watch(one.project, one.spec, name, reporter, options=options,
                  notifier=Notifier(settings.on_event(), reporter))

    def on_job(job: NodeJob) -> None:  # a multi-node job: one node failing stops the others,
        # or, with spares, a node lost moves the whole job to them
        from outrig.journal import Journal
        from outrig.ops.job_move import split_hosts, watch_job
        from outrig.ops.nodes_watch import watch_nodes
        from outrig.providers.spares import spares_for_watch

        limit = float(number(threshold, "threshold", 60, whole=False))
        name = (Journal().job(job.recorded_id) or {}).get("playbook")
        spares = spares_for_watch(job.project, split_hosts(spare),
                                  str(name) if name else None)
        if not spares:
            watch_nodes(job.project, job.recorded_id, reporter, threshold=limit)
            return
        notifier = Notifier(settings.on_event(), reporter)
        watch_job(job.project, job.recorded_id, spares, reporter, send=notifier.send,
                  threshold=limit)

    target.run(host=on_host, job=on_job)


@task(
    auto_shortflags=False,
    iterable=["host"],
    help={"host": HOSTS_HELP, "playbook": "whose checkpoints (default: the playbook of the "
          "host's newest run that really ran)",
          "run": "take the playbook of this run id instead; a multi-node job's id mirrors "
                 "the job's checkpoints (read on every node that answers: global rank 0 "
                 "writes them on one), no --host needed",
          "max_parallel": MAX_PARALLEL_HELP, "deadline": LONG_DEADLINE_HELP,
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
          "json": JSON_HELP + "; with several hosts one line per host " + FANOUT_JSON},
)
@friendly
def sync_checkpoints(c: TaskContext, host: list[str] | None = None, playbook: str | None = None,
                     run: str | None = None, max_parallel: str | None = None,
                     deadline: str | None = None, project: str | None = None,
                     no_keep: bool = False, json: bool = False) -> None:
    """Pull new complete checkpoints from a box into this workstation's mirror.

    Only checkpoints that are complete (every file present, training_state.json readable, and
    logged as saved or followed by a later epoch) are pulled; ``interrupted/`` never is. Run
    it now and then: a dead box then loses at most the work since the last sync.

    Examples:
        outrig sync-checkpoints --host uk-node
        outrig sync-checkpoints --run pair-20260101-120000-ab12
    """
    from outrig.cli.sweep import sync_hosts
    from outrig.cli.targets import select
    from outrig.journal import Journal
    from outrig.ops.stage import sync_checkpoints as run_sync

    settings = settings_for(c, project, no_keep=no_keep)
    reporter = make_reporter(json)
    if run and Journal().job(run) is not None:
        # a job's id: global rank 0 (node 0) writes the job's checkpoints
        from outrig.ops.job_move import sync_job_checkpoints

        if playbook or [h for h in host or [] if h]:
            raise ConfigError(f"--run {run} is a multi-node job: its checkpoints are node 0's, "
                              "read at the playbook it was deployed with; drop --host and "
                              "--playbook. Nothing was sent.")
        sync_job_checkpoints(settings.project, str(run), reporter)
        return
    # any other --run id is one box's run (a node's run is too)
    target = select(settings, reporter, host, max_parallel=max_parallel, deadline=deadline)
    target.run(
        host=lambda one: run_sync(one.project, one.spec, reporter, playbook=playbook,
                                  run_id=run, book=one.book),
        sweep=lambda sweep: sync_hosts(sweep, playbook, run=run))


@task(
    auto_shortflags=False,
    iterable=["param"],
    help={"from_": "the old box (dead or alive): host file name, ssh alias or user@host:port; "
                   "default: the box the journal files --run under (its host file may be "
                   "gone: the address recorded with the run is used)",
          "to": "the new box; for a multi-node job, one new box per node, new node 0 first "
                "(--to a,b)", "playbook": "playbook to run on the new box (default: the "
          "moved run's playbook as it was deployed, or the member of its family that fits the "
          "new box best)",
          "run": "the run to move (default: the old box's newest run that really ran), or a "
                 "multi-node job's id: the whole job moves",
          "param": "change a param of the moved run (the run's own --param values are "
                   "carried over without it)",
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP, "json": JSON_HELP},
)
@friendly
def migrate(c: TaskContext, from_: str | None = None, to: str | None = None,
            playbook: str | None = None, run: str | None = None,
            param: list[str] | None = None, project: str | None = None,
            no_keep: bool = False, json: bool = False) -> None:
    """Move a job to a fresh box and resume it from the newest complete checkpoint.

    The run is deployed on the new box as it was deployed: its playbook as it was then (not
    a re-read of today's file), its --param values and --test; the success line names any
    difference. Needs only the journal and the new box: with --run the old box is found in
    the journal, and a box whose host file is gone is probed at the address recorded with
    the run.

    Probes the old box several times before calling it dead; provisions and stages the new
    one; re-plans GPU placement for its hardware (old and new shown side by side); stops the
    old run if the box is alive and copies its checkpoint box to box, else uses this
    workstation's mirror; deploys with resume. See docs/migrate.md.

    A multi-node job (--run JOB --to a,b) moves as a whole to as many new boxes: the nodes
    that answer are fenced, the newest complete checkpoint goes to every new node, and
    the job resumes with the new node 0 as its rendezvous host. See docs/scale-out.md.

    Examples:
        outrig migrate --from uk-node --to new-node
        outrig migrate --run smoke-20250101-120000-ab12 --to new-node
        outrig migrate --run pair-20250101-120000-ab12 --to spare-a,spare-b
    """
    from outrig.cli.targets import job_id_for
    from outrig.ops.migrate import migrate as run_migrate

    if not to or not (from_ or run):
        raise ConfigError("migrate needs the run to move and the new box: --run RUN (or "
                          "--from OLD) and --to NEW (host file names, ssh aliases or "
                          "user@host:port). Nothing was sent.")
    settings = settings_for(c, project, no_keep=no_keep)
    job_id = job_id_for(run)
    if job_id is not None:  # a multi-node job moves as a whole, to as many boxes
        from outrig.ops.job_move import JobMoveOptions, move_job, split_hosts

        if from_ or playbook:
            raise ConfigError(f"--run {run} is a multi-node job: it moves as deployed from the "
                              "boxes the journal records; drop --from and --playbook. Nothing "
                              "was stopped or started.")
        move_job(settings.project, job_id, split_hosts(to), make_reporter(json),
                 options=JobMoveOptions(params=parse_params(param) or None))
        return
    if "," in to:
        raise ConfigError(f"--to {to}: a run of one box moves to one box; several boxes are "
                          "for a multi-node job (--run JOB). Nothing was stopped or started.")
    run_migrate(settings.project, from_, to, make_reporter(json), playbook=playbook,
                run_id=run, params=parse_params(param) or None)
