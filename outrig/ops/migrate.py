"""``inv migrate (--run RUN | --from OLD) --to NEW``: move a job to a fresh box and resume it,
as it was deployed (its playbook as deployed, ``--param``, ``--test``: :mod:`outrig.redeploy`).

The runbook, in order (docs/migrate.md):
1. Probe OLD several times, and several ways (SSH, then the connector's look from outside: for
   SSH a fresh TCP connect to the port), before calling it dead. A slow link is not a dead
   node; what was tried is always shown.
2. Preflight NEW (reach, python, GPUs, disk).
3. Re-plan for NEW's hardware: the playbook itself, or the member of its family that fits NEW
   and uses the most GPUs. The old and new placement are shown side by side.
4. Provision NEW when the playbook names environments, at the same time as 5 and 6 (they do
   not depend on each other; a second session to NEW carries it).
5. Stage model and data on NEW (hub, box to box, or workstation; see ``inv stage``).
6. If OLD is alive, wait for provision to succeed (OLD goes on training meanwhile), stop its
   run (the trainer saves on SIGTERM; its last complete checkpoint is final), then copy the
   newest complete checkpoint OLD → NEW. If OLD is dead, take the newest one from the
   workstation's mirror (``inv sync-checkpoints``) while the environments install.
7. Deploy on NEW once 4 to 6 are done, the job rebuilt from the old run's move record (every
   difference named); the trainer resumes from the highest complete epoch in its save path.
8. Record the move in the journal. OLD's logs stay in the local mirror (``tail-logs``).

``report["timings"]`` has the seconds of each step (probe, provision, stage, checkpoint,
deploy, total); provision overlaps stage and checkpoint, so they add up to more than total.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from outrig.console import Reporter
from outrig.errors import ConfigError, OutrigError, PlanError
from outrig.hosts import gpu_health
from outrig.inventory import Host, HostBook
from outrig.journal import Journal
from outrig.moves import mark_moved
from outrig.ops.cleanup import cleanup_on
from outrig.ops.deploy import cached_models, deploy_on, plan_job
from outrig.ops.nodes import refuse_node_run
from outrig.ops.runs import pick_host_run
from outrig.ops.stage import NoCheckpoint, family, stage_on
from outrig.plan import Plan
from outrig.playbook import Job, find_playbook, load_job
from outrig.progress import argv_int
from outrig.recipes import ModelFacts
from outrig.redeploy.rebuild import Redeploy, rebuild
from outrig.redeploy.record import run_host
from outrig.session import HostSession, Project
from outrig.timing import MIGRATE_PROBE_PAUSE, TCP_PROBE_LIMIT, connect_timeout_for


def probe(project: Project, host_spec: str, reporter: Reporter, journal: Journal, *,
          attempts: int = 3, pause: float = MIGRATE_PROBE_PAUSE, host: Host | None = None
          ) -> tuple[HostSession | None, list[str]]:
    """Try to reach a box ``attempts`` times (with pauses) before concluding anything.

    Returns the box's session, open, when any attempt worked (migrate goes on using it), and
    the list of what was tried. ``attempts=0``: the caller has just confirmed the death
    (``watch`` does, with a fresh login); nothing is tried, not even the look from outside
    (:meth:`~outrig.transport.Transport.probe`), whose connect limit would only add to the
    recovery on a blackholed link.
    """
    if attempts <= 0:
        return None, ["not probed: the death was confirmed before the move"]
    session = HostSession(project, host_spec, reporter, journal,
                          host=host or HostBook(project.hosts_dir)(host_spec))
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
    # then the connector's look from outside, without a login (SSH: a fresh TCP connect)
    limit = min(connect_timeout_for(session.host, None)[0], TCP_PROBE_LIMIT)
    door = session.transport.peer_address()
    for seen in session.transport.probe(limit):
        if seen.signal == "tcp":
            tried.append(f"tcp {door.host}:{door.port}: " + (
                "port open, but SSH did not answer (sshd hung or the box is overloaded)"
                if seen.ok else seen.detail))
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


def choose_playbook(project: Project, to_spec: str, playbook: str, *, to_host: Host,
                    explicit: bool, journal: Journal, ranks: int | None = None,
                    from_host: Host | None = None,
                    jobs: Callable[[str], Job] | None = None) -> tuple[Plan, str, list[str]]:
    """The plan for NEW: ``playbook`` if it was named explicitly, else the member of its
    family that fits NEW and uses the most GPUs (ties: the playbook itself), among those
    whose trainer keeps the ``ranks`` of the run being moved.

    A fresh box has not got the model yet (stage copies it after this choice), so its layer
    count and vocabulary are taken from what OLD's box reported for the same model path
    (``from_host``), unless NEW itself reported them. Deploy reads them on NEW again.

    ``jobs``: a member (name or path) → its job (a move's: the run's playbook as deployed,
    with its params; :mod:`outrig.redeploy`); default: today's file.

    Returns the plan, the chosen member as a name or path that ``find_playbook`` accepts,
    and the names of every member considered.
    """
    known: dict[str, ModelFacts] = {}
    if from_host is not None:
        known.update(cached_models(journal, from_host))
    known.update(cached_models(journal, to_host))
    load = jobs or (lambda member: load_job(find_playbook(member, project.playbooks_dir)))

    def plan_for(member: str) -> Plan:
        return plan_job(load(member), to_host, journal, probed=known)

    if explicit:
        plan = plan_for(playbook)
        problem = rank_problem(ranks, plan, to_spec)
        if problem:
            raise PlanError([problem], context=f"migrate to {to_spec}")
        return plan, playbook, [plan.playbook]
    base = load(playbook)
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


def placement_rows(old: dict[str, Any] | None, new: Plan) -> list[list[str]]:
    """Each process's GPUs on the old box and on the new one (``—``: not on that box)."""
    old_procs = {p["name"]: p for p in ((old or {}).get("processes") or [])}

    def cell(gpus: list[int], parallel: Any) -> str:
        text = ",".join(str(g) for g in gpus) or "-"
        if parallel:
            text += f" (TP{parallel[0]}×DP{parallel[1]})"
        return text

    rows = []
    for name in dict.fromkeys([*old_procs, *new.order]):
        before = old_procs.get(name)
        after = new.processes.get(name)
        rows.append([name, cell(before["gpus"], before.get("parallel")) if before else "—",
                     cell(after.gpus, after.parallel) if after else "—"])
    return rows


def migrate(project: Project, from_spec: str | None, to_spec: str, reporter: Reporter, *,
            playbook: str | None = None, journal: Journal | None = None,
            probe_attempts: int = 3, probe_pause: float = MIGRATE_PROBE_PAUSE,
            run_id: str | None = None, params: dict[str, Any] | None = None,
            from_host: Host | None = None, book: HostBook | None = None) -> dict[str, Any]:
    """Move a job from OLD to NEW and resume it there (the runbook is this module's doc).

    OLD is ``from_host`` (a box already resolved: ``watch`` holds it), else ``from_spec``, else
    the host the journal files run ``run_id`` under; a box whose host file is gone is reached
    (or found dead) at the address the run's move record holds (:mod:`outrig.redeploy`). The
    run is deployed on NEW as it was deployed on OLD (its playbook as deployed, its
    ``--param`` and ``--test``); ``params`` given here win, and the success line names every
    difference.

    One session per box for the whole move: NEW's connection is opened once and every step
    (check, provision, stage, deploy) runs its core on it; OLD's session, when the probe
    reached it, serves the box-to-box copies and the stop of its run. ``book``: the
    command's hosts, each resolved once (NEW is resolved there)."""
    journal = journal or Journal()
    old_host, note = old_box(project, journal, from_spec, run_id, from_host)
    if note:
        reporter.info(f"• {note}")
    from_label = from_spec or old_host.name
    new_host = (book or HostBook(project.hosts_dir))(to_spec)
    if old_host.name == new_host.name:
        raise ConfigError("--from and --to name the same host")
    moving: dict[str, Any] | None = None
    with contextlib.suppress(ConfigError):  # no run to move: _move says so, after the probe
        moving, _ = old_run(journal, old_host.name, run_id=run_id, playbook=playbook)
    if moving is not None:  # one node of a multi-node job is not moved alone
        refuse_node_run(journal, str(moving.get("run_id")), what="migrate")
    report: dict[str, Any] = {"from": from_label, "to": to_spec, "started": time.time(),
                              "timings": {step: 0.0 for step in (*STEPS, "total")}}
    if probe_attempts > 0:
        reporter.info(f"• probing {from_label} (up to {probe_attempts} tries)")
    with timed(report, reporter, "probe"):
        old, tried = probe(project, from_label, reporter, journal, attempts=probe_attempts,
                           pause=probe_pause, host=old_host)
    report["old_alive"] = old is not None
    report["probes"] = tried
    for line in tried:
        reporter.info(f"    {line}")
    if old is None:
        reporter.warn(f"{from_label} is unreachable" + (f" after {len(tried)} checks"
                      if probe_attempts > 0 else "") + "; using the checkpoint mirror on "
                      "this workstation")
    new = HostSession(project, to_spec, reporter, journal, host=new_host)
    try:
        return _move(new, old, report, old_host, playbook=playbook, run_id=run_id,
                     params=params)
    finally:
        new.close()
        if old is not None:
            old.close()


def old_box(project: Project, journal: Journal, from_spec: str | None, run_id: str | None,
            from_host: Host | None) -> tuple[Host, str | None]:
    """OLD as a host, and a note when it comes from the journal (see :func:`migrate`)."""
    if from_host is not None:
        return from_host, None
    if from_spec is None:
        if run_id is None:
            raise ConfigError("migrate needs the run to move or its box: --run RUN (the "
                              "journal knows its box) or --from OLD, and --to NEW. Nothing "
                              "was sent.")
        record = journal.run(run_id)
        if record is None or not record.get("host"):
            raise ConfigError(f"the journal has no run {run_id}; see the runs it knows with "
                              "`outrig runs`, or name the old box with --from OLD. Nothing "
                              "was sent.")
        return run_host(HostBook(project.hosts_dir), journal, str(record["host"]), run_id)
    return run_host(HostBook(project.hosts_dir), journal, from_spec, run_id)


def _move(new: HostSession, old: HostSession | None, report: dict[str, Any], old_host: Host,
          *, playbook: str | None, run_id: str | None,
          params: dict[str, Any] | None) -> dict[str, Any]:
    """Steps 2 to 7 of the runbook on open sessions (``old`` is None when OLD is dead)."""
    project, reporter, journal = new.project, new.reporter, new.journal
    from_spec, to_spec = str(report["from"]), new.host_spec
    old_name = old_host.name
    last, why = old_run(journal, old_name, run_id=run_id, playbook=playbook)
    old_playbook = str(last["playbook"]) if last else None
    source = playbook or old_playbook
    if source is None:
        raise ConfigError(f"the journal has no run on {old_name}; pass --playbook")
    reporter.info(f"• moving {why}" if last else f"• no earlier run of {source} on "
                  f"{old_name} in the journal; {source} starts afresh")
    report["old_run"] = {"run_id": last.get("run_id") if last else None, "why": why}
    carried = _carried(project, last, playbook, params)
    for line in carried.notes if carried else []:
        reporter.info(f"• {line}")
    job = _prepare(new, carried.job if carried else _load(project, source, params), report)
    old_plan = last.get("plan") if last else None
    members: dict[str, tuple[Job, dict[str, Any]]] = {}

    def member(ref: str) -> Job:
        if carried is not None:
            members[ref] = carried.member(ref, project.playbooks_dir)
        else:
            members[ref] = (_load(project, ref, params), dict(params or {}))
        return members[ref][0]

    plan, new_playbook, considered = choose_playbook(
        project, to_spec, source, to_host=new.host, explicit=playbook is not None,
        journal=journal,
        ranks=trainer_ranks((old_plan or {}).get("processes")), from_host=old_host,
        jobs=member)
    if not reporter.json_mode:
        reporter.table("placement: old → new",
                       ["process", f"{old_name} ({(old_plan or {}).get('playbook', '?')})",
                        f"{new.host.name} ({plan.playbook})"],
                       placement_rows(old_plan, plan))
        if len(considered) > 1:
            reporter.info(f"• chose {plan.playbook} of family {family(job)} for {to_spec} "
                          f"(considered: {', '.join(considered)})")
    report["playbook"] = plan.playbook
    new_job, new_params = members[new_playbook]
    report["params"] = new_params
    report["differences"] = list(carried.notes) if carried else []
    refuse_unhealthy(plan, report.get("gpu_health") or [], to_spec)
    _carry_state(new, old, report, new_job, carried.job if carried else old_playbook,
                 old_playbook, provision=job if job.spec.environments else None)
    with timed(report, reporter, "deploy"):
        deployed = deploy_on(new, new_job, params=new_params)
    report["run_id"] = deployed.plan.run_id
    report["seconds"] = round(time.time() - float(report["started"]), 1)
    report["timings"]["total"] = report["seconds"]
    journal.record_run(deployed.plan.run_id, {"migrated_from": {
        "host": old_name, "run_id": last.get("run_id") if last else None,
        "playbook": old_playbook, "alive": report["old_alive"], "probes": report["probes"],
        "checkpoint": report["checkpoint"], "differences": report["differences"]}})
    mark_moved(journal, old_name, last.get("run_id") if last else None, new.host.name,
               deployed.plan.run_id, stopped=report.get("old_cleanup"))
    if reporter.json_mode:
        reporter.emit_json(report)
    else:
        reporter.success(success_line(report, plan.playbook, from_spec, to_spec))
    return report


def success_line(report: dict[str, Any], playbook: str, from_spec: str, to_spec: str) -> str:
    """``migrated P from OLD to NEW in Ns, resuming from checkpoint E (route), with steps=3000;
    differences: ...; probe 2.1s, ...``: what was moved, with what, and what differs from
    the run as it was deployed."""
    checkpoint = report["checkpoint"] or {}
    params = report.get("params") or {}
    with_params = (", with " + ", ".join(f"{k}={v}" for k, v in sorted(params.items()))
                   if params else "")
    resumed = (f"resuming from checkpoint {checkpoint.get('epoch')} "
               f"({checkpoint.get('route')})" if checkpoint else "starting afresh (no "
               "complete checkpoint)")
    differences = report.get("differences") or []
    return (f"migrated {playbook} from {from_spec} to {to_spec} in {report['seconds']:.0f}s, "
            f"{resumed}{with_params}; "
            + (f"differences: {'; '.join(differences)}; " if differences else
               "as deployed (same playbook, params and test mode); ")
            + describe_timings(report["timings"]))


def _carried(project: Project, last: dict[str, Any] | None, playbook: str | None,
             params: dict[str, Any] | None) -> Redeploy | None:
    """What the move deploys of the old run: its job as it was deployed, with its params and
    test mode; with ``--playbook``, that file as it is now, with the run's params and test
    mode (:func:`outrig.redeploy.rebuild.rebuild`). None when the journal knows no run."""
    if last is None:
        return None
    return rebuild(project.playbooks_dir, last, params=params, named=playbook)


def _load(project: Project, ref: str, params: dict[str, Any] | None) -> Job:
    """A playbook as today's file has it, with ``params`` (a move that carries no run)."""
    return load_job(find_playbook(ref, project.playbooks_dir), params=params or None)


def _prepare(new: HostSession, job: Job, report: dict[str, Any]) -> Job:
    """Preflight NEW (reach, python, GPUs; counted in the probe's time) and return the
    playbook being moved (``job``). Its environments are installed later, beside the staging
    (:func:`_carry_state`)."""
    with timed(report, new.reporter, "probe"):
        check = new.call("check", stream=False)
    gpus = (check.get("facts") or {}).get("gpus") or []
    new.reporter.info(f"• {new.host_spec}: python {check.get('python')}, {len(gpus)} GPU(s)"
                      + (f" × {gpus[0].get('memory_total_mib')} MiB" if gpus else ""))
    verdicts, _ = gpu_health.look(new.journal, new.host.name, check.get("facts") or {})
    report["gpu_health"] = verdicts
    return job


def refuse_unhealthy(plan: Plan, verdicts: list[dict[str, Any]], to_spec: str) -> None:
    """Stop the move before anything is staged or stopped when the plan for NEW gives a
    process a GPU that is ``bad`` there: the deploy at the end would refuse it, after the
    old run was stopped and the data copied."""
    needs = {g for p in plan.processes.values() for g in p.gpus}
    bad = [v for v in verdicts if v["verdict"] == gpu_health.BAD and v.get("index") in needs]
    if bad:
        raise OutrigError(
            f"{to_spec} is not fit for {plan.playbook}: "
            + "; ".join(gpu_health.summary(v) for v in bad)
            + ". Nothing was moved or stopped. Choose another --to box (outrig check --host "
            "BOX shows each GPU's health).")


def _carry_state(new: HostSession, old: HostSession | None, report: dict[str, Any],
                 new_playbook: Job, old_job: Job | str | None, old_playbook: str | None, *,
                 provision: Job | None = None) -> None:
    """Stage data on NEW and bring the newest complete checkpoint (OLD → NEW directly, or
    from the workstation's mirror), while NEW's environments install when ``provision`` names
    a playbook with environments. They do not depend on each other; deploy waits for both.

    Provision runs on a second session to NEW: a session's transport keeps per-connection
    state (reconnects, RTT, retries) without locks, so two threads never share one; with a
    warm connection both ride the same SSH connection. The first failure in either branch
    stops the other at its next step (nothing new starts: no stop of OLD's run, no
    checkpoint copy, no deploy), the running step ends, and that first failure is raised.
    ``old_job``: the old run's playbook (its job as deployed, or a name), whose paths are
    the ones to read on OLD; ``old_playbook``: the name its runs are filed under."""
    if provision is None:
        _stage_and_checkpoint(new, old, report, new_playbook, old_job, old_playbook, Overlap())
        return
    overlap = Overlap(("provision", "stage"))
    lock = threading.RLock()
    journal = SerialJournal(new.journal.root, lock)
    main_reporter, main_journal = new.reporter, new.journal
    old_reporter = old.reporter if old is not None else None
    new.reporter, new.journal = StepReporter(main_reporter, "stage", lock), journal
    if old is not None:
        old.reporter = StepReporter(main_reporter, "stage", lock)
    helper = HostSession(new.project, new.host_spec, StepReporter(main_reporter, "provision",
                                                                  lock), journal,
                         host=new.host)
    # A daemon: after Ctrl-C the move waits for provision's running install, and a second
    # Ctrl-C ends the command without it (the box finishes that install; a re-run resumes).
    worker = threading.Thread(target=overlap.branch, name="migrate-provision", daemon=True,
                              args=("provision", lambda: _provision(helper, provision, report)))
    worker.start()
    try:
        overlap.branch("stage", lambda: _stage_and_checkpoint(
            new, old, report, new_playbook, old_job, old_playbook, overlap))
    finally:
        worker.join()
        helper.transport.close()
        new.reporter, new.journal = main_reporter, main_journal
        if old is not None and old_reporter is not None:
            old.reporter = old_reporter
    overlap.raise_first(main_reporter)


def _provision(session: HostSession, job: Job, report: dict[str, Any]) -> None:
    """Step 4: make NEW's environments right (``inv provision``'s core)."""
    from outrig.ops.provision import provision_on

    with timed(report, session.reporter, "provision"):
        result = provision_on(session, job)
    report["provision"] = {"environments": result.environments,
                           "seconds": round(result.seconds, 2)}


def _stage_and_checkpoint(new: HostSession, old: HostSession | None, report: dict[str, Any],
                          new_playbook: Job, old_job: Job | str | None,
                          old_playbook: str | None, overlap: Overlap) -> None:
    """Steps 5 and 6: data, then (once provision succeeded, when OLD is alive) OLD's stop and
    the checkpoint."""
    with timed(report, new.reporter, "stage"):
        if _has_data(new_playbook, new.host):
            report["stage"] = stage_on(new, new_playbook, src=old,
                                       source_playbook=old_job, parts=("data",))
        else:
            report["stage"] = {"items": []}
    overlap.go_on("stage")
    if old is not None and old_playbook:
        overlap.wait_for("provision")  # OLD trains on until NEW is known to be ready
        with timed(report, new.reporter, "checkpoint"):
            new.reporter.info(f"• stopping {old_playbook} on {old.host_spec}")
            report["old_cleanup"] = cleanup_on(old, playbook=old_playbook)
    with timed(report, new.reporter, "checkpoint"):
        try:
            resumed = stage_on(new, new_playbook, src=old, resume=True,
                               source_playbook=old_job, parts=("checkpoint",))
            report["checkpoint"] = resumed.get("checkpoint")
        except NoCheckpoint as exc:
            new.reporter.warn(f"{exc} The trainer on {new.host_spec} starts from scratch.")
            report["checkpoint"] = None


class MoveStopped(OutrigError):
    """The other branch of a move failed, so this one starts nothing new."""


class Overlap:
    """Two branches of a move running at once: which have finished, and the first failure,
    which stops the other branch at its next step."""

    def __init__(self, branches: tuple[str, ...] = ()) -> None:
        self.branches = set(branches)  # the names that run; waiting for another returns at once
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.done: set[str] = set()
        self.failures: list[tuple[str, BaseException]] = []

    def branch(self, name: str, body: Callable[[], None]) -> None:
        """Run one branch, keeping its failure (the caller raises the first)."""
        try:
            body()
        except BaseException as exc:  # Ctrl-C in the main thread must stop the other too
            with self._changed:
                self.failures.append((name, exc))
                self._changed.notify_all()
            return
        with self._changed:
            self.done.add(name)
            self._changed.notify_all()

    def go_on(self, name: str) -> None:
        """Raise :class:`MoveStopped` when another branch failed: ``name`` starts nothing
        more."""
        with self._lock:
            if self.failures:
                raise MoveStopped(f"{name}: stopped because {self.failures[0][0]} failed")

    def wait_for(self, name: str) -> None:
        """Block until branch ``name`` finished (at once when it is not running), or raise
        :class:`MoveStopped` when a branch failed."""
        with self._changed:
            while True:
                if self.failures:
                    raise MoveStopped(f"stopped because {self.failures[0][0]} failed")
                if name in self.done or name not in self.branches:
                    return
                self._changed.wait()

    def raise_first(self, reporter: Reporter) -> None:
        """Raise the first real failure (a branch that merely stopped is not one); later ones
        are shown as warnings."""
        real = [(n, e) for n, e in self.failures if not isinstance(e, MoveStopped)]
        if not real:
            return
        for name, exc in real[1:]:
            reporter.warn(f"{name} failed as well: {exc}")
        raise real[0][1]


class StepReporter(Reporter):
    """A reporter's output for one of two steps running at once: each line starts with the
    step's name, and the two never write at the same moment (they share ``lock``); the one
    live status line shows whichever step spoke last."""

    def __init__(self, parent: Reporter, step: str, lock: threading.RLock) -> None:
        super().__init__(json_mode=parent.json_mode, out=parent.out, quiet=parent.quiet,
                         gpu_table=parent.gpu_table)
        self.console, self.stdout_console = parent.console, parent.stdout_console
        self.parent, self.step, self.lock = parent, step, lock

    def info(self, message: str) -> None:
        with self.lock:
            self.parent.info(f"[{self.step}] {message}")

    def warn(self, message: str) -> None:
        with self.lock:
            self.parent.warn(f"[{self.step}] {message}")

    def success(self, message: str) -> None:
        with self.lock:
            self.parent.success(f"[{self.step}] {message}")

    def live(self, text: str) -> None:
        with self.lock:
            self.parent.live(f"[{self.step}] {text}")

    def lines(self, lines: list[str]) -> None:
        with self.lock:
            self.parent.lines([f"[{self.step}] {line}" for line in lines])

    def emit_json(self, document: Any) -> None:
        with self.lock:
            self.parent.emit_json({**document, "branch": self.step}
                                  if isinstance(document, dict) else document)

    def close(self) -> None:
        """The parent's status line belongs to the parent."""


class SerialJournal(Journal):
    """The journal for two branches at once: its read-modify-write updates one at a time."""

    def __init__(self, root: Any, lock: threading.RLock) -> None:
        super().__init__(root)
        self.lock = lock

    def update_host(self, host: str, **facts: Any) -> None:
        with self.lock:
            super().update_host(host, **facts)

    def record_run(self, run_id: str, record: dict[str, Any]) -> None:
        with self.lock:
            super().record_run(run_id, record)

    def reconcile(self, host: str, box_runs: list[dict[str, Any]]) -> list[str]:
        with self.lock:
            return super().reconcile(host, box_runs)


@contextmanager
def timed(report: dict[str, Any], reporter: Reporter, step: str) -> Iterator[None]:
    """Add the seconds ``step`` takes to ``report["timings"]`` and say when it starts and
    ends (``migrate_step`` JSON events, in the order they happen)."""
    started = time.monotonic()
    reporter.emit_json({"event": "migrate_step", "step": step, "state": "started"})
    state = "failed"
    try:
        yield
        state = "done"
    finally:
        seconds = time.monotonic() - started
        timings = report.setdefault("timings", {})
        timings[step] = round(float(timings.get(step, 0.0)) + seconds, 2)
        reporter.emit_json({"event": "migrate_step", "step": step, "state": state,
                            "seconds": round(seconds, 2)})


def describe_timings(timings: dict[str, Any]) -> str:
    """``probe 2.1s, provision 41.0s, stage 12.3s, checkpoint 3.2s, deploy 8.0s`` (the steps
    that took time, in the runbook's order)."""
    parts = [f"{step} {float(timings[step]):.1f}s" for step in STEPS if timings.get(step)]
    return ", ".join(parts)


STEPS = ("probe", "provision", "stage", "checkpoint", "deploy")


def old_run(journal: Journal, host: str, *, run_id: str | None,
            playbook: str | None) -> tuple[dict[str, Any] | None, str]:
    """The run being moved (see :func:`outrig.ops.runs.pick_host_run`) and why it was
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


def _has_data(job: Job, host: Host) -> bool:
    from outrig.ops.stage import stage_items

    return any(i.kind != "checkpoints" for i in stage_items(job, host))
