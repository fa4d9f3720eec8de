"""Test stand-in for ``mooncake_master`` (mooncake-transfer-engine 0.3.13; not product code).

The real master is a native binary that needs the RDMA user libraries (libibverbs, libnl-3)
even for TCP; the sandbox boxes use this instead. What outrig relies on, each as the real
one does it (its glog lines name the source, ``file.cpp:line``; tests/standins/README.md;
tests/contract/test_mooncake_master.py checks both against the same expectations):

- flags in gflags form (``--rpc_port 50051`` or ``--rpc_port=50051``, one dash too):
  ``rpc_port`` (the port the trainer and vLLM's store clients reach), ``rpc_address``
  (default ``0.0.0.0``), ``metrics_port`` (default 9003), ``metrics_host`` (default
  ``0.0.0.0``); others are accepted and ignored;
- start: ``master.cpp:1522] Master service started on port P, ...`` is printed first, then
  the RPC port listens; the admin HTTP server on the metrics port follows
  (``master_admin_service.cpp:310] Master admin server started on port M``) and answers
  ``GET /health`` with 200 and ``{"status":"ok",...,"service_ready":true}``, ``/metrics``
  with 200, anything else 404;
- an RPC port already taken: the same start line, then exit 1 with no error of its own (so
  only outrig's check before launch names the port);
- SIGTERM: ``master.cpp:1683] Shutdown signal received, exiting gracefully``, exit 0.

Standard library only; no outrig import.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List

DEFAULTS = {"rpc_port": "0", "port": "50051", "rpc_address": "0.0.0.0", "metrics_port": "9003",
            "metrics_host": "0.0.0.0"}


def log(where: str, text: str) -> None:
    """A glog line: ``I1205 06:18:31.659734 17347 master.cpp:1522] text``."""
    now = time.time()
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1e6):06d}"
    print(f"I{stamp} {os.getpid()} {where}] {text}", file=sys.stderr, flush=True)


def parse(argv: List[str]) -> Dict[str, str]:
    flags = dict(DEFAULTS)
    i = 0
    while i < len(argv):
        arg = argv[i].lstrip("-")
        if "=" in arg:
            key, value = arg.split("=", 1)
        else:
            key = arg
            value = argv[i + 1] if i + 1 < len(argv) else ""
            i += 1
        flags[key] = value
        i += 1
    return flags


class Admin(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            body = json.dumps({"status": "ok", "role": "leader", "ha_state": "serving",
                               "service_ready": True, "leader_address": None,
                               "view_version": None}).encode()
        elif self.path == "/metrics":
            body = b"master_key_count 0\n"
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def accept_forever(server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        conn.close()


def main(argv: List[str]) -> None:
    flags = parse(argv)
    port = int(flags["rpc_port"]) or int(flags["port"])
    metrics = int(flags["metrics_port"])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log("master.cpp:1522", f"Master service started on port {port}, metrics_port={metrics}, "
        f"metrics_host={flags['metrics_host']}, rpc_port={port}, "
        f"rpc_address={flags['rpc_address']} (fake, outrig test stand-in)")
    rpc = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        rpc.bind((flags["rpc_address"], port))
        rpc.listen(64)
        admin = ThreadingHTTPServer((flags["metrics_host"], metrics), Admin)
    except OSError:
        os._exit(1)  # the real one exits 1 without a line of its own
    threading.Thread(target=accept_forever, args=(rpc,), daemon=True).start()
    threading.Thread(target=admin.serve_forever, kwargs={"poll_interval": 0.1},
                     daemon=True).start()
    log("master_admin_service.cpp:310", f"Master admin server started on port {metrics}")
    while not stop.wait(0.1):
        pass
    log("master.cpp:1683", "Shutdown signal received, exiting gracefully")
    admin.shutdown()
    rpc.close()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
