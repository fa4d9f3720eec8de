"""``outrig sandbox-down``: stop the sandbox box of ``sandbox-up``, and first its outrig runs.

The box is this machine: its runs are processes here, their records and logs in the box's
workdir under the sandbox's state folder. So ``--keep-runs`` cannot simply skip the cleanup
and then delete that folder, as it once did: the runs would go on with nothing left that names
them (no host file, no workdir, no records), out of reach of every command. Here it keeps
them findable instead: when runs are still running, the sshd stops but the box's folder
stays and its host file is rewritten to reach that workdir without SSH (``hostname: local``),
so ``status``, ``tail-logs`` and ``cleanup --host sandbox`` work on as before, and a later
``sandbox-up`` serves the same box again. A plain ``sandbox-down`` then stops those runs and
removes everything. Refusing ``--keep-runs`` instead would leave the flag no use at all.
"""

from __future__ import annotations

import io
import shlex
from pathlib import Path
from typing import Any

from outrig.console import Reporter
from outrig.errors import OutrigError
from outrig.inventory import HostBook
from outrig.ops.cleanup import cleanup
from outrig.sandbox import service
from outrig.session import Project, host_session


def sandbox_down(project: Project, name: str, reporter: Reporter, *,
                 keep_runs: bool = False) -> dict[str, Any]:
    """Stop sandbox ``name``: its runs first (as ``cleanup --all``), unless ``keep_runs``;
    then exactly the processes ``sandbox-up`` recorded. With ``keep_runs`` and runs still
    running, the box stays reachable for them (module docstring). Returns the service's
    report plus ``kept_runs`` (the run ids left running) and ``stopped_runs`` (those its
    cleanup stopped)."""
    state = service.read_state(name)
    reachable = state is not None and (service.is_up(state) or service.is_kept(state))
    live: list[str] = []
    stopped_runs: list[str] = []
    if state is not None and reachable:
        host = str(state["host_file"])
        quiet = Reporter(quiet=True, out=io.StringIO(), err=io.StringIO())
        book = HostBook(project.hosts_dir)  # the file sandbox-up wrote, read once here
        try:
            if keep_runs:
                live = running_runs(project, host, quiet, book)
            else:
                done = cleanup(project, host, quiet, all_runs=True, book=book)
                stopped_runs = [str(run.get("run_id")) for run in done.get("runs") or []
                                if run.get("run_id")]
        except OutrigError as exc:
            if keep_runs:  # unknown: keep the box rather than delete what may still run
                reporter.warn(f"could not ask sandbox {name} which runs are running ({exc}); "
                              "keeping its workdir and runs")
                live = ["(unknown)"]
            else:
                reporter.warn(f"could not stop the runs on sandbox {name} ({exc}); stopping "
                              "the box anyway, their processes may keep running")
    result = service.sandbox_down(name, keep_box=bool(live))
    return {**result, "kept_runs": live, "stopped_runs": stopped_runs}


def running_runs(project: Project, host: str, reporter: Reporter,
                 book: HostBook) -> list[str]:
    """The ids of the box's current runs with a process still running (one agent call)."""
    with host_session(project, host, reporter, book=book) as session:
        result = session.call("status", stream=False, log_lines=0)
    return [str(run.get("run_id")) for run in result.get("runs") or []
            if any(p.get("state") == "running" for p in run.get("processes") or [])]


def _shown(path: str) -> str:
    """A path as a person typed it: relative to the current folder when it is under it
    (``hosts/sandbox.yaml``), else as it is."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return path


def down_lines(result: dict[str, Any], host: str) -> list[str]:
    """What ``sandbox-down`` says for people: what it stopped and, when it kept runs, where
    they are and how to reach and stop them."""
    name = result["name"]
    named = "" if name == "sandbox" else f" --name {shlex.quote(name)}"
    pids = ", ".join(map(str, result["stopped"])) or "none were still running"
    if result.get("kept"):
        runs = ", ".join(result.get("kept_runs") or [])
        return [f"sandbox {name}: sshd stopped (pids {pids}); its runs keep running: {runs}",
                f"  {result['host_file']} now reaches them on this machine without SSH",
                f"  look: outrig status --host {shlex.quote(host)}",
                f"  stop them and the box: outrig sandbox-down{named}",
                f"  serve the box over SSH again: outrig sandbox-up{named}"]
    removed = f"; removed {_shown(result['host_file'])}" if result["host_file_removed"] else ""
    ended = [str(r) for r in result.get("stopped_runs") or []]
    stopped = f" and its run(s) {', '.join(ended)}" if ended else ""
    return [f"sandbox {name} stopped (pids {pids}){stopped}{removed}"]
