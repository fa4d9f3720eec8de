"""``outrig exec``: one command on the box, in the host's workdir with the host's env.

The command travels as an argv list: the host's python runs a fixed script (no user value in
it) that applies the host's env, enters the workdir and ``execvp``s the command's words, all
passed as arguments, so nothing the user typed is ever parsed by a shell on the box. Output
streams as it comes and the command's exit status becomes ours.
"""

from __future__ import annotations

import json
import sys
from typing import IO

from outrig.errors import ConfigError, ConnectError
from outrig.inventory import Host
from outrig.journal import private_state_dir
from outrig.session import Project
from outrig.transport import AgentChannel, transport_for

# argv[1] is the workdir, argv[2] the host's env as JSON, the rest the command. The env is
# applied as the agent applies it (in order, $VARS expanded, so PATH: /x:$PATH works).
EXEC_SCRIPT = "\n".join([
    "import json,os,sys",
    "for k,v in json.loads(sys.argv[2]):",
    " os.environ[k]=os.path.expandvars(v)",
    "d=os.path.expanduser(sys.argv[1])",
    "try:",
    " os.chdir(d)",
    "except OSError as e:",
    " sys.exit('outrig exec: cannot enter the workdir %s on the box (%s); run outrig check "
    "or a deploy first, or fix workdir: in the host file'%(d,e.strerror))",
    "try:",
    " os.execvp(sys.argv[3],sys.argv[3:])",
    "except OSError as e:",
    " sys.stderr.write('outrig exec: cannot run %r on the box: %s\\n'%(sys.argv[3],e.strerror))",
    " sys.exit(127 if isinstance(e,FileNotFoundError) else 126)",
])
EXIT_NO_STATUS = 255  # like ssh: the channel closed without an exit status


def exec_argv(host: Host, command: list[str]) -> list[str]:
    """The argv run on the box for ``command`` (see :data:`EXEC_SCRIPT`)."""
    if not command:
        raise ConfigError("exec needs a command after --, e.g. outrig exec --host NAME -- "
                          "nvidia-smi; nothing was run")
    env = json.dumps(list(host.env.items()))
    return [host.python, "-S", "-c", EXEC_SCRIPT, host.workdir, env, *command]


def _pump(channel: AgentChannel, out: IO[bytes], err: IO[bytes]) -> None:
    """Copy stdout and stderr as they arrive, until the command closes its stdout."""
    sent_err = 0
    while True:
        chunk = channel.read(0.2)
        errors = channel.stderr_so_far()
        if len(errors) > sent_err:
            err.write(errors[sent_err:])
            err.flush()
            sent_err = len(errors)
        if chunk == b"":
            break
        if chunk:
            out.write(chunk)
            out.flush()
    rest = channel.stderr_text().encode("utf-8", "replace")
    if len(rest) > sent_err:  # what came after stdout closed
        err.write(rest[sent_err:])
        err.flush()


def run_exec(project: Project, host: Host, command: list[str], *,
             out: IO[bytes] | None = None, err: IO[bytes] | None = None) -> int:
    """Run ``command`` on ``host`` (resolved by the caller: :meth:`outrig.cli.targets.Target.
    resolve`); return its exit status (255 when the box gave none)."""
    argv = exec_argv(host, command)
    out = out or sys.stdout.buffer
    err = err or sys.stderr.buffer
    private_state_dir()  # before a keeper makes its socket folder in it (without a journal)
    transport = transport_for(host, keep_seconds=project.keep_seconds)
    try:
        channel = transport.start(argv)
        try:
            channel.close_input()
            _pump(channel, out, err)
            status = channel.exit_status(timeout=30.0)
        finally:
            channel.close()
    except OSError as exc:
        raise ConnectError(f"{host.label()}: the link broke while running the command "
                           f"({exc}); it may still be running on the box") from None
    finally:
        transport.close()
    return EXIT_NO_STATUS if status is None else status
