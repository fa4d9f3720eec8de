"""Multi-node jobs: one playbook's run on several boxes at once, tied together by a job id.

A playbook with ``nodes: N`` (or a list of N hosts) runs on N boxes; each box is one node and
gets its own plan, with ``${node_rank}`` (0..N-1), ``${nnodes}``, ``${head_host}`` (how the
others reach node 0), ``${rdzv_port}`` and ``${job_id}`` (shared). Torch's own rendezvous
(``torchrun --rdzv-backend c10d``) does the distributed work; outrig starts, watches and
stops it:

* :func:`deploy_nodes` plans every node first (each node's GPUs checked against that node's
  facts; nothing is started when any plan has a problem), launches node 0 (the rendezvous
  host), the parts of a server spanning nodes once node 0's first process is (``Plan.
  launch_with_head``), the others once every process of node 0 is, and waits until
  every node is ready. When a node fails to launch or to become ready, the deploy calls still
  waiting are cancelled (their boxes stop what they launched) and every node's run is stopped
  by its recorded process groups (``cleanup``), and the error says which node failed and why.
* :mod:`outrig.ops.node_control` covers every node of a job for ``status``, ``cleanup --run``
  and ``tail-logs``.
* :func:`outrig.ops.nodes_watch.watch_nodes` is the workstation-side guard once the job is
  up: it asks every node for its run's state each period and, when one node's processes fail
  (or the node stops answering for the threshold), stops the others and says which node
  failed and why. A peer failure does not always end the other nodes by itself: their ranks
  may sit in a collective until the process group's timeout (tests/standins/fake_torchrun.py
  lists torch's rules).

The journal keeps one record per job (``jobs/<job_id>.json``: playbook, nodes with rank, host
and run id) and one run record per node, whose run id is ``<job_id>-node<rank>``; each node's
run record carries ``job_id`` and ``node_rank``, so one box's commands still see a node's run
as an ordinary run of that box.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from outrig.agent.client import CANCEL_LINE, AgentCall, raise_for_result
from outrig.console import Reporter, describe_event
from outrig.errors import ConfigError, Interrupted, OutrigError, PlanError
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup_on
from outrig.ops.deploy import deploy_request, deployed_status, plan_on
from outrig.ops.node_checks import check_checkpoints_agree, check_gpu_counts
from outrig.ops.runs import new_run_id, secret_values
from outrig.plan import NodePlace, Plan
from outrig.playbook import Job
from outrig.redeploy.record import RECORD_KEY, move_record
from outrig.session import HostSession, Project, remember_facts

NODE_SUFFIX = "-node"
Item = TypeVar("Item")
STOP_TIMEOUT = 60.0  # seconds each node's cleanup may wait for its GPUs to come back


class NodesFailed(OutrigError):
    """A node of a multi-node job failed (to launch, to become ready, or later); the other
    nodes were stopped. The message names the node and the reason."""


@dataclass(frozen=True)
class NodeRun:
    """One node of a job: its rank, its host (as ``--host`` names it) and its run id there."""

    rank: int
    host: str
    run_id: str

    def label(self) -> str:
        return f"node {self.rank} ({self.host})"

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "run_id": self.run_id}


@dataclass
class NodesResult:
    """What :func:`deploy_nodes` did: the job id, each node's plan and deploy answer."""

    job_id: str
    nodes: list[NodeRun]
    plans: list[Plan]
    launched: bool
    status: str = "planned"
    processes: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass(frozen=True)
class JobOrigin:
    """Where a moved job came from: the job record's ``migrated_from`` (``job``) and each
    new node's (``runs``, by rank: the old node's run, which ``report``'s chain follows)."""

    job: dict[str, Any]
    runs: dict[int, dict[str, Any]]


def on_every_node(work: Callable[[Item], None], items: Sequence[Item],
                  name: Callable[[Item], str]) -> None:
    """``work`` on every item at once, a thread each (named ``outrig-<name(item)>``), and
    back when all are done: a node's box costs round trips that the others need not wait
    for. ``work`` keeps its own results and errors (each op reports them its own way)."""
    threads = [threading.Thread(target=work, args=(item,), daemon=True,
                                name=f"outrig-{name(item)}") for item in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def node_run_id(job_id: str, rank: int) -> str:
    """The run id of node ``rank`` of job ``job_id`` on its box."""
    return f"{job_id}{NODE_SUFFIX}{rank}"


# ------------------------------------------------------------------------------ selection


def select_nodes(project: Project, job: Job, selection: Sequence[str], *,
                 placed: bool = False, book: HostBook | None = None) -> list[str]:
    """The hosts of the job's nodes, node 0 first, from the ``--host`` selection (already
    expanded, in order) and the playbook's ``nodes:``. Raises :class:`ConfigError` naming the
    file, the key and the fix when they disagree, or when one box would be two nodes.
    ``placed``: the selection is a move's new boxes, which the playbook's list never names.
    ``book``: the command's hosts, each resolved once."""
    book = book or HostBook(project.hosts_dir)
    spec, where = job.spec, job.where(("nodes",))
    listed = [] if placed else list(spec.node_hosts or [])
    chosen = list(selection)
    if listed and chosen and sorted(listed) != sorted(chosen):
        raise ConfigError(
            f"{where}: the playbook's nodes are {', '.join(listed)} but --host selected "
            f"{', '.join(chosen)}; drop --host (the playbook's list is used, node 0 first) or "
            "select exactly those hosts. Nothing was sent.")
    hosts = listed or chosen
    if len(hosts) != spec.nodes:
        raise ConfigError(
            f"{where}: the job spans nodes: {spec.nodes}, but --host selected {len(hosts)} "
            f"host(s) ({', '.join(hosts) or 'none'}); select exactly {spec.nodes} hosts, node "
            "0 (the rendezvous host) first, or change nodes:. Nothing was sent.")
    twice = sorted({h for h in hosts if hosts.count(h) > 1})
    if twice:
        raise ConfigError(f"--host names {', '.join(twice)} twice; each node of {job.name} "
                          "must be a different host. Nothing was sent.")
    boxes: dict[tuple[str, int | None, str], str] = {}
    for spec_text in hosts:
        host = book(spec_text)
        key = (host.hostname, host.port, host.workdir)
        if key in boxes:
            raise ConfigError(
                f"--host {boxes[key]} and {spec_text} are the same box ({host.describe()}, "
                f"workdir {host.workdir}); each node of {job.name} must be a different box. "
                "Nothing was sent.")
        boxes[key] = spec_text
    return hosts


def find_job(journal: Journal, ident: str) -> tuple[dict[str, Any], list[NodeRun]] | None:
    """The multi-node job ``ident`` names (its job id, or one of its nodes' run ids) and its
    nodes, or None when ``ident`` is not a multi-node job (then it is an ordinary run id).
    This is how ``status``/``cleanup``/``tail-logs --run ID`` decide to cover every node."""
    record = journal.job(ident)
    if record is None:
        run = journal.run(ident)
        job_id = run.get("job_id") if run else None
        record = journal.job(job_id) if isinstance(job_id, str) else None
    if record is None:
        return None
    nodes = [NodeRun(int(n["rank"]), str(n["host"]), str(n["run_id"]))
             for n in record.get("nodes") or [] if isinstance(n, dict)]
    return record, sorted(nodes, key=lambda n: n.rank)


def job_nodes(journal: Journal, ident: str) -> tuple[dict[str, Any], list[NodeRun]]:
    found = find_job(journal, ident)
    if found is None:
        raise ConfigError(f"the journal has no multi-node job {ident}; pass the job id that "
                          "deploy printed (or a node's run id)")
    return found


# ------------------------------------------------------------------------------ deploy


def deploy_nodes(project: Project, hosts: Sequence[str], job: Job, reporter: Reporter, *,
                 dry_run: bool = False, wait: bool = True, journal: Journal | None = None,
                 params: dict[str, Any] | None = None,
                 allow_unhealthy_gpu: bool = False,
                 moved: JobOrigin | None = None,
                 book: HostBook | None = None) -> NodesResult:
    """``deploy`` of a playbook with ``nodes`` > 1 on the ``--host`` selection (expanded).

    Plans every node first and sends nothing when any plan fails; then node 0, then the
    others; when any node fails, every node's run is stopped and :class:`NodesFailed` names
    the node. ``wait=False`` launches without waiting for readiness (node 0 first still).
    ``allow_unhealthy_gpu``: each node's box places processes on a ``bad`` GPU too.
    ``moved``: this deploy is a job's move (:mod:`outrig.ops.job_move`): the hosts are its new
    boxes, and the job and node records say where it came from. ``book``: the command's
    hosts, each resolved once (the sessions take them from it)."""
    journal = journal or Journal()
    book = book or HostBook(project.hosts_dir)
    names = select_nodes(project, job, hosts, placed=moved is not None, book=book)
    job_id = new_run_id(job.name)
    nodes = [NodeRun(rank, host, node_run_id(job_id, rank)) for rank, host in enumerate(names)]
    sessions = [HostSession(project, n.host, reporter, journal, host=book(n.host))
                for n in nodes]
    try:
        plans = plan_nodes(sessions, job, nodes, job_id, probe=not dry_run)
        for plan in plans:
            reporter.plan(plan)
        if dry_run:
            reporter.emit_json({"event": "plan", "job_id": job_id,
                                "plans": [p.to_dict() for p in plans]})
            reporter.info("dry run: nothing was sent")
            return NodesResult(job_id, nodes, plans, launched=False)
        check_checkpoints_agree(sessions, nodes, plans)
        return _launch(sessions, nodes, plans, job, journal, reporter, wait=wait,
                       params=params, allow_unhealthy_gpu=allow_unhealthy_gpu, moved=moved)
    finally:
        for session in sessions:
            session.transport.close()


def refuse_node_run(journal: Journal, run_id: str, *, what: str) -> None:
    """A node's run of a multi-node job is not one box's job: watching (or moving) it alone
    would restart or migrate one node while the others wait in a collective. Point at the
    job instead; nothing is started."""
    record = journal.run(run_id) or {}
    job_id = record.get("job_id")
    if not isinstance(job_id, str):
        return
    raise ConfigError(
        f"{run_id} is node {record.get('node_rank')} of the multi-node job {job_id}; {what} "
        f"follows one box's run, which would leave the other nodes waiting. Use `outrig watch "
        f"--run {job_id}` (a node failing stops the others), or move the whole job with "
        f"`outrig migrate --run {job_id} --to A,B` (one box per node). Nothing was started.")


def plan_nodes(sessions: Sequence[HostSession], job: Job, nodes: Sequence[NodeRun],
               job_id: str, *, probe: bool = True) -> list[Plan]:
    """Every node's plan (in parallel: a probe costs an exec per box), each against its own
    box's facts; raise one :class:`PlanError` listing every node's problems."""
    head = sessions[0].host.peer_address()
    hosts = tuple(s.host.peer_address() for s in sessions)
    declared = sessions[0].host.node_address is not None
    plans: dict[int, Plan] = {}
    problems: dict[int, list[str]] = {}

    def plan_one(session: HostSession, node: NodeRun) -> None:
        place = NodePlace(rank=node.rank, nnodes=len(nodes), head_host=head, job_id=job_id,
                          hosts=hosts, head_declared=declared)
        try:
            plans[node.rank] = plan_on(session, job, probe=probe, run_id=node.run_id,
                                       node=place)
        except PlanError as exc:
            problems[node.rank] = exc.problems
        except OutrigError as exc:
            problems[node.rank] = [str(exc)]

    on_every_node(lambda pair: plan_one(*pair), list(zip(sessions, nodes, strict=True)),
                  lambda pair: f"plan {pair[1].host}")
    if problems:
        raise PlanError([f"{nodes[rank].label()}: {line}" for rank in sorted(problems)
                         for line in problems[rank]],
                        context=f"{job.name} on {len(nodes)} nodes")
    check_gpu_counts(job, nodes, [plans[n.rank] for n in nodes])
    first = sessions[0].host
    if first.node_address is None:
        plans[0].notes.append(
            f"${{head_host}} is {head}, the hostname in {first.source or first.name}; if the "
            "other nodes reach node 0 by another address (a cluster-internal one), set "
            "node_address: there")
    return [plans[n.rank] for n in nodes]


class _NodeDeploy:
    """One node's deploy exec, on a thread of its own, that another thread can cancel (the
    ``cancel`` line a Ctrl-C writes: the box stops what this deploy launched and answers)."""

    def __init__(self, node: NodeRun, session: HostSession, plan: Plan,
                 request: dict[str, Any], show: Callable[[NodeRun, dict[str, Any]], None]
                 ) -> None:
        self.node, self.session, self.plan, self.request = node, session, plan, request
        self.show = show
        self.launched = threading.Event()  # every process of its plan launched, or call over
        self.began = threading.Event()  # its first process launched (the box's checks passed)
        self.done = threading.Event()
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.count = 0
        self._lock = threading.Lock()
        self._channel: Any = None
        self._cancelled = False

    def start(self, finished: Callable[[_NodeDeploy], None]) -> None:
        def work() -> None:
            try:
                self.result = self._call()
            except BaseException as exc:  # the thread's outcome, read by deploy_nodes
                self.error = exc
            finally:
                self.began.set()
                self.launched.set()
                self.done.set()
                finished(self)

        threading.Thread(target=work, daemon=True, name=f"outrig-deploy {self.node.host}").start()

    def _call(self) -> dict[str, Any]:
        session = self.session
        call = AgentCall(session.transport)
        request = session.request("deploy", host_label=session.host_spec, **self.request)
        channel = call.start(request)
        with self._lock:
            self._channel, cancelled = channel, self._cancelled
        if cancelled:
            channel.write(CANCEL_LINE)
        try:
            result = call.reader(channel).result(self._on_event, call.events)
        finally:
            channel.close()
        return raise_for_result(result, where=f"deploy on {self.node.label()}")

    def _on_event(self, event: dict[str, Any]) -> None:
        session, kind = self.session, event.get("event")
        if kind == "facts":
            remember_facts(session.journal, session.host, event, session.transport.rtt)
        elif kind == "runs":
            runs = event.get("runs")
            if isinstance(runs, list):
                session.journal.reconcile(session.host.name,
                                          [r for r in runs if isinstance(r, dict)])
            return
        elif kind == "launched":
            self.count += 1
            self.began.set()
            if self.count >= len(self.plan.order):
                self.launched.set()
        self.show(self.node, event)

    def cancel(self) -> None:
        """Ask the box to stop what this deploy launched (a no-op once the call is over)."""
        with self._lock:
            self._cancelled, channel = True, self._channel
        if channel is not None and not self.done.is_set():
            with contextlib.suppress(Exception):  # a dead link: cleanup stops the run instead
                channel.write(CANCEL_LINE)


def _launch(sessions: Sequence[HostSession], nodes: Sequence[NodeRun], plans: Sequence[Plan],
            job: Job, journal: Journal, reporter: Reporter, *, wait: bool,
            params: dict[str, Any] | None, allow_unhealthy_gpu: bool = False,
            moved: JobOrigin | None = None) -> NodesResult:
    """Launch node 0, then the rest; wait for all; on any failure stop every node.

    Each node's run record keeps the move record (:mod:`outrig.redeploy.record`: the
    playbook as deployed, ``--param``, ``--test``, the box's address), so the job can be
    deployed again exactly on other boxes (:mod:`outrig.ops.job_move`)."""
    secrets = secret_values(plans[0].secrets)
    job_id = plans[0].job_id
    began = time.monotonic()
    _record_deploying(sessions, nodes, plans, job, journal, params, moved)
    lock = threading.Lock()

    def show(node: NodeRun, event: dict[str, Any]) -> None:
        with lock:
            if reporter.json_mode:
                reporter.emit_json({**event, "node_rank": node.rank, "host": node.host})
                return
            text = describe_event(event)
            if text is not None and event.get("event") not in ("waiting", "stopping"):
                reporter.info(f"{node.label()}: {text}")

    calls = [_NodeDeploy(n, s, p, deploy_request(p, wait=wait, secrets=secrets,
                                                 allow_unhealthy_gpu=allow_unhealthy_gpu),
                         show)
             for n, s, p in zip(nodes, sessions, plans, strict=True)]
    finished: list[_NodeDeploy] = []
    changed = threading.Condition()

    def on_finished(call: _NodeDeploy) -> None:
        with changed:
            finished.append(call)
            changed.notify_all()

    reporter.info(f"• {nodes[0].label()} first: it hosts the rendezvous "
                  f"({plans[0].job_id}, {len(nodes)} nodes)")
    calls[0].start(on_finished)
    started = calls[:1]
    # Parts of a server spanning nodes start once node 0's checks passed (its first process
    # launched): the head is ready only when they joined. The rest wait for node 0's whole plan.
    waves = ([c for c in calls[1:] if c.plan.launch_with_head],
             [c for c in calls[1:] if not c.plan.launch_with_head])
    try:
        for wave, ready in zip(waves, (calls[0].began, calls[0].launched), strict=True):
            ready.wait()
            if calls[0].error is not None or not wave:
                continue
            reporter.info("• " + ", ".join(c.node.label() for c in wave) + ": launching")
            for call in wave:
                call.start(on_finished)
            started += wave
        failed = _wait_all(started, finished, changed)
        why = _why(failed.error) if failed is not None else ""
    except KeyboardInterrupt:
        failed, why = None, "interrupted (Ctrl-C)"
    for call in (c for c in calls if c not in started):  # node 0 failed: never sent
        journal.record_run(call.node.run_id, {"status": "not_on_box"})
    if why:
        _fail(started, failed, why, sessions, journal, reporter, job_id)
    status = _record_deployed(calls, journal, job_id, wait)
    seconds = time.monotonic() - began
    result = NodesResult(job_id, list(nodes), list(plans), launched=True, status=status,
                         processes={c.node.rank: list((c.result or {}).get("processes") or [])
                                    for c in calls}, seconds=seconds)
    reporter.emit_json({"event": "deployed", "job_id": job_id, "ok": True, "status": status,
                        "seconds": round(seconds, 3),
                        "nodes": [n.to_json() for n in nodes]})
    hosts = ",".join(n.host for n in nodes)
    reporter.success(f"{job.name} {'ready' if wait else 'launched'} on {len(nodes)} nodes "
                     f"({hosts}) in {seconds:.1f}s — job {job_id}. Next: outrig status "
                     f"--host {hosts} --run {job_id}")
    return result


def _record_deployed(calls: Sequence[_NodeDeploy], journal: Journal, job_id: str,
                     wait: bool) -> str:
    """Each node's run and the job as the deploy left them; the job's status."""
    statuses = {c.node.rank: deployed_status(c.result or {}, wait) for c in calls}
    for call in calls:
        journal.record_run(call.node.run_id, {
            "status": statuses[call.node.rank], "ran": statuses[call.node.rank] != "launched",
            "processes": list((call.result or {}).get("processes") or []),
            "run_dir": (call.result or {}).get("run_dir")})
    status = "running" if wait else "launched"
    if all(s == "finished" for s in statuses.values()):
        status = "finished"
    journal.record_job(job_id, {"status": status})
    return status


def _record_deploying(sessions: Sequence[HostSession], nodes: Sequence[NodeRun],
                      plans: Sequence[Plan], job: Job, journal: Journal,
                      params: dict[str, Any] | None, moved: JobOrigin | None) -> None:
    """The job and each node's run in the journal, as deploying, before anything is sent."""
    job_id = plans[0].job_id
    journal.record_job(job_id, {"job_id": job_id, "playbook": job.name, "created": time.time(),
                                "nnodes": len(nodes), "nodes": [n.to_json() for n in nodes],
                                "test_mode": job.test_mode, "status": "deploying",
                                "param_overrides": dict(params or {}),
                                **({"migrated_from": moved.job} if moved else {})})
    for node, plan, session in zip(nodes, plans, sessions, strict=True):
        journal.record_run(node.run_id, {
            "run_id": node.run_id, "host": plan.host, "playbook": plan.playbook,
            "created": time.time(), "test_mode": plan.test_mode, "plan": plan.to_dict(),
            "param_overrides": dict(params or {}), "status": "deploying", "job_id": job_id,
            "node_rank": node.rank, "nnodes": len(nodes),
            RECORD_KEY: move_record(job, session.host, params),
            **({"migrated_from": moved.runs.get(node.rank)} if moved else {})})


def _wait_all(calls: Sequence[_NodeDeploy], finished: list[_NodeDeploy],
              changed: threading.Condition) -> _NodeDeploy | None:
    """Wait until every call has ended, or one has failed (returned at once)."""
    with changed:
        while True:
            bad = next((c for c in finished if c.error is not None), None)
            if bad is not None or len(finished) == len(calls):
                return bad
            changed.wait()


def _why(error: BaseException | None) -> str:
    if isinstance(error, OutrigError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def _fail(calls: Sequence[_NodeDeploy], failed: _NodeDeploy | None, why: str,
          sessions: Sequence[HostSession], journal: Journal, reporter: Reporter,
          job_id: str) -> NoReturn:
    """One node failed (or Ctrl-C): cancel the deploys still waiting, let them end, stop the
    run on every node that was started, and raise :class:`NodesFailed` naming the node
    (:class:`~outrig.errors.Interrupted` after a Ctrl-C)."""
    who = failed.node.label() if failed is not None else "the deploy"
    reporter.warn(f"{who} failed: {why}. Stopping the job on every node.")
    for call in calls:
        call.cancel()
    for call in calls:
        call.done.wait()
    stopped = []
    for call in calls:
        try:
            cleanup_on(sessions[call.node.rank], run_id=call.node.run_id,
                       timeout=STOP_TIMEOUT, missing_ok=True)
            stopped.append(f"{call.node.label()} stopped")
        except OutrigError as exc:
            stopped.append(f"{call.node.label()}: could not be stopped ({exc})")
        journal.record_run(call.node.run_id, {"status": "failed" if call is failed
                                              else "stopped"})
    journal.record_job(job_id, {"status": "failed", "failed_node": failed.node.rank
                                if failed is not None else None, "error": why})
    # A failure often ends the peers too (torch's store host gone): their errors follow it.
    others = [f"{c.node.label()}: {_why(c.error)}" for c in calls
              if c is not failed and c.error is not None]
    also = f" Then also failed: {'; '.join(others)}." if others else ""
    # Ctrl-C (no node failed) ends the command with 130, as it does every command
    error = NodesFailed if failed is not None else Interrupted
    raised = error(f"{who} failed: {why}.{also} The job {job_id} was stopped on every node "
                   f"it had reached: {'; '.join(stopped)}.")
    if failed is not None and getattr(failed.error, "exit_code", 1) == 2 and not any(
            c.count for c in calls):
        raised.exit_code = 2  # a box refused the request before anything started anywhere
    raise raised
