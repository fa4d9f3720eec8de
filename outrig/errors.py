"""The one exception tree of outrig.

Every error a user can see is an :class:`OutrigError`. Its message says what failed, where
(file, key, host, process) and what to do about it, in one paragraph, so that ``tasks.py``
can print ``str(err)`` and exit without a traceback. Subclasses also inherit the matching
builtin where one fits, so library callers can catch ``ValueError`` or ``ConnectionError``.
"""

from __future__ import annotations


class OutrigError(Exception):
    """Root of every error outrig raises on purpose.

    ``exit_code`` is what ``inv`` exits with: 2 for bad input (nothing was sent),
    1 for a failure on or while reaching the box.
    """

    exit_code = 1


class ConfigError(OutrigError, ValueError):
    """A host file, playbook or flag is wrong. Nothing was sent or started."""

    exit_code = 2


class PlanError(OutrigError, ValueError):
    """The plan has problems (GPU overlap, TP×DP mismatch, cycles...). Nothing was sent."""

    exit_code = 2

    def __init__(self, problems: list[str], context: str = "") -> None:
        self.problems = list(problems)
        head = f"the plan{(' for ' + context) if context else ''} has "
        head += f"{len(problems)} problem{'s' if len(problems) != 1 else ''}; nothing was sent:"
        super().__init__("\n".join([head, *(f"  - {p}" for p in problems)]))


class ConnectError(OutrigError, ConnectionError):
    """The box could not be reached or would not let us in."""


class HostKeyError(ConnectError):
    """The box's host key differs from the recorded one (possible spoofing or a rebuilt box)."""


class Interrupted(OutrigError):
    """The user pressed Ctrl-C; the message says what was stopped or what keeps running."""

    exit_code = 130


class AuthRefused(ConnectError):
    """The box answered and refused every key offered. Never retried: the same keys would be
    refused again; the user must fix ``user:`` / ``identity_file:`` or the box's keys."""


class LinkLost(ConnectError):
    """The link dropped or went silent: a reset, an EOF, or a timeout, at any point from the
    TCP connect to the end of a stream. Retrying may work, so callers retry these (bounded).

    ``phase`` names where it happened (``connect``, ``banner``, ``kex``, ``auth``,
    ``channel``, ``exec``, ``stream``); ``request_sent`` says whether the agent may have
    received its request (if not, nothing ran on the box and a retry is always safe);
    ``silent`` whether the link went quiet (a timeout) rather than dropping (a reset, an EOF).
    """

    def __init__(self, message: str, *, phase: str, request_sent: bool = False,
                 silent: bool = False) -> None:
        super().__init__(message)
        self.phase = phase
        self.request_sent = request_sent
        self.silent = silent


class ConnectRefused(ConnectError):
    """Nothing listens on the SSH port (the box is down, rebooting, or ``port:`` is wrong)."""


class LocalWriteError(OutrigError):
    """Writing a file on this workstation failed (disk full, permissions). Not a link problem:
    reconnecting cannot help, so it stops the command with the path and the fix."""


class RemoteError(OutrigError, RuntimeError):
    """The agent on the box reported a failure, or could not run at all."""

    def __init__(self, message: str, *, kind: str = "remote", excerpt: list[str] | None = None,
                 exit_code: int | None = None, process: str | None = None) -> None:
        self.kind = kind
        self.excerpt = list(excerpt or [])
        self.process_exit_code = exit_code
        self.process = process
        text = message
        if self.excerpt:
            text += "\n  last log lines" + (f" of {process}" if process else "") + ":\n"
            text += "\n".join(f"    | {line}" for line in self.excerpt)
        super().__init__(text)
