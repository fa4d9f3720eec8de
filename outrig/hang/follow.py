"""The hang judge as ``watch`` uses it: one :class:`HangFollower` per followed run, fed each
``status`` answer of the watch's heartbeat; and the wording of a hang no restart or spare took.
The judging is :mod:`outrig.hang.judge`'s, the state :mod:`outrig.hang.store`'s."""

from __future__ import annotations

from typing import Any

from outrig.hang import store
from outrig.hang.judge import ProcessVerdict, hung_line
from outrig.journal import Journal


class HangFollower:
    """The followed run's hang settings (its playbook's ``hang:`` section), what the
    heartbeat asks the agent to sample, and the newest verdicts."""

    def __init__(self, journal: Journal, run_id: str,
                 from_playbook: store.PlaybookSettings) -> None:
        self.journal = journal
        self.run_id = run_id
        self.settings = store.settings_for(journal, run_id, from_playbook)
        self.request = store.request_for(self.settings)
        self.verdicts: list[ProcessVerdict] = []

    def observe(self, run: dict[str, Any], facts: dict[str, Any]) -> str | None:
        """Judge one answer of the followed run; the evidence in words once a process is
        confirmed hung, else None."""
        if self.request is None or run.get("run_id") != self.run_id:
            return None
        self.verdicts = store.judge_answer(self.journal, run, facts, self.settings)
        return hung_line(self.verdicts) or None

    def evidence(self) -> list[dict[str, Any]]:
        """The hung processes' verdicts, as the ``hung`` event carries them."""
        return [v.to_json() for v in self.verdicts if v.hung]


def hang_hint(record: dict[str, Any], why: str) -> str:
    """The error of a hung run that no restart and no spare took (``record``: the watch's),
    with what to do next."""
    host, run_id, playbook = record.get("host"), record.get("run_id"), record.get("playbook")
    used, allowed = record.get("restarts_used") or 0, record.get("restarts") or 0
    return (f"run {run_id} on {host} is hung ({why}); no restart was left (used {used} of "
            f"{allowed}) and no spare took it. Look: `outrig status --host {host} --run "
            f"{run_id}`; stop it: `outrig cleanup --host {host} --run {run_id}`; start it "
            f"again: `outrig deploy --host {host} --playbook {playbook}`, or let watch do "
            "it: --restarts N or --spare HOST (docs/watch.md#hangs)")
