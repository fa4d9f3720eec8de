"""The agent's entry point: one request in, events out, always a ``result`` line last.

:data:`OPS` is the one table from op name to the function that runs it; its names are exactly
the protocol's (protocol.py; a unit test keeps them in step).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from typing import Callable, Dict, Optional

from .constants import JSONDict
from .events import AgentError, Emitter, internal_error
from .protocol import REQUEST_ENV, SERVE_KEY, decode_request
from .validation import Request, apply_env, parse_request

OpFunction = Callable[[Request, Emitter], JSONDict]
# op → "module:function" in this package. A call imports only its op's module (and what that
# imports): a ``check`` or ``status`` does not pay for provision, transfer or hub on every start.
OPS: Dict[str, str] = {
    "deploy": "deploy:op_deploy",
    "cleanup": "cleanup:op_cleanup",
    "status": "status:op_status",
    "logs": "status:op_logs",
    "check": "status:op_check",
    "model_facts": "model_facts:op_model_facts",
    "follow": "follow:op_follow",
    "provision": "provision:op_provision",
    "hub_download": "hub:op_hub_download",
    "mark_staged": "transfer:op_mark_staged",
    "manifest": "transfer:op_manifest",
    "send_files": "transfer:op_send_files",
    "recv_files": "transfer:op_recv_files",
    "authorize_key": "transfer:op_authorize_key",
    "revoke_key": "transfer:op_revoke_key",
    "peer_keygen": "peer:op_peer_keygen",
    "peer_pull": "peer:op_peer_pull",
    "checkpoints": "checkpoints:op_checkpoints",
    "bench": "bench:op_bench",
}


def op_function(op: str) -> OpFunction:
    """The function that runs ``op`` (its module imported on first use)."""
    module, _, name = OPS[op].partition(":")
    run: OpFunction = getattr(importlib.import_module("." + module, __package__), name)
    return run


def dispatch(req: Request, out: Emitter) -> JSONDict:
    """Apply the host env, then run the op (``Request`` has checked it is one of OPS)."""
    apply_env(req.env)
    return op_function(req.op)(req, out)


def read_request_line() -> bytes:
    """The request: handed over by the bootstrap in ``OUTRIG_REQUEST`` (taken out of the
    environment at once, so no launched process inherits it; see bundle.py), or else exactly
    one line from stdin, which may stay open."""
    preset = os.environ.pop(REQUEST_ENV, None)
    if preset:
        return decode_request(preset)
    return sys.stdin.buffer.readline()


def _report_runs(req: Optional[Request], out: Emitter) -> None:
    """The run index for the ops that report it (runs.py; imported only for those)."""
    from .runs import RUN_INDEX_OPS, report_runs

    if req is not None and req.op in RUN_INDEX_OPS:
        report_runs(req, out)


def run(line: bytes) -> None:
    """Run one request line, always finishing with a ``result`` line: the exec path's whole
    life, and each serve-mode child's (serve.py)."""
    out = Emitter(sys.stdout.buffer)
    req: Optional[Request] = None
    try:
        req = parse_request(line)
        result = dispatch(req, out)
        _report_runs(req, out)
        out.emit("result", ok=True, **result)
    except AgentError as exc:
        _report_runs(req, out)
        out.emit("result", ok=False, error=exc.to_json())
    except (Exception, KeyboardInterrupt) as exc:
        error = internal_error(exc, req.workdir if req is not None else None)
        if error.kind == "internal":
            traceback.print_exc(file=sys.stderr)
        out.emit("result", ok=False, error=error.to_json())


def serve_options(line: bytes) -> Optional[JSONDict]:
    """The options of a serve-mode request (``{"serve": {...}}``), else ``None``: one op."""
    if not line.lstrip().startswith(b'{"' + SERVE_KEY.encode() + b'"'):
        return None
    try:
        options = json.loads(line).get(SERVE_KEY)
    except (ValueError, AttributeError):
        return None
    return options if isinstance(options, dict) else None


def preload() -> None:
    """Serve mode, once idle: import every op's module, so each forked request starts with
    its code loaded (the exec path imports only its own op's)."""
    for target in [*OPS.values(), "runs:report_runs"]:
        importlib.import_module("." + target.partition(":")[0], __package__)


def main() -> None:
    """Read the request line: serve mode (the keeper's live agent), or one request."""
    line = read_request_line()
    options = serve_options(line)
    if options is None:
        run(line)
        return
    from .bundle import running_digest
    from .serve import serve

    serve(options, run, preload, running_digest())


if __name__ == "__main__":
    main()
