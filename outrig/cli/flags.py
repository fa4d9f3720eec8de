"""What every task of :mod:`outrig.cli` shares: the flags' help texts, numeric flags parsed
into clear errors, the reporter, and :func:`friendly` (an error as one paragraph and its exit
status, no traceback). A module of its own so that the task modules import it without
importing each other. Every task module imports it at start-up (``outrig --list`` imports
them without Invoke, :mod:`outrig.cli.launcher`), so the console (rich) is imported only when a
reporter is made (:func:`make_reporter`) and Invoke's ``Exit`` only when a task ends with a
status (:func:`exit_with`, where Invoke, which runs the task, is loaded already), purely for
start-up.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from outrig.errors import ConfigError, Interrupted, OutrigError
from outrig.text.layout import paragraph, visible
from outrig.text.terminal import wrap_width

if TYPE_CHECKING:
    from invoke.exceptions import Exit

    from outrig.console import Reporter

F = TypeVar("F", bound=Callable[..., Any])

HOST_HELP = ("host: a file name in hosts/, an ~/.ssh/config alias, user@host:port, or 'local' "
             "(default: OUTRIG_HOST, then host: in outrig.yaml)")
JSON_HELP = "print JSON (one document, or JSON lines while streaming) instead of tables"
PROJECT_HELP = ("the project folder (holding hosts/ and playbooks/); default: OUTRIG_PROJECT, "
                "else the nearest such folder upward from here")
GPUS_HELP = ("the full GPU table (one row per GPU, with who holds it and its health) instead "
             "of the one-line summary")
PARAM_HELP = "set one of the playbook's params: key=value (repeat for several)"
NO_KEEP_HELP = ("connect directly: neither use nor leave a warm connection to the box "
                "(default: keep one for keep_seconds, 10 minutes; see outrig connections)")

HOSTS_HELP = ("host(s): a file name in hosts/, an ~/.ssh/config alias, user@host:port or "
              "'local'; or several (repeat --host, or a,b,c), a group of hosts/groups.yaml, "
              "or 'all' (every host file), which run at once (default: OUTRIG_HOST, then "
              "host: in outrig.yaml)")
MAX_PARALLEL_HELP = ("with several hosts: how many are worked on at once (default "
                     "32)")
FANOUT_JSON = "{host, ok, state, seconds, error, result, warnings}"
LONG_DEADLINE_HELP = ("with several hosts: seconds each host may take before it is reported as "
                      "giving no answer (default: its connect limit plus an hour)")
DEADLINE_HELP = ("with several hosts: seconds each host may take before it is reported as "
                 "giving no answer (default: from its last RTT, see docs/cli.md)")
JOB_RUN = ("; a multi-node job's id (or a node's run id) covers every node of it, no --host "
           "needed")


def number(value: str | None, flag: str, default: float, *, whole: bool = True,
           least: float | None = None, most: float | None = None) -> float:
    """A numeric flag, parsed here so that ``--lines abc`` (or ``--lines -1``, below
    ``least``) is one clear exit-2 paragraph before anything is contacted."""
    if value is None:
        return default
    try:
        parsed = int(value) if whole else float(value)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise ConfigError(f"--{flag} must be {kind}, not {value!r} (e.g. --{flag} "
                          f"{int(default)})") from None
    if (least is not None and parsed < least) or (most is not None and parsed > most):
        def shown(bound: float) -> str:
            return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"
        span = f"from {shown(least or 0)} to {shown(most)}" if most is not None else \
            f"at least {shown(least or 0)}"
        raise ConfigError(f"--{flag} must be {span}, not {value} (e.g. --{flag} "
                          f"{int(default)}). Nothing was sent.")
    return parsed


def make_reporter(json: bool, gpus: bool = False) -> Reporter:
    """The reporter a task prints through: tables for people, or JSON with --json."""
    from outrig.console import Reporter

    return Reporter(json_mode=json, gpu_table=gpus)


def exit_with(code: int) -> Exit:
    """Invoke's ``Exit`` with ``code``: raised by a task, the program exits with that status
    and prints nothing more."""
    from invoke.exceptions import Exit

    return Exit(code=code)


def friendly(func: F) -> F:
    """Print an OutrigError's message (no traceback) and exit with its status; Ctrl-C
    exits 130 (docs/cli.md, "Exit status"). The message is one paragraph wrapped at spaces
    to the terminal (:func:`outrig.text.layout.paragraph`), so no word is cut at its edge."""

    def say(text: str, first: str = "") -> None:
        console = sys.modules.get("outrig.console")  # imported only if a task printed
        if console is not None:
            console.stop_live()
        print(paragraph(visible(text), wrap_width(sys.stderr), first=first), file=sys.stderr)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except Interrupted as exc:  # what Ctrl-C stopped: a note, not an error
            say(str(exc))
            raise exit_with(exc.exit_code) from None
        except OutrigError as exc:
            say(str(exc), first="error: ")
            raise exit_with(exc.exit_code) from None
        except KeyboardInterrupt:
            say("interrupted: anything already launched keeps running on the box; see "
                "`outrig status`")
            raise exit_with(130) from None

    return wrapper  # type: ignore[return-value]
