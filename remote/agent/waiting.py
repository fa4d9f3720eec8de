"""Deploys of one playbook waiting for the workdir lock: each says so in a file before it
waits, so the deploy that holds the lock can tell, before it reports its run ready, that the
next one will replace that run the moment it lets go.

Why: two identical deploys started at the same moment run one after the other (the lock).
The first reported "ready" and exited 0 for a run the second stopped two seconds later;
only the second said anything. Now the first sees the second waiting and says its run is
being replaced (the workstation makes that a failure), and the second still says which run
it replaced.

``<workdir>/.outrig/waiting/<playbook>/<run id>.json``: ``{pid, start_ticks, since}`` of the
waiting agent; a file whose agent is gone (killed while waiting) is ignored and removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, List, Optional

from .constants import JSONDict
from .layout import Layout, read_json, write_atomic
from .procs import read_stat


def _folder(layout: Layout, playbook: str) -> str:
    return os.path.join(layout.state, "waiting", playbook)


class Waiting:
    """A deploy of ``playbook`` (run ``run_id``) announced as waiting until it leaves."""

    def __init__(self, layout: Layout, playbook: str, run_id: str) -> None:
        self.path = os.path.join(_folder(layout, playbook), run_id + ".json")

    def __enter__(self) -> Waiting:
        me = read_stat(os.getpid())
        note = {"pid": os.getpid(), "start_ticks": me.start_ticks if me else None,
                "since": round(time.time(), 3)}
        with contextlib.suppress(OSError):  # a full disk: the deploy goes on unannounced
            write_atomic(self.path, (json.dumps(note) + "\n").encode())
        return self

    def __exit__(self, *exc: Any) -> None:
        self.leave()

    def leave(self) -> None:
        """No longer waiting (the lock is held, or the deploy ended); again is harmless."""
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def waiting_others(layout: Layout, playbook: str, run_id: str) -> List[JSONDict]:
    """``[{run_id, waiting}]`` of the other deploys of ``playbook`` waiting now (``waiting``:
    seconds, on the box's clock), oldest first."""
    folder = _folder(layout, playbook)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    out: List[JSONDict] = []
    for name in names:
        other = name[:-len(".json")] if name.endswith(".json") else None
        if other is None or other == run_id:
            continue
        path = os.path.join(folder, name)
        note = _read(path)
        if note is None or not _alive(note):
            with contextlib.suppress(OSError):
                os.unlink(path)  # its agent was killed while it waited
            continue
        since = note.get("since")
        waited = round(time.time() - since, 3) if isinstance(since, (int, float)) else None
        out.append({"run_id": other, "waiting": waited})
    return sorted(out, key=lambda w: -(w["waiting"] or 0))


def _read(path: str) -> Optional[JSONDict]:
    try:
        note = read_json(path)
    except (OSError, ValueError):
        return None
    return note if isinstance(note, dict) else None


def _alive(note: JSONDict) -> bool:
    pid = note.get("pid")
    if not isinstance(pid, int) or pid <= 1:
        return False
    st = read_stat(pid)
    return st is not None and st.live() and st.start_ticks == note.get("start_ticks")

