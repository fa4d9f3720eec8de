# ruff: noqa: E501
"""Test stand-in for ``torchrun``: one node (``--standalone --nproc_per_node N
[--shutdown-timeout S] -m MOD ...``) or one node of several (``--nnodes N --node-rank I
--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID ...``).

Not product code. Reproduces the launcher behaviour outrig depends on, read from torch
2.13's ``torch/distributed`` (the same in 2.14; lines are 2.14's):

| real behaviour | source | here |
|---|---|---|
| each worker (rank) is started with ``start_new_session=True`` | elastic/multiprocessing/subprocess_handler/subprocess_handler.py:66 | same: every rank leads its own session and group (so a SIGKILLed launcher, a node that "disappears", leaves its ranks running: outrig's cleanup stops them by group and marker) |
| workers get RANK, GROUP_RANK, ROLE_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, WORLD_SIZE, GROUP_WORLD_SIZE, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID | elastic/agent/server/local_elastic_agent.py:425-437, 522 | same; RANK = GROUP_RANK × nproc + LOCAL_RANK, WORLD_SIZE = nnodes × nproc, the run id is ``--rdzv-id`` (``none`` alone) |
| ``--node-rank`` is ignored by c10d (a warning when it is not 0, a bare line first in the log) | run.py:968-977 | same warning; the rank comes from the rendezvous |
| c10d: the process whose endpoint host is this machine (``localhost``, a loopback or own address) hosts the TCP store; when the port is taken it falls back to a client of the store there | elastic/rendezvous/c10d_rendezvous_backend.py:137-145, 154-181; elastic/rendezvous/utils.py:117-133 | same: the first node started on the endpoint's machine hosts the store (outrig starts node 0 first, but torch's import time can reorder them: seen with real torchrun 2.14 on one machine); ``--rdzv-conf is_host=1/0`` decides it, with no fallback |
| the store's listening socket reuses its address (SO_REUSEADDR), so a store started on the port of one killed a moment ago binds although the old connections sit in TIME_WAIT (a job moved or restarted on the same rendezvous port) | torch/csrc/distributed/c10d/socket.cpp (``SocketListenOp::tryListen``: ``enableAddressReuse``); tests/contract/test_store_rebind.py checks it against torch's ``TCPStore`` | same |
| a client reaches the store within ``read_timeout`` (``--rdzv-conf read_timeout=S``, default 60 s), else RendezvousConnectionError | c10d_rendezvous_backend.py:148, 161, 179-181 | same: connects retrying until then, else exits 1 |
| the rendezvous completes when ``--nnodes`` nodes joined, within ``join_timeout`` (default 600 s) | elastic/rendezvous/dynamic_rendezvous.py:143-144, 1405 | same (``--rdzv-conf join_timeout=S``); nodes of another ``--rdzv-id`` do not meet |
| group ranks are assigned by sorting the participants (address, pid, local id), not by ``--node-rank`` | dynamic_rendezvous.py:833 | same sort (address, pid) |
| the store and join messages ("Process PID hosts the TCP store ...", "The node ... has joined round 0 ...") go to module loggers torchrun leaves unconfigured, so they are not in the log | c10d_rendezvous_backend.py:29, 165-169; dynamic_rendezvous.py:49, 1186-1191 | not printed either |
| the agent logs "[default] starting workers for entrypoint: python" (the binary's name) before the rendezvous, "[default] Rendezvous'ing worker group", then "[default] Rendezvous complete for workers. Result:" with ``group_rank=R``, ``group_world_size=N``, ``master_addr``, ``master_port`` ... on lines of their own | elastic/agent/server/api.py:912-914, 707, 553-575 | same lines, in that order |
| those agent lines are INFO: shown only with ``LOGLEVEL=INFO`` (default WARNING) | elastic/utils/logging.py:34-37 | same |
| MASTER_ADDR is group rank 0's ``--local-addr`` or ``socket.getfqdn()``, MASTER_PORT a free port it picked | elastic/rendezvous/api.py:89-100 | same (``getfqdn()``) |
| SIGTERM/SIGINT/SIGHUP/SIGQUIT to torchrun: ``close(death_sig)`` sends the signal to each worker's whole process group (``os.killpg``) | subprocess_handler.py:79-85, elastic/multiprocessing/api.py ``_close`` | same |
| then waits ``--shutdown-timeout`` (else ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, else 30 s) and SIGKILLs the groups still alive | run.py:690 (flag), api.py ``_close`` | same |
| ``--shutdown-timeout`` is a usage error on torch 2.11 (seen on the real H200) | | ``FAKE_TORCHRUN_NO_SHUTDOWN_TIMEOUT=1`` makes it one: exit 2 with argparse's message |
| all workers exit 0 → torchrun exits 0; one fails and ``--max-restarts`` is 0 (the default) → its node's workers are closed as above, exit 1 | elastic/agent/server/api.py:937-953 | same (restarts are not modelled: a ``--max-restarts`` other than 0 is refused) |
| a peer node's workers fail: that node's agent exits, closing the rendezvous on its way out (launcher/api.py:373, 405-406; dynamic_rendezvous.py:1284-1289); the other agents do not learn of it (a departed node never enters the wait list, so ``num_nodes_waiting()`` stays 0); their workers fail only if a collective with the gone peer errors, else they hang until the process group's timeout | api.py:957-969; dynamic_rendezvous.py:1265-1271 | the other nodes keep running: the stand-in's ranks run no collectives (the case where only outrig's guard stops them) |
| the store host's node goes away (its torchrun ends): every other agent's next ``num_nodes_waiting()`` fails, the error propagates out of ``run()`` whose ``finally`` shuts the workers down, exit 1 | api.py:959, 741-761; dynamic_rendezvous.py:1273-1278; local_elastic_agent.py:527-537 | same: each node asks the store every ``--monitor-interval`` (default 0.1 s, run.py:572-578); a lost store closes the workers (SIGTERM, shutdown timeout) and exits 1. Seen with real torchrun 2.14: the client node's agent failed with RendezvousConnectionError from ``num_nodes_waiting`` (c10d_rendezvous_backend.py:116) about a second after the store's node ended |

Difference: ranks >= 1 of the trainer stand-in only hold their GPUs, so when a node's local
rank 0 ends with code 0 this launcher ends that node's other ranks (SIGTERM to their groups)
instead of waiting for their loop. The exit barrier a finished node waits in
(api.py:931-940, 976; up to 300 s for the other nodes) is not modelled: a node whose
workers all exited 0 exits 0.

The module is run as ``python -m MOD`` (``-m speculators.train`` maps to the trainer
stand-in through ``FAKE_TORCHRUN_MODULES``: a JSON object module → script path).
Standard library only; no outrig import.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

DEFAULT_SHUTDOWN_TIMEOUT = 30
DEFAULT_PORT = 29400  # c10d's port when the endpoint names none
ENTRY = "torch/distributed"


def parse(argv: List[str]) -> tuple[argparse.Namespace, List[str]]:
    if "-m" not in argv:
        sys.stderr.write("fake torchrun: only '-m MODULE' is supported\n")
        sys.exit(2)
    cut = argv.index("-m")
    launcher, module, rest = argv[:cut], argv[cut + 1], argv[cut + 2:]
    p = argparse.ArgumentParser(prog="torchrun")
    p.add_argument("--standalone", action="store_true")
    p.add_argument("--nproc_per_node", "--nproc-per-node", type=int, default=1)
    p.add_argument("--nnodes", default="1")
    p.add_argument("--node_rank", "--node-rank", type=int, default=0)
    p.add_argument("--rdzv_backend", "--rdzv-backend", default="static")
    p.add_argument("--rdzv_endpoint", "--rdzv-endpoint", default="")
    p.add_argument("--rdzv_id", "--rdzv-id", default="none")
    p.add_argument("--rdzv_conf", "--rdzv-conf", default="")
    p.add_argument("--max_restarts", "--max-restarts", type=int, default=0)
    p.add_argument("--monitor_interval", "--monitor-interval", type=float, default=0.1)
    if os.environ.get("FAKE_TORCHRUN_NO_SHUTDOWN_TIMEOUT") != "1":
        p.add_argument("--shutdown-timeout", "--shutdown_timeout", type=int, default=None)
    args = p.parse_args(launcher)
    args.module = module
    low, _, high = str(args.nnodes).partition(":")
    if high and high != low:
        p.error("fake torchrun: an elastic --nnodes MIN:MAX is not modelled; give one count")
    args.nnodes = int(low)
    if args.max_restarts != 0:
        p.error("fake torchrun: restarts are not modelled; use --max-restarts 0")
    if args.nnodes > 1 and args.rdzv_backend != "c10d":
        p.error("fake torchrun: several nodes need --rdzv-backend c10d")
    return args, rest


def shutdown_timeout(args: argparse.Namespace) -> float:
    value = getattr(args, "shutdown_timeout", None)
    if value is None:
        value = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") or DEFAULT_SHUTDOWN_TIMEOUT
    return float(value)


def log(msg: str, where: str = "elastic/multiprocessing/api.py:1030", level: str = "W") -> None:
    """A line as torch's elastic loggers write it; INFO ones only with ``LOGLEVEL=INFO``."""
    if level == "I" and os.environ.get("LOGLEVEL", "WARNING").upper() not in ("INFO", "DEBUG"):
        return
    print(f"{level}1201 00:00:00.000000 {os.getpid()} {ENTRY}/{where}] {msg}", flush=True)


def rdzv_conf(text: str) -> Dict[str, str]:
    """``--rdzv-conf join_timeout=5,read_timeout=3`` as a dict."""
    pairs = [item.split("=", 1) for item in text.split(",") if "=" in item]
    return {k.strip(): v.strip() for k, v in pairs}


# ------------------------------------------------------------------ the rendezvous store


class Store:
    """The TCP store one node hosts: nodes join a rendezvous (by id), get their group rank
    once ``nnodes`` have joined, then ask it for news every monitor interval. JSON lines."""

    def __init__(self, sock: socket.socket, nnodes: int) -> None:
        self.sock, self.nnodes = sock, nnodes
        self.lock = threading.Condition()
        self.joined: Dict[str, List[Tuple[str, int]]] = {}
        self.master_port = free_port()

    def serve(self) -> None:
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        reader = conn.makefile("r")
        try:
            for line in reader:
                msg = json.loads(line)
                if msg.get("op") == "join":
                    answer = self._join(str(msg["id"]), str(msg["addr"]), int(msg["pid"]))
                else:
                    answer = {"waiting": 0}  # num_nodes_waiting(): nobody joins later
                conn.sendall((json.dumps(answer) + "\n").encode())
        except (OSError, ValueError):
            pass
        finally:
            conn.close()

    def _join(self, rdzv_id: str, addr: str, pid: int) -> Dict[str, Any]:
        with self.lock:
            members = self.joined.setdefault(rdzv_id, [])
            members.append((addr, pid))
            self.lock.notify_all()
            while len(members) < self.nnodes:
                self.lock.wait()
            ranked = sorted(members[: self.nnodes])
            return {"rank": ranked.index((addr, pid)), "world": self.nnodes,
                    "master_addr": socket.getfqdn(), "master_port": self.master_port}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def matches_this_machine(host: str) -> bool:
    """utils.py:117-133: localhost, a loopback address, or one of this machine's names."""
    if host in ("localhost", "127.0.0.1", "::1") or host.startswith("127."):
        return True
    return host in (socket.gethostname(), socket.getfqdn())


def host_store(host: str, port: int, nnodes: int, is_host: Optional[str]) -> Optional[Store]:
    """Host the store when ``is_host`` says so, or (unset) when the endpoint is this machine
    and its port is free; else None: a client of the store already there
    (c10d_rendezvous_backend.py:137-145, 154-181)."""
    told = None if is_host is None else is_host.lower() in ("1", "true", "t", "yes", "y")
    if told is False or (told is None and not matches_this_machine(host)):
        return None
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if told:
            log(f"RendezvousConnectionError: The connection to the C10d store has failed "
                f"({exc}).", "elastic/rendezvous/c10d_rendezvous_backend.py:180", "E")
            sys.exit(1)
        return None
    sock.listen(64)
    store = Store(sock, nnodes)
    store.serve()
    return store


def rendezvous(args: argparse.Namespace) -> Tuple[Dict[str, Any], Optional[socket.socket]]:
    """Join the rendezvous; return its answer and the open store connection."""
    if args.nnodes == 1:
        return {"rank": 0, "world": 1, "master_addr": socket.getfqdn(),
                "master_port": free_port()}, None
    host, _, port_text = args.rdzv_endpoint.rpartition(":")
    if not host:
        host, port_text = args.rdzv_endpoint, ""
    port = int(port_text) if port_text else DEFAULT_PORT
    conf = rdzv_conf(args.rdzv_conf)
    read_timeout = float(conf.get("read_timeout", 60))
    join_timeout = float(conf.get("join_timeout", 600))
    store = host_store(host, port, args.nnodes, conf.get("is_host"))
    deadline = time.monotonic() + read_timeout
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=read_timeout)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                log(f"RendezvousConnectionError: The connection to the C10d store has failed "
                    f"({exc}).", "elastic/rendezvous/c10d_rendezvous_backend.py:180", "E")
                sys.exit(1)
            time.sleep(0.2)
    me = "127.0.0.1" if matches_this_machine(host) else socket.getfqdn()
    conn.settimeout(join_timeout)
    conn.sendall((json.dumps({"op": "join", "id": args.rdzv_id, "addr": me,
                              "pid": os.getpid()}) + "\n").encode())
    try:
        answer: Dict[str, Any] = json.loads(conn.makefile("r").readline())
    except (OSError, ValueError):
        log(f"RendezvousTimeoutError: the rendezvous '{args.rdzv_id}' did not complete within "
            f"{join_timeout:g} s", "elastic/rendezvous/dynamic_rendezvous.py:1180", "E")
        sys.exit(1)
    conn.settimeout(read_timeout)
    if store is not None:
        answer["store"] = store  # kept alive with this process
    return answer, conn


def store_alive(conn: Optional[socket.socket], reader: Any) -> bool:
    """num_nodes_waiting(): one round trip to the store; False once it is gone."""
    if conn is None:
        return True
    try:
        conn.sendall(b'{"op": "waiting"}\n')
        return bool(reader.readline())
    except OSError:
        return False


def main(argv: List[str]) -> int:
    args, rest = parse(argv)
    modules: Dict[str, str] = json.loads(os.environ.get("FAKE_TORCHRUN_MODULES") or "{}")
    script = modules.get(args.module)
    if script is None:
        sys.stderr.write(f"fake torchrun: no stand-in for module {args.module}\n")
        return 2
    workers: List[subprocess.Popen[bytes]] = []
    state: Dict[str, Any] = {"signal": None}

    def on_signal(signum: int, frame: Any) -> None:
        state["signal"] = signum

    # A signal during the rendezvous ends the process at once (torch raises
    # SignalException there); from here on it closes the workers first.
    if args.node_rank != 0 and args.rdzv_backend != "static":
        # run.py's own logger: a bare line, before anything of the agent (seen on 2.14)
        print(f"node_rank is only used for static rdzv_backend. It will be ignored for "
              f"rdzv_backend={args.rdzv_backend}.", flush=True)
    log(f"[default] starting workers for entrypoint: {os.path.basename(sys.executable)}",
        "elastic/agent/server/api.py:912", "I")
    log("[default] Rendezvous'ing worker group", "elastic/agent/server/api.py:707", "I")
    group, conn = rendezvous(args)
    nproc, nnodes = args.nproc_per_node, int(group["world"])
    ranks = [int(group["rank"]) * nproc + local for local in range(nproc)]
    for line in ("[default] Rendezvous complete for workers. Result:", "  restart_count=0",
                 f"  master_addr={group['master_addr']}",
                 f"  master_port={group['master_port']}", f"  group_rank={group['rank']}",
                 f"  group_world_size={nnodes}", f"  local_ranks={list(range(nproc))}",
                 f"  role_ranks={ranks}", f"  global_ranks={ranks}",
                 f"  role_world_sizes={[nnodes * nproc] * nproc}",
                 f"  global_world_sizes={[nnodes * nproc] * nproc}"):
        log(line, "elastic/agent/server/api.py:553", "I")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, on_signal)
    reader = conn.makefile("r") if conn is not None else None
    for local in range(nproc):
        rank = int(group["rank"]) * nproc + local
        env = {**os.environ, "RANK": str(rank), "GROUP_RANK": str(group["rank"]),
               "ROLE_RANK": str(rank), "LOCAL_RANK": str(local),
               "LOCAL_WORLD_SIZE": str(nproc), "WORLD_SIZE": str(nnodes * nproc),
               "GROUP_WORLD_SIZE": str(nnodes), "ROLE_WORLD_SIZE": str(nnodes * nproc),
               "MASTER_ADDR": str(group["master_addr"]),
               "MASTER_PORT": str(group["master_port"]), "TORCHELASTIC_RESTART_COUNT": "0",
               "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": args.rdzv_id}
        workers.append(subprocess.Popen([sys.executable, script, *rest], env=env,
                                        stdin=subprocess.DEVNULL, start_new_session=True))

    def close(sig: int) -> None:
        for w in workers:
            if w.poll() is None:
                log(f"Sending process {w.pid} closing signal {signal.Signals(sig).name}")
                try:
                    os.killpg(w.pid, sig)
                except ProcessLookupError:
                    pass
        end = time.monotonic() + shutdown_timeout(args)
        for w in workers:
            left = end - time.monotonic()
            if left <= 0:
                break
            try:
                w.wait(left)
            except subprocess.TimeoutExpired:
                pass
        for w in workers:
            if w.poll() is None:
                log(f"Unable to shutdown process {w.pid} via {signal.Signals(sig)}, forcefully "
                    "exiting via Signals.SIGKILL")
                try:
                    os.killpg(w.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                w.wait()

    failed: Optional[int] = None
    while True:
        if state["signal"] is not None:
            close(state["signal"])
            return 128 + int(state["signal"])
        codes = [w.poll() for w in workers]
        bad = [c for c in codes if c not in (None, 0)]
        if bad:
            failed = bad[0]
            close(signal.SIGTERM)
            log(f"failed (exitcode: {failed}) local_rank: {codes.index(failed)}")
            return 1
        if all(c == 0 for c in codes):
            return 0
        if not store_alive(conn, reader):
            log("RendezvousConnectionError: The connection to the C10d store has failed.",
                "elastic/rendezvous/dynamic_rendezvous.py:1278", "E")
            close(signal.SIGTERM)
            return 1
        if codes[0] == 0 and not state.get("rank0_done"):
            # Stand-in only: ranks >= 1 hold GPUs but do not train, so they are told to end
            # when rank 0 has (the real ranks finish their loop at the same time).
            state["rank0_done"] = True
            for w in workers[1:]:
                if w.poll() is None:
                    os.killpg(w.pid, signal.SIGTERM)
        time.sleep(max(0.05, args.monitor_interval))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
