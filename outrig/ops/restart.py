"""A run deployed again in place, as it was deployed (``watch --restarts``): the job, params
and test mode rebuilt from the run's journal record (:mod:`outrig.redeploy`), each
difference said, and the new run's record saying where it came from (``restarted_from``,
which ``status`` shows)."""

from __future__ import annotations

from outrig.ops.deploy import DeployResult, deploy_on
from outrig.redeploy.rebuild import redeploy_of
from outrig.session import HostSession


def restart_on(session: HostSession, run_id: str, playbook: str) -> DeployResult:
    """Deploy run ``run_id`` (of ``playbook``, the name its runs are filed under) again on
    the session's box."""
    again = redeploy_of(session.project.playbooks_dir, session.journal, run_id, playbook)
    for note in again.notes:
        session.reporter.info(f"• {note}")
    deployed = deploy_on(session, again.job, params=again.params)
    session.journal.record_run(deployed.plan.run_id, {"restarted_from": {
        "run_id": again.run_id, "host": session.host.name, "differences": again.notes}})
    return deployed
