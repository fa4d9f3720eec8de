"""The tasks' work on a multi-node job (a playbook with ``nodes:`` > 1; outrig/ops/nodes.py).

Several hosts mean two different things to ``deploy``: with a one-node playbook the same job
on every host (a sweep, :mod:`outrig.fanout_tasks`), with ``nodes: N`` one job across N hosts
(its nodes). The playbook decides, so each task asks here first, before it resolves
``--host``: a playbook that lists its nodes needs no ``--host`` at all, and ``status``,
``cleanup``, ``tail-logs`` and ``watch`` with the ``--run`` id of a job (its job id, or one
node's run id) cover every node of it, whatever ``--host`` says.
"""

from __future__ import annotations

from typing import Any

from outrig.console import Reporter
from outrig.journal import Journal
from outrig.playbook import Job
from outrig.settings import Settings


def multi_node_job(settings: Settings, playbook: str | None, *, test: bool,
                   params: dict[str, Any]) -> Job | None:
    """The loaded playbook when it spans several nodes, else None (a one-node playbook, or
    none named by ``--playbook``, ``OUTRIG_PLAYBOOK`` or ``playbook:`` in outrig.yaml: then
    the task goes on as for one host, where the host's current run may name it)."""
    from outrig.playbook import find_playbook, load_job

    name, _ = settings.value("playbook", playbook)
    if name is None:
        return None
    job = load_job(find_playbook(str(name), settings.project.playbooks_dir), test=test,
                   params=params)
    return job if job.spec.nodes > 1 else None


def node_selection(settings: Settings, host: list[str] | None, job: Job) -> list[str]:
    """The ``--host`` selection for a job's nodes: as given (expanded, in order), or empty
    when none is given and the playbook lists its nodes (:func:`outrig.ops.nodes.
    select_nodes` then takes the playbook's list and checks the count either way)."""
    if not [v for v in host or [] if v] and job.spec.node_hosts:
        return []
    return settings.hosts(host)


def deploy_job(settings: Settings, host: list[str] | None, job: Job, reporter: Reporter, *,
               dry_run: bool, wait: bool, params: dict[str, Any]) -> None:
    """``deploy`` (and ``plan``, as a dry run) of a multi-node playbook: node 0 first, every
    node ready, or every node stopped and the failing node named."""
    from outrig.ops.nodes import deploy_nodes

    deploy_nodes(settings.project, node_selection(settings, host, job), job, reporter,
                 dry_run=dry_run, wait=wait, params=params)


def job_id_for(run: str | None) -> str | None:
    """The job a ``--run`` id names (a job id or one of its nodes' run ids), else None (an
    ordinary run id, or no ``--run``). ``--playbook`` alone never selects a job: with a
    ``--host`` it means that box's current run, as before."""
    if run is None:
        return None
    from outrig.ops.nodes import find_job

    found = find_job(Journal(), run)
    return None if found is None else str(found[0].get("job_id"))
