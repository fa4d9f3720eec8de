"""The tasks on a box: ``check`` it, set up its environments (``provision``) and data
(``stage``), run a command or a shell on it (``exec``, ``ssh``), reach a port on it
(``forward``), and list or close the warm connections to boxes (``connections``).

Each task parses its flags, resolves the box (or, where several are allowed, the sweep) into
a :class:`~outrig.cli.targets.Target`, and makes one call into ``outrig.ops``. The ops, the
targets, the sweeps, the console and the inventory are imported inside each task, purely for
start-up: ``outrig --version``, ``--list`` and ``--help`` load none of them. (``stage``'s
help says the default of :data:`outrig.transfer.STREAMS` in words; a test keeps the two
equal.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from outrig.cli.flags import (
    DEADLINE_HELP,
    FANOUT_JSON,
    HOST_HELP,
    HOSTS_HELP,
    JSON_HELP,
    LONG_DEADLINE_HELP,
    MAX_PARALLEL_HELP,
    NO_KEEP_HELP,
    PROJECT_HELP,
    exit_with,
    friendly,
    make_reporter,
    number,
)
from outrig.cli.launcher import remainder_argv
from outrig.cli.settings import playbook_for, settings_for
from outrig.cli.taskspec import TaskContext, task
from outrig.errors import ConfigError

if TYPE_CHECKING:
    from outrig.inventory import Host


@task(auto_shortflags=False, iterable=["host"],
      help={"host": HOSTS_HELP, "max_parallel": MAX_PARALLEL_HELP, "deadline": DEADLINE_HELP,
            "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
            "json": JSON_HELP + "; with several hosts one line per host {host, ok, state, "
                    "seconds, error, result}"})
@friendly
def check(c: TaskContext, host: list[str] | None = None, max_parallel: str | None = None,
          deadline: str | None = None, project: str | None = None, no_keep: bool = False,
          json: bool = False) -> None:
    """Preflight: reach the box, measure RTT, check python3, GPUs, workdir and disk.

    Each GPU's health is judged from nvidia-smi's ECC, row remapping, clock, P-state and
    PCIe fields and the kernel log's Xid lines: ok, warn (slower or at risk), bad (deploy
    refuses it) or unknown (not reported), with the field and the fix for each GPU that is
    not ok (docs/gpu-health.md).

    Example:
        outrig check --host uk-node
        outrig check --host sweep --json
    """
    from outrig.cli.sweep import check_hosts
    from outrig.cli.targets import select
    from outrig.ops.check import check as run_check

    settings = settings_for(c, project, no_keep=no_keep)
    reporter = make_reporter(json)
    target = select(settings, reporter, host, max_parallel=max_parallel, deadline=deadline)
    target.run(host=lambda one: run_check(one.project, one.spec, reporter, book=one.book),
               sweep=check_hosts)


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
def provision(c: TaskContext, host: list[str] | None = None, playbook: str | None = None,
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
    from outrig.cli.sweep import provision_hosts
    from outrig.cli.targets import select
    from outrig.ops.provision import provision as run_provision

    settings = settings_for(c, project, no_keep=no_keep)
    reporter = make_reporter(json)
    target = select(settings, reporter, host, max_parallel=max_parallel, deadline=deadline)
    name = settings.value("playbook", playbook)[0]
    target.run(
        host=lambda one: run_provision(one.project, one.spec, reporter, playbook=name,
                                       dry_run=dry_run, book=one.book),
        sweep=lambda sweep: provision_hosts(sweep, name, dry_run=dry_run))


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
          "streams": "parallel streams for copies through the workstation (default 4)",
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
          "json": JSON_HELP + "; with several hosts one line per host " + FANOUT_JSON},
)
@friendly
def stage_(c: TaskContext, host: list[str] | None = None, playbook: str | None = None,
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
    from outrig.cli.sweep import stage_hosts
    from outrig.cli.targets import select
    from outrig.ops.stage import stage
    from outrig.transfer import STREAMS

    count = int(number(streams, "streams", STREAMS))
    reporter = make_reporter(json)
    settings = settings_for(c, project, no_keep=no_keep)
    target = select(settings, reporter, host, max_parallel=max_parallel, deadline=deadline)
    name = playbook_for(settings, playbook, None, reporter, what="stage")
    target.run(
        host=lambda one: stage(one.project, one.spec, name, reporter, from_host=from_,
                               resume=resume, streams=count, book=one.book),
        sweep=lambda sweep: stage_hosts(sweep, name, from_=from_, resume=resume,
                                        streams=count))


@task(name="exec", auto_shortflags=False,
      help={"host": HOST_HELP, "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
            "json": "capture the output and print one JSON object {host, command, exit_code, "
                    "stdout, stderr} when the command ends (the exit status stays the "
                    "command's)"})
@friendly
def exec_(c: TaskContext, host: str | None = None, project: str | None = None,
          no_keep: bool = False, json: bool = False) -> None:
    """Run one command on the box, in the host's workdir with its env; output streams here.

    Everything after -- is the command, passed as words (no shell on the box parses it;
    for pipes say so: -- sh -c 'a | b'). The exit status is the command's own (255 when the
    box gave none). stdin is not forwarded.

    Examples:
        outrig exec --host uk-node -- nvidia-smi
        outrig exec -- ls -la runs
    """
    from outrig.cli.targets import one_host
    from outrig.console import Reporter
    from outrig.ops.remote_exec import run_exec

    command = remainder_argv()
    settings = settings_for(c, project, no_keep=no_keep)
    one = one_host(settings, make_reporter(json), host)
    host_spec = one.spec
    if not json:
        code = run_exec(settings.project, one.host, command)
    else:
        import io

        out, err = io.BytesIO(), io.BytesIO()
        code = run_exec(settings.project, one.host, command, out=out, err=err)
        Reporter(json_mode=True).emit_json({
            "host": host_spec, "command": command, "exit_code": code,
            "stdout": out.getvalue().decode("utf-8", "replace"),
            "stderr": err.getvalue().decode("utf-8", "replace")})
    if code:
        raise exit_with(code)


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
def forward(c: TaskContext, host: str | None = None, process: str | None = None,
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
    from outrig.cli.targets import one_host
    from outrig.ops.forward import forward as run_forward

    remote = None if remote_port is None else int(number(remote_port, "remote-port", 8000))
    local = None if local_port is None else int(number(local_port, "local-port", 8000))
    settings = settings_for(c, project, no_keep=no_keep)
    reporter = make_reporter(json)
    one = one_host(settings, reporter, host, playbook)
    run_forward(settings.project, one.host, reporter, process=process, run_id=run,
                playbook=one.playbook_name, remote_port=remote, local_port=local)


@task(auto_shortflags=False,
      help={"host": HOST_HELP, "project": PROJECT_HELP,
            "json": "print the resolved ssh command as JSON {host, client, argv} and run "
                    "nothing"})
@friendly
def ssh(c: TaskContext, host: str | None = None, project: str | None = None,
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
    from outrig.cli.targets import one_host
    from outrig.ops.shell import open_ssh

    settings = settings_for(c, project)
    one = one_host(settings, make_reporter(json), host)
    if json:
        _print_ssh_argv(one.spec, one.host, remainder_argv())
        return
    open_ssh(one.host, remainder_argv())


def _print_ssh_argv(host_spec: str, resolved: Host, command: list[str]) -> None:
    """``ssh --json``: what ``ssh`` would run (for scripts, or to see the key and port used);
    the terminal flag is left out, as there is no terminal to give the box then."""
    import shutil

    from outrig.console import Reporter
    from outrig.ops.shell import ssh_argv

    Reporter(json_mode=True).emit_json({
        "host": host_spec, "client": shutil.which("ssh"),
        "argv": ssh_argv(resolved, command, tty=False)})


@task(auto_shortflags=False,
      help={"close": "stop the warm connections (all, or --host's)",
            "host": "with --close: only this host's (its host-file name or address)",
            "json": "print the list as JSON {connections: [...]}"})
@friendly
def connections(c: TaskContext, close: bool = False, host: str | None = None,
                json: bool = False) -> None:
    """List the warm connections this user's commands left open, or close them.

    Each is a keeper process holding one box's SSH connection; it exits by itself after
    keep_seconds idle (10 minutes by default). --close stops them by the pid recorded.

    Examples:
        outrig connections
        outrig connections --close --host uk-node
    """
    from outrig.connectors.keeper.connections import (
        close_keepers,
        keepers,
        older_keepers,
        wait_closed,
    )

    if host and not close:
        raise ConfigError("--host goes with --close (outrig connections lists every host). "
                          "Nothing was closed.")
    reporter = make_reporter(json)
    if close:
        closed = close_keepers(host)
        gone = [e for e in closed if wait_closed(e, 10.0)]
        if json:
            reporter.emit_json({"closed": closed})
            return
        for entry in closed:
            state = "closed" if entry in gone else "asked to close"
            print(f"{state} {entry['host']} ({entry['name']}), pid {entry['pid']}")
        if not closed:
            print("no warm connection" + (f" to {host}" if host else "") + " was open")
        return
    found, older = keepers(), older_keepers()
    if json:
        reporter.emit_json({"connections": found, **({"older": older} if older else {})})
        return
    from outrig.text.layout import wrapped
    from outrig.text.terminal import terminal_width

    width = terminal_width()
    if found:
        print("\n".join(connection_lines(found, width)))
    elif not older:
        print("no warm connections")
    for entry in older:
        print("\n".join(wrapped(
            f"an older outrig's warm connection to {entry['host']} ({entry['name']}), pid "
            f"{entry['pid']}: left alone (it closes itself when idle; `outrig connections "
            "--close` stops it)", width, "", "  ")))


def connection_lines(found: list[dict[str, Any]], width: int) -> list[str]:
    """The table of ``outrig connections`` in ``width`` columns: name, address, keeper pid,
    age and idle time left in a row, the live agent's state at the row's end when every row
    has room for it, else wrapped under each row."""
    from outrig.text.layout import columns, wrapped

    rows = [[str(e["name"]), str(e["host"]), str(e["pid"]), f"{e['age']:.0f}s",
             f"{e['idle_left']:.0f}s"] for e in found]
    live = [live_words(e) for e in found]
    header, lines = columns(["NAME", "HOST", "PID", "AGE", "IDLE LEFT"], rows, indent="")
    row_width = max(len(header), *(len(line) for line in lines))
    if all(row_width + 2 + len(words) <= width for words in [*live, "LIVE AGENT"]):
        return [f"{header:<{row_width}}  LIVE AGENT",
                *(f"{line:<{row_width}}  {words}" for line, words in zip(lines, live,
                                                                           strict=True))]
    out = [header]
    for line, words in zip(lines, live, strict=True):
        out += [line, *wrapped(f"live agent: {words}", width, "    ", "      ")]
    return out


def live_words(entry: dict[str, Any]) -> str:
    """The LIVE AGENT column of ``outrig connections``: whether the box's resident agent
    serves this connection's calls, and if not, why they take the exec path."""
    live = entry.get("live")
    if not isinstance(live, dict):
        return "none yet (starts with the first agent call)"
    state, why = live.get("state"), live.get("why") or ""
    if state == "ready":
        return f"ready, box pid {live.get('pid')}, {live.get('served', 0)} calls served"
    if state == "starting":
        return "starting"
    if state == "failed":
        return f"off: {why} (calls take the exec path)"
    return f"ended: {why} (the next call starts a fresh one)"
