"""GPU health on the workstation: each look at a box's GPUs judged, remembered, and shown.

The box sends raw fields (nvidia-smi's ECC, row remapping, clocks, P-state and PCIe
answers, and the kernel log's Xid lines: the ``facts`` every ``check``, ``status`` and
``deploy`` carries); the judge is the agent's own :mod:`gpu_judge` (imported through
:mod:`outrig.agent_code`), so the box's deploy refusal and what ``check`` shows never
disagree. What this module adds is what only the workstation can do:

* remember each GPU's last verdict and correctable-error count in the journal's host record
  (``gpu_health``, by GPU UUID), so a count that rises between two looks is a ``warn`` and a
  GPU that turns ``bad`` during a run is news (``gpu_unhealthy``) once, not at every look;
* lines and event fields for ``check``, ``status``, ``plan``, ``watch`` and ``migrate``.

Pure but for :func:`look`, which reads and writes the journal.
"""

from __future__ import annotations

from typing import Any

from outrig.agent_code import gpu_judge
from outrig.journal import Journal
from outrig.text.layout import ranges

OK, UNKNOWN, WARN, BAD = gpu_judge.OK, gpu_judge.UNKNOWN, gpu_judge.WARN, gpu_judge.BAD
JOURNAL_KEY = "gpu_health"
summary = gpu_judge.summary


def judge(facts: dict[str, Any], previous: dict[str, dict[str, Any]] | None = None
          ) -> list[dict[str, Any]]:
    """Every GPU of ``facts`` judged (``previous``: uuid → the last look's verdict)."""
    return list(gpu_judge.judge_facts(facts, previous))


def remembered(journal: Journal, host: str) -> dict[str, dict[str, Any]]:
    """The last look's verdicts on ``host``, by GPU UUID."""
    saved = journal.host_facts(host).get(JOURNAL_KEY)
    if not isinstance(saved, dict):
        return {}
    return {str(k): v for k, v in saved.items() if isinstance(v, dict)}


def look(journal: Journal, host: str, facts: dict[str, Any]
         ) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Judge ``facts`` against the last look at ``host`` and remember this one: (verdicts,
    the previous look's verdicts by UUID). A box that sent no GPUs changes nothing."""
    before = remembered(journal, host)
    verdicts = judge(facts, before)
    if verdicts:
        journal.update_host(host, **{JOURNAL_KEY: {
            str(v["uuid"]): {"uuid": v["uuid"], "index": v["index"], "verdict": v["verdict"],
                             "corrected": v.get("corrected")} for v in verdicts}})
    return verdicts, before


def newly_bad(verdicts: list[dict[str, Any]], before: dict[str, dict[str, Any]]
              ) -> list[dict[str, Any]]:
    """The GPUs ``bad`` now that were not ``bad`` at the last look (a first look at a
    bad GPU counts: nobody has been told yet)."""
    return [v for v in verdicts if v["verdict"] == BAD
            and (before.get(str(v["uuid"])) or {}).get("verdict") != BAD]


def event_fields(verdict: dict[str, Any]) -> dict[str, Any]:
    """The ``gpu_unhealthy`` event's fields for one GPU: which, the field that decided, why
    and what to do (the ``on_event`` hook gets these on its stdin)."""
    worst = [f for f in verdict["findings"] if f["verdict"] == verdict["verdict"]]
    first = worst[0] if worst else {}
    return {"gpu": verdict.get("index"), "uuid": verdict.get("uuid"),
            "verdict": verdict["verdict"], "field": first.get("field"),
            "value": first.get("value"), "why": summary(verdict), "fix": first.get("fix")}


def health_head(verdicts: list[dict[str, Any]]) -> str | None:
    """``GPU health: 0-6 ok, 7 bad`` (None without GPUs): ``check``'s line, above one line
    per GPU that is not ``ok`` (:func:`summary`)."""
    by: dict[str, list[int]] = {}
    for v in verdicts:
        if isinstance(v.get("index"), int):
            by.setdefault(v["verdict"], []).append(v["index"])
    if not by:
        return None
    return "GPU health: " + ", ".join(f"{ranges(by[k])} {k}" for k in (OK, UNKNOWN, WARN, BAD)
                                      if k in by)


def short(verdict: dict[str, Any]) -> str:
    """``bad (remapped_rows.pending)``: the verdict and the fields behind it, for a table
    cell."""
    if verdict["verdict"] == OK:
        return OK
    fields = sorted({str(f["field"]) for f in verdict["findings"]
                     if f["verdict"] == verdict["verdict"]})
    return f"{verdict['verdict']} ({', '.join(fields)})"
