"""The sandbox tasks: ``demo`` (the whole loop against a local sandbox box), ``sandbox-up``
and ``sandbox-down`` (a sandbox that outlives the command). See docs/sandbox.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from invoke.tasks import task

from outrig.cli.flags import JSON_HELP, NO_KEEP_HELP, PROJECT_HELP, friendly, make_reporter, number
from outrig.console import Reporter
from outrig.errors import OutrigError
from outrig.settings import Settings, settings_for


@task(
    auto_shortflags=False,
    help={"keep": "leave the sandbox and the smoke run running after this command (the "
                  "sandbox of sandbox-up) and print how to reach them; sandbox-down stops both",
          "delay": "one-way delay in ms added by a latency proxy in front of the sandbox "
                   "(default 0; 120 gives a 240 ms RTT like a far-away box)",
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
          "json": "each step's JSON (deploy events, the status document, log lines, the "
                  "cleanup report) as JSON lines; progress notes go to stderr"},
)
@friendly
def demo(c: Any, keep: bool = False, delay: str | None = None,
         project: str | None = None, no_keep: bool = False, json: bool = False) -> None:
    """The whole loop against a local sandbox box: deploy smoke, status, logs, cleanup.

    Starts a real OpenSSH sshd on 127.0.0.1 with throwaway keys and a fake nvidia-smi,
    installing openssh-server with apt-get first if this machine has no sshd. Needs a project
    with the smoke playbook (this repository's).

    Example:
        outrig demo
    """
    from outrig.ops.demo import run_demo

    one_way_ms = number(delay, "delay", 0)
    settings = settings_for(c, project, no_keep=no_keep)
    run_demo(settings.project, make_reporter(json), keep=keep,
             one_way_delay=one_way_ms / 1000.0)


SANDBOX_NAME_HELP = "the sandbox's name (default sandbox); several can be up at once"


def _sandbox_host_file(settings: Settings, name: str, flag: str | None) -> Path:
    """``--host-file``, else ``hosts/NAME.yaml`` in the project, so ``--host NAME`` works."""
    return Path(flag).expanduser() if flag else settings.project.hosts_dir / f"{name}.yaml"


def _down_command(name: str) -> str:
    import shlex

    return "outrig sandbox-down" + ("" if name == "sandbox" else f" --name {shlex.quote(name)}")


@task(
    name="sandbox-up",
    auto_shortflags=False,
    help={"name": SANDBOX_NAME_HELP,
          "delay": "one-way delay in ms added by a latency proxy in front of the sshd "
                   "(default 0: no proxy; 120 gives a 240 ms RTT like a far-away box)",
          "host_file": "write the host file here (default: hosts/NAME.yaml in the project)",
          "project": PROJECT_HELP, "json": JSON_HELP},
)
@friendly
def sandbox_up(c: Any, name: str = "sandbox", delay: str | None = None,
               host_file: str | None = None, project: str | None = None,
               json: bool = False) -> None:
    """Start a sandbox box here that stays up after this command; sandbox-down stops it.

    The box is a real sshd on 127.0.0.1 with throwaway keys and fake GPUs, behind a latency
    proxy with --delay. Writes a host file for it and prints how to use it and how to stop it
    (outrig sandbox-down). A second sandbox-up with the same name finds it up and starts
    nothing. See docs/sandbox.md.

    Examples:
        outrig sandbox-up --delay 120
        outrig check --host sandbox
    """
    from outrig.ops.demo import ensure_sshd
    from outrig.sandbox.service import describe_up, host_argument
    from outrig.sandbox.service import sandbox_up as start

    one_way_ms = number(delay, "delay", 0, whole=False)
    settings = settings_for(c, project)
    reporter = make_reporter(json)
    ensure_sshd(reporter)
    path = _sandbox_host_file(settings, name, host_file)
    state = start(name, path, one_way_delay=one_way_ms / 1000.0)
    if json:
        reporter.emit_json(state)
        return
    host = host_argument(Path(state["host_file"]), settings.project.hosts_dir)
    reporter.lines(describe_up(state, host, down=_down_command(name), width=reporter.width))


@task(
    name="sandbox-down",
    auto_shortflags=False,
    help={"name": SANDBOX_NAME_HELP,
          "keep_runs": "do not ask the box to stop its outrig runs first (their processes "
                       "then keep running on this machine)",
          "project": PROJECT_HELP, "json": JSON_HELP},
)
@friendly
def sandbox_down(c: Any, name: str = "sandbox", keep_runs: bool = False,
                 project: str | None = None, json: bool = False) -> None:
    """Stop the sandbox that sandbox-up (or demo --keep) started and remove its host file.

    First stops every outrig run on it (as cleanup --all would), then signals exactly the
    server and sshd processes that sandbox-up recorded (checked by pid and start time, never
    found by name). Harmless when nothing is up.

    Example:
        outrig sandbox-down
    """
    from outrig.sandbox.service import is_up, read_state
    from outrig.sandbox.service import sandbox_down as stop

    settings = settings_for(c, project)
    reporter = make_reporter(json)
    state = read_state(name)
    if state is not None and is_up(state) and not keep_runs:
        from outrig.ops.cleanup import cleanup

        try:
            import io

            quiet = Reporter(quiet=True, out=io.StringIO(), err=io.StringIO())
            cleanup(settings.project, str(state["host_file"]), quiet, all_runs=True)
        except OutrigError as exc:
            reporter.warn(f"could not stop the runs on sandbox {name} ({exc}); stopping the "
                          "box anyway, their processes may keep running")
    result = stop(name)
    if json:
        reporter.emit_json(result)
    elif not result["stopped"] and not result["was_up"] and state is None:
        reporter.info(f"sandbox {name} is not up: nothing to stop")
    else:
        pids = ", ".join(map(str, result["stopped"])) or "none were still running"
        removed = f"; removed {result['host_file']}" if result["host_file_removed"] else ""
        reporter.success(f"sandbox {name} stopped (pids {pids}){removed}")
