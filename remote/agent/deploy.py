"""The ``deploy`` op: stop the playbook's previous run, write files, launch every process
through the wrapper in dependency order, wait for readiness, record run.json."""

from __future__ import annotations

import contextlib
import os
import pkgutil
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, NamedTuple, Optional, Set

from .cgroups import make_cgroup
from .checkpoints import quarantine_checkpoints
from .constants import (
    CENSUS_EVERY_S,
    CGROUP_KEY,
    DEFAULT_SETTLE_S,
    DEFAULT_STOP_GRACE,
    EXCERPT_LINES,
    FATAL_AFTER_REFUSAL_S,
    MARKER_KEY,
    PROBE_EVERY_S,
    PROCESS_KEY,
    TICK_S,
    JSONDict,
)
from .events import AgentError, Emitter, bad_request, internal_error, redact
from .gpus import GPU_WAIT_DEFAULT_S, gather_facts, gpu_audit, wait_gpus_released
from .layout import (
    Layout,
    WorkdirFolder,
    ensure_workdir,
    read_json,
    read_pointer,
    write_atomic,
    write_json_atomic,
)
from .lock import WorkdirLock
from .logs import tail_lines
from .preflight import (
    check_gpus,
    check_gpus_free,
    check_gpus_healthy,
    check_gpus_readable,
    check_ports_free,
)
from .probes import probe_completion, probe_http, probe_port, probe_served_model
from .procs import boot_id, read_stat, require_proc
from .protocol import PROTOCOL_VERSION
from .stopping import Stopper, stop_run_by_id, valid_record
from .validation import (
    FileSpec,
    ProcSpec,
    Request,
    get_bool,
    get_name,
    get_num,
    get_opt_str,
    get_str_dict,
    topo_order,
)
from .waiting import Waiting, waiting_others
from .watch import CANCEL_MESSAGE, CancelWatch, Watch


class Deployment:
    """Steps 6-9 of a deploy: create the run, launch in order, wait, record."""

    def __init__(
        self,
        layout: Layout,
        out: Emitter,
        run: JSONDict,
        procs: List[ProcSpec],
        secrets: Dict[str, str],
        wait: bool,
        progress_interval: float,
        settle: float = DEFAULT_SETTLE_S,
    ) -> None:
        self.layout = layout
        self.out = out
        self.run = run
        self.run_id: str = run["run_id"]
        self.run_dir = layout.run_dir(self.run_id)
        self.procs = procs
        self.secrets = secrets
        self.hidden = [v for v in secrets.values() if v]  # values redacted from every excerpt
        self.wait = wait
        self.progress_interval = progress_interval
        self.settle = settle
        self.needed = {dep for p in procs for dep in p.after}  # processes others wait for
        self.cancel = CancelWatch()
        self.popens: Dict[int, subprocess.Popen[bytes]] = {}
        self.watches: Dict[str, Watch] = {}
        self.order: List[str] = []
        # Records the run's processes (pid + start time) from the first look on, so a child
        # that renames itself (vLLM's setproctitle clears environ) or leaves the session
        # later is still proven ours by having been seen here.
        self.stopper = Stopper(out, self.popens, layout)
        self.next_census = 0.0

    def save(self) -> None:
        """Rewrite run.json atomically (after every change the workstation might need)."""
        write_json_atomic(os.path.join(self.run_dir, "run.json"), self.run)

    def execute(self) -> List[JSONDict]:
        """Launch everything in dependency order, waiting where needed; return the records,
        each with its ``outcome``: ``ready``, ``finished`` (exited 0 before it was ready,
        nothing waits for it) or ``launched`` (not waited for)."""
        for spec in topo_order(self.procs):
            if spec.after:
                self.wait_for(set(spec.after))
            if self.cancel.requested():
                raise AgentError("cancelled", CANCEL_MESSAGE)
            self.launch(spec)
        if self.wait:
            self.wait_for(set(self.watches))
        else:
            self.wait_for(self.needed)
        for watch in self.watches.values():
            watch.record.setdefault("outcome", "launched")
        self.census(force=True)
        return [self.watches[n].record for n in self.order]

    def census(self, force: bool = False) -> None:
        """Record the run's live processes as seen (every CENSUS_EVERY_S, or now)."""
        now = time.monotonic()
        if not force and now < self.next_census:
            return
        self.next_census = now + CENSUS_EVERY_S
        self.stopper.census(self.run_id, self.run["processes"])

    def all_finished(self) -> bool:
        """Every process exited 0 before it was ready: the run has nothing left running."""
        return bool(self.watches) and all(w.finished for w in self.watches.values())

    def process_env(self, spec: ProcSpec, cgroup: Optional[str] = None) -> Dict[str, str]:
        """Agent env + process env + secrets + the run markers (markers win)."""
        env = dict(os.environ)
        env.update(spec.env)
        env.update(self.secrets)
        env[MARKER_KEY] = self.run_id
        env[PROCESS_KEY] = spec.name
        env.pop(CGROUP_KEY, None)
        if cgroup is not None:
            env[CGROUP_KEY] = os.path.join(cgroup, "cgroup.procs")
        return env

    def resolve_cwd(self, spec: ProcSpec) -> str:
        """null → workdir; relative → under workdir (not through a symlink out of it);
        created if missing."""
        cwd = self.layout.workdir
        if spec.cwd is not None:
            cwd = os.path.normpath(os.path.join(self.layout.workdir, spec.cwd))
        try:
            os.makedirs(cwd, exist_ok=True)
        except OSError as exc:
            raise AgentError(
                "workdir", f"cannot create cwd {cwd} for {spec.name}: {exc.strerror}", spec.name
            ) from None
        if spec.cwd is not None and not os.path.isabs(os.path.expanduser(spec.cwd)):
            real = os.path.realpath(cwd)
            root = os.path.realpath(self.layout.workdir)
            if os.path.commonpath([real, root]) != root:
                raise AgentError(
                    "workdir", f"cwd {spec.cwd!r} of {spec.name} resolves to {real}, outside the "
                    f"workdir {root} (a symlink on the box leads out of it). Remove the link or "
                    "give that folder as an absolute cwd", spec.name)
        return cwd

    def launch(self, spec: ProcSpec) -> None:
        """Start one process through the wrapper in its own session; record it at once."""
        log = os.path.join(self.run_dir, "logs", f"{spec.name}.log")
        exit_file = os.path.join(self.run_dir, "exit", f"{spec.name}.json")
        cwd = self.resolve_cwd(spec)
        if spec.checkpoints is not None:
            quarantine_checkpoints(spec.checkpoints["path"], spec.checkpoints["scheduler"],
                                   self.out)
        self.out.step(f"launching {spec.name}")
        cgroup = make_cgroup(self.run_id, spec.name)
        with open(log, "ab") as logf:
            offset = logf.seek(0, os.SEEK_END)
            popen = subprocess.Popen(
                [sys.executable, self.layout.wrap, exit_file, "--", *spec.argv],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=self.process_env(spec, cgroup),
                close_fds=True,
                start_new_session=True,
            )
        self.popens[popen.pid] = popen
        # Not yet polled, so even a wrapper that already died is a zombie whose stat is readable.
        st = read_stat(popen.pid)
        if st is None:
            # Without its start time nothing could ever prove this process ours: stop it now,
            # while it is our unreaped child (its pid and group cannot be reused yet).
            with contextlib.suppress(OSError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.kill()
            popen.wait()
            raise AgentError("proc", f"/proc/{popen.pid}/stat of {spec.name} was unreadable "
                             "right after launch (/proc hidden?), so outrig cannot prove it "
                             "its own; it was killed at once", spec.name)
        record: JSONDict = {
            "name": spec.name,
            "pid": popen.pid,
            "pgid": st.pgid,
            "sid": st.sid,
            "start_ticks": st.start_ticks,
            "boot_id": boot_id(),
            "argv": list(spec.argv),
            "env_keys": [*sorted(set(spec.env) | set(self.secrets)), MARKER_KEY, PROCESS_KEY],
            # names only: status reads the values from the live process to redact its log tail
            "secret_keys": sorted(self.secrets),
            "cwd": cwd,
            "gpus": list(spec.gpus),
            "cgroup": cgroup,  # the wrapper joins it before starting the command
            "log": log,
            "exit_file": exit_file,
            "started_at": round(time.time(), 3),
            "stop_grace": spec.stop_grace,
            "stop_children_first": spec.stop_children_first,
            "scratch": [os.path.expanduser(d) for d in spec.scratch],
            "ready": spec.ready.to_json() if spec.ready is not None else None,
        }
        self.run["processes"].append(record)
        self.save()
        self.order.append(spec.name)
        watch = Watch(spec, popen, record, offset, self.settle, self.hidden)
        self.watches[spec.name] = watch
        self.out.emit("launched", process=spec.name, pid=popen.pid, pgid=st.pgid, sid=st.sid)

    def fail(self, watch: Watch, kind: str, message: str, code: Optional[int]) -> AgentError:
        """An error about one process, with its last log lines; secret values are redacted
        from both, since the error goes to the terminal, run.json and the journal."""
        excerpt = tail_lines(watch.record["log"], EXCERPT_LINES, self.hidden)
        return AgentError(kind, redact(message, self.hidden), watch.spec.name, excerpt, code)

    def mark_ready(self, watch: Watch) -> None:
        """Every readiness condition holds: record it and tell the workstation."""
        watch.ready = True
        watch.record["outcome"] = "ready"
        self.out.emit("ready", process=watch.spec.name, elapsed=watch.elapsed(),
                      via="+".join(watch.kinds))

    def mark_finished(self, watch: Watch) -> None:
        """Exited 0 before it was ready and nothing waits for it: done, not failed. A resumed
        trainer with nothing left to do logs that training is complete and exits 0."""
        watch.finished = True
        watch.record.update({"outcome": "finished", "exit_code": 0,
                             "ended_at": round(time.time(), 3)})
        self.save()
        self.out.emit("finished", process=watch.spec.name, elapsed=watch.elapsed(),
                      exit_code=0, last_line=watch.follower.latest())

    def early_exit(self, watch: Watch, code: Optional[int], sig: Optional[int]) -> None:
        """The process ended before it was ready: finished when it exited 0 and its readiness
        is not needed by a process after it, else an ``exited`` error."""
        spec = watch.spec
        waiting = sorted(p.name for p in self.procs if spec.name in p.after)
        alive_only = watch.kinds == ["alive"]
        if code == 0 and sig is None and (alive_only or not waiting):
            self.mark_finished(watch)
            return
        what = f"exited with code {code}" if sig is None else f"was killed by signal {sig}"
        if alive_only:
            message = (f"{spec.name} {what} {watch.elapsed():g} s after it started, so it "
                       f"never ran (it has no ready: check; a process must stay up "
                       f"{watch.settle:g} s to count as started)")
        else:
            message = f"{spec.name} {what} before it was ready"
            if code == 0 and sig is None:
                message += (f"; {', '.join(waiting)} waits for it (after:), so it had to be "
                            f"ready ({spec.ready.describe() if spec.ready else 'none'})")
        if code in (126, 127):
            message += ". Exit 126/127: the program could not be run; check the command " \
                       "and PATH on the box"
        raise self.fail(watch, "exited", message, code)

    def scan_lines(self, watch: Watch, lines: List[str]) -> None:
        """Fatal patterns (raise ``fatal_log``) and the log readiness regex, line by line."""
        spec = watch.spec
        log_re = spec.ready.log_re if spec.ready is not None else None
        for line in lines:
            for rx in spec.fatal:
                if rx.search(line):
                    raise self.fail(
                        watch,
                        "fatal_log",
                        f"{spec.name} logged a fatal line (matches /{rx.pattern}/): {line}",
                        None,
                    )
            if log_re is not None and log_re.search(line):
                watch.met.add("log")

    def check(self, watch: Watch) -> None:
        """One look at a launched process: fatal lines, readiness, early exit (raises)."""
        spec = watch.spec
        ready = spec.ready
        # Poll before reading: whatever the process wrote before it exited is then in the file.
        exited = not watch.ended and watch.popen.poll() is not None
        self.scan_lines(watch, watch.follower.read_new())
        while exited:  # drain the rest, including an unterminated last line
            more = watch.follower.read_new()
            if not more:
                self.scan_lines(watch, watch.follower.flush())
                break
            self.scan_lines(watch, more)
        if exited:
            watch.ended = True
            code, sig = watch.exit_status()
            watch.record["exit_code"] = code
            if "exit" in watch.kinds and code == 0:
                watch.met.add("exit")
            elif watch.ready and code == 0:
                return  # a process that was ready may end well (its work was short)
            elif watch.ready:
                what = f"exited with code {code}" if sig is None else f"was killed by signal {sig}"
                raise self.fail(watch, "exited", f"{spec.name} {what} after it was ready", code)
            elif "exit" in watch.kinds:  # a one-shot that failed: decided as before
                what = f"exited with code {code}" if sig is None else f"was killed by signal {sig}"
                raise self.fail(watch, "exited", f"{spec.name} {what} before it was ready", code)
            else:
                self.early_exit(watch, code, sig)
                return
        if watch.done:
            return
        now = time.monotonic()
        if "alive" in watch.kinds and now - watch.t0 >= watch.settle:
            watch.met.add("alive")
        if ready is not None and ("http" in watch.kinds or "port" in watch.kinds) \
                and now >= watch.next_probe:
            # Probe soon after launch, then back off to the steady period: a server that is
            # up in 100 ms should not cost a whole period (half a second of every deploy).
            watch.probes += 1
            watch.next_probe = now + min(PROBE_EVERY_S, 0.05 * (2 ** (watch.probes - 1)))
            if (
                ready.http is not None
                and "http" not in watch.met
                and probe_http(ready.http)
                and (ready.model is None or self.served_model_ok(watch, ready.http, ready.model))
                and (not ready.generate or self.answers_request(watch, ready.http, ready.model))
            ):
                watch.met.add("http")
            if ready.port is not None and "port" not in watch.met and probe_port(ready.port):
                watch.met.add("port")
        if all(k in watch.met for k in watch.kinds):
            self.mark_ready(watch)
        elif watch.ended:
            code, _ = watch.exit_status()
            raise self.fail(watch, "exited", f"{spec.name} exited before it was ready", code)

    def served_model_ok(self, watch: Watch, url: str, expected: str) -> bool:
        """True when /v1/models serves ``expected``; another id is an error right away (the
        trainer would die on it minutes later); no answer yet means keep waiting."""
        served = probe_served_model(url)
        if served is None:
            return False
        if served != expected:
            raise self.fail(
                watch,
                "model_mismatch",
                f"{watch.spec.name} serves model id {served!r} at /v1/models, but "
                f"{expected!r} is expected (the trainer's --verifier-name-or-path must equal it;"
                " do not pass --served-model-name)",
                None,
            )
        return True

    def answers_request(self, watch: Watch, url: str, model: Optional[str]) -> bool:
        """``ready.generate``: one tiny real request is answered 2xx. No answer yet means keep
        waiting; a non-2xx answer fails the deploy: with the fatal line when the log shows one
        (the engine died of it), else ``not_serving`` with the status and body."""
        assert model is not None  # validation: generate needs model
        code, text = probe_completion(url, model)
        if code is None:
            return False
        if 200 <= code < 300:
            self.out.step(f"{watch.spec.name} answered a /v1/completions request ({code})")
            return True
        # The engine logs its fatal error as it dies; the API server answers 500 right after.
        until = time.monotonic() + FATAL_AFTER_REFUSAL_S
        while True:
            self.scan_lines(watch, watch.follower.read_new())
            if time.monotonic() >= until:
                break
            time.sleep(TICK_S)
        raise self.fail(
            watch, "not_serving",
            f"{watch.spec.name} answers /health but refused a real request: POST /v1/completions"
            f" (model {model!r}, max_tokens 1) answered {code}: {text.strip()[:200]}", None)

    def wait_for(self, names: Set[str]) -> None:
        """Wait until every named process is ready (or finished), watching all launched ones
        meanwhile."""
        next_beat = time.monotonic() + self.progress_interval
        while True:
            for name in self.order:
                self.check(self.watches[name])
            self.census()
            pending = [self.watches[n] for n in self.order if n in names]
            pending = [w for w in pending if not w.done]
            if not pending:
                return
            now = time.monotonic()
            for w in pending:
                if w.spec.ready is not None and "alive" not in w.kinds \
                        and now - w.t0 >= w.limit:
                    raise self.fail(
                        w,
                        "timeout",
                        f"{w.spec.name} not ready after {w.spec.ready.timeout:g} s"
                        f" (waiting for {w.spec.ready.describe()})",
                        None,
                    )
            if self.cancel.requested():
                raise AgentError("cancelled", CANCEL_MESSAGE)
            if now >= next_beat:
                next_beat = now + self.progress_interval
                for w in pending:
                    self.out.emit(
                        "waiting",
                        process=w.spec.name,
                        elapsed=w.elapsed(),
                        timeout=w.limit,
                        last_line=w.follower.latest(),
                    )
            time.sleep(TICK_S)


def expand_home_workdir(procs: List[ProcSpec], raw: str, workdir: str) -> None:
    """A ``~/...`` workdir is rendered into commands as written (the workstation does not know
    the box's home); there is no shell to expand it, so the agent does it here."""
    if not raw.startswith("~"):
        return
    pattern = re.compile(re.escape(raw.rstrip("/")) + r"(?=/|$)")
    for spec in procs:
        spec.argv = [pattern.sub(lambda _m: workdir, arg) for arg in spec.argv]
        spec.env = {key: pattern.sub(lambda _m: workdir, value)
                    for key, value in spec.env.items()}
        if spec.cwd:
            spec.cwd = pattern.sub(lambda _m: workdir, spec.cwd)


def wrap_source() -> bytes:
    """The process wrapper's text: this package's wrap.py, read through whichever loader
    imported the package (a folder on disk or the bundle held in memory)."""
    data = pkgutil.get_data(__package__ or "", "wrap.py")
    if data is None:
        raise AgentError("internal", "the agent bundle has no wrap.py")
    return data


def write_files(layout: Layout, files: List[FileSpec], out: Emitter) -> None:
    """Step 4: wrap.py and the request's files, each atomically (``workdir`` error naming it).

    The request's files are written through folders opened one by one with O_NOFOLLOW under
    the workdir, so a symlinked folder on the box can never carry a file out of it."""
    for f in files:  # refuse every escape before writing anything
        with contextlib.closing(WorkdirFolder(layout.workdir, f.path, create=False)):
            pass
    try:
        write_atomic(layout.wrap, wrap_source(), 0o644)
    except OSError as exc:
        raise AgentError("workdir", f"cannot write {layout.wrap}: {exc.strerror or exc}") from None
    if files:
        out.step(f"writing {len(files)} file{'s' if len(files) != 1 else ''}")
    for f in files:
        try:
            with contextlib.closing(WorkdirFolder(layout.workdir, f.path, create=True)) as folder:
                folder.write(os.path.basename(f.path), f.data, f.mode)
        except OSError as exc:
            path = os.path.join(layout.workdir, f.path)
            raise AgentError("workdir", f"cannot write {path}: {exc.strerror or exc}") from None


class DeployArgs(NamedTuple):
    """A deploy request's fields, checked (see the protocol)."""

    playbook: str
    run_id: str
    secrets: Dict[str, str]
    files: List[FileSpec]
    procs: List[ProcSpec]
    wait: bool
    lock_timeout: float
    progress: float
    settle: float
    gpu_timeout: float
    host_label: str
    allow_unhealthy_gpu: bool


def parse_deploy(req: Request) -> DeployArgs:
    """Every field of a deploy request checked before anything on the box is touched."""
    raw = req.raw
    playbook = get_name(raw, "playbook", "")
    run_id = get_name(raw, "run_id", "")
    secrets = get_str_dict(raw, "secrets", "")
    files_raw = raw.get("files") or []
    if not isinstance(files_raw, list):
        raise bad_request("files: must be a list")
    files = [FileSpec(f, i) for i, f in enumerate(files_raw)]
    procs_raw = raw.get("processes")
    if not isinstance(procs_raw, list):
        raise bad_request("processes: must be a list")
    procs = [ProcSpec(p, i) for i, p in enumerate(procs_raw)]
    topo_order(procs)  # validate names and dependencies now, before touching anything
    expand_home_workdir(procs, str(raw.get("workdir") or ""), req.workdir)
    wait = get_bool(raw, "wait", "", True)
    lock_timeout = get_num(raw, "lock_timeout", "", 10.0)
    progress = get_num(raw, "progress_interval", "", 1.0, positive=True)
    settle = max(0.0, get_num(raw, "settle", "", DEFAULT_SETTLE_S))
    gpu_timeout = get_num(raw, "gpu_timeout", "", GPU_WAIT_DEFAULT_S, positive=True)
    host_label = get_opt_str(raw, "host_label", "") or "HOST"
    allow_unhealthy = get_bool(raw, "allow_unhealthy_gpu", "", False)
    return DeployArgs(playbook, run_id, secrets, files, procs, wait, lock_timeout, progress,
                      settle, gpu_timeout, host_label, allow_unhealthy)


def stop_previous(layout: Layout, out: Emitter, previous: str, before: Optional[JSONDict],
                  gpu_timeout: float) -> None:
    """Stop the run this deploy replaces and, when GPUs were audited, wait until the memory
    it held is released (``gpu_stuck`` otherwise: nothing is started)."""
    out.step(f"stopping previous run {previous}")
    stopper = Stopper(out, layout=layout)
    stop_run_by_id(layout, previous, stopper, out, None, by="redeploy")
    if before is not None:
        release = wait_gpus_released(layout, stopper, out, {previous}, before,
                                     gpu_timeout)
        verdict = release["verdict"]
        if not verdict["released"]:
            raise AgentError("gpu_stuck", f"{verdict.get('message')} Nothing was "
                             "started.")


def replaced_run(layout: Layout, previous: Optional[str]) -> Optional[JSONDict]:
    """The run this deploy replaces: its id, and its status and start (``created``, the
    box's clock) as run.json has them. The result adds ``age`` (seconds since ``created``,
    when the result is sent): the workstation compares it with how long its command has
    been running, so the second of two deploys started at the same moment can say that it
    replaced the first's run, just reported ready, and the two never both look live."""
    if previous is None:
        return None
    try:
        run = read_json(layout.run_json(previous))
    except (OSError, ValueError):
        run = {}
    if not isinstance(run, dict):
        run = {}
    created = run.get("created")
    return {"run_id": previous, "status": run.get("status"),
            "created": float(created) if isinstance(created, (int, float)) else None}


def with_age(replaced: Optional[JSONDict]) -> Optional[JSONDict]:
    """``replaced`` with its ``age`` now (None when its start is unknown)."""
    if replaced is None:
        return None
    created = replaced.get("created")
    age = None if created is None else round(max(0.0, time.time() - float(created)), 3)
    return {**replaced, "age": age}


def make_run_dir(layout: Layout, run_id: str) -> str:
    """The new run's folder with its logs/ and exit/ (an existing one is a bad request)."""
    run_dir = layout.run_dir(run_id)
    try:
        os.makedirs(run_dir)
        os.makedirs(os.path.join(run_dir, "logs"))
        os.makedirs(os.path.join(run_dir, "exit"))
    except FileExistsError:
        raise bad_request(f"run_id: {run_id} already exists in {layout.runs}") from None
    return run_dir


def launch(deployment: Deployment, layout: Layout, out: Emitter, run: JSONDict
           ) -> List[JSONDict]:
    """Run the deployment; when it fails, stop what it launched and record the run failed."""
    try:
        return deployment.execute()
    except BaseException as exc:
        error = exc if isinstance(exc, AgentError) else internal_error(exc)
        out.step(f"deploy failed ({error.kind}); stopping what was launched")
        stopper = deployment.stopper  # what the wait saw stays proven ours
        launched = [r for r in run["processes"] if valid_record(r)]
        graces = [float(r["stop_grace"]) for r in launched] or [DEFAULT_STOP_GRACE]
        stopper.stop_run(run["run_id"], launched, max(graces))
        run["status"] = "failed"
        run["error"] = error.to_json()
        deployment.save()
        raise


def op_deploy(req: Request, out: Emitter) -> JSONDict:
    """Push files, stop the previous run of the playbook, launch, wait; see the protocol."""
    args = parse_deploy(req)
    playbook, run_id, procs = args.playbook, args.run_id, args.procs
    layout = Layout(req.workdir)
    if os.path.lexists(layout.run_dir(run_id)):
        raise bad_request(f"run_id: {run_id} already exists in {layout.runs}")
    require_proc("started nothing (it could not stop what it starts)")
    ensure_workdir(layout)
    needs_gpus = any(p.gpus for p in procs)
    facts_box: List[JSONDict] = []
    facts_thread = threading.Thread(target=lambda: facts_box.append(gather_facts()), daemon=True)
    facts_thread.start()
    if needs_gpus:  # GPU indices and holders must be known before anything is touched
        facts_thread.join(30)
        facts: JSONDict = (facts_box[0] if facts_box
                           else {"gpus": [], "gpu_error": "nvidia-smi hung",
                                 "gpu_unreadable": True})
        out.emit("facts", **facts)
        check_gpus_readable(procs, facts, args.allow_unhealthy_gpu)
        check_gpus(procs, facts["gpus"])
        check_gpus_healthy(procs, facts, args.allow_unhealthy_gpu)
    else:  # nvidia-smi can take seconds on a real box: let it run while we launch
        facts = {"gpus": []}  # no GPU is named: nothing to check

    # announced while it waits for the lock: the deploy holding it sees this one coming
    with Waiting(layout, playbook, run_id) as waiting, \
            WorkdirLock(layout, "deploy", args.lock_timeout):
        waiting.leave()
        previous = read_pointer(layout, playbook)
        replaced = replaced_run(layout, previous)
        check_ports_free(layout, procs, previous, Stopper(out), args.host_label)
        needed = {g for p in procs for g in p.gpus}
        before: Optional[JSONDict] = None
        if needed and facts["gpus"]:
            # Refuse *before* stopping or writing anything when a GPU we need is held by
            # anything but the run this deploy replaces.
            before = gpu_audit(layout, Stopper(out, layout=layout))
            check_gpus_free(before, needed, previous, args.host_label)
        write_files(layout, args.files, out)
        if previous is not None:
            stop_previous(layout, out, previous, before, args.gpu_timeout)
        run_dir = make_run_dir(layout, run_id)
        run: JSONDict = {
            "v": PROTOCOL_VERSION,
            "run_id": run_id,
            "playbook": playbook,
            "marker": f"{MARKER_KEY}={run_id}",
            "created": round(time.time(), 3),
            "status": "launching",
            "processes": [],
            "manifest": req.raw.get("manifest"),
        }
        deployment = Deployment(layout, out, run, procs, args.secrets, args.wait,
                                args.progress, args.settle)
        deployment.save()
        write_atomic(layout.current(playbook), (run_id + "\n").encode())
        records = launch(deployment, layout, out, run)
        run["status"] = "finished" if deployment.all_finished() else "running"
        run["ready_at"] = round(time.time(), 3)  # the deploy succeeded: this run really ran
        deployment.save()
        next_ones = waiting_others(layout, playbook, run_id)  # they replace this run next
    if not needs_gpus:
        facts_thread.join(15)
        if facts_box:
            out.emit("facts", **facts_box[0])
    return {"run_id": run_id, "run_dir": run_dir, "processes": records,
            "status": run["status"], "replaced": with_age(replaced), "waiting": next_ones}
