"""The run helpers the ops share: a run's id, the playbook's secrets, and which of a host's
runs a command means (:func:`pick_host_run`). Which playbook ``--playbook`` names is resolved
once, in the command's target (:func:`outrig.cli.targets.playbook_identity`).

Nothing here reaches a box: they read the journal they are given or this environment
(:func:`secret_values`); a box is reached through :mod:`outrig.session`.
"""

from __future__ import annotations

import os
import secrets as _secrets
import time
from typing import Any

from outrig.errors import ConfigError
from outrig.journal import Journal


def new_run_id(playbook: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{playbook}-{stamp}-{_secrets.token_hex(2)}"


def secret_values(names: list[str]) -> dict[str, str]:
    """Read the playbook's secrets from this environment; a missing one is a ConfigError."""
    missing = [name for name in names if not os.environ.get(name)]
    if missing:
        raise ConfigError(
            f"secret{'s' if len(missing) > 1 else ''} {', '.join(missing)} (listed under "
            "secrets: in the playbook) not set in this shell; export it before deploying. "
            "Nothing was sent."
        )
    return {name: os.environ[name] for name in names}


def run_ran(record: dict[str, Any]) -> bool:
    """Whether a journal run really ran: its deploy succeeded (or the box saw it running)."""
    return bool(record.get("ran")) or (record.get("ran") is None
                                       and record.get("status") in ("running", "finished"))


def _run_line(record: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(record.get("created") or 0)))
    return (f"{record.get('run_id')} (playbook {record.get('playbook')}, "
            f"{record.get('status')}, created {when})")


def pick_host_run(journal: Journal, host: str, *, run_id: str | None = None,
                  playbook: str | None = None) -> tuple[dict[str, Any], str]:
    """The host's run that ``migrate`` and ``sync-checkpoints`` act on, and why it was chosen.

    ``run_id`` picks one outright. Otherwise the newest run (of ``playbook``, if given) that
    really ran (see :func:`run_ran`; the journal follows the box's run records on every
    contact): a failed deploy, a cut one or one that never reached the box made no
    checkpoints. When runs of different playbooks are running on the host at once there is no
    single answer: a :class:`ConfigError` names them and the flag that picks one."""
    runs = journal.runs(host=host, playbook=playbook)
    if run_id is not None:
        chosen = next((r for r in runs if r.get("run_id") == run_id), None)
        if chosen is None:
            have = "; ".join(_run_line(r) for r in runs[:8]) or "none"
            raise ConfigError(f"the journal has no run {run_id} on {host} (it has: {have})")
        return chosen, f"run {_run_line(chosen)}, named with --run"
    ran = [r for r in runs if run_ran(r)]
    scope = f"of playbook {playbook} " if playbook else ""
    if not ran:
        seen = "; ".join(_run_line(r) for r in runs[:8])
        raise ConfigError(
            f"no run {scope}on {host} in the journal ever ran"
            + (f" (recorded: {seen})" if seen else "")
            + "; pass --playbook NAME to say which playbook's checkpoints to use")
    running = [r for r in ran if r.get("status") == "running"]
    if len({r.get("playbook") for r in running}) > 1:
        choices = "; ".join(_run_line(r) for r in running)
        raise ConfigError(
            f"runs of {len(running)} playbooks are running on {host}: {choices}. Say which "
            "one: --run RUN_ID" + (" or --playbook NAME" if playbook is None else ""))
    chosen = running[0] if running else ran[0]
    skipped = [r for r in runs if r is not chosen
               and float(r.get("created") or 0) > float(chosen.get("created") or 0)]
    why = (f"run {_run_line(chosen)}: the newest run {scope}on {host} that "
           + ("is running" if running else "ran"))
    if skipped:
        why += "; passed over: " + ", ".join(
            f"{r.get('run_id')} ({r.get('status')}, {'ran' if run_ran(r) else 'never ran'})"
            for r in skipped)
    return chosen, why


def head_run_id(journal: Journal, ident: str) -> str:
    """``ident`` as one run's id: a multi-node job's id names its node 0's run (global rank
    0, which prints the metrics and writes the checkpoints); any other id is itself."""
    if journal.run(ident) is not None:
        return ident
    nodes = (journal.job(ident) or {}).get("nodes") or []
    head = [n for n in nodes if isinstance(n, dict) and n.get("rank") == 0]
    return str(head[0].get("run_id")) if head else ident
