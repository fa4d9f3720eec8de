"""The hang judge's state per run in the journal (``<journal>/hangs/<run>.json``).

``watch`` and ``status`` both feed the agent's samples to :func:`outrig.hang.judge.judge_run`
through :func:`judge_answer`; keeping the state here (read, judged, written under the
record's lock) makes them count the same confirmations, so ``status`` shows ``hung`` with the
evidence a watch collected, and a ``status`` now and then adds its own samples. The settings
are those the run was first judged with (kept here: the playbook's ``hang:`` section as it was
when the run began to be judged, and no playbook read again on each ``status``), else the
run's playbook's section where the playbook can be read here, else the defaults.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from outrig.hang.judge import ProcessVerdict, defaults, judge_run, sample_request
from outrig.journal import Journal, atomic_write_json, read_json, record_lock, safe_name

HANG_DIR = "hangs"


def hang_file(journal: Journal, run_id: str) -> Path:
    return journal.root / HANG_DIR / f"{safe_name(run_id)}.json"


PlaybookSettings = Callable[[str], "dict[str, Any] | None"]
"""The ``hang:`` settings of the playbook a name means, or None when it cannot be read (the
caller's: :func:`outrig.playbook.hang_settings` over its project's playbooks)."""


def settings_for(journal: Journal, run_id: str,
                 from_playbook: PlaybookSettings) -> dict[str, Any]:
    """The run's settings, in the order of the module docstring: those saved with its state,
    else its playbook's (``from_playbook``), else the defaults."""
    saved = read_json(hang_file(journal, run_id))
    if isinstance(saved, dict) and isinstance(saved.get("settings"), dict):
        return dict(saved["settings"])
    playbook = (journal.run(run_id) or {}).get("playbook")
    found = from_playbook(str(playbook)) if playbook else None
    return found if found is not None else defaults()


def request_for(settings: dict[str, Any]) -> dict[str, Any] | None:
    """The ``hang`` field of a ``status`` request for these settings (None: all off)."""
    return sample_request(settings) if settings.get("enabled", True) else None


def judge_answer(journal: Journal, run: dict[str, Any], facts: dict[str, Any],
                 settings: dict[str, Any]) -> list[ProcessVerdict]:
    """Judge one run of a ``status`` answer against its saved state; save the new state and
    the verdicts (``status`` shows them); return the verdicts."""
    run_id = run.get("run_id")
    if not isinstance(run_id, str):
        return []
    path = hang_file(journal, run_id)
    with record_lock(path):
        saved = read_json(path)
        state = saved.get("state") if isinstance(saved, dict) else None
        new_state, verdicts = judge_run(state if isinstance(state, dict) else {}, run, facts,
                                        settings)
        atomic_write_json(path, {"run_id": run_id, "settings": settings, "state": new_state,
                                 "verdicts": [v.to_json() for v in verdicts],
                                 "at": time.time()})
    return verdicts


def forget(journal: Journal, run_id: str) -> None:
    """Drop a run's state (a restarted or moved run starts counting afresh)."""
    hang_file(journal, run_id).unlink(missing_ok=True)
