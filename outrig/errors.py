"""The one exception tree of outrig.

Every error a user can see is an :class:`OutrigError`. Its message says what failed, where
(file, key, host, process) and what to do about it, in one paragraph, so that ``tasks.py``
can print ``str(err)`` and exit without a traceback. Subclasses also inherit the matching
builtin where one fits, so library callers can catch ``ValueError`` or ``ConnectionError``.
Retries decide on these types, never on message text (docs/reliability.md).

The whole tree (builtin bases in brackets; exit status where it is not 1; the classes defined
next to the code that raises them are marked with their module)::

    OutrigError                         anything outrig raises on purpose
    ├── ConfigError [ValueError]        exit 2: a host file, playbook or flag is wrong
    │   └── BudgetRefused               outrig.providers.budget: a rent would cross the budget
    ├── PlanError [ValueError]          exit 2: the plan has problems; nothing was sent
    ├── AuthenticationError             the box refused every key; never retried
    ├── ConnectError [ConnectionError]  the box could not be reached
    │   ├── HostKeyError                its host key changed; never retried
    │   ├── ConnectRefused              nothing listens on the SSH port
    │   ├── LinkLost                    a cut or a silence at any phase; retried (bounded)
    │   └── UnsafePlace                 connectors.keeper_wire: a keeper socket others could open
    ├── RemoteError [RuntimeError]      the agent reported a failure (``kind``); 2: bad input
    │   └── FramingError                outrig.logs.tail: the agent's stream contradicts itself
    ├── LocalWriteError                 writing a file on this workstation failed
    ├── Interrupted                     exit 130: Ctrl-C; says what stopped, what runs on
    ├── CleanupIncomplete               outrig.ops.cleanup: something still holds a GPU
    ├── DeploySuperseded                outrig.ops.deploy: an identical deploy replaces the run
    ├── FanOutFailed                    outrig.fanout: some hosts of a selection failed
    ├── NoCheckpoint                    outrig.ops.stage: no complete checkpoint anywhere
    ├── MoveStopped                     outrig.ops.migrate: the move's other branch failed
    ├── NodesFailed                     outrig.ops.nodes: a node of a multi-node job failed
    ├── EvaluationFailed                outrig.ops.evaluate: requests failed on the server
    │   └── CheckpointRewritten         outrig.ops.evaluate: the trainer rewrote it meanwhile
    ├── CountersUnusable                outrig.evaluation.spec: /metrics went back, NaN, or junk
    ├── ProviderError                   outrig.providers.base: a provider's API failed a call
    │   ├── NoCapacity                  outrig.providers.base: the offer is taken; retried
    │   ├── NeverAnswered               outrig.providers.base: the new box never answered SSH
    │   └── HttpError                   outrig.providers.webapi: an error answer (``status``)
    ├── SpareTaken                      outrig.providers.spares: another watch rented the spare
    ├── SandboxError [RuntimeError]     outrig.sandbox.box: the sandbox could not start
    └── FullDiskUnavailable [RuntimeError]  outrig.sandbox.fulldisk: no small fs to mount

Who raises them (tests/unit/test_errors.py keeps this drawing and the classes in step):

* ConfigError: playbook, inventory, yamlfile, hub, starter, cli, connectors/ssh (a key file
  that is not there) and most ops (bad input is found before anything is sent);
* PlanError: ops/deploy and ops/migrate, from the planner's problems;
* AuthenticationError, HostKeyError, ConnectRefused: transport (classifying a failed
  connect by type and handshake phase; no key offered at all is an AuthenticationError);
* ConnectError: transport (unresolvable name, refused session channel), ops/logs (tail-logs
  gave up), ops/forward (the box refused a forwarded port), ops/remote_exec;
* LinkLost: transport, agent/client, transfer, ops/logs, connectors/keeper/client (the keeper's link
  died under a channel);
* UnsafePlace: connectors/keeper/wire, for connectors/keeper/client (the warm connection's folder or
  socket is not private);
* RemoteError: agent/client (``raise_for_result``: every op's failure), transfer, ops/logs,
  ops/stage;
* LocalWriteError: ops/logs (the log mirror), journal (a record that cannot be written);
  Interrupted: ops/deploy;
* OutrigError itself: transport, transfer, ops/demo, ops/shell, ops/stage.

``AuthRefused`` is the earlier name of :class:`AuthenticationError`, kept as an alias.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

# The exit status when the reader of stdout went away (``outrig plan | head``): 128 + SIGPIPE,
# what a shell reports for a Unix tool that SIGPIPE ended; nothing is printed.
CLOSED_PIPE_EXIT = 141


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


class AuthenticationError(OutrigError):
    """The box answered and refused every key offered. Never retried: the same keys would be
    refused again; the user must fix ``user:`` / ``identity_file:`` or the box's keys.

    Not a :class:`ConnectError` (nor an ``OSError``): the link works, so nothing that handles
    a lost or refused connection (a retry, "the link broke while ...") may take it for one.
    """


AuthRefused = AuthenticationError  # the earlier name


class ConnectError(OutrigError, ConnectionError):
    """The box could not be reached (or the link to it failed); a refused key is an
    :class:`AuthenticationError` instead."""


class HostKeyError(ConnectError):
    """The box's host key differs from the recorded one (possible spoofing or a rebuilt box)."""


class Interrupted(OutrigError):
    """The user pressed Ctrl-C; the message says what was stopped or what keeps running."""

    exit_code = 130


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


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known name ``word`` was most likely meant to be (a typo: ``statsu``, ``--hots``,
    ``sandbx``), for an error's "did you mean"; None when nothing is close. difflib's ratio,
    at 0.6 (its default): one or two letters swapped, dropped or added in a short name."""
    names = [name for name in dict.fromkeys(known) if name != word]
    found = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`` Did you mean 'X'?`` for the closest known name, else ``""`` (to end a sentence)."""
    name = closest(word, known)
    return f" Did you mean {name!r}?" if name else ""


# Agent error kinds (remote/agent/protocol.py) that mean the request named something wrong:
# a run, process or playbook the box does not have, two runs where one was meant, a field out
# of range. Nothing was started or stopped, so they exit 2 like any bad input.
# port_busy: a port the playbook names is taken on the box; refused before anything started
BAD_INPUT_KINDS = frozenset({"bad_request", "not_found", "port_busy"})


class RemoteError(OutrigError, RuntimeError):
    """The agent on the box reported a failure, or could not run at all. Exit 2 when the
    agent said the request named something wrong (:data:`BAD_INPUT_KINDS`), else 1."""

    def __init__(self, message: str, *, kind: str = "remote", excerpt: list[str] | None = None,
                 exit_code: int | None = None, process: str | None = None) -> None:
        self.kind = kind
        self.exit_code = 2 if kind in BAD_INPUT_KINDS else 1
        self.excerpt = list(excerpt or [])
        self.process_exit_code = exit_code
        self.process = process
        text = message
        if self.excerpt:
            text += "\n  last log lines" + (f" of {process}" if process else "") + ":\n"
            text += "\n".join(f"    | {line}" for line in self.excerpt)
        super().__init__(text)
