"""``evaluate.during_training``: ``watch`` evaluates each new complete checkpoint while the
run trains (docs/evaluate.md "During training").

Started by the watch, one evaluation at a time, in a thread of its own so that the watch's
heartbeat and its verdicts never wait on a vLLM start: every probe period :meth:`poll` reports
an evaluation that ended and, when none is in flight, starts a worker that lists the run's
checkpoints on its box (the agent's completeness rule), picks the next one
(:func:`outrig.evaluation.schedule.choose`) and evaluates it through the same code as
``outrig evaluate --checkpoint PATH`` (:func:`outrig.ops.evaluate.evaluate_on`: a recorded
server run under ``<playbook>.evaluate`` on the GPUs set aside, or on the second box, stopped
by its run id; the baseline cached in the journal). What is done is the journal's: an
evaluation recorded there is never repeated, whichever watch (or hand) recorded it, so a
watch started again, or following the run after a restart or a move, goes on from there.
Failures are counted in the watch's record, each checkpoint tried at most twice.

The section is the run's as deployed (its move record, :mod:`outrig.redeploy`), so it travels
with the run to a spare.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from outrig.checkpoints import Checkpoint, assess, order_text
from outrig.errors import OutrigError
from outrig.evaluation import schedule
from outrig.evaluation.section import DuringTrainingSpec
from outrig.evaluation.spec import EVALUATE_SUFFIX
from outrig.inventory import HostBook
from outrig.journal import Journal
from outrig.ops.cleanup import cleanup_on
from outrig.ops.evaluate import CheckpointRewritten, Options, evaluate_on, resolve
from outrig.ops.evaluate_copy import copy_checkpoint
from outrig.ops.watch_record import silent
from outrig.playbook import Job
from outrig.redeploy.rebuild import redeploy_of
from outrig.redeploy.record import run_host
from outrig.session import HostSession, Project

Say = Callable[..., None]  # say(event, why=..., **fields): the watch's send


class Source(Protocol):
    """What the evaluator needs of the world (the watch's box and journal; fakes in tests)."""

    def spec(self) -> DuringTrainingSpec | None: ...
    def checkpoints(self) -> list[Checkpoint]: ...
    def done(self) -> set[str]: ...
    def evaluate(self, ckpt: Checkpoint) -> dict[str, Any]: ...
    def where(self, spec: DuringTrainingSpec) -> str: ...
    def stop_servers(self) -> None: ...


class Record(Protocol):
    def __getitem__(self, key: str) -> Any: ...
    def update(self, **fields: Any) -> None: ...


def spawn_thread(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="outrig-watch-evaluate", daemon=True).start()


def describe(ckpt: Checkpoint) -> str:
    step = f", global step {ckpt.global_step}" if ckpt.global_step is not None else ""
    return f"{ckpt.path} ({order_text(ckpt.order)}{step})"


class CheckpointEvaluator:
    """One watch's evaluations during training. ``spawn`` runs the worker (a thread; tests
    run it at once), ``clock`` says when to look again (every ``look_every`` seconds)."""

    def __init__(self, source: Source, record: Record, say: Say, *,
                 spawn: Callable[[Callable[[], None]], None] = spawn_thread,
                 clock: Callable[[], float] = time.monotonic, look_every: float = 30.0) -> None:
        self.source = source
        self.record = record
        self.say = say
        self.spawn = spawn
        self.clock = clock
        self.look_every = look_every
        self.busy = threading.Event()  # a worker is listing or evaluating
        self.results: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self._looked: float | None = None
        self._spec: tuple[str, DuringTrainingSpec | None] | None = None  # (run id, section)

    def spec(self) -> DuringTrainingSpec | None:
        """The followed run's ``evaluate.during_training`` (read again after a restart or a
        move: the run id changes)."""
        run_id = str(self.record["run_id"])
        if self._spec is None or self._spec[0] != run_id:
            self._spec = (run_id, self.source.spec())
        return self._spec[1]

    # --- from the watch's loop ---------------------------------------------------------------
    def poll(self) -> None:
        """Report what ended; start the next evaluation when none is in flight and it is
        time to look (never two at once)."""
        self.drain()
        if self.busy.is_set() or self.spec() is None:
            return
        now = self.clock()
        if self._looked is not None and now - self._looked < self.look_every:
            return
        self._looked = now
        self.busy.set()
        self.spawn(self._work_in_thread)

    def finish(self, wait: Callable[[threading.Event], None] | None = None) -> None:
        """The run has finished: let the evaluation in flight end, then evaluate what is not
        yet done (the final checkpoint; a failed one once more) here, before the watch ends."""
        if self.busy.is_set():
            (wait or _wait_idle)(self.busy)
        self.drain()
        if self.spec() is None:
            return
        for _ in range(schedule.MAX_ATTEMPTS):  # the newest, and a retry if it fails
            self.busy.set()
            if not self._work(direct=True):
                break

    def abandon(self) -> None:
        """The watch ends (Ctrl-C, a failed run) with an evaluation in flight: its worker
        dies with the process, so its server is stopped here, by the playbook its runs are
        filed under (``<playbook>.evaluate``, evaluation servers only)."""
        self.drain()
        if self.busy.is_set():
            self.say("evaluation_failed", why="the watch ends during an evaluation: its "
                     "server is stopped; the checkpoint is evaluated when a watch runs again")
            self.source.stop_servers()

    def drain(self) -> None:
        while True:
            try:
                event, fields = self.results.get_nowait()
            except queue.Empty:
                return
            self.say(event, **fields)

    # --- the worker --------------------------------------------------------------------------
    def _work_in_thread(self) -> None:
        self._work()

    def _work(self, direct: bool = False) -> bool:
        """Evaluate the next checkpoint, if any; whether one was tried. ``direct``: in the
        loop's own thread (``finish``), so each line is said at once; a worker thread leaves
        them to the loop's next :meth:`poll`."""
        def emit(event: str, fields: dict[str, Any]) -> None:
            if direct:
                self.say(event, **fields)
            else:
                self.results.put((event, fields))
        try:
            return self._evaluate_next(emit)
        except Exception as exc:  # listing failed (the box away...): said, looked at again
            emit("evaluation_failed", {
                "why": f"could not list the checkpoints to evaluate: {_text(exc)}"})
            return False
        finally:
            self.busy.clear()

    def _evaluate_next(self, emit: Callable[[str, dict[str, Any]], None]) -> bool:
        spec = self._spec[1] if self._spec is not None else None
        if spec is None:
            return False
        failures: dict[str, int] = dict(self.record["eval_failures"] or {})
        ckpt = schedule.choose(self.source.checkpoints(), self.source.done(), failures,
                               spec.every)
        if ckpt is None:
            return False
        key = schedule.checkpoint_key(ckpt)
        emit("evaluating", {"why": f"checkpoint {describe(ckpt)} on {self.source.where(spec)}",
                            "checkpoint": ckpt.path, "step": ckpt.global_step})
        try:
            doc = self.source.evaluate(ckpt)
        except CheckpointRewritten:  # not the checkpoint's failure: its newer state is next
            emit("evaluation_failed", {
                "why": f"checkpoint {describe(ckpt)} was rewritten by the trainer while it "
                "was evaluated (which state vLLM loaded is unknown): nothing recorded; the "
                "newer state is next", "checkpoint": ckpt.path, "step": ckpt.global_step})
            return True
        except Exception as exc:  # OutrigError or not: the watch goes on, the user is told
            failures[key] = failures.get(key, 0) + 1
            self.record.update(eval_failures=failures)
            again = ("not trying it again" if schedule.gives_up(failures, key)
                     else "trying it once more")
            emit("evaluation_failed", {
                "why": f"checkpoint {describe(ckpt)}: {_text(exc)}; {again}",
                "checkpoint": ckpt.path, "step": ckpt.global_step, "attempt": failures[key]})
            return True
        emit("evaluated", {"why": finished_line(ckpt, doc), **summary(doc)})
        return True


def _wait_idle(busy: threading.Event) -> None:
    while busy.is_set():
        time.sleep(0.5)


def _text(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, OutrigError) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:600]


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """The fields of an ``evaluated`` event."""
    ckpt = doc.get("checkpoint") if isinstance(doc.get("checkpoint"), dict) else {}
    return {"eval_id": doc.get("eval_id"), "checkpoint": (ckpt or {}).get("path"),
            "step": (ckpt or {}).get("global_step"),
            "acceptance_length": doc.get("acceptance_length"),
            "per_position": doc.get("per_position"), "speedup": doc.get("speedup"),
            "train_eal": (doc.get("provenance") or {}).get("train_eal")}


def finished_line(ckpt: Checkpoint, doc: dict[str, Any]) -> str:
    """``checkpoint P (epoch 1, step 3, global step 16): served acceptance length 1.42,
    per position 0.31 0.08 0.03, speedup 0.81× (evaluation E)``."""
    parts = [f"checkpoint {describe(ckpt)}: served acceptance length "
             f"{_num(doc.get('acceptance_length'))}"]
    rates = doc.get("per_position")
    if isinstance(rates, list) and rates:
        parts.append("per position " + " ".join(_num(r) for r in rates))
    eal = (doc.get("provenance") or {}).get("train_eal")
    if isinstance(eal, (int, float)):
        parts.append(f"train/eal {eal:.2f}")
    if isinstance(doc.get("speedup"), (int, float)):
        parts.append(f"speedup {doc['speedup']:.2f}×")
    return ", ".join(parts) + f" (evaluation {doc.get('eval_id')})"


def _num(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "?"


# ------------------------------------------------------------------------------ the real source


@dataclasses.dataclass
class WatchSource:
    """The watch's box and journal as a :class:`Source`: the run the watch follows now
    (``record``'s host and run id, read at each call, so a restart or a move is followed)."""

    project: Project
    journal: Journal
    record: Record
    playbook: Callable[[], str]  # the followed run's playbook (a move may change it)

    def job(self) -> Job:
        return redeploy_of(self.project.playbooks_dir, self.journal,
                           str(self.record["run_id"]), self.playbook()).job

    def spec(self) -> DuringTrainingSpec | None:
        try:
            evaluate = self.job().spec.evaluate
        except OutrigError:
            return None
        return evaluate.during_training if evaluate is not None else None

    def session(self, spec: str) -> HostSession:
        host = run_host(HostBook(self.project.hosts_dir), self.journal, spec,
                        str(self.record["run_id"]))[0]
        return HostSession(self.project, spec, silent(), self.journal, host=host)

    def checkpoints(self) -> list[Checkpoint]:
        job = self.job()
        session = self.session(str(self.record["host"]))
        try:
            run = self.journal.run(str(self.record["run_id"])) or {
                "run_id": self.record["run_id"]}
            settings = resolve(session, job, run, requests=None, baseline=None)
            if not settings.save_path:
                return []
            listing = session.call("checkpoints", stream=False, save_path=settings.save_path,
                                   scheduler=settings.scheduler)
            return assess(listing)
        finally:
            _close(session)

    def done(self) -> set[str]:
        names = {self.playbook(), str(self.record["playbook"])}
        return schedule.done_keys(doc for name in names
                                  for doc in self.journal.evaluations(playbook=name))

    def where(self, spec: DuringTrainingSpec) -> str:
        if spec.host is not None:
            return f"{spec.host} (the second box)"
        gpus = f"GPU(s) {spec.gpus}" if spec.gpus else "no GPU"
        return f"{gpus} of {self.record['host']}, set aside"

    def stop_servers(self) -> None:
        spec = self.spec()
        if spec is None:
            return
        session = self.session(spec.host or str(self.record["host"]))
        try:
            cleanup_on(session, playbook=f"{self.job().name}{EVALUATE_SUFFIX}"[:64])
        except OutrigError:  # nothing of it running any more, or the box away: said above
            pass
        finally:
            _close(session)

    def evaluate(self, ckpt: Checkpoint) -> dict[str, Any]:
        job = self.job()
        during = job.spec.evaluate.during_training if job.spec.evaluate else None
        assert during is not None
        run_id = str(self.record["run_id"])
        train = self.session(str(self.record["host"]))
        try:
            if during.host is None:
                return evaluate_on(train, job, Options(run_id=run_id, checkpoint=ckpt.path,
                                                       gpus=tuple(during.gpus or ())))
            return self._on_second_box(train, job, during.host, run_id, ckpt)
        finally:
            _close(train)

    def _on_second_box(self, train: HostSession, job: Job, host: str, run_id: str,
                       ckpt: Checkpoint) -> dict[str, Any]:
        """Copy the checkpoint onto the second box (:mod:`outrig.ops.evaluate_copy`), then
        evaluate that copy there. The verifier and the prompts must be on that box already
        (``outrig stage``, or a workstation prompts file): the evaluation says so if not."""
        second = HostSession(self.project, host, silent(), self.journal,
                             host=HostBook(self.project.hosts_dir)(host))
        try:
            copy = copy_checkpoint(train, second, ckpt, job.name, self.journal)
            return evaluate_on(second, job, Options(run_id=run_id, checkpoint=copy))
        finally:
            _close(second)


def _close(session: HostSession) -> None:
    try:
        session.transport.close()
    except Exception:  # closing a connection that broke: nothing left to do
        pass
