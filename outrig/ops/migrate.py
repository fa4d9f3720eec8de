"""``inv migrate --from OLD --to NEW``: move a job to a fresh box and resume it.

The runbook, in order (docs/migrate.md):
1. Probe OLD several times, and several ways (SSH, then a bare TCP connect), before calling it
   dead. A slow link is not a dead node; what was tried is always shown.
2. Preflight NEW (reach, python, GPUs, disk) and provision it when the playbook names
   environments.
3. Re-plan for NEW's hardware: the playbook itself, or the member of its family that fits NEW
   and uses the most GPUs. The old and new placement are shown side by side.
4. Stage model and data on NEW (hub, box to box, or workstation; see ``inv stage``).
5. If OLD is alive, stop its run (the trainer saves on SIGTERM; its last complete checkpoint is
   final), then copy the newest complete checkpoint OLD → NEW. If OLD is dead, take the newest
   one from the workstation's mirror (``inv sync-checkpoints``).
6. Deploy on NEW; the trainer resumes from the highest complete epoch in its save path.
7. Record the move in the journal. OLD's logs stay in the local mirror (``tail-logs``).
"""

from __future__ import annotations

import socket
import time
from dataclasses import replace
from typing import Any

from rich.markup import escape
from rich.table import Table

from outrig.console import Reporter
from outrig.errors import ConfigError, OutrigError, PlanError
from outrig.fencing import mark_moved
from outrig.inventory import resolve_host
from outrig.journal import Journal
from outrig.ops.base import HostSession, Project, pick_host_run
from outrig.ops.cleanup import cleanup_on
from outrig.ops.deploy import cached_models, deploy_on, plan_job
from outrig.ops.stage import NoCheckpoint, family, stage_on
from outrig.plan import Plan
from outrig.playbook import Job, find_playbook, load_job
from outrig.progress import argv_int
from outrig.recipes import ModelFacts
from outrig.timing import MIGRATE_PROBE_PAUSE, TCP_PROBE_LIMIT, connect_timeout_for


def probe(project: Project, host_spec: str, reporter: Reporter, journal: Journal, *,
          attempts: int = 3, pause: float = MIGRATE_PROBE_PAUSE
          ) -> tuple[HostSession | None, list[str]]:
    """Try to reach a box ``attempts`` times (with pauses) before concluding anything.

    Returns the box's session, open, when any attempt worked (migrate goes on using it), and
    the list of what was tried.
    """
    session = HostSession(project, host_spec, reporter, journal)
    # this loop does the retrying of refused connects, with its own pauses
    session.transport.retry = replace(session.transport.retry, refused=1)
    tried: list[str] = []
    for attempt in range(1, attempts + 1):
        started = time.monotonic()
        try:
            session.call("check", stream=False)
            tried.append(f"ssh attempt {attempt}: ok in {time.monotonic() - started:.1f}s")
            return session, tried
        except OutrigError as exc:  # ConnectError and every other failure: try again
            session.transport.reconnect()
            first = str(exc).split(". ")[0]
            tried.append(f"ssh attempt {attempt}: {first} ({time.monotonic() - started:.1f}s)")
        if attempt < attempts:
            time.sleep(pause * attempt)
    session.close()
    host = session.host
    if not host.is_local:
        timeout = connect_timeout_for(host, None)[0]
        address = (host.hostname, host.port or 22)
        try:
            with socket.create_connection(address, timeout=min(timeout, TCP_PROBE_LIMIT)):
                tried.append(f"tcp {address[0]}:{address[1]}: port open, but SSH did not "
                             "answer (sshd hung or the box is overloaded)")
        except OSError as exc:
            tried.append(f"tcp {address[0]}:{address[1]}: {exc.strerror or exc}")
    return None, tried


def trainer_ranks(processes: Any) -> int | None:
    """torchrun's ``--nproc_per_node`` of a plan's ``trainer`` (a Plan's processes, or the
    journal's list of process dicts); None when the trainer is not launched by torchrun."""
    if isinstance(processes, dict):
        proc = processes.get("trainer")
        argv = list(proc.argv) if proc is not None else []
    else:
        found = [p for p in processes or [] if isinstance(p, dict) and p.get("name") == "trainer"]
        argv = [str(a) for a in found[0].get("argv") or []] if found else []
    ranks = argv_int(argv, "--nproc_per_node")
    return ranks if ranks is not None else argv_int(argv, "--nproc-per-node")


def rank_problem(old: int | None, plan: Plan, to_spec: str) -> str | None:
    """Why ``plan`` cannot resume a run trained with ``old`` ranks, or None.

    speculators counts steps per rank: ``len(train_loader)`` shrinks as ranks are added, the
    restored LR scheduler carries the old global step against a total re-derived from the new
    length (trainer.py ``_resolve_scheduler_steps``), and a mid-epoch resume skips
    ``local_step`` batches of the new loader (dataloader.py), which are not the batches the
    old ranks saw. Resuming with another rank count can end the schedule at once (LR 0) or
    replay and skip the wrong samples."""
    new = trainer_ranks(plan.processes)
    if old is None or new is None or old == new:
        return None
    return (f"{plan.playbook} trains with {new} rank(s) on {to_spec}, but the run being "
            f"moved trained with {old}: speculators counts steps per rank, so its restored "
            "LR schedule and mid-epoch position would not line up (the schedule can already "
            f"be at 0). Use a family member whose trainer has {old} GPU(s) on {to_spec}, or "
            "start a fresh run there (a new save_path) instead of resuming")


def choose_playbook(project: Project, to_spec: str, playbook: str, *, explicit: bool,
                    journal: Journal, ranks: int | None = None,
                    from_host: str | None = None) -> tuple[Plan, str, list[str]]:
    """The plan for NEW: ``playbook`` if it was named explicitly, else the member of its
    family that fits NEW and uses the most GPUs (ties: the playbook itself), among those
    whose trainer keeps the ``ranks`` of the run being moved.

    A fresh box has not got the model yet (stage copies it after this choice), so its layer
    count and vocabulary are taken from what OLD's box reported for the same model path
    (``from_host``), unless NEW itself reported them. Deploy reads them on NEW again.

    Returns the plan, the chosen member as a name or path that ``find_playbook`` accepts,
    and the names of every member considered.
    """
    new_host = resolve_host(to_spec, hosts_dir=project.hosts_dir)
    known: dict[str, ModelFacts] = {}
    if from_host is not None:
        known.update(cached_models(journal, resolve_host(from_host,
                                                         hosts_dir=project.hosts_dir)))
    known.update(cached_models(journal, new_host))

    def plan_for(member: str) -> Plan:
        job = load_job(find_playbook(member, project.playbooks_dir))
        return plan_job(job, new_host, journal, probed=known)

    if explicit:
        plan = plan_for(playbook)
        problem = rank_problem(ranks, plan, to_spec)
        if problem:
            raise PlanError([problem], context=f"migrate to {to_spec}")
        return plan, playbook, [plan.playbook]
    base = load_job(find_playbook(playbook, project.playbooks_dir))
    fam = family(base)
    members = [(playbook, base.name)]
    for path in sorted(project.playbooks_dir.glob("*.y*ml")):
        try:
            job = load_job(path)
        except OutrigError:
            continue
        if family(job) == fam and job.name != base.name:
            members.append((str(path), job.name))
    fitting: list[tuple[int, int, Plan, str]] = []
    problems: list[str] = []
    for order, (member, name) in enumerate(members):
        try:
            plan = plan_for(member)
        except PlanError as exc:
            problems.append(f"{name}: {'; '.join(exc.problems)}")
            continue
        problem = rank_problem(ranks, plan, to_spec)
        if problem:
            problems.append(f"{name}: {problem}")
            continue
        used = sum(len(p.gpus) for p in plan.processes.values())
        fitting.append((used, -order, plan, member))
    if not fitting:
        raise PlanError(problems, context=f"family {fam} on {to_spec}")
    fitting.sort(key=lambda t: (t[0], t[1]), reverse=True)
    _, _, chosen, ref = fitting[0]
    return chosen, ref, [name for _, name in members]


def placement_table(old: dict[str, Any] | None, new: Plan, old_host: str,
                    new_host: str) -> Table:
    table = Table(title="placement: old → new", title_justify="left")
    table.add_column("process")
    table.add_column(escape(f"{old_host} ({(old or {}).get('playbook', '?')})"))
    table.add_column(escape(f"{new_host} ({new.playbook})"))
    old_procs = {p["name"]: p for p in ((old or {}).get("processes") or [])}

    def cell(gpus: list[int], parallel: Any) -> str:
        text = ",".join(str(g) for g in gpus) or "-"
        if parallel:
            text += f" (TP{parallel[0]}×DP{parallel[1]})"
        return text

    for name in dict.fromkeys([*old_procs, *new.order]):
        before = old_procs.get(name)
        after = new.processes.get(name)
        table.add_row(name,
                      cell(before["gpus"], before.get("parallel")) if before else "—",
                      cell(after.gpus, after.parallel) if after else "—")
    return table


def migrate(project: Project, from_spec: str, to_spec: str, reporter: Reporter, *,
            playbook: str | None = None, journal: Journal | None = None,
            probe_attempts: int = 3, probe_pause: float = MIGRATE_PROBE_PAUSE,
            run_id: str | None = None) -> dict[str, Any]:
    """Move a job from OLD to NEW and resume it there (the runbook is this module's doc).

    One session per box for the whole move: NEW's connection is opened once and every step
    (check, provision, stage, deploy) runs its core on it; OLD's session, when the probe
    reached it, serves the box-to-box copies and the stop of its run."""
    journal = journal or Journal()
    old_host = resolve_host(from_spec, hosts_dir=project.hosts_dir)
    new_host = resolve_host(to_spec, hosts_dir=project.hosts_dir)
    if old_host.name == new_host.name:
        raise ConfigError("--from and --to name the same host")
    report: dict[str, Any] = {"from": from_spec, "to": to_spec, "started": time.time()}
    reporter.info(f"• probing {from_spec} (up to {probe_attempts} tries)")
    old, tried = probe(project, from_spec, reporter, journal, attempts=probe_attempts,
                       pause=probe_pause)
    report["old_alive"] = old is not None
    report["probes"] = tried
    for line in tried:
        reporter.info(f"    {line}")
    if old is None:
        reporter.warn(f"{from_spec} is unreachable after {len(tried)} checks; using the "
                      "checkpoint mirror on this workstation")
    new = HostSession(project, to_spec, reporter, journal)
    try:
        return _move(new, old, report, playbook=playbook, run_id=run_id)
    finally:
        new.close()
        if old is not None:
            old.close()


def _move(new: HostSession, old: HostSession | None, report: dict[str, Any], *,
          playbook: str | None, run_id: str | None) -> dict[str, Any]:
    """Steps 2 to 7 of the runbook on open sessions (``old`` is None when OLD is dead)."""
    project, reporter, journal = new.project, new.reporter, new.journal
    from_spec, to_spec = str(report["from"]), new.host_spec
    old_name = resolve_host(from_spec, hosts_dir=project.hosts_dir).name
    last, why = old_run(journal, old_name, run_id=run_id, playbook=playbook)
    old_playbook = str(last["playbook"]) if last else None
    source = playbook or old_playbook
    if source is None:
        raise ConfigError(f"the journal has no run on {old_name}; pass --playbook")
    reporter.info(f"• moving {why}" if last else f"• no earlier run of {source} on "
                  f"{old_name} in the journal; {source} starts afresh")
    report["old_run"] = {"run_id": last.get("run_id") if last else None, "why": why}
    job = _prepare(new, source)
    old_plan = last.get("plan") if last else None
    plan, new_playbook, considered = choose_playbook(
        project, to_spec, source, explicit=playbook is not None, journal=journal,
        ranks=trainer_ranks((old_plan or {}).get("processes")), from_host=from_spec)
    if not reporter.json_mode:
        reporter.stdout_console.print(placement_table(old_plan, plan, old_name, new.host.name))
        if len(considered) > 1:
            reporter.info(f"• chose {plan.playbook} of family {family(job)} for {to_spec} "
                          f"(considered: {', '.join(considered)})")
    report["playbook"] = plan.playbook
    _carry_state(new, old, report, new_playbook, old_playbook)
    deployed = deploy_on(new, load_job(find_playbook(new_playbook, project.playbooks_dir)))
    report["run_id"] = deployed.plan.run_id
    report["seconds"] = round(time.time() - float(report["started"]), 1)
    journal.record_run(deployed.plan.run_id, {"migrated_from": {
        "host": old_name, "run_id": last.get("run_id") if last else None,
        "playbook": old_playbook, "alive": report["old_alive"], "probes": report["probes"],
        "checkpoint": report["checkpoint"]}})
    mark_moved(journal, old_name, last.get("run_id") if last else None, new.host.name,
               deployed.plan.run_id, stopped=report.get("old_cleanup"))
    if reporter.json_mode:
        reporter.emit_json(report)
    else:
        epoch = (report["checkpoint"] or {}).get("epoch")
        reporter.success(f"migrated {plan.playbook} from {from_spec} to {to_spec} in "
                         f"{report['seconds']:.0f}s, resuming from checkpoint {epoch} "
                         f"({(report['checkpoint'] or {}).get('route')})")
    return report


def _prepare(new: HostSession, source: str) -> Job:
    """Preflight NEW (reach, python, GPUs) and provision it when the playbook names
    environments; returns the playbook being moved."""
    check = new.call("check", stream=False)
    gpus = (check.get("facts") or {}).get("gpus") or []
    new.reporter.info(f"• {new.host_spec}: python {check.get('python')}, {len(gpus)} GPU(s)"
                      + (f" × {gpus[0].get('memory_total_mib')} MiB" if gpus else ""))
    job = load_job(find_playbook(source, new.project.playbooks_dir))
    if job.spec.environments:
        from outrig.ops.provision import pick_playbook, provision_on

        provision_on(new, pick_playbook(new.project, source))
    return job


def _carry_state(new: HostSession, old: HostSession | None, report: dict[str, Any],
                 new_playbook: str, old_playbook: str | None) -> None:
    """Stage data on NEW; stop OLD's run when it is alive; then bring the newest complete
    checkpoint (OLD → NEW directly, or from the workstation's mirror)."""
    if _has_data(new.project, new_playbook, new.host_spec):
        report["stage"] = stage_on(new, new_playbook, src=old, source_playbook=old_playbook,
                                   parts=("data",))
    else:
        report["stage"] = {"items": []}
    if old is not None and old_playbook:
        new.reporter.info(f"• stopping {old_playbook} on {old.host_spec}")
        report["old_cleanup"] = cleanup_on(old, playbook=old_playbook)
    try:
        resumed = stage_on(new, new_playbook, src=old, resume=True,
                           source_playbook=old_playbook, parts=("checkpoint",))
        report["checkpoint"] = resumed.get("checkpoint")
    except NoCheckpoint as exc:
        new.reporter.warn(f"{exc} The trainer on {new.host_spec} starts from scratch.")
        report["checkpoint"] = None


def old_run(journal: Journal, host: str, *, run_id: str | None,
            playbook: str | None) -> tuple[dict[str, Any] | None, str]:
    """The run being moved (see :func:`outrig.ops.base.pick_host_run`) and why it was
    chosen. With an explicit ``--playbook`` and no run of it that ran, there is none: the new
    box starts that playbook afresh; without one, that is an error naming the choices."""
    try:
        return pick_host_run(journal, host, run_id=run_id)
    except ConfigError:
        if playbook is None or run_id is not None:
            raise
    try:
        return pick_host_run(journal, host, playbook=playbook)
    except ConfigError:
        return None, "none"


def _has_data(project: Project, playbook: str, host_spec: str) -> bool:
    from outrig.ops.stage import stage_items

    host = resolve_host(host_spec, hosts_dir=project.hosts_dir)
    job = load_job(find_playbook(playbook, project.playbooks_dir))
    return any(i.kind != "checkpoints" for i in stage_items(job, host))
