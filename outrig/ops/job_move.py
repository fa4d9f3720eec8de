"""A multi-node job moved as one job: ``migrate --run JOB --to a,b``, ``watch --run JOB
--spare a,b`` (or ``--spare auto``) and ``sync-checkpoints --run JOB``.

A job of N nodes is moved as a whole to N fresh boxes, never node by node: torch's
rendezvous ties the nodes together (a replacement node cannot join ranks that sit in a
collective of the old world, and elastic torchrun loses jobs when a node goes: pytorch
issues 67742, 182221), so the move is a checkpoint restart of the whole job, exactly what a
one-box move is (docs/scale-out.md, "Moving a job"). In order:

1. Bad input first, before anything is stopped or started: ``--to`` names exactly as many
   boxes as the job has nodes, each a different box and none of the job's own; every new
   box is planned (reached, its GPUs checked against the job as deployed).
2. The job is rebuilt from node 0's move record (:mod:`outrig.redeploy`): the playbook as
   deployed, its ``--param`` values and ``--test``.
3. The old nodes are probed (a node the watch confirmed dead is not).
4. Every new node is made ready as a one-box ``migrate`` makes its new box, all at once
   (:mod:`outrig.ops.job_prepare`): the playbook's environments installed and its data
   staged (box to box from the old node of the same rank when it answers). The old job
   trains on meanwhile; a box that cannot be made ready ends the move with nothing stopped.
5. Each old node that still answers is fenced: its run stopped by the process groups its
   box recorded (``cleanup_on`` with the node's run id), nothing else on the box.
6. Global rank 0 writes the checkpoints, on one node's disk (node 0 with a static
   rendezvous; with c10d the node torch ranked first): the old nodes that answer are synced
   into the workstation's mirror (after the fence: the last save is final), and a dead one
   contributes what the last sync took (``watch`` syncs as it goes). Nothing is needed from
   a dead box.
7. The newest complete checkpoint in the mirror is pushed to every new node's save path
   (the same one on each: every rank resumes from its own node's copy).
8. The job is deployed on the new boxes, node 0 first: a new job id, the rendezvous re-made
   with the new node 0 as the master address; each node's run records the run it continues
   (``migrated_from``) and each old run its successor (``moved_to``), so ``report``,
   ``metrics`` and ``plot`` draw the job's curve across the move.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from outrig.console import Reporter
from outrig.errors import ConfigError, OutrigError
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.moves import mark_moved
from outrig.ops.cleanup import cleanup_on
from outrig.ops.job_prepare import needs_preparing, prepare_nodes
from outrig.ops.migrate import probe
from outrig.ops.nodes import (
    STOP_TIMEOUT,
    JobOrigin,
    NodeRun,
    NodesFailed,
    deploy_nodes,
    find_job,
    node_run_id,
    on_every_node,
    plan_nodes,
)
from outrig.ops.nodes_watch import watch_nodes
from outrig.ops.stage import NoCheckpoint, stage_items, stage_on, sync_checkpoints_on
from outrig.playbook import Job
from outrig.redeploy.rebuild import Redeploy, rebuild
from outrig.redeploy.record import run_host
from outrig.session import HostSession, Project
from outrig.timing import MIGRATE_PROBE_PAUSE

Send = Callable[..., Any]


def split_hosts(values: Sequence[str] | str | None) -> list[str]:
    """``--to a,b`` / ``--spare a --spare b,c`` as a list of host specs, in order."""
    given = [values] if isinstance(values, str) else list(values or [])
    return [part.strip() for value in given for part in value.split(",") if part.strip()]


def recorded_job(journal: Journal, ident: str, *,
                 movable: bool = False) -> tuple[str, list[NodeRun]]:
    """The job id and nodes ``ident`` names (a job id or one node's run id). ``movable``:
    refuse a job that was moved already (its successor is the job now; moving the old one
    again would start a second copy of it)."""
    found = find_job(journal, ident)
    if found is None:
        raise ConfigError(f"--run {ident}: the journal has no multi-node job of that id; "
                          "`outrig runs` lists the jobs it knows. Nothing was stopped or "
                          "started.")
    record, nodes = found
    job_id = str(record.get("job_id"))
    moved = record.get("moved_to")
    if movable and isinstance(moved, dict):
        raise ConfigError(
            f"--run {ident}: job {job_id} was moved to {','.join(moved.get('hosts') or [])} "
            f"as job {moved.get('job_id')}; that job is the one to move or watch now (--run "
            f"{moved.get('job_id')}). Nothing was stopped or started.")
    return job_id, nodes


def check_targets(project: Project, job_id: str, nodes: Sequence[NodeRun],
                  to: Sequence[str], flag: str, *, pool: bool = False,
                  book: HostBook | None = None) -> list[str]:
    """The new boxes, checked before anything is sent: as many as the job has nodes (``pool``:
    at least as many; a watch's spares, the first N taken at each move), each a different
    box, none one of the job's own boxes. A ConfigError (exit 2) names the flag.
    ``book``: the command's hosts, each resolved once."""
    book = book or HostBook(project.hosts_dir)
    hosts = list(to)
    if len(hosts) < len(nodes) or (len(hosts) > len(nodes) and not pool):
        exactly = "at least" if pool else "exactly"
        raise ConfigError(
            f"{flag} names {len(hosts)} box(es) ({', '.join(hosts) or 'none'}), but job "
            f"{job_id} runs on {len(nodes)} nodes ({', '.join(n.host for n in nodes)}); a job "
            f"moves as a whole, so name {exactly} {len(nodes)} boxes, new node 0 first "
            f"(e.g. {flag} {','.join(f'spare{n.rank}' for n in nodes)}). Nothing was stopped "
            "or started.")
    boxes: dict[tuple[str, int | None, str], str] = {}
    for spec in hosts:
        host = book(spec)
        key = (host.hostname, host.port, host.workdir)
        if key in boxes:
            raise ConfigError(f"{flag}: {boxes[key]} and {spec} are the same box "
                              f"({host.describe()}, workdir {host.workdir}); each node needs "
                              "a box of its own. Nothing was stopped or started.")
        boxes[key] = spec
        if spec in {n.host for n in nodes} or host.name in {n.host for n in nodes}:
            raise ConfigError(f"{flag}: {spec} is a node of job {job_id} already; move the "
                              "job to fresh boxes. Nothing was stopped or started.")
    return hosts


@dataclass
class JobMoveOptions:
    """How a move goes: ``params`` (``--param``, winning over the job's own), how often
    each old node is probed, and which ranks the watch already confirmed dead (not
    probed)."""

    params: dict[str, Any] | None = None
    probe_attempts: int = 3
    probe_pause: float = MIGRATE_PROBE_PAUSE
    dead: frozenset[int] = frozenset()


@dataclass
class _OldNode:
    node: NodeRun
    session: HostSession | None = None
    tried: list[str] = field(default_factory=list)
    fenced: dict[str, Any] | None = None


def move_job(project: Project, ident: str, to: Sequence[str], reporter: Reporter, *,
             journal: Journal | None = None,
             options: JobMoveOptions | None = None) -> dict[str, Any]:
    """Move job ``ident`` to the boxes ``to`` (node 0 first) and resume it there from the
    newest complete checkpoint, as it was deployed (this module's doc gives the order).
    Returns the report: old and new job ids, hosts, the checkpoint, what was fenced, the
    notes that say how the job differs from the one deployed."""
    journal = journal or Journal()
    options = options or JobMoveOptions()
    started = time.monotonic()
    job_id, nodes = recorded_job(journal, ident, movable=True)
    book = HostBook(project.hosts_dir)
    hosts = check_targets(project, job_id, nodes, to, "--to", book=book)
    head = journal.run(nodes[0].run_id)
    if head is None:
        raise ConfigError(f"the journal has no record of {nodes[0].run_id}, node 0 of job "
                          f"{job_id}, so the job cannot be deployed again as it was. Deploy "
                          "the playbook afresh on the new boxes. Nothing was stopped or started.")
    redeploy = rebuild(project.playbooks_dir, head, params=options.params)
    job = redeploy.job
    reporter.info(f"• moving job {job_id} ({job.name}, {len(nodes)} nodes) to "
                  f"{', '.join(hosts)}")
    new = [HostSession(project, h, reporter, journal, host=book(h)) for h in hosts]
    olds = [_OldNode(n) for n in nodes]
    try:
        _preflight(new, job, nodes)
        _probe_old(project, olds, reporter, journal, options)
        prepared = _prepare(project, hosts, new[0], olds, job, reporter, journal)
        _fence(olds, reporter, job_id)
        checkpoint = _carry_checkpoint(new, olds, job, reporter)
        origin = JobOrigin(
            job={"job_id": job_id, "hosts": [n.host for n in nodes], "at": time.time(),
                 "checkpoint": checkpoint},
            runs={o.node.rank: {"run_id": o.node.run_id, "host": o.node.host,
                                "checkpoint": checkpoint} for o in olds})
    finally:
        for session in [*new, *(o.session for o in olds if o.session is not None)]:
            session.close()
    try:
        result = deploy_nodes(project, hosts, job, reporter, journal=journal,
                              params=redeploy.params, moved=origin, book=book)
    except NodesFailed as exc:
        raise NodesFailed(
            f"{exc} The move of job {job_id} ended there: its old nodes are stopped and its "
            "checkpoint is in this workstation's mirror; move it again (`outrig migrate --run "
            f"{job_id} --to A,B`, other boxes if one of these is at fault).") from exc
    for old in olds:
        old_host = str((journal.run(old.node.run_id) or {}).get("host") or old.node.host)
        mark_moved(journal, old_host, old.node.run_id, hosts[old.node.rank],
                   node_run_id(result.job_id, old.node.rank), stopped=old.fenced)
    journal.record_job(job_id, {"status": "moved", "moved_to": {
        "job_id": result.job_id, "hosts": hosts, "at": time.time()}})
    report = _report(job_id, result.job_id, nodes, hosts, olds, checkpoint, redeploy,
                     time.monotonic() - started)
    report["prepared"] = prepared
    if reporter.json_mode:
        reporter.emit_json({"event": "job_moved", **report})
    else:
        reporter.success(success_line(report, job.name))
    return report


def _preflight(new: Sequence[HostSession], job: Job, nodes: Sequence[NodeRun]) -> None:
    """Every new box reached and planned for the job as deployed (its GPUs, python, paths)
    before anything old is touched: a plan problem is a :class:`~outrig.errors.PlanError`
    naming the node, and nothing was stopped."""
    placed = [NodeRun(n.rank, s.host_spec, node_run_id("preflight", n.rank))
              for n, s in zip(nodes, new, strict=True)]
    plan_nodes(new, job, placed, "preflight")


def _probe_old(project: Project, olds: Sequence[_OldNode], reporter: Reporter,
               journal: Journal, options: JobMoveOptions) -> None:
    """Probe every old node at once (a dead one costs the probe's pauses; they overlap). A
    node the caller confirmed dead is not probed."""

    def one(old: _OldNode) -> None:
        if old.node.rank in options.dead:
            old.tried = ["not probed: the watch confirmed it dead"]
            return
        try:
            host, _ = run_host(HostBook(project.hosts_dir), journal, old.node.host,
                               old.node.run_id)
        except ConfigError as exc:
            old.tried = [f"no address for it: {exc}"]
            return
        old.session, old.tried = probe(project, old.node.host, reporter, journal,
                                       attempts=max(1, options.probe_attempts),
                                       pause=options.probe_pause, host=host)

    on_every_node(one, olds, lambda o: f"probe {o.node.host}")
    for old in olds:
        state = "answers" if old.session is not None else "is unreachable"
        reporter.info(f"• {old.node.label()} {state} ({'; '.join(old.tried)})")


def _prepare(project: Project, hosts: Sequence[str], first: HostSession,
             olds: Sequence[_OldNode], job: Job, reporter: Reporter,
             journal: Journal) -> list[dict[str, Any]]:
    """Every new node given the job's environments and data (:mod:`outrig.ops.
    job_prepare`), while the old nodes still run: a box that cannot be made ready ends the
    move before anything old is stopped."""
    if not any(needs_preparing(job, first)):
        return []
    return prepare_nodes(project, hosts, job, reporter, journal=journal,
                         sources=[o.session for o in olds])


def _fence(olds: Sequence[_OldNode], reporter: Reporter, job_id: str) -> None:
    """Stop the job's run on every old node that answers, by its recorded process groups
    (never by name). One that answers but cannot be stopped ends the move before anything
    starts: two copies of the job would train."""
    for old in olds:
        if old.session is None:
            continue
        try:
            old.fenced = cleanup_on(old.session, run_id=old.node.run_id,
                                    timeout=STOP_TIMEOUT, missing_ok=True)
        except OutrigError as exc:
            raise OutrigError(
                f"{old.node.label()} answers but its run {old.node.run_id} could not be "
                f"stopped ({exc}); nothing was started on the new boxes. Stop it with "
                f"`outrig cleanup --run {job_id}` and move the job again.") from exc
        procs = [p for r in old.fenced.get("runs") or [] for p in r.get("processes") or []]
        stopped = sum(1 for p in procs if p.get("how") not in ("gone", "reused"))
        reporter.info(f"• fenced {old.node.label()}: run {old.node.run_id}, {stopped} "
                      f"process(es) stopped, {len(procs) - stopped} had ended already")


def _carry_checkpoint(new: Sequence[HostSession], olds: Sequence[_OldNode], job: Job,
                      reporter: Reporter) -> dict[str, Any] | None:
    """Rank 0's newest complete checkpoint onto every new node's save path: the old nodes
    that answer are mirrored first (after the fence, so their last save is final), then the
    mirror's newest is pushed to each new node. None when the job keeps no checkpoints or
    none exists (it starts afresh, and a warning says so)."""
    if not any(i.kind == "checkpoints" for i in stage_items(job, new[0].host)):
        reporter.warn(f"{job.name} names no checkpoints to carry (a stage: item of kind "
                      "checkpoints, or the recipe's save_path): the job starts afresh")
        return None
    alive = [o for o in olds if o.session is not None]
    for old in alive:
        assert old.session is not None
        sync_checkpoints_on(old.session, run_id=old.node.run_id, as_deployed=job)
    if len(alive) < len(olds):
        reporter.warn(", ".join(o.node.label() for o in olds if o.session is None)
                      + " unreachable: what it last held is taken from the mirror (the last "
                      "sync-checkpoints or watch's look)")
    carried: dict[str, Any] | None = None
    for session in new:
        try:
            staged = stage_on(session, job, resume=True, parts=("checkpoint",))
        except NoCheckpoint as exc:
            reporter.warn(f"{exc} The job starts afresh on the new boxes.")
            return None
        carried = staged.get("checkpoint") or carried
    return carried


def _report(job_id: str, new_id: str, nodes: Sequence[NodeRun], hosts: Sequence[str],
            olds: Sequence[_OldNode], checkpoint: dict[str, Any] | None, redeploy: Redeploy,
            seconds: float) -> dict[str, Any]:
    return {"from_job": job_id, "to_job": new_id, "from": [n.host for n in nodes],
            "to": list(hosts), "checkpoint": checkpoint, "params": dict(redeploy.params),
            "test": redeploy.test, "differences": list(redeploy.notes),
            "old_nodes": [{"rank": o.node.rank, "host": o.node.host, "alive": o.session
                           is not None, "probes": o.tried, "fenced": o.fenced is not None}
                          for o in olds],
            "seconds": round(seconds, 2)}


def success_line(report: dict[str, Any], playbook: str) -> str:
    """``moved job J (P, 2 nodes) from a,b to c,d as job K in 41s, resuming from checkpoint
    2 (mirror), with lr=0.25; as deployed (...)``."""
    checkpoint = report.get("checkpoint") or {}
    resumed = (f"resuming from checkpoint {checkpoint.get('epoch')} (mirror)" if checkpoint
               else "starting afresh (no complete checkpoint)")
    params = report.get("params") or {}
    with_params = (", with " + ", ".join(f"{k}={v}" for k, v in sorted(params.items()))
                   if params else "")
    fenced = [f"node {o['rank']}" for o in report["old_nodes"] if o["fenced"]]
    differences = report.get("differences") or []
    return (f"moved job {report['from_job']} ({playbook}, {len(report['to'])} nodes) from "
            f"{','.join(report['from'])} to {','.join(report['to'])} as job "
            f"{report['to_job']} in {report['seconds']:.0f}s, {resumed}{with_params}; "
            + (f"fenced {', '.join(fenced)}; " if fenced else "")
            + (f"differences: {'; '.join(differences)}" if differences else
               "as deployed (same playbook, params and test mode)")
            + f". Next: outrig status --run {report['to_job']}")


# ------------------------------------------------------------------------ sync-checkpoints


def sync_job_checkpoints(project: Project, ident: str, reporter: Reporter, *,
                         journal: Journal | None = None) -> dict[str, Any]:
    """``sync-checkpoints --run JOB``: the job's complete checkpoints into the mirror, read
    at the save path of the job as it was deployed. Global rank 0 writes them, on one node's
    disk: node 0 with a static rendezvous, with c10d the node torch ranked first (not
    necessarily node 0; docs/scale-out.md, "Checkpoints"), so every node that answers is
    read, and the mirror's rule (only a newer state replaces one) keeps the newest. A node
    that does not answer is named; none answering is an error."""
    journal = journal or Journal()
    job_id, nodes = recorded_job(journal, ident)
    record = journal.run(nodes[0].run_id)
    if record is None:
        raise ConfigError(f"the journal has no record of {nodes[0].run_id}, node 0 of job "
                          f"{job_id}; its checkpoints cannot be located")
    job = rebuild(project.playbooks_dir, record).job
    pulled: list[dict[str, Any]] = []
    missed: list[str] = []
    for node in nodes:
        try:
            host, note = run_host(HostBook(project.hosts_dir), journal, node.host,
                                  node.run_id)
            if note:
                reporter.info(f"• {note}")
            session = HostSession(project, node.host, reporter, journal, host=host)
            try:
                reporter.info(f"• job {job_id}: checkpoints of {node.label()}")
                done = sync_checkpoints_on(session, run_id=node.run_id, as_deployed=job)
            finally:
                session.close()
        except OutrigError as exc:
            missed.append(f"{node.label()}: {exc}")
            reporter.warn(f"{node.label()}: checkpoints not read: {exc}")
            continue
        pulled += [{**p, "node_rank": node.rank} for p in done.get("pulled") or []]
    if len(missed) == len(nodes):
        raise OutrigError(f"no node of job {job_id} could be read ({'; '.join(missed)}); the "
                          "mirror keeps what it held. Run it again once a node answers.")
    return {"job_id": job_id, "pulled": pulled, "missed": missed}


# ------------------------------------------------------------------------ watch --spare


MIRROR_EVERY = 30.0  # seconds between the watch's syncs of rank 0's checkpoints


class SpareMover:
    """``watch --run JOB --spare ...``: the guard's mover (:class:`outrig.ops.nodes_watch.
    NodeMover`). Each look, at most every ``mirror_every`` seconds, mirrors the job's new
    complete checkpoints (so a dead rank-0 node loses at most the work since); a node lost moves
    the job to the spares (``auto``: N boxes rented through the provider of ``spares:``)."""

    def __init__(self, project: Project, job_id: str, spares: list[str], reporter: Reporter,
                 journal: Journal, send: Send, *, mirror_every: float = MIRROR_EVERY) -> None:
        self.project, self.job_id, self.spares = project, job_id, spares
        self.reporter, self.journal, self.send = reporter, journal, send
        self.mirror_every = mirror_every
        self.synced_at: float | None = None
        self.report: dict[str, Any] | None = None

    def look(self) -> None:
        now = time.monotonic()
        if self.synced_at is not None and now - self.synced_at < self.mirror_every:
            return
        self.synced_at = now
        quiet = Reporter(json_mode=self.reporter.json_mode, out=self.reporter.out, quiet=True)
        try:
            sync_job_checkpoints(self.project, self.job_id, quiet, journal=self.journal)
        except OutrigError as exc:  # a slow or gone node 0: the next look tries again
            self.reporter.warn(f"job {self.job_id}: checkpoints not mirrored this time: {exc}")

    def move(self, lost: list[NodeRun]) -> dict[str, Any]:
        dead = frozenset(n.rank for n in lost)
        _, nodes = recorded_job(self.journal, self.job_id)
        self.reporter.warn(", ".join(n.label() for n in lost) + " lost: moving job "
                           f"{self.job_id} to " + ("rented spares" if self.auto()
                                                   else ", ".join(self.spares[:len(nodes)])))
        self.send("node_lost", job_id=self.job_id, nodes=[n.to_json() for n in lost])
        try:
            hosts = self._rent(nodes) if self.auto() else self.spares[:len(nodes)]
        except OutrigError as exc:
            raise OutrigError(
                f"job {self.job_id}: {', '.join(n.label() for n in lost)} lost, and the "
                f"{len(nodes)} spares could not be rented ({exc}); every box rented for it was "
                "released and nothing was stopped. Move the job with `outrig migrate --run "
                f"{self.job_id} --to A,B` or stop it with `outrig cleanup --run "
                f"{self.job_id}`.") from exc
        try:
            self.report = move_job(self.project, self.job_id, hosts, self.reporter,
                                   journal=self.journal,
                                   options=JobMoveOptions(probe_attempts=1, dead=dead))
        except OutrigError:
            if self.auto():
                self._release(nodes, hosts)
            raise
        self.send("job_moved", job_id=self.job_id, to_job=self.report["to_job"],
                  to=self.report["to"])
        return self.report

    def auto(self) -> bool:
        from outrig.providers.spares import AUTO

        return self.spares == [AUTO]

    def _rent(self, nodes: Sequence[NodeRun]) -> list[str]:
        from outrig.providers.spares import rent_spare

        playbook = (self.journal.job(self.job_id) or {}).get("playbook")
        rented: list[str] = []
        try:
            for node in nodes:  # one rent per node: the lock of one death is the node's run
                name = rent_spare(self.project, self.journal, self.send, node.host,
                                  node.run_id, str(playbook) if playbook else None)
                if name is None:
                    raise OutrigError(f"no spare was rented for {node.label()}")
                rented.append(name)
        except OutrigError:
            self._release(nodes[:len(rented)], rented)
            raise
        return rented

    def _release(self, nodes: Sequence[NodeRun], hosts: Sequence[str]) -> None:
        from outrig.providers.spares import release_unused

        for node, host in zip(nodes, hosts, strict=False):
            release_unused(self.project, self.journal, self.send, host, node.run_id)


def check_spares(project: Project, ident: str, spares: list[str],
                 journal: Journal | None = None) -> list[str]:
    """``watch --run JOB --spare``'s spares checked before the watch starts: ``auto``
    alone, or as many boxes as the job has nodes (ConfigError, exit 2)."""
    from outrig.providers.spares import AUTO

    journal = journal or Journal()
    job_id, nodes = recorded_job(journal, ident, movable=True)
    if AUTO in spares:
        if spares != [AUTO]:
            raise ConfigError("--spare auto rents every spare the job needs; give it alone, "
                              "not beside named boxes. Nothing was started.")
        return spares
    return check_targets(project, job_id, nodes, spares, "--spare", pool=True)


def watch_job(project: Project, ident: str, spares: list[str], reporter: Reporter, *,
              send: Send, threshold: float, period: float = 5.0,
              journal: Journal | None = None,
              stop: threading.Event | None = None) -> dict[str, Any]:
    """``watch --run JOB --spare ...``: the job's guard (:func:`outrig.ops.nodes_watch.
    watch_nodes`) with the mirror kept up and, when a node is lost, the job moved to the
    spares; then the moved job is followed the same way, for as long as spares last:
    ``auto`` rents N boxes at every move; a list gives each move its first N boxes not used
    yet. Once fewer than N are left, the job is followed without spares (a node failing
    then stops the others), and a warning says so. Returns the last job's outcome, with
    ``moved`` (the last move's report) and ``moves`` (every one, in order)."""
    journal = journal or Journal()
    job_id, nodes = recorded_job(journal, ident)
    pool = check_spares(project, job_id, spares, journal)
    moves: list[dict[str, Any]] = []
    while True:
        mover = (SpareMover(project, job_id, pool, reporter, journal, send)
                 if pool else None)
        outcome = watch_nodes(project, job_id, reporter, period=period, threshold=threshold,
                              journal=journal, stop=stop, mover=mover)
        if mover is None or mover.report is None:
            return {**outcome, **({"moved": moves[-1], "moves": moves} if moves else {})}
        moves.append(mover.report)
        job_id = str(mover.report["to_job"])
        pool = left_after(pool, mover.report["to"], len(nodes))
        if not pool:
            reporter.warn(f"the spares are spent: job {job_id} is watched without them, so a "
                          "node failing now stops the job (give more with `outrig watch "
                          f"--run {job_id} --spare A,B`, or --spare auto)")
            send("spares_spent", job_id=job_id)


def left_after(pool: Sequence[str], used: Sequence[str], nodes: int) -> list[str]:
    """The spares a watch keeps for its next move: ``auto`` stays ``auto``; of a list, the
    boxes the move did not take, when they are still enough for a job of ``nodes``."""
    from outrig.providers.spares import AUTO

    if list(pool) == [AUTO]:
        return [AUTO]
    left = [h for h in pool if h not in used]
    return left if len(left) >= nodes else []
