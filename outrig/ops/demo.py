"""``inv demo``: the whole loop against a sandbox box on this machine.

A real OpenSSH ``sshd`` on 127.0.0.1 with throwaway keys stands in for the rented box (so the
demo exercises exactly the code path a real box does: Fabric, host-key recording, the agent
over one exec). A fake ``nvidia-smi`` on its PATH reports GPUs. When this machine has no sshd,
the demo installs Debian/Ubuntu's ``openssh-server`` with apt-get (as root) rather than falling
back to an embedded SSH server: a Python SSH server would test a different server than the
one every real box runs (docs/sandbox.md).

The job is outrig's own smoke playbook, shipped with it (``outrig/_box/examples/``: in this
checkout remote/examples/, whose smoke.yaml links to playbooks/smoke.yaml), so the demo works
from a wheel in any folder: the project is only where ``demo --keep`` writes its host file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from outrig.agent_code import examples_dir
from outrig.console import Reporter
from outrig.errors import OutrigError
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup
from outrig.ops.deploy import deploy
from outrig.ops.logs import logs
from outrig.ops.status import status
from outrig.session import Project


def ensure_sshd(reporter: Reporter) -> str:
    """Path of sshd; install openssh-server with apt-get when missing and allowed."""
    from outrig.sandbox.box import SandboxError, find_sshd

    try:
        return find_sshd()
    except SandboxError:
        if shutil.which("apt-get") is None or os.geteuid() != 0:
            raise
    reporter.info("• no sshd on this machine: installing openssh-server with apt-get "
                  "(once; needs the package mirror)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "openssh-server"]):
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
            raise OutrigError(
                f"could not install openssh-server ({' '.join(argv)} exited "
                f"{proc.returncode}):\n{tail}\nInstall it by hand (apt-get install -y "
                "openssh-server) and run `outrig demo` again."
            )
    return find_sshd()


DEMO_PLAYBOOK = "smoke"
DEMO_TRAINER = "train_tiny.py"


def demo_playbook(root: Path) -> Path:
    """Lay the shipped smoke playbook and its trainer out under ``root`` the way a project
    holds them (``playbooks/smoke.yaml``, ``remote/examples/train_tiny.py``, the path its
    ``files:`` names) and return the playbook's path, which deploy takes as it is."""
    shipped = examples_dir()
    playbook = root / "playbooks" / f"{DEMO_PLAYBOOK}.yaml"
    trainer = root / "remote" / "examples" / DEMO_TRAINER
    for source, target in ((shipped / f"{DEMO_PLAYBOOK}.yaml", playbook),
                           (shipped / DEMO_TRAINER, trainer)):
        if not source.is_file():
            raise OutrigError(f"this outrig install lacks {source}, which `outrig demo` "
                              "deploys; reinstall outrig (pip install --force-reinstall)")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return playbook


def run_demo(project: Project, reporter: Reporter, *, keep: bool = False,
             one_way_delay: float = 0.0, steps_wait: float = 3.0) -> None:
    """Deploy smoke to a sandbox, show status and logs, clean up. With ``keep`` the sandbox
    is the detached one of ``outrig sandbox-up`` (it outlives this command) and the run is
    left running; ``outrig sandbox-down`` stops both."""
    from outrig.sandbox.box import start_sandbox
    from outrig.sandbox.proxy import LatencyProxy

    ensure_sshd(reporter)
    if keep:
        _kept_demo(project, reporter, one_way_delay, steps_wait)
        return
    root = Path(tempfile.mkdtemp(prefix="outrig-demo-"))
    journal = Journal()
    proxy: LatencyProxy | None = None
    box = None
    try:
        reporter.info(f"• starting the sandbox box in {root}")
        box = start_sandbox(root, name="sandbox")
        port = box.port
        if one_way_delay > 0:
            proxy = LatencyProxy(box.host, box.port, one_way_delay=one_way_delay)
            proxy.start()
            port = proxy.port
            reporter.info(f"• latency proxy on port {port}: RTT {2 * one_way_delay * 1000:.0f} ms")
        host_file = box.write_host_file(root / "sandbox.yaml", port=port)
        reporter.info(f"• sandbox sshd on 127.0.0.1:{box.port}, host file {host_file}")
        playbook = demo_playbook(root / "job")
        # no "Next: outrig status --host <its host file>": that file goes with the box below
        _loop(project, str(host_file), playbook, reporter, journal, steps_wait, hint=False)
        cleanup(project, str(host_file), reporter, playbook=DEMO_PLAYBOOK, journal=journal)
    finally:
        if proxy is not None:
            proxy.close()
        if box is not None:
            box.stop()
        shutil.rmtree(root, ignore_errors=True)
    reporter.info(CLOSING)


CLOSING = ("demo done: its run is stopped and its sandbox box removed. To try the commands "
           "yourself on a box that stays up: outrig demo --keep (or outrig sandbox-up), then "
           "outrig status --host sandbox; outrig sandbox-down stops it.")


def _loop(project: Project, host: str, playbook: Path, reporter: Reporter, journal: Journal,
          steps_wait: float, hint: bool = True) -> None:
    from outrig.sandbox.box import free_port

    # a port free now, not the playbook's 8765: another server of this machine may hold that
    deploy(project, host, str(playbook), reporter, journal=journal,
           params={"port": free_port()}, hint=hint)
    time.sleep(steps_wait)  # let the trainer print a few metric lines and save an epoch
    status(project, host, reporter, playbook=DEMO_PLAYBOOK, journal=journal)
    logs(project, host, reporter, playbook=DEMO_PLAYBOOK, lines=8, journal=journal)


def _kept_demo(project: Project, reporter: Reporter, one_way_delay: float,
               steps_wait: float) -> None:
    """The demo on the sandbox of ``sandbox-up`` (started here, or already up), leaving it
    and the smoke run running, and saying how to reach and stop them."""
    from outrig.sandbox.service import describe_up, host_argument, sandbox_root, sandbox_up

    state = sandbox_up("sandbox", project.hosts_dir / "sandbox.yaml",
                       one_way_delay=one_way_delay)
    host = host_argument(Path(state["host_file"]), project.hosts_dir)
    for line in describe_up(state, host, down="outrig sandbox-down"):
        reporter.info(line)
    # beside the sandbox's own state: it goes when sandbox-down removes the sandbox
    playbook = demo_playbook(sandbox_root("sandbox") / "job")
    _loop(project, host, playbook, reporter, Journal(), steps_wait)
    reporter.info(f"kept: the sandbox and the smoke run on it keep running. Look: outrig "
                  f"status --host {host}; stop both: outrig sandbox-down")
