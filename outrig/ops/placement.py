"""``plan --host GROUP``: where the next run can go, one host of the group at a time.

For each host: the runs it holds now and their GPUs (from the box, one ``status`` call), the
GPUs nobody holds, and, given a playbook, whether that playbook's plan fits there: its GPU
check made against the GPUs this host has, and the GPUs the plan needs free. The command
runs this on every host at once (outrig/fanout.py) and prints one row per host.

A GPU is taken when a process holds memory on it (nvidia-smi's holders, ours or not) or when
a running process of an outrig run was given it (a process may not have touched its GPU
yet). For the fit, a GPU taken only by a run of the same playbook counts as free: deploy
stops the playbook's previous run before it launches. A GPU whose health is ``bad``
(:mod:`outrig.hosts.gpu_health`) is never free, and a plan that needs one does not fit: deploy
would refuse it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from outrig.ops.runs import new_run_id
from outrig.plan import HostFacts, make_plan
from outrig.playbook import Job
from outrig.session import HostSession, host_facts
from outrig.text.layout import ranges


def held_runs(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The box's runs as ``{run_id, playbook, status, gpus}``, ``gpus`` being those its
    running processes were given or hold."""
    runs = []
    for run in status.get("runs") or []:
        gpus: set[int] = set()
        for proc in run.get("processes") or []:
            if proc.get("state") == "running":
                gpus.update(g for g in [*(proc.get("gpus") or []),
                                        *(proc.get("gpus_held") or [])] if isinstance(g, int))
        runs.append({"run_id": run.get("run_id"), "playbook": run.get("playbook"),
                     "status": run.get("status"), "gpus": sorted(gpus)})
    return runs


def taken_by(status: dict[str, Any], runs: Sequence[dict[str, Any]]) -> dict[int, set[str]]:
    """Each taken GPU and who takes it (run ids, or ``pid N`` for a process not ours)."""
    taken: dict[int, set[str]] = {}
    for gpu in status.get("gpus") or []:
        for holder in gpu.get("holders") or []:
            who = holder.get("run_id") or f"pid {holder.get('pid')}"
            taken.setdefault(int(gpu["index"]), set()).add(str(who))
    for run in runs:
        if run.get("status") == "running":
            for index in run.get("gpus") or []:
                taken.setdefault(int(index), set()).add(str(run.get("run_id")))
    return taken


def bad_gpus(status: dict[str, Any]) -> dict[int, str]:
    """The GPUs status judged ``bad`` and the fields why (``remapped_rows.pending``)."""
    out: dict[int, str] = {}
    for gpu in status.get("gpus") or []:
        health = gpu.get("health") or {}
        if health.get("verdict") == "bad":
            out[int(gpu["index"])] = str(health.get("short") or "bad")
    return out


def fit(job: Job, session: HostSession, gpu_count: int | None,
        taken: dict[int, set[str]], runs: Sequence[dict[str, Any]],
        bad: dict[int, str] | None = None) -> dict[str, Any]:
    """Whether ``job`` fits on the session's host now: its plan's problems with the GPU
    count the box has (``None``: what the journal or host file knows), then the GPUs it
    needs that are ``bad`` (``bad``: index → why), then those another playbook's run or a
    foreign process takes."""
    facts = host_facts(session.host, session.journal)
    if gpu_count is not None:
        facts = HostFacts(gpu_count=gpu_count, gpu_memory_mib=facts.gpu_memory_mib,
                          source="seen by nvidia-smi now", models=facts.models,
                          envs=facts.envs)
    plan = make_plan(job, session.host, facts, new_run_id(job.name))
    needs = sorted({g for p in plan.processes.values() for g in p.gpus})
    if plan.problems:
        return {"fits": False, "needs": needs, "why": "; ".join(plan.problems)}
    sick = {g: why for g, why in (bad or {}).items() if g in needs}
    if sick:
        return {"fits": False, "needs": needs, "why": "unhealthy: " + "; ".join(
            f"GPU {g} {why}" for g, why in sorted(sick.items()))}
    own = {str(r.get("run_id")) for r in runs if r.get("playbook") == job.name}
    busy = {g: who - own for g, who in taken.items() if g in needs and who - own}
    if busy:
        held = "; ".join(f"GPU {g} by {', '.join(sorted(w))}" for g, w in sorted(busy.items()))
        return {"fits": False, "needs": needs, "why": f"taken: {held}"}
    return {"fits": True, "needs": needs,
            "why": f"GPUs {ranges(needs)} free" if needs else "needs no GPU"}


def placement_on(session: HostSession, job: Job | None = None) -> dict[str, Any]:
    """One host of ``plan --host GROUP``: its runs, its free GPUs, and with ``job`` the fit
    (one agent call)."""
    from outrig.ops.status import status_on

    status = status_on(session, log_lines=0)
    gpus = status.get("gpus") or []
    runs = held_runs(status)
    taken = taken_by(status, runs)
    bad = bad_gpus(status)
    doc: dict[str, Any] = {
        "runs": runs, "gpus": len(gpus), "gpu_error": status.get("gpu_error"),
        "free": sorted(int(g["index"]) for g in gpus
                       if int(g["index"]) not in taken and int(g["index"]) not in bad),
        "unhealthy": {str(k): v for k, v in sorted(bad.items())}}
    if job is not None:
        doc["playbook"] = job.name
        doc.update(fit(job, session, len(gpus) if gpus else None, taken, runs, bad))
    return doc


def placement_summary(result: dict[str, Any]) -> str:
    """``smoke-… (0-1) · GPUs 2-7 free · smoke fits (GPUs 2-3 free)`` (one host)."""
    runs = [r for r in result.get("runs") or [] if r.get("status") == "running"]
    held = ", ".join(f"{r.get('run_id')}" + (f" (GPUs {ranges(r['gpus'])})" if r.get("gpus")
                                             else "") for r in runs) or "no runs"
    free = result.get("free") or []
    total = result.get("gpus") or 0
    gpus = (f"GPUs {ranges(free)} free of {total}" if free else
            f"no GPU free of {total}") if total else "no GPUs"
    text = f"{held} · {gpus}"
    unhealthy = result.get("unhealthy") or {}
    if unhealthy:
        text += " · " + ", ".join(f"GPU {k} {v}" for k, v in unhealthy.items())
    if "fits" in result:
        verdict = "fits" if result["fits"] else "does not fit"
        text += f" · {result.get('playbook')} {verdict} ({result.get('why')})"
    return text
