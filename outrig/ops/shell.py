"""``outrig ssh``: the OpenSSH client, pointed where outrig itself connects.

Same hostname, port, user, key and known_hosts file as outrig's own connection (so the first
``ssh`` trusts exactly the key outrig recorded), landing in the host's workdir with its env,
the way ``outrig exec`` runs commands. The remote command is built with :func:`shlex.join`, so
no user value is parsed by the box's shell.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from outrig.errors import ConfigError, OutrigError
from outrig.inventory import Host
from outrig.ops.remote_exec import exec_argv
from outrig.transport import known_hosts_path

INTERACTIVE = ["sh", "-c", 'exec "${SHELL:-/bin/sh}" -i']


def ssh_argv(host: Host, command: list[str], *, tty: bool) -> list[str]:
    """The ``ssh`` argv for ``command`` (an interactive shell when empty) on ``host``."""
    if host.is_local:
        raise ConfigError(f"{host.name} is 'local' (this machine): there is nothing to ssh "
                          f"to; cd {host.workdir} instead, or use outrig exec")
    argv = ["ssh", "-o", f"UserKnownHostsFile={known_hosts_path(host)}",
            "-o", "StrictHostKeyChecking=accept-new"]
    if host.port:
        argv += ["-p", str(host.port)]
    if host.user:
        argv += ["-l", host.user]
    if host.identity_file:
        argv += ["-i", str(Path(host.identity_file).expanduser())]
    if tty:
        argv.append("-t")
    if command:  # its output is the command's alone: no "Connection to ... closed." after
        # it (an INFO line). Not -q: that hides the client's errors too (a refused
        # connection would exit 255 without a word); ERROR keeps them.
        argv += ["-o", "LogLevel=ERROR"]
    remote = exec_argv(host, command or INTERACTIVE)
    return [*argv, "--", host.hostname, shlex.join(remote)]


def open_ssh(host: Host, command: list[str]) -> None:
    """Replace this process with ``ssh`` (its exit status is then the command's)."""
    host.refuse_placeholder()
    argv = ssh_argv(host, command, tty=sys.stdin.isatty() and sys.stdout.isatty())
    client = shutil.which("ssh")
    if client is None:
        raise OutrigError("no ssh client on this machine (outrig itself does not need one); "
                          "install OpenSSH's client (e.g. apt-get install openssh-client)")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(client, argv)
