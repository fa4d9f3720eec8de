#!/usr/bin/env python3
"""Warm-connection benchmark: what a second command costs, cold vs warm, over a slow link.

Starts the sandbox box (a real OpenSSH sshd on 127.0.0.1) behind a latency proxy (one-way
delay = RTT / 2) and times, through the proxy, in seconds and RTT multiples:

- ``status`` in process (``outrig.ops.status.status``, no Python start-up): cold (a
  direct connection, ``OUTRIG_KEEP_SECONDS=0``), the first command with keeping on (it starts
  the keeper, which connects), and a second command through the keeper; ``status`` on
  ``hostname: local`` (the agent's own time, no link at all);
- the same through the ``outrig`` CLI as a subprocess (``--no-keep``, first, second), with
  the CLI's own start-up measured apart (``outrig status`` with an unknown host: the same
  imports, exit 2, no network) and subtracted in the "net" columns;
- OpenSSH ``ssh box true``: ``-o ControlMaster=no``, and with ``ControlMaster=auto`` /
  ``ControlPersist``, first and second command; the client's start-up (``ssh -G``: reads
  its options, no network) is measured apart and subtracted in the "net" columns;
- ``outrig deploy --no-wait`` of playbooks/smoke.yaml, ``--no-keep`` and warm on the keeper's
  live agent (each deploy replaces the last one's run; the last is cleaned up);
- what goes wrong around a keeper, through the CLI: the keeper killed (SIGKILL, by the pid
  it recorded) then a command, and the command after it; the link cut under the keeper
  (the proxy resets every connection) then a command; two commands started at the same
  time sharing one keeper (CLI, and two threads in process).

Every round is run twice, alternately: at the RTT, and with the proxy's delay at 0 (the same
commands, the same machine, no link time). The "link RTT" column is the difference over the
RTT: the round trips a command waits for on the link, with the CPU's share (start-ups, the
box's own time, and what a loaded machine adds to them) taken out. The "net RTT" column
subtracts only the measured start-up. On a shared machine the wall-clock columns move with its
load; the link column much less.

The proxy counts TCP connections per command: a warm command must open none, a command after
a killed keeper or a cut link one (the fresh keeper's). Everything is stopped at the end
(keepers by their recorded pid, the ControlMaster by ``ssh -O exit``). The machine's load
average is printed before and after: the figures are only comparable within one run.

Usage:  python bench/warm_rtt.py [--rtt-ms 240] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUTRIG = [sys.executable, "-c",
          "import sys; from outrig.cli import program; program.run(['outrig', *sys.argv[1:]])"]
TARGET = 2.5  # RTT: a warm second status, net of the CLI's start-up (issue 15)


def timed(argv: list[str], env: dict[str, str] | None = None, expect: int = 0) -> float:
    """Wall time of one subprocess; a wrong exit status stops the bench with its stderr."""
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env=env, cwd=REPO)
    seconds = time.monotonic() - started
    if done.returncode != expect:
        raise SystemExit(f"{argv[:4]} failed ({done.returncode}):\n{done.stderr}")
    return seconds


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class Row:
    """One measured line: its samples, the TCP connections each opened, and which start-up
    (``outrig`` CLI, ``ssh`` client, or none) the net columns subtract."""

    name: str
    startup: str = ""
    seconds: list[float] = field(default_factory=list)
    opened: list[int] = field(default_factory=list)


class Table:
    """Rows in the order first measured."""

    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}

    def add(self, name: str, seconds: float, opened: int | None = None,
            startup: str = "") -> None:
        row = self.rows.setdefault(name, Row(name, startup))
        row.seconds.append(seconds)
        if opened is not None:
            row.opened.append(opened)

    def value(self, name: str) -> float:
        return median(self.rows[name].seconds) if name in self.rows else float("nan")


LINK_ROWS = {"two at once through one keeper, each, in process",
             "outrig status, two at once through one keeper, each"}
STARTUP_ROWS = {"outrig": "outrig CLI start-up alone (status --host no-such-host: exit 2, "
                          "no network)",
                "ssh": "ssh client start-up alone (ssh -G: options only, no network)"}


def report(table: Table, bare: Table, rtt: float, repeat: int,
           loads: list[tuple[float, float, float]]) -> None:
    """The table: seconds and RTT at ``rtt``, net of start-up (where one applies), the same
    command with no delay, the link's share in RTT, connections per command."""
    print(f"RTT {rtt * 1000:.0f} ms, median of {repeat}; {os.cpu_count()} CPUs; load "
          f"average (1, 5, 15 min) before {loads[0][0]:.2f} {loads[0][1]:.2f} "
          f"{loads[0][2]:.2f}, after {loads[1][0]:.2f} {loads[1][1]:.2f} {loads[1][2]:.2f}")
    width = max(len(name) for name in table.rows)
    print(f"{'what':<{width}} {'seconds':>8} {'RTT':>6} {'net RTT':>8} {'0 ms s':>7} "
          f"{'link RTT':>9} {'TCP/cmd':>8}")
    for row in table.rows.values():
        seconds = median(row.seconds)
        net = f"{(seconds - table.value(STARTUP_ROWS[row.startup])) / rtt:>8.1f}" \
            if row.startup else f"{'':>8}"
        zero = bare.value(row.name)
        link = f"{zero:>7.3f} {(seconds - zero) / rtt:>9.1f}" if row.opened or \
            row.name in LINK_ROWS else f"{zero:>7.3f} {'':>9}"
        opened = f"{sum(row.opened) / len(row.opened):>8.1f}" if row.opened else f"{'':>8}"
        print(f"{row.name:<{width}} {seconds:>8.3f} {seconds / rtt:>6.1f} {net} {link} "
              f"{opened}")


SMOKE = REPO / "playbooks" / "smoke.yaml"


def verdict(table: Table, bare: Table, rtt: float) -> None:
    """The issue's two targets, from this run's rows."""
    name = "outrig status, second (through the keeper)"
    startup = table.value(STARTUP_ROWS["outrig"])
    warm = table.value(name) - startup
    print(f"warm second status, net of CLI start-up: {warm:.3f} s = {warm / rtt:.2f} RTT "
          f"(target <= {TARGET} RTT): {'met' if warm / rtt <= TARGET else 'NOT met'}")
    link = (table.value(name) - bare.value(name)) / rtt
    print(f"warm second status, the link's share (its time minus the same at 0 ms): "
          f"{link:.2f} RTT")
    live = "outrig status, warm (on the keeper's live agent)"
    control = "ssh box true, ControlMaster=auto, second (through the master)"
    ratio = table.value(live) / table.value(control)
    print(f"warm status on the live agent {table.value(live):.3f} s vs ssh -o ControlMaster "
          f"true {table.value(control):.3f} s: {ratio:.2f}x (target <= 1): "
          f"{'met' if ratio <= 1 else 'NOT met'}; net of CLI start-up "
          f"{(table.value(live) - startup) / rtt:.2f} RTT, the link's share "
          f"{(table.value(live) - bare.value(live)) / rtt:.2f} RTT")
    deploy = "outrig deploy --no-wait, warm (on the keeper's live agent)"
    share = (table.value(deploy) - bare.value(deploy)) / rtt
    print(f"warm deploy --no-wait on the live agent: net of CLI start-up "
          f"{(table.value(deploy) - startup) / rtt:.2f} RTT, the link's share "
          f"{share:.2f} RTT (target <= 1.5 RTT beyond start, by the link's share: "
          f"{'met' if share <= 1.5 else 'NOT met'})")
    cold_keep = table.value("outrig status, first (forks the keeper, which connects)")
    cold_direct = table.value("outrig status --no-keep (plain connector)")
    print(f"cold status with keeping {cold_keep:.3f} s vs --no-keep {cold_direct:.3f} s: "
          f"{(cold_keep - cold_direct) / rtt:+.2f} RTT")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtt-ms", type=float, default=240.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rtt = args.rtt_ms / 1000.0
    loads = [os.getloadavg()]

    root = Path(tempfile.mkdtemp(prefix="outrig-warm-"))
    os.environ["XDG_STATE_HOME"] = str(root / "state")
    os.environ["OUTRIG_RUNTIME_DIR"] = str(root / "run")

    from outrig.connectors.keeper.client import close_keepers, keepers, wait_gone
    from outrig.console import Reporter
    from outrig.journal import Journal
    from outrig.ops.status import status
    from outrig.sandbox.box import start_sandbox
    from outrig.sandbox.proxy import LatencyProxy
    from outrig.session import Project

    project = Project(REPO)
    journal = Journal(root / "state" / "outrig")
    box = start_sandbox(root / "box", name="bench")
    proxy = LatencyProxy(box.host, box.port, one_way_delay=rtt / 2).start()
    host_file = box.write_host_file(root / "bench.yaml", port=proxy.port)
    ssh_opts = ["-F", "/dev/null", "-p", str(proxy.port), "-i", str(box.identity_file),
                "-o", f"UserKnownHostsFile={box.known_hosts}",
                "-o", "StrictHostKeyChecking=accept-new", "-o", "BatchMode=yes",
                "-o", "LogLevel=ERROR"]
    target = f"{box.user}@{box.host}"
    plain = ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
    control = ["-o", "ControlMaster=auto", "-o", f"ControlPath={root}/cm-%C",
               "-o", "ControlPersist=600"]
    local_file = root / "local.yaml"
    local_file.write_text(f"hostname: local\nworkdir: {box.workdir}\n")
    env = {**os.environ, "OUTRIG_KEEP_SECONDS": "600"}
    status_cmd = [*OUTRIG, "status", "--host", str(host_file), "--json"]
    deploy_cmd = [*OUTRIG, "deploy", "--host", str(host_file), "--playbook", str(SMOKE),
                  "--no-wait", "--json"]
    tables = {"delayed": Table(), "bare": Table()}

    def counted(run: Callable[[], float]) -> tuple[float, int]:
        """Seconds of ``run`` and the TCP connections the proxy accepted meanwhile."""
        before = proxy.accepted
        seconds = run()
        return seconds, proxy.accepted - before

    def in_process(keep: str, host: Path = host_file) -> float:
        os.environ["OUTRIG_KEEP_SECONDS"] = keep
        started = time.monotonic()
        status(project, str(host), Reporter(quiet=True, out=io.StringIO(), err=io.StringIO()),
               journal=journal)
        return time.monotonic() - started

    def cli(*extra: str) -> float:
        return timed([*status_cmd, *extra], env)

    def close_all() -> None:
        for entry in close_keepers():
            wait_gone(int(entry["pid"]), 10.0)

    def the_keeper_pid() -> int:
        """The pid the one live keeper recorded (confirmed as the socket's listener)."""
        listed = keepers()
        if len(listed) != 1:
            raise SystemExit(f"expected one live keeper, found {listed}")
        return int(listed[0]["pid"])

    def live_ready() -> None:
        """Wait until the one keeper's live agent serves calls (it starts after the first
        call on the exec path; connectors/keeper/live.py)."""
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            listed = keepers()
            live = listed[0].get("live") if len(listed) == 1 else None
            if isinstance(live, dict) and live.get("state") == "ready":
                return
            if isinstance(live, dict) and live.get("state") == "failed":
                raise SystemExit(f"the live agent failed to start: {live.get('why')}")
            time.sleep(0.05)
        raise SystemExit(f"the live agent did not become ready: {keepers()}")

    def at_once(run: Callable[[], float]) -> tuple[list[float], float, int]:
        """Two runs started together: each one's seconds, the span, connections opened."""
        took: list[float] = []
        gate = threading.Barrier(2)

        def one() -> None:
            gate.wait(30)
            took.append(run())

        before = proxy.accepted
        started = time.monotonic()
        threads = [threading.Thread(target=one) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        span = time.monotonic() - started
        if len(took) != 2:
            raise SystemExit("one of the two commands sharing the keeper failed")
        return took, span, proxy.accepted - before

    def round_once(table: Table) -> None:
        table.add("status, direct (--no-keep), in process", *counted(lambda: in_process("0")))
        close_all()
        table.add("status, first with keeping (starts the keeper as a new interpreter), "
                  "in process", *counted(lambda: in_process("600")))
        table.add("status, second, through the keeper, in process",
                  *counted(lambda: in_process("600")))
        live_ready()
        table.add("status, warm, on the keeper's live agent, in process",
                  *counted(lambda: in_process("600")))
        took, span, opened = at_once(lambda: in_process("600"))
        for seconds in took:
            table.add("two at once through one keeper, each, in process", seconds)
        table.add("two at once through one keeper, both done, in process", span, opened)
        table.add("status on hostname: local (the agent's own time, no link), in process",
                  in_process("0", local_file))
        close_all()

        table.add(STARTUP_ROWS["outrig"],
                  timed([*OUTRIG, "status", "--host", "no-such-host"], env, expect=2))
        table.add("outrig status on hostname: local (CLI, no link)",
                  timed([*OUTRIG, "status", "--host", str(local_file), "--json"], env),
                  startup="outrig")
        table.add("outrig status --no-keep (plain connector)",
                  *counted(lambda: cli("--no-keep")), startup="outrig")
        table.add("outrig status, first (forks the keeper, which connects)",
                  *counted(cli), startup="outrig")
        table.add("outrig status, second (through the keeper)", *counted(cli),
                  startup="outrig")
        live_ready()
        table.add("outrig status, warm (on the keeper's live agent)", *counted(cli),
                  startup="outrig")
        table.add("outrig deploy --no-wait --no-keep (plain connector)",
                  *counted(lambda: timed([*deploy_cmd, "--no-keep"], env)), startup="outrig")
        live_ready()
        table.add("outrig deploy --no-wait, warm (on the keeper's live agent)",
                  *counted(lambda: timed(deploy_cmd, env)), startup="outrig")
        timed([*OUTRIG, "cleanup", "--host", str(host_file), "--playbook", str(SMOKE)], env)
        took, span, opened = at_once(cli)
        for seconds in took:
            table.add("outrig status, two at once through one keeper, each", seconds,
                      startup="outrig")
        table.add("outrig status, two at once through one keeper, both done", span, opened,
                  startup="outrig")
        pid = the_keeper_pid()
        os.kill(pid, signal.SIGKILL)
        if not wait_gone(pid, 10.0):
            raise SystemExit(f"the keeper {pid} outlived SIGKILL")
        table.add("outrig status after the keeper was killed (SIGKILL, recorded pid)",
                  *counted(cli), startup="outrig")
        table.add("outrig status, the next one after the kill (through the fresh keeper)",
                  *counted(cli),
                  startup="outrig")
        pid = the_keeper_pid()
        if proxy.cut_all() < 1:
            raise SystemExit("the proxy had no connection to cut under the keeper")
        table.add("outrig status after the link was cut under the keeper", *counted(cli),
                  startup="outrig")
        if not wait_gone(pid, 10.0):
            raise SystemExit(f"the keeper {pid} outlived its cut link")
        table.add("outrig status, the next one after the cut (through the fresh keeper)",
                  *counted(cli),
                  startup="outrig")
        close_all()

        table.add(STARTUP_ROWS["ssh"], timed(["ssh", *ssh_opts, *plain, "-G", target]))
        table.add("ssh box true, -o ControlMaster=no",
                  *counted(lambda: timed(["ssh", *ssh_opts, *plain, target, "true"])),
                  startup="ssh")
        table.add("ssh box true, ControlMaster=auto, first (starts the master)",
                  *counted(lambda: timed(["ssh", *ssh_opts, *control, target, "true"])),
                  startup="ssh")
        table.add("ssh box true, ControlMaster=auto, second (through the master)",
                  *counted(lambda: timed(["ssh", *ssh_opts, *control, target, "true"])),
                  startup="ssh")
        subprocess.run(["ssh", *ssh_opts, *control, "-O", "exit", target],
                       capture_output=True, stdin=subprocess.DEVNULL)

    try:
        in_process("0")  # warm-up: host key recorded, agent unpacked, RTT in the journal
        timed([*status_cmd, "--no-keep"], env)  # warm-up: the CLI's bundle cache
        for number in range(2 * args.repeat):  # alternately at RTT and with no delay
            delayed = number % 2 == 0
            proxy.set_delay(rtt / 2 if delayed else 0.0)
            round_once(tables["delayed" if delayed else "bare"])
    finally:
        close_all()
        proxy.close()
        box.stop()
        shutil.rmtree(root, ignore_errors=True)

    loads.append(os.getloadavg())
    report(tables["delayed"], tables["bare"], rtt, args.repeat, loads)
    verdict(tables["delayed"], tables["bare"], rtt)
    if args.json:
        print(json.dumps({"rtt_ms": args.rtt_ms, "load": loads,
                          "rows": {r.name: {"seconds": r.seconds, "opened": r.opened,
                                            "startup": r.startup,
                                            "seconds_at_0_ms": tables["bare"].rows[r.name].seconds}
                                   for r in tables["delayed"].rows.values()}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
