"""Every node of a multi-node job at once, for the commands that take a job id: ``status
--run JOB`` (a row per node, then each node's status), ``cleanup --run JOB`` (each node's run
stopped by its recorded process groups) and ``tail-logs --run JOB`` (every node's lines,
each prefixed with its node). The job and its nodes come from the journal's job record
(:mod:`outrig.ops.nodes`); each node is asked over a session of its own
(:func:`outrig.fanout.run_fanout`), so a dead node costs its own deadline, not the others'.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Sequence
from typing import IO, Any

from outrig.console import Reporter
from outrig.errors import OutrigError
from outrig.fanout import HostOutcome, run_fanout
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup_on
from outrig.ops.logs import TailResult, tail_logs
from outrig.ops.nodes import STOP_TIMEOUT, NodeRun, NodesFailed, job_nodes, on_every_node
from outrig.ops.status import status_on
from outrig.session import HostSession, Project
from outrig.watching.health import run_state


def node_core(nodes: Sequence[NodeRun],
               core: Callable[[HostSession, NodeRun], dict[str, Any]]
               ) -> Callable[[HostSession], dict[str, Any]]:
    by_host = {n.host: n for n in nodes}
    return lambda session: core(session, by_host[session.host_spec])


def state_words(state: str, why: str) -> str:
    """``failed — worker was killed by signal 15``; just ``running`` when the reason only
    repeats the state."""
    return state if not why or why == state else f"{state} — {why}"


def node_state(result: dict[str, Any] | None, run_id: str) -> tuple[str, str]:
    """(running | finished | failed | missing, why) of the node's run in a status answer."""
    runs = [r for r in (result or {}).get("runs") or [] if r.get("run_id") == run_id]
    if not runs:
        return "missing", f"the box has no run {run_id}"
    run = runs[0]
    if run.get("status") in ("stopped", "failed") and not run.get("processes"):
        return "failed", f"the run is {run.get('status')}"
    state, why = run_state(run.get("processes") or [])
    if state == "running" and run.get("status") == "stopped":
        return "failed", "the run was stopped"
    return state, why


def nodes_status(project: Project, ident: str, reporter: Reporter, *, log_lines: int = 5,
                 journal: Journal | None = None) -> dict[str, Any]:
    """``status --run JOB`` of a multi-node job: every node's run, asked at once; a row per
    node (rank, host, state, why), then each node's status as for one box."""
    journal = journal or Journal()
    record, nodes = job_nodes(journal, ident)

    def one(session: HostSession, node: NodeRun) -> dict[str, Any]:
        return status_on(session, run_id=node.run_id, log_lines=log_lines)

    outcomes = run_fanout(project, [n.host for n in nodes], node_core(nodes, one),
                          journal=journal)
    rows = [_status_row(n, o) for n, o in zip(nodes, outcomes, strict=True)]
    document = {"job_id": record.get("job_id"), "playbook": record.get("playbook"),
                "nnodes": len(nodes), "nodes": rows}
    if reporter.json_mode:
        reporter.emit_json(document)
        return document
    reporter.info(f"job {record.get('job_id')} ({record.get('playbook')}, {len(nodes)} nodes)")
    for row in rows:
        reporter.info(f"  node {row['rank']} {row['host']}: "
                      + state_words(str(row["state"]), str(row["why"])))
    for node, outcome in zip(nodes, outcomes, strict=True):
        if outcome.result is not None:
            reporter.info(f"── {node.label()}, run {node.run_id}")
            reporter.status(outcome.result)
    return document


def _status_row(node: NodeRun, outcome: HostOutcome) -> dict[str, Any]:
    if not outcome.ok:
        state, why = "unreachable", str(outcome.error)
    else:
        state, why = node_state(outcome.result, node.run_id)
    return {**node.to_json(), "ok": outcome.ok, "state": state, "why": why,
            "error": outcome.error, "result": outcome.result}


def stop_nodes(project: Project, ident: str, reporter: Reporter, *,
               timeout: float = STOP_TIMEOUT, journal: Journal | None = None) -> dict[str, Any]:
    """``cleanup --run JOB``: stop the job's run on every node at once (each by its recorded
    process groups, as cleanup does; nothing else on the boxes). Raises
    :class:`NodesFailed` naming the nodes that could not be stopped."""
    journal = journal or Journal()
    record, nodes = job_nodes(journal, ident)

    def one(session: HostSession, node: NodeRun) -> dict[str, Any]:
        return cleanup_on(session, run_id=node.run_id, timeout=timeout, missing_ok=True)

    outcomes = run_fanout(project, [n.host for n in nodes], node_core(nodes, one),
                          journal=journal, work=timeout)
    rows = []
    for node, outcome in zip(nodes, outcomes, strict=True):
        stopped = [p for r in (outcome.result or {}).get("runs") or []
                   for p in r.get("processes") or []]
        rows.append({**node.to_json(), "ok": outcome.ok, "error": outcome.error,
                     "stopped": len(stopped)})
        if not reporter.json_mode:
            line = (f"{node.label()}: run {node.run_id}, {len(stopped)} process(es) stopped"
                    if outcome.ok else f"{node.label()}: not stopped: {outcome.error}")
            (reporter.info if outcome.ok else reporter.warn)(line)
    document = {"job_id": record.get("job_id"), "nodes": rows}
    reporter.emit_json(document)
    failed = [r for r in rows if not r["ok"]]
    if record.get("status") != "failed":
        journal.record_job(str(record.get("job_id")),
                           {"status": "stopped" if not failed else "stop_failed"})
    if failed:
        raise NodesFailed("could not stop " + "; ".join(
            f"node {r['rank']} ({r['host']}): {r['error']}" for r in failed)
            + f". Run outrig cleanup --run {record.get('job_id')} again once they answer.")
    return document


def node_log_targets(journal: Journal, ident: str) -> list[NodeRun]:
    """``tail-logs --run JOB``: the (host, run id) of every node, node 0 first, to tail
    each node's run on its host (lines prefixed with the host, as for several hosts)."""
    return job_nodes(journal, ident)[1]


class _NodeLines(io.StringIO):
    """One node's log output, written whole lines at a time to the shared stream: each line
    prefixed with the node (``node 1 b | trainer | ...``), or, as JSON lines, with
    ``node_rank`` and ``host`` added. The lock keeps two nodes' lines from interleaving."""

    def __init__(self, node: NodeRun, out: IO[str], lock: threading.Lock,
                 json_mode: bool) -> None:
        super().__init__()
        self.node, self.target, self.lock, self.json_mode = node, out, lock, json_mode
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        *whole, self.pending = self.pending.split("\n")
        if whole:
            with self.lock:
                self.target.write("".join(self._line(line) + "\n" for line in whole))
                self.target.flush()
        return len(text)

    def _line(self, line: str) -> str:
        if not self.json_mode:
            return f"node {self.node.rank} {self.node.host} | {line}"
        try:
            document = json.loads(line)
        except ValueError:
            return line
        if isinstance(document, dict):
            document = {"node_rank": self.node.rank, "host": self.node.host, **document}
        return json.dumps(document)


def tail_nodes(project: Project, ident: str, reporter: Reporter, *, lines: int | None = None,
               follow: bool = True, grep: str | None = None,
               processes: list[str] | None = None, journal: Journal | None = None,
               stop: threading.Event | None = None) -> dict[int, TailResult]:
    """``tail-logs --run JOB``: every node's logs at once, each line prefixed with its node
    (a tailer per node, each with its own session, cursors and mirror, exactly as for one
    box). Returns each node's :class:`~outrig.ops.logs.TailResult` by rank."""
    journal = journal or Journal()
    nodes = node_log_targets(journal, ident)
    lock = threading.Lock()
    results: dict[int, TailResult] = {}
    errors: dict[int, str] = {}

    def one(node: NodeRun) -> None:
        out = _NodeLines(node, reporter.out, lock, reporter.json_mode)
        mine = Reporter(json_mode=reporter.json_mode, out=out, quiet=reporter.quiet)
        try:
            results[node.rank] = tail_logs(project, node.host, mine, run_id=node.run_id,
                                           processes=processes, lines=lines, follow=follow,
                                           grep=grep, journal=journal, stop=stop)
        except OutrigError as exc:
            errors[node.rank] = str(exc)

    on_every_node(one, nodes, lambda n: f"tail {n.host}")
    if errors:
        raise NodesFailed("tail-logs failed on " + "; ".join(
            f"{nodes[rank].label()}: {why}" for rank, why in sorted(errors.items())))
    return results
