"""The sandbox tasks: ``demo`` (the whole loop against a local sandbox box), ``sandbox-up``
and ``sandbox-down`` (a sandbox that outlives the command). See docs/sandbox.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from outrig.cli.flags import JSON_HELP, NO_KEEP_HELP, PROJECT_HELP, friendly, make_reporter, number
from outrig.cli.settings import Settings, settings_for
from outrig.cli.taskspec import TaskContext, task


@task(
    auto_shortflags=False,
    help={"keep": "leave the sandbox and the smoke run running after this command (the "
                  "sandbox of sandbox-up) and print how to reach them; sandbox-down stops both",
          "delay": "one-way delay in ms added by a latency proxy in front of the sandbox "
                   "(default 0; 120 gives a 240 ms RTT like a far-away box)",
          "failover": "instead: rent a box from the sandbox provider, let it die under "
                      "watch --spare auto, and see a rented box take the job over and the "
                      "dead one released, with what each cost (docs/providers.md)",
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
          "json": "each step's JSON (deploy events, the status document, log lines, the "
                  "cleanup report) as JSON lines; progress notes go to stderr"},
)
@friendly
def demo(c: TaskContext, keep: bool = False, delay: str | None = None, failover: bool = False,
         project: str | None = None, no_keep: bool = False, json: bool = False) -> None:
    """The whole loop against a local sandbox box: deploy smoke, status, logs, cleanup.

    Starts a real OpenSSH sshd on 127.0.0.1 with throwaway keys and a fake nvidia-smi,
    installing openssh-server with apt-get first if this machine has no sshd. The smoke
    playbook and its trainer ship with outrig, so it runs in any folder.

    Examples:
        outrig demo
        outrig demo --failover
    """
    from outrig.ops.demo import run_demo

    if failover:
        from outrig.ops.demo_failover import run_failover_demo

        run_failover_demo(make_reporter(json))
        return

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
def sandbox_up(c: TaskContext, name: str = "sandbox", delay: str | None = None,
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
          "keep_runs": "leave the box's outrig runs running: the sshd stops, the runs stay "
                       "reachable through the host file (hostname: local) until sandbox-down",
          "crash": "die like a rented box: SIGKILL its sshd and every process of its runs "
                   "at once, no cleanup, and keep its host file (watch sees a dead box; a "
                   "later sandbox-down removes what is left)",
          "project": PROJECT_HELP, "json": JSON_HELP},
)
@friendly
def sandbox_down(c: TaskContext, name: str = "sandbox", keep_runs: bool = False,
                 crash: bool = False, project: str | None = None, json: bool = False) -> None:
    """Stop the sandbox that sandbox-up (or demo --keep) started and remove its host file.

    First stops every outrig run on it (as cleanup --all would), then signals exactly the
    server and sshd processes that sandbox-up recorded (checked by pid and start time, never
    found by name). Harmless when nothing is up. With --keep-runs, runs still running keep
    the box's workdir and stay reachable through the host file, without SSH.

    Example:
        outrig sandbox-down
    """
    from outrig.ops.sandbox import down_lines
    from outrig.ops.sandbox import sandbox_down as stop
    from outrig.sandbox.service import host_argument, read_state

    settings = settings_for(c, project)
    reporter = make_reporter(json)
    if crash:
        _crash(settings, name, reporter, keep_runs=keep_runs, json=json)
        return
    state = read_state(name)
    result = stop(settings.project, name, reporter, keep_runs=keep_runs)
    if json:
        reporter.emit_json(result)
    elif not result["stopped"] and not result["was_up"] and state is None:
        reporter.info(f"sandbox {name} is not up: nothing to stop")
    else:
        host = host_argument(Path(result["host_file"]), settings.project.hosts_dir)
        first, *rest = down_lines(result, host)
        reporter.success(first)
        for line in rest:
            reporter.info(line)


def _crash(settings: Settings, name: str, reporter: Any, *, keep_runs: bool,
           json: bool) -> None:
    """``sandbox-down --crash``: the box dies at once (outrig/sandbox/faults.py)."""
    from outrig.errors import ConfigError
    from outrig.sandbox.faults import crash
    from outrig.sandbox.service import host_argument

    if keep_runs:
        raise ConfigError("--crash kills the box's runs with it; it cannot be given with "
                          "--keep-runs (drop one of them)")
    result = crash(name)
    if json:
        reporter.emit_json(result)
        return
    host = host_argument(Path(str(result["host_file"])), settings.project.hosts_dir)
    killed = ", ".join(map(str, result["killed"])) or "none"
    reporter.success(f"sandbox {name} crashed: sshd and server killed (pids {killed}), "
                     f"runs killed: {', '.join(result['runs']) or 'none'}")
    reporter.info(f"  its host file stays: outrig status --host {host} now fails to connect, "
                  f"as with a dead box; remove what is left: {_down_command(name)}")


@task(
    name="sandbox-hang",
    auto_shortflags=False,
    help={"name": SANDBOX_NAME_HELP,
          "resume": "send SIGCONT instead: the stopped runs carry on",
          "project": PROJECT_HELP, "json": JSON_HELP},
)
@friendly
def sandbox_hang(c: TaskContext, name: str = "sandbox", resume: bool = False,
                 project: str | None = None, json: bool = False) -> None:
    """Hang the runs on a sandbox box: SIGSTOP every process of its outrig runs.

    The box and its sshd keep answering while the job does nothing, as with a trainer stuck
    in a collective or a wedged vLLM engine; watch calls it hung after the playbook's
    confirmations (docs/watch.md). The processes are found from the box's run records (pid,
    group and start time), never by name. --resume sends SIGCONT.

    Examples:
        outrig sandbox-hang
        outrig sandbox-hang --resume
    """
    from outrig.sandbox.faults import hang

    settings_for(c, project)
    reporter = make_reporter(json)
    result = hang(name, resume=resume)
    if json:
        reporter.emit_json(result)
        return
    runs = ", ".join(result["runs"]) or "none (no run of it is running)"
    reporter.success(f"sandbox {name}: " + ("resumed (SIGCONT) " if resume else
                                            "stopped (SIGSTOP) ") + f"runs {runs}")
