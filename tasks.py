"""outrig's command line: a thin Invoke skin over the ``outrig`` library.

Each task turns flags into one call into ``outrig.ops``; errors come back as one paragraph that
says what failed, where, and the fix (no traceback), with exit status 2 for bad input (nothing
was sent) and 1 for failures on or while reaching the box. Run ``inv --list`` for the tasks and
``inv --help TASK`` for each flag.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from invoke.exceptions import Exit
from invoke.tasks import task

from outrig.console import Reporter, visible
from outrig.errors import OutrigError
from outrig.ops.base import Project

F = TypeVar("F", bound=Callable[..., Any])
PROJECT = Project(Path(__file__).resolve().parent)

HOST_HELP = "host: a file name in hosts/, an ~/.ssh/config alias, user@host:port, or 'local'"
JSON_HELP = "print JSON (one document, or JSON lines while streaming) instead of tables"


def _reporter(json: bool) -> Reporter:
    return Reporter(json_mode=json)


def friendly(func: F) -> F:
    """Print an OutrigError's message (no traceback) and exit with its status."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except OutrigError as exc:
            print(f"error: {visible(str(exc))}", file=sys.stderr)
            raise Exit(code=exc.exit_code) from None
        except KeyboardInterrupt:
            print("interrupted: anything already launched keeps running on the box; "
                  "see `inv status`", file=sys.stderr)
            raise Exit(code=130) from None

    return wrapper  # type: ignore[return-value]


@task(
    auto_shortflags=False,
    help={
        "host": HOST_HELP,
        "playbook": "playbook name in playbooks/ (or a path to one); default: smoke",
        "test": "apply the playbook's test: overrides (fewer samples, one epoch)",
        "dry_run": "print the plan and stop; nothing is sent",
        "no_wait": "return as soon as every process is launched and recorded",
        "json": JSON_HELP,
    },
)
@friendly
def deploy(c: Any, host: str, playbook: str = "smoke", test: bool = False,
           dry_run: bool = False, no_wait: bool = False, json: bool = False) -> None:
    """Push files, stop the previous run, launch every process and wait until it is ready.

    Examples:
        inv deploy --host uk-node --playbook dflash-qwen36
        inv deploy --host uk-node --playbook dflash-qwen36 --test --dry-run
    """
    from outrig.ops.deploy import deploy as run_deploy

    run_deploy(PROJECT, host, playbook, _reporter(json), test=test, dry_run=dry_run,
               wait=not no_wait)


@task(
    auto_shortflags=False,
    help={"host": HOST_HELP, "playbook": "playbook name in playbooks/ (or a path)",
          "test": "plan with the playbook's test: overrides", "json": JSON_HELP},
)
@friendly
def plan(c: Any, host: str, playbook: str, test: bool = False, json: bool = False) -> None:
    """Show the plan (GPU map, full commands, env, start order); nothing is sent.

    Example:
        inv plan --host uk-node --playbook dflash-qwen36
    """
    from outrig.ops.deploy import show_plan

    show_plan(PROJECT, host, playbook, _reporter(json), test=test)


@task(
    auto_shortflags=False,
    help={"host": HOST_HELP, "run": "the run id to show (default: current runs)",
          "playbook": "show the current run of this playbook",
          "lines": "log lines to show per process (default 5)", "json": JSON_HELP},
)
@friendly
def status(c: Any, host: str, run: str | None = None, playbook: str | None = None,
           lines: int = 5, json: bool = False) -> None:
    """Show each process (running / exited with code / killed), readiness, GPUs, progress.

    One agent call: per process state, pid, uptime, readiness and the GPUs it holds; the
    trainer's step, loss, acceptance, speed and ETA parsed from its metric lines; the newest
    complete checkpoint; vLLM's /health and served model; the last lines of a failed process.

    Example:
        inv status --host uk-node
    """
    from outrig.ops.runs import status as run_status

    run_status(PROJECT, host, _reporter(json), run_id=run, playbook=playbook, log_lines=lines)


@task(
    auto_shortflags=False,
    iterable=["process"],
    help={"host": HOST_HELP, "run": "run id (default: the current run)",
          "playbook": "the current run of this playbook",
          "process": "only this process (repeat for several)",
          "lines": "start N lines before the end (default: resume from the saved cursor, or "
                   "from the beginning the first time)",
          "no_follow": "print what is there now and exit",
          "grep": "show only lines matching this regular expression (the mirror keeps all)",
          "since": "not supported (logs carry no reliable timestamps); use --lines",
          "json": "JSON lines {process, line} instead of prefixed text"},
)
@friendly
def tail_logs(c: Any, host: str, run: str | None = None, playbook: str | None = None,
              process: list[str] | None = None, lines: str | None = None,
              no_follow: bool = False, grep: str | None = None, since: str | None = None,
              json: bool = False) -> None:
    """Follow every log of a run over one SSH channel, exactly once, into a local mirror.

    Lines are prefixed with the process name. The mirror is kept under
    ~/.local/state/outrig/logs/HOST/RUN/PROCESS.log with a cursor; a dropped link reconnects
    and resumes there, and so does the next tail-logs (no line lost or repeated). Stop with
    Ctrl-C. See docs/logs-and-status.md.

    Examples:
        inv tail-logs --host uk-node
        inv tail-logs --host uk-node --process trainer --lines 100 --grep global_step
        inv tail-logs --host uk-node --no-follow --json
    """
    from outrig.errors import ConfigError
    from outrig.ops.logs import tail_logs as run_tail

    count: int | None = None
    if lines is not None:
        try:
            count = int(lines)
        except ValueError:
            raise ConfigError(f"--lines must be a whole number, not {lines!r}") from None
    run_tail(PROJECT, host, _reporter(json), run_id=run, playbook=playbook,
             processes=list(process or []), lines=count, follow=not no_follow, grep=grep,
             since=since)


@task(
    auto_shortflags=False,
    iterable=["force_foreign"],
    help={"host": HOST_HELP, "run": "stop this run id", "playbook": "stop this playbook's run",
          "all": "stop every outrig run on the box",
          "force_foreign": "also kill this pid that outrig did not start (repeat for several); "
                           "it is shown before it is killed",
          "dry_run": "show what would be signalled and who holds the GPUs; signal nothing",
          "timeout": "seconds to wait for GPU memory to come back (default 60)",
          "json": JSON_HELP},
)
@friendly
def cleanup(c: Any, host: str, run: str | None = None, playbook: str | None = None,
            all: bool = False, force_foreign: list[str] | None = None, dry_run: bool = False,
            timeout: float = 60.0, json: bool = False) -> None:
    """Stop exactly what outrig started, then prove the GPUs are free (audit + wait).

    Exit status 0 only when nothing of ours is left and the GPU memory it held is back.
    Processes outrig did not start are listed, never killed, unless named with
    --force-foreign.

    Examples:
        inv cleanup --host uk-node --playbook dflash-qwen36
        inv cleanup --host uk-node --all --dry-run
        inv cleanup --host uk-node --force-foreign 4711
    """
    from outrig.ops.cleanup import cleanup as run_cleanup

    run_cleanup(PROJECT, host, _reporter(json), run_id=run, playbook=playbook, all_runs=all,
                force_foreign=list(force_foreign or []), dry_run=dry_run,
                timeout=float(timeout))


@task(
    auto_shortflags=False,
    help={"host": HOST_HELP,
          "playbook": "playbook whose environments:/requires: to set up (default: the only "
                      "playbook in playbooks/ that has environments:)",
          "dry_run": "check the box and say what would be created or updated; install nothing",
          "json": JSON_HELP},
)
@friendly
def provision(c: Any, host: str, playbook: str | None = None, dry_run: bool = False,
              json: bool = False) -> None:
    """Idempotent environment set-up: the playbook's venvs with pinned packages.

    Checks python, the NVIDIA driver and free disk against requires:, then creates or updates
    each environment; what is already right is skipped (one exec to find out). Installed
    versions are recorded in the journal. See docs/provision.md.

    Examples:
        inv provision --host new-node --playbook dflash-qwen36
        inv provision --host new-node --playbook dflash-qwen36 --dry-run
    """
    from outrig.ops.provision import provision as run_provision

    run_provision(PROJECT, host, _reporter(json), playbook=playbook, dry_run=dry_run)


@task(
    auto_shortflags=False,
    name="stage",
    help={"host": HOST_HELP, "playbook": "playbook whose model, data (and checkpoints) to stage",
          "from_": "copy from this box (direct box-to-box when they can reach each other, "
                       "else relayed through this workstation)",
          "resume": "also put the newest complete checkpoint in place (from --from, "
                    "else from this workstation's mirror)",
          "streams": "parallel streams for copies through the workstation (default 4)",
          "json": JSON_HELP},
)
@friendly
def stage_(c: Any, host: str, playbook: str, from_: str | None = None,
           resume: bool = False, streams: int = 4, json: bool = False) -> None:
    """Put the model, data and (with --resume) a checkpoint on a box: fastest route, verified.

    A re-run moves nothing and costs one agent call (each folder carries a verified manifest).
    Routes: the box downloads hf: sources itself; --from copies box to box; folders on
    this workstation are pushed in parallel streams. Cut transfers resume.

    Examples:
        inv stage --host new-node --playbook dflash-qwen36
        inv stage --host new-node --playbook dflash-qwen36 --from uk-node --resume
    """
    from outrig.ops.stage import stage

    stage(PROJECT, host, playbook, _reporter(json), from_host=from_, resume=resume,
          streams=streams)


@task(
    auto_shortflags=False,
    help={"host": HOST_HELP, "playbook": "whose checkpoints (default: the playbook of the "
          "host's newest run that really ran)",
          "run": "take the playbook of this run id instead", "json": JSON_HELP},
)
@friendly
def sync_checkpoints(c: Any, host: str, playbook: str | None = None, run: str | None = None,
                     json: bool = False) -> None:
    """Pull new complete checkpoints from a box into this workstation's mirror.

    Only checkpoints that are complete (every file present, training_state.json readable, and
    logged as saved or followed by a later epoch) are pulled; ``interrupted/`` never is. Run
    it now and then: a dead box then loses at most the work since the last sync.

    Example:
        inv sync-checkpoints --host uk-node
    """
    from outrig.ops.stage import sync_checkpoints as run_sync

    run_sync(PROJECT, host, _reporter(json), playbook=playbook, run_id=run)


@task(
    auto_shortflags=False,
    help={"from_": "the old box (dead or alive): host file name, ssh alias or user@host:port",
          "to": "the new box", "playbook": "playbook to run on the new box (default: the old "
          "box's last playbook, or the member of its family that fits the new box best)",
          "run": "the run on the old box to move (default: its newest run that really ran)",
          "json": JSON_HELP},
)
@friendly
def migrate(c: Any, from_: str, to: str, playbook: str | None = None, run: str | None = None,
            json: bool = False) -> None:
    """Move a job to a fresh box and resume it from the newest complete checkpoint.

    Probes the old box several times before calling it dead; provisions and stages the new
    one; re-plans GPU placement for its hardware (old and new shown side by side); stops the
    old run if the box is alive and copies its checkpoint box to box, else uses this
    workstation's mirror; deploys with resume. See docs/migrate.md.

    Example:
        inv migrate --from uk-node --to new-node
    """
    from outrig.ops.migrate import migrate as run_migrate

    run_migrate(PROJECT, from_, to, _reporter(json), playbook=playbook, run_id=run)


@task(auto_shortflags=False, help={"host": HOST_HELP, "json": JSON_HELP})
@friendly
def check(c: Any, host: str, json: bool = False) -> None:
    """Preflight: reach the box, measure RTT, check python3, GPUs, workdir and disk.

    Example:
        inv check --host uk-node
    """
    from outrig.ops.runs import check as run_check

    run_check(PROJECT, host, _reporter(json))


@task(
    auto_shortflags=False,
    help={"keep": "leave the sandbox (sshd and processes) running and print how to reach it",
          "delay": "one-way delay in ms added by a latency proxy in front of the sandbox "
                   "(default 0; 120 gives a 240 ms RTT like a far-away box)"},
)
@friendly
def demo(c: Any, keep: bool = False, delay: int = 0) -> None:
    """The whole loop against a local sandbox box: deploy smoke, status, logs, cleanup.

    Starts a real OpenSSH sshd on 127.0.0.1 with throwaway keys and a fake nvidia-smi,
    installing openssh-server with apt-get first if this machine has no sshd.

    Example:
        inv demo
    """
    from outrig.ops.demo import run_demo

    run_demo(PROJECT, Reporter(), keep=keep, one_way_delay=delay / 1000.0)
