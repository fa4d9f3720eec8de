# ruff: noqa: E501
"""Test stand-in for ``torchrun --standalone --nproc_per_node N [--shutdown-timeout S] -m MOD ...``.

Not product code. Reproduces the launcher behaviour outrig's stop depends on, read from torch
2.13's ``torch/distributed`` (the same in 2.14):

| real behaviour | source | here |
|---|---|---|
| each worker (rank) is started with ``start_new_session=True`` | elastic/multiprocessing/subprocess_handler/subprocess_handler.py:66 | same: every rank leads its own session and group |
| workers get RANK, LOCAL_RANK, WORLD_SIZE in their environment | elastic/agent/server/local_elastic_agent.py (worker_env) | same |
| SIGTERM/SIGINT/SIGHUP/SIGQUIT to torchrun: ``close(death_sig)`` sends the signal to each worker's whole process group (``os.killpg``) | subprocess_handler.py:79-85, elastic/multiprocessing/api.py ``_close`` | same |
| then waits ``--shutdown-timeout`` (else ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, else 30 s) and SIGKILLs the groups still alive | run.py:690 (flag), api.py ``_close`` | same |
| ``--shutdown-timeout`` is a usage error on torch 2.11 (seen on the real H200) | | ``FAKE_TORCHRUN_NO_SHUTDOWN_TIMEOUT=1`` makes it one: exit 2 with argparse's message |
| all workers exit 0 → torchrun exits 0; one fails → the others are closed as above, exit 1 | elastic/agent/server/api.py ``_invoke_run`` | same |

Difference: ranks >= 1 of the trainer stand-in only hold their GPUs, so when rank 0 ends with
code 0 this launcher ends them (SIGTERM to their groups) instead of waiting for their loop.

The module is run as ``python -m MOD`` (``-m speculators.train`` maps to the trainer
stand-in through ``FAKE_TORCHRUN_MODULES``: a JSON object module → script path).
Standard library only; no outrig import.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

DEFAULT_SHUTDOWN_TIMEOUT = 30


def parse(argv: List[str]) -> tuple[argparse.Namespace, List[str]]:
    if "-m" not in argv:
        sys.stderr.write("fake torchrun: only '-m MODULE' is supported\n")
        sys.exit(2)
    cut = argv.index("-m")
    launcher, module, rest = argv[:cut], argv[cut + 1], argv[cut + 2:]
    p = argparse.ArgumentParser(prog="torchrun")
    p.add_argument("--standalone", action="store_true")
    p.add_argument("--nproc_per_node", "--nproc-per-node", type=int, default=1)
    if os.environ.get("FAKE_TORCHRUN_NO_SHUTDOWN_TIMEOUT") != "1":
        p.add_argument("--shutdown-timeout", "--shutdown_timeout", type=int, default=None)
    args = p.parse_args(launcher)
    args.module = module
    return args, rest


def shutdown_timeout(args: argparse.Namespace) -> float:
    value = getattr(args, "shutdown_timeout", None)
    if value is None:
        value = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") or DEFAULT_SHUTDOWN_TIMEOUT
    return float(value)


def log(msg: str) -> None:
    print(f"W1201 00:00:00.000000 {os.getpid()} torch/distributed/elastic/multiprocessing/"
          f"api.py:1030] {msg}", flush=True)


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

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, on_signal)
    for rank in range(args.nproc_per_node):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": str(args.nproc_per_node), "TORCHELASTIC_RUN_ID": "none"}
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
        if codes[0] == 0 and not state.get("rank0_done"):
            # Stand-in only: ranks >= 1 hold GPUs but do not train, so they are told to end
            # when rank 0 has (the real ranks finish their loop at the same time).
            state["rank0_done"] = True
            for w in workers[1:]:
                if w.poll() is None:
                    os.killpg(w.pid, signal.SIGTERM)
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
