"""``outrig watch --host A --playbook P [--spare B ...]``: follow one run until it finishes.

What it does, each probe period (from the measured RTT, see
:func:`outrig.watching.health.limits_for`):

* looks at the box afresh through its connector (SSH: a TCP connect and the banner, see
  :meth:`outrig.transport.Transport.probe`) from this thread, and asks the agent
  for the run's ``status`` over the open session from a worker thread, so a silent link never
  holds the loop up; each answer becomes observations for :func:`outrig.watching.health.judge`;
* shows progress (run state, the trainer's step and epoch, the newest complete checkpoint)
  and mirrors each new complete checkpoint to this workstation (``sync-checkpoints`` on the
  same session);
* acts on the verdict: ``suspect`` and back is a notice; ``dead`` (every signal failing for
  the threshold, confirmed by a fresh connection) runs the migrate flow to the first spare
  that passes ``check`` and watches the new box; ``crashed`` (the box answers, the run's
  processes are gone) is reported and, with ``--restarts N``, redeployed in place at most N
  times; ``finished`` ends the watch.

Its state (the box and run it follows, spares left, restarts used, the newest mirrored
checkpoint, runs moved away and not yet fenced, the events sent) is a small JSON file in the
journal (``<journal>/watches/``), written after every change. A ``watch`` started again with
the same ``--host`` (or the box it moved to) and ``--playbook`` carries on where it stopped
when the saved watch follows the run that is current now; after a redeploy it follows the new
run instead, with its own command line's flags (:func:`open_record`).

On a terminal a heartbeat line (state, last step/loss/ETA where known, time since the box last
answered) is redrawn at least every :data:`BEAT_EVERY` seconds, so a run without metrics does
not look hung; ``--json`` prints events and progress only.
"""

from __future__ import annotations

import contextlib
import hashlib
import queue
import threading
import time
from functools import partial
from typing import Any

from outrig.console import Reporter, one_line
from outrig.errors import ConfigError, OutrigError, RemoteError
from outrig.hang.follow import HangFollower, hang_hint
from outrig.hosts import gpu_health
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.ops.cleanup import fence_on, stop_all_runs
from outrig.ops.restart import restart_on
from outrig.ops.status import (
    PROGRESS_BYTES,
    PROGRESS_MARKERS,
    read_answer,
    remember_progress,
)
from outrig.ops.watch_evaluate import CheckpointEvaluator, WatchSource
from outrig.ops.watch_lock import WatchLock
from outrig.ops.watch_record import (
    WatchOptions,
    WatchRecord,
    open_record,
    opened,
    silent,
)
from outrig.playbook import hang_settings
from outrig.providers import spares as rented
from outrig.providers.renting import check_box
from outrig.redeploy.record import run_host
from outrig.session import HostSession, Project
from outrig.timing import connect_timeout_for
from outrig.watching.health import (
    Limits,
    Observation,
    Verdict,
    judge,
    limits_for,
    prune,
    run_state,
)
from outrig.watching.lines import crash_hint, death_hint, heartbeat_line
from outrig.watching.notify import Notifier

FENCE_EVERY = 5  # probe periods between two looks at a box a run was moved from
CONFIRM_FLOOR = 7.5  # seconds: a confirming TCP connect outlasts SYN retries at 0, 1, 3, 7 s


# ------------------------------------------------------------------------------ probes


# ------------------------------------------------------------------------------ the watcher


class Watcher:
    """One watch: the loop, its state, and what it sends. ``stop`` ends it from outside
    (tests, a signal handler) at the next period."""

    def __init__(self, project: Project, reporter: Reporter, journal: Journal,
                 notifier: Notifier, record: WatchRecord, options: WatchOptions,
                 stop: threading.Event | None = None) -> None:
        self.project = project
        self.reporter = reporter
        self.journal = journal
        self.notifier = notifier
        self.record = record
        self.options = options
        self.stop = stop or threading.Event()
        self.results: queue.Queue[tuple[float, Any]] = queue.Queue()
        self._fencing: threading.Thread | None = None
        self.mirroring = threading.Event()  # the worker is copying a checkpoint
        self._mirror_lock = threading.Lock()  # one mirror at a time into the one folder
        self._mirror_warned: int | None = None  # the checkpoint a failed mirror was said of
        self.last_answer: float | None = None  # monotonic time of the box's last answer
        self.latest: dict[str, Any] = {}  # the newest progress shown (state, step, loss, ...)
        self._beat_at = time.monotonic()
        self.evaluator = CheckpointEvaluator(
            WatchSource(project, journal, record, self.run_playbook), record, self.send,
            look_every=options.period or 30.0)

    # --- events --------------------------------------------------------------------------
    def send(self, event: str, **fields: Any) -> None:
        """One event: to the hook, into the record, and on the terminal."""
        payload = self.notifier.send(event, host=self.record["host"],
                                     run_id=self.record["run_id"],
                                     playbook=self.record["playbook"], **fields)
        self.record.add_event(payload)
        why = fields.get("why")
        line = f"{event}: {self.record['host']} {self.record['run_id']}" + (
            f": {why}" if why else "")
        if self.reporter.json_mode:
            self.reporter.emit_json(payload)
        elif event in ("failed", "dead", "hung", "gpu_unhealthy", "evaluation_failed"):
            self.reporter.warn(line)
        else:
            self.reporter.info(f"• {line}")

    # --- the loop ------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Follow the run (across migrations and restarts) until it ends; the record."""
        try:
            return self._run()
        finally:
            self.evaluator.abandon()  # an evaluation in flight: its server is stopped

    def _run(self) -> dict[str, Any]:
        while not self.stop.is_set():
            verdict = self.follow()
            if verdict is None:
                break
            if verdict.state == "finished":
                self.send("finished", why=verdict.why)
                self.evaluator.finish()  # the one in flight, then the final checkpoint
                self.record.update(status="finished")
                rented.release_finished(self.project, self.journal, self.send,
                                        str(self.record["host"]), str(self.record["run_id"]))
                break
            if verdict.state == "crashed":
                self.on_crash(verdict)
            elif verdict.state == "dead":
                self.on_death(verdict)
            elif verdict.state == "hung":
                self.on_hang(verdict)
        return self.record.snapshot()

    def follow(self) -> Verdict | None:
        """Watch the record's box and run until the verdict is final (or ``stop``)."""
        spec = str(self.record["host"])  # its host file, else the run's recorded address
        self.session = HostSession(self.project, spec, silent(), self.journal, host=run_host(
            HostBook(self.project.hosts_dir), self.journal, spec, str(self.record["run_id"]))[0])
        self.hangs = HangFollower(self.journal, str(self.record["run_id"]),
                                  partial(hang_settings, self.project.playbooks_dir))
        self.hung: str | None = None  # the evidence once a process is confirmed hung
        try:
            return self._follow()
        finally:
            with contextlib.suppress(Exception):
                self.session.transport.close()

    def _follow(self) -> Verdict | None:
        session = self.session
        since = time.monotonic()
        seen: list[Observation] = []
        worker: threading.Thread | None = None
        worker_started = 0.0
        flagged = 0.0
        suspect = False
        ticks = 0
        self.results = queue.Queue()
        while not self.stop.is_set():
            limits = self.limits(session)
            tick = time.monotonic()
            seen += self.drain(session)
            if worker is None or not worker.is_alive():  # one heartbeat at a time
                worker = threading.Thread(target=self.heartbeat, args=(session, self.results),
                                          name="outrig-watch-heartbeat", daemon=True)
                worker_started = time.monotonic()
                worker.start()
            elif tick - worker_started > limits.suspect_after and tick - flagged >= limits.period:
                # An answer overdue: a failure, unless the worker is busy mirroring over a
                # link that works. When the link looks down too, drop the connection (the
                # hung call ends) and connect afresh for the next heartbeat.
                banner = next((o for o in reversed(seen) if o.signal == "banner"), None)
                link_down = banner is not None and not banner.ok
                if link_down or not self.mirroring.is_set():
                    flagged = tick
                    seen.append(Observation(tick, "heartbeat", False,
                                            f"no answer for {tick - worker_started:.0f}s"))
                    if link_down:  # the hung worker ends on its own; the next one connects
                        session = self.session = self._fresh_session(session)
                        worker = None
            seen += self.probe(session, limits)
            seen += self.drain(session)
            now = time.monotonic()
            verdict = judge(seen, now, limits, since)
            if verdict.needs_confirm:
                seen.append(session.transport.confirm_alive(
                    self.confirm_timeout(session, limits)))
                verdict = judge(seen, time.monotonic(), limits, since)
            if verdict.state in ("dead", "crashed", "finished"):
                if verdict.state == "dead" and not suspect:
                    self.send("suspect", why=verdict.why)
                return verdict
            if self.hung is not None:  # the box answers; a process of the run does no work
                return Verdict("hung", self.hung)
            if verdict.state == "suspect" and not suspect:
                suspect = True
                self.send("suspect", why=verdict.why)
            elif verdict.state == "alive" and suspect:
                suspect = False
                self.send("recovered", why="answering again")
            self.beat(now)
            if verdict.state == "alive":
                self.evaluator.poll()  # evaluate.during_training: one at a time, in a thread
            ticks += 1
            if ticks % FENCE_EVERY == 1:
                self.fence_moved()
            seen = prune(seen, now, 2 * limits.threshold)
            self.stop.wait(max(0.0, limits.period - (time.monotonic() - tick)))
        return None

    def _fresh_session(self, session: HostSession) -> HostSession:
        """A session to replace one whose heartbeat hangs: the hung call keeps the old
        connection (its worker ends when that call gives up); the next heartbeat connects
        afresh on the new session."""
        with contextlib.suppress(Exception):
            session.transport.close()
        return HostSession(self.project, session.host_spec, silent(), self.journal,
                           host=session.host)


    def limits(self, session: HostSession) -> Limits:
        rtt = session.transport.best_rtt if hasattr(session.transport, "best_rtt") else None
        limits = limits_for(self.options.threshold, rtt)
        if self.options.period is not None:
            limits = Limits(limits.threshold, max(limits.suspect_after,
                                                  3 * self.options.period),
                            self.options.period)
        return limits

    def probe(self, session: HostSession, limits: Limits) -> list[Observation]:
        """The connector's fresh look at the box from outside (SSH: the port and its banner),
        from this thread: never the session the heartbeat uses."""
        return session.transport.probe(self.probe_timeout(session, limits))

    def confirm_timeout(self, session: HostSession, limits: Limits) -> float:
        """The confirming probe's limit for TCP and the banner: longer than a routine
        probe's, since it decides a death: it outlasts TCP's SYN retries (sent at 0, 1, 3
        and 7 s) on a lossy link, at most the host's connect limit."""
        return min(max(CONFIRM_FLOOR, 3 * limits.period),
                   connect_timeout_for(session.host, None)[0])

    def probe_timeout(self, session: HostSession, limits: Limits) -> float:
        """How long a TCP connect plus banner may take: a probe period, at least 2 s (a
        loaded sshd), at most the host's connect limit."""
        return min(max(2.0, limits.period), connect_timeout_for(session.host, None)[0])

    # --- the worker: heartbeat, progress, mirror -------------------------------------------
    def heartbeat(self, session: HostSession, results: queue.Queue[tuple[float, Any]]) -> None:
        """One ``status`` call for the run (the agent answering, its processes, its log),
        then a mirror of any new complete checkpoint. Results go to ``results``, the queue
        of the loop that started this worker (a worker still hung on a box the job has
        left reports to that loop's queue, which nobody reads any more)."""
        run_id = self.record["run_id"]
        try:
            result = session.call("status", stream=False, run_id=run_id, log_lines=0,
                                  progress_bytes=PROGRESS_BYTES, markers=PROGRESS_MARKERS,
                                  gpu_holders=False, hang=self.hangs.request)
        except RemoteError as exc:  # the agent answered: the run is not there
            results.put((time.monotonic(), ("gone", str(exc))))
            return
        except OutrigError as exc:
            results.put((time.monotonic(), ("error", str(exc).split(". ")[0])))
            return
        except Exception as exc:  # a worker must report, never die silently
            results.put((time.monotonic(), ("error", f"{type(exc).__name__}: {exc}")))
            return
        results.put((time.monotonic(), ("status", result)))
        newest = self._newest_checkpoint(result)
        tried = self.record["mirror_tried"]
        if newest is not None and (tried is None or newest > int(tried)):
            self.mirror(session, newest, results)

    def _newest_checkpoint(self, result: dict[str, Any]) -> int | None:
        for run in result.get("runs") or []:
            for proc in run.get("processes") or []:
                name = (proc.get("checkpoint") or {}).get("name")
                if isinstance(name, str) and name.isdigit():
                    return int(name)
        return None

    def run_playbook(self) -> str:
        """The playbook the followed run runs (after a move, the family member migrate
        chose, which may not be the one the watch began with)."""
        run = self.journal.run(str(self.record["run_id"])) or {}
        return str(run.get("playbook") or self.record["playbook"])

    def mirror(self, session: HostSession, newest: int,
               results: queue.Queue[tuple[float, Any]]) -> None:
        """Pull the new complete checkpoints into the workstation's mirror (the one migrate
        resumes from when the box is dead)."""
        from outrig.ops.stage import sync_checkpoints_on

        if not self._mirror_lock.acquire(blocking=False):
            return  # a worker left behind on a replaced session still mirrors: next time
        self.mirroring.set()
        try:
            report = sync_checkpoints_on(session, playbook=self.run_playbook(),
                                         run_id=self.record["run_id"])
        except Exception as exc:  # OutrigError, or a local file error: report, go on
            text = str(exc).split(". ")[0] if isinstance(exc, OutrigError) else \
                f"{type(exc).__name__}: {exc}"
            results.put((time.monotonic(), ("mirror_error", (newest, text))))
            return
        finally:
            self.mirroring.clear()
            self._mirror_lock.release()
        self.record.update(mirror_tried=newest)
        pulled = [int(p["epoch"]) for p in report.get("pulled") or []]
        results.put((time.monotonic(), ("mirrored", pulled)))

    def drain(self, session: HostSession) -> list[Observation]:
        """Turn the worker's results into observations (and progress lines)."""
        out: list[Observation] = []
        while True:
            try:
                at, (kind, value) = self.results.get_nowait()
            except queue.Empty:
                return out
            if kind in ("status", "gone"):
                self.last_answer = at
            if kind == "status":
                out += self.on_status(at, value)
            elif kind == "gone":
                out += [Observation(at, "heartbeat", True),
                        Observation(at, "processes", False, value, run_state="failed")]
            elif kind == "error":
                out.append(Observation(at, "heartbeat", False, value))
            elif kind == "mirrored" and value:
                newest = max(value)
                self.record.update(mirrored=max(newest, int(self.record["mirrored"] or -1)))
                self.emit_progress({"mirrored": newest})
            elif kind == "mirror_error" and value[0] != self._mirror_warned:
                # tried again at each heartbeat (a blip must not cost a checkpoint), said
                # once per checkpoint (a playbook with nothing to mirror said it every second)
                self._mirror_warned = value[0]
                self.reporter.warn(f"mirroring checkpoint {value[0]} failed: {value[1]}; "
                                   "trying again at each heartbeat")

    def on_status(self, at: float, result: dict[str, Any]) -> list[Observation]:
        runs = [r for r in result.get("runs") or [] if isinstance(r, dict)]
        texts = "".join(str(p.get("tail_text") or "") for r in runs
                        for p in r.get("processes") or [])
        digest = hashlib.sha256(texts.encode()).hexdigest() if texts else None
        grew = digest is not None and digest != self.record["log_seen"]
        if grew:
            self.record.note(log_seen=digest)  # saved with the next change, not each beat
        read_answer(self.journal, result)  # keeps the series and GPUs, for outrig report
        out = [Observation(at, "heartbeat", True), Observation(at, "log", grew)]
        if not runs:
            out.append(Observation(at, "processes", False, "the box has no such run",
                                   run_state="failed"))
            return out
        state, why = run_state(runs[0].get("processes") or [])
        out.append(Observation(at, "processes", state != "failed", why, run_state=state))
        self.show_progress(runs[0], state)
        self.gpu_news(result.get("facts") or {}, runs[0])
        if state == "running":
            self.hung = self.hangs.observe(runs[0], result.get("facts") or {})
        return out

    def gpu_news(self, facts: dict[str, Any], run: dict[str, Any]) -> None:
        """A GPU of the box that turned ``bad`` during the run (the heartbeat's facts carry
        the health fields and Xid lines): one ``gpu_unhealthy`` event per GPU, sent once
        (the record keeps which are known bad; one that recovers, after a reset, is news
        again when it turns bad again). ``in_use``: whether the run's processes were given
        it. The watch goes on: a sick GPU is for the user to judge, not a death."""
        verdicts, _ = gpu_health.look(self.journal, self.session.host.name, facts)
        if not verdicts:
            return
        known = set(self.record["gpu_bad"] or [])
        bad = {str(v["uuid"]): v for v in verdicts if v["verdict"] == gpu_health.BAD}
        used = {g for p in run.get("processes") or [] for g in p.get("gpus") or []
                if isinstance(g, int)}
        for uuid, verdict in bad.items():
            if uuid not in known:
                self.send("gpu_unhealthy", **gpu_health.event_fields(verdict),
                          in_use=verdict.get("index") in used)
        if set(bad) != known:
            self.record.update(gpu_bad=sorted(bad))

    def show_progress(self, run: dict[str, Any], state: str) -> None:
        procs = [p for p in run.get("processes") or [] if isinstance(p, dict)]
        trainer = next((p for p in procs if p.get("name") == "trainer"), None) or next(
            (p for p in procs if p.get("progress") or p.get("checkpoint")), None)
        progress = (trainer or {}).get("progress") or {}
        checkpoint = ((trainer or {}).get("checkpoint") or {}).get("name")
        line = {"state": state, "step": progress.get("step"), "epoch": progress.get("epoch"),
                "checkpoint": checkpoint}
        self.latest = {**line, "loss": progress.get("loss"), "eta_s": progress.get("eta_s"),
                       "loss_trend": progress.get("loss_trend")}
        before = self.record["progress"] or {}
        if line == before:
            return
        self.record.update(progress=line)
        # a new state or checkpoint is a line of its own; a new step only redraws the
        # status line (a long run must not print a line per probe period)
        lasting = any(line[k] != before.get(k) for k in ("state", "checkpoint"))
        if lasting:  # for outrig runs, and status of a box that is gone (the journal's)
            remember_progress(self.journal, {"runs": [run]})
        self.emit_progress(line, lasting=lasting)

    def emit_progress(self, fields: dict[str, Any], *, lasting: bool = True) -> None:
        if self.reporter.json_mode:
            self.reporter.emit_json({"event": "progress", "host": self.record["host"],
                                     "run_id": self.record["run_id"], **fields})
            return
        parts = [f"{k} {one_line(v)}" for k, v in fields.items() if v is not None]  # box's
        # The same two-space indent for both, so that off a terminal (where the live line
        # is printed too, at most every 10 s) the lines stay aligned.
        text = f"  {self.record['host']} {self.record['run_id']}: " + ", ".join(parts)
        if lasting:
            self.reporter.info(text)
        else:
            self.reporter.live(text)

    def beat(self, now: float) -> None:
        """The heartbeat line, at most :attr:`WatchOptions.beat_every` apart: what the watch
        knows of the run and how long ago the box answered (on a terminal it is redrawn in
        place; ``--json`` has the events and progress instead)."""
        if now - self._beat_at < self.options.beat_every or self.reporter.json_mode:
            return
        self._beat_at = now
        self.reporter.live(heartbeat_line(self.record["host"], self.record["run_id"],
                                          self.latest, self.last_answer, now))

    def checkpointed(self) -> bool:
        """Whether the followed run's playbook has a process that declares ``checkpoints:``
        (what the hints may promise: a resume from the newest complete checkpoint). Without
        the file here, whether the watch has seen a checkpoint of the run."""
        from outrig.playbook import find_playbook, load_job

        try:
            job = load_job(find_playbook(self.run_playbook(), self.project.playbooks_dir))
        except OutrigError:
            return bool(self.record["mirror_tried"] is not None
                        or (self.record["progress"] or {}).get("checkpoint"))
        return any(p.checkpoints is not None for p in job.spec.processes.values())

    # --- verdicts ------------------------------------------------------------------------
    def on_crash(self, verdict: Verdict) -> None:
        """A crash on a healthy box: never a migrate. Restart in place while allowed."""
        self.send("failed", why=verdict.why)
        used = int(self.record["restarts_used"] or 0)
        allowed = int(self.record["restarts"] or 0)
        if used >= allowed:
            self.record.update(status="failed")
            raise OutrigError(crash_hint(self.record.snapshot(), verdict.why, used, allowed,
                                         self.checkpointed()))
        self.restart(used, allowed)

    def restart(self, used: int, allowed: int) -> None:
        """Deploy the run's playbook again on its box (restart ``used + 1`` of ``allowed``):
        the re-deploy stops what is left of the run, and a trainer resumes from its newest
        complete checkpoint there."""
        self.send("restarting", why=f"restart {used + 1} of {allowed}")
        with opened(HostSession(self.project, str(self.record["host"]), self.reporter,
                                self.journal, host=self.session.host)) as session:
            deployed = restart_on(session, str(self.record["run_id"]), self.run_playbook())
        self.record.update(run_id=deployed.plan.run_id, restarts_used=used + 1,
                           log_seen=None, progress=None)
        self.reporter.info(f"• restarted in place as {deployed.plan.run_id}")

    def on_hang(self, verdict: Verdict) -> None:
        """A confirmed hang on a box that answers (docs/watch.md#hangs): restart in place
        while ``--restarts`` allow (the re-deploy stops the hung run), else as a death."""
        self.send("hung", why=verdict.why, processes=self.hangs.evidence())
        used, allowed = int(self.record["restarts_used"] or 0), int(self.record["restarts"] or 0)
        if used < allowed:
            self.restart(used, allowed)
        else:
            self.on_death(verdict, hung=True)

    def on_death(self, verdict: Verdict, *, hung: bool = False) -> None:
        """Migrate to the first spare that passes ``check``; then watch it. ``hung``: the box
        answers (its run hangs), so the move probes it and stops the run there."""
        if not hung:
            self.send("dead", why=verdict.why)
        old_host, old_run = str(self.record["host"]), str(self.record["run_id"])
        skipped: list[str] = []
        for spare in list(self.record["spares"] or []):
            if spare == rented.AUTO:  # rent one through the provider (outrig.providers)
                spare = self.rent_spare(old_host, old_run, skipped) or ""
                if not spare:
                    continue
            problem = self.check_spare(spare)
            if problem:
                skipped.append(f"{spare}: {problem}")
                self.reporter.warn(f"spare {spare} skipped: {problem}")
                continue
            self.send("migrating", to=spare, skipped=skipped)
            report = self.migrate_to(old_host, old_run, spare, probe=hung)
            if report is None:
                skipped.append(f"{spare}: the move failed")
                rented.release_unused(self.project, self.journal, self.send, spare, old_run,
                                      stop_runs=stop_all_runs)
                continue
            moved = [*(self.record["moved"] or []), {"host": old_host, "run_id": old_run,
                                                     "fenced": None}]
            self.record.update(host=spare, run_id=report["run_id"], moved=moved,
                               spares=[s for s in self.record["spares"] or [] if s != spare],
                               log_seen=None, progress=None)
            checkpoint = report.get("checkpoint") or {}
            self.show_timings(report)  # printed before the event goes out: who reacts to
            self.send("resumed", **{"from": old_host}, old_run_id=old_run,  # it finds the
                      checkpoint=checkpoint.get("epoch"), timings=report.get("timings"),
                      seconds=report.get("seconds"))  # line already there
            if rented.release_dead(self.project, self.journal, self.send, old_host,
                                   self.run_playbook(), stop_runs=stop_all_runs):
                self.record.update(moved=[rented.moved_entry_released(m)
                                          if m.get("run_id") == old_run else m
                                          for m in self.record["moved"] or []])
            return
        self.send("failed", why=("the run hangs" if hung else "the box is dead")
                  + " and no spare took the job"
                  + (f" ({'; '.join(skipped)})" if skipped else " (no spares left)"))
        self.record.update(status="failed")
        raise OutrigError(hang_hint(self.record.snapshot(), verdict.why) if hung else death_hint(
            self.record.snapshot(), old_host, old_run, verdict.why, skipped, self.checkpointed()))

    def rent_spare(self, old_host: str, old_run: str, skipped: list[str]) -> str | None:
        """``--spare auto``: the box rented for this death (:mod:`outrig.providers.spares`),
        or None with the reason added to ``skipped``."""
        try:
            return rented.rent_spare(self.project, self.journal, self.send, old_host, old_run,
                                     self.run_playbook())
        except rented.SpareTaken as exc:
            self.record.update(status="handed over")
            raise OutrigError(str(exc)) from None
        except OutrigError as exc:
            skipped.append(f"auto: {exc}")
            return None

    def check_spare(self, spare: str) -> str | None:
        """Why ``spare`` cannot take the job (its ``check`` failed, or a GPU of it is
        ``bad``: a job moved there would be refused, or run on a sick card), or None."""
        # a fresh book: a spare's host file may have been written (rented) since watch began
        try:
            host = HostBook(self.project.hosts_dir)(spare)
        except OutrigError as exc:  # its host file is gone or broken: a reason, as a
            return str(exc).split(". ")[0]  # failed check is
        return check_box(self.project, self.journal, spare, host)

    def migrate_to(self, old_host: str, old_run: str, spare: str,
                   probe: bool = False) -> dict[str, Any] | None:
        from outrig.ops.migrate import migrate

        # A death was confirmed a moment ago by a failed fresh SSH login; migrate's own
        # probes would only add their connect timeouts (up to 15 s each on a blackholed
        # box) to the recovery, so it probes nothing (once for a hang: the box answers).
        # Should OLD answer after all, the moved run there is fenced when it does.
        try:
            return migrate(self.project, old_host, spare, self.reporter, journal=self.journal,
                           run_id=old_run, probe_attempts=int(probe), probe_pause=0.0,
                           from_host=self.session.host)
        except OutrigError as exc:
            self.reporter.warn(f"moving {old_run} to {spare} failed: {exc}")
            return None

    def show_timings(self, report: dict[str, Any]) -> None:
        timings = report.get("timings")
        if not isinstance(timings, dict) or self.reporter.json_mode:
            return
        parts = [f"{k} {float(v):.1f}s" for k, v in timings.items()
                 if isinstance(v, (int, float))]
        self.reporter.info("  recovery: " + ", ".join(parts))

    # --- fencing -------------------------------------------------------------------------
    def fence_moved(self) -> None:
        """Look at the boxes runs were moved from; stop the moved run on one that answers
        again (in the background: a flaky old box must not hold up the watch)."""
        pending = [m for m in self.record["moved"] or [] if not m.get("fenced")]
        if not pending or (self._fencing is not None and self._fencing.is_alive()):
            return
        self._fencing = threading.Thread(target=self._fence, args=(pending,),
                                         name="outrig-watch-fence", daemon=True)
        self._fencing.start()

    def _fence(self, pending: list[dict[str, Any]]) -> None:
        for entry in pending:
            try:
                session = HostSession(self.project, str(entry["host"]), Reporter(quiet=True),
                                      self.journal, host=run_host(
                                          HostBook(self.project.hosts_dir), self.journal,
                                          str(entry["host"]), str(entry["run_id"]))[0])
            except OutrigError as exc:  # no host file and no address recorded
                self.reporter.warn(f"cannot look at {entry['host']} to fence it: {exc}")
                continue
            if not all(seen.ok for seen in session.transport.probe(5.0)):
                continue  # still away (SSH: no banner); looked at again later
            try:
                stopped = fence_on(session, self.notifier)
            except OutrigError as exc:
                self.reporter.warn(f"fencing {entry['host']} failed: {exc}")
                continue
            finally:
                with contextlib.suppress(Exception):
                    session.transport.close()
            moved = [{**m, "fenced": time.time(), "stopped": stopped}
                     if (m.get("host"), m.get("run_id")) == (entry.get("host"),
                                                             entry.get("run_id")) else m
                     for m in self.record["moved"] or []]
            self.record.update(moved=moved)


# ------------------------------------------------------------------------------ entry point


def watch(project: Project, host_spec: str, playbook: str, reporter: Reporter, *,
          options: WatchOptions | None = None, journal: Journal | None = None,
          notifier: Notifier | None = None,
          stop: threading.Event | None = None) -> dict[str, Any]:
    """``outrig watch``: follow the run until it finishes (see the module docstring).
    ``playbook`` is the name its runs are filed under (the CLI resolves ``--playbook``).
    Returns the watch's record; raises when the run failed for good."""
    options = options or WatchOptions()
    if options.restarts is not None and options.restarts < 0:
        raise ConfigError("--restarts must be 0 or more")
    if options.threshold <= 0:
        raise ConfigError("--threshold must be more than 0 seconds (default 60)")
    journal = journal or Journal()
    notifier = notifier or Notifier(None, reporter)
    lock = WatchLock(journal)  # one watch per run, held until this one ends
    try:
        record = open_record(project, journal, host_spec, playbook, options, reporter, lock)
        reporter.info(f"• watching {record['run_id']} on {record['host']}"
                      + (f" (spares: {', '.join(record['spares'])})" if record["spares"]
                         else ""))
        try:
            return Watcher(project, reporter, journal, notifier, record, options, stop).run()
        finally:
            notifier.close(timeout=60)
    finally:
        lock.release()
