"""The agent's entry point: one request in, events out, always a ``result`` line last.

:data:`OPS` is the one table from op name to the function that runs it; its names are exactly
the protocol's (protocol.py; a unit test keeps them in step).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Callable, Dict, Optional

from .bundle import REQUEST_ENV, decode_request
from .checkpoints import op_checkpoints
from .cleanup import op_cleanup
from .constants import JSONDict
from .deploy import op_deploy
from .events import AgentError, Emitter, internal_error
from .follow import op_follow
from .hub import op_hub_download
from .model_facts import op_model_facts
from .peer import op_peer_keygen, op_peer_pull
from .provision import op_provision
from .runs import report_runs
from .status import op_check, op_logs, op_status
from .transfer import (
    op_authorize_key,
    op_manifest,
    op_mark_staged,
    op_recv_files,
    op_revoke_key,
    op_send_files,
)
from .validation import Request, apply_env, parse_request

OpFunction = Callable[[Request, Emitter], JSONDict]
OPS: Dict[str, OpFunction] = {
    "deploy": op_deploy,
    "cleanup": op_cleanup,
    "status": op_status,
    "logs": op_logs,
    "check": op_check,
    "model_facts": op_model_facts,
    "follow": op_follow,
    "provision": op_provision,
    "hub_download": op_hub_download,
    "mark_staged": op_mark_staged,
    "manifest": op_manifest,
    "send_files": op_send_files,
    "recv_files": op_recv_files,
    "authorize_key": op_authorize_key,
    "revoke_key": op_revoke_key,
    "peer_keygen": op_peer_keygen,
    "peer_pull": op_peer_pull,
    "checkpoints": op_checkpoints,
}


def dispatch(req: Request, out: Emitter) -> JSONDict:
    """Apply the host env, then run the op (``Request`` has checked it is one of OPS)."""
    apply_env(req.env)
    return OPS[req.op](req, out)


def read_request_line() -> bytes:
    """The request: handed over by the bootstrap in ``OUTRIG_REQUEST`` (taken out of the
    environment at once, so no launched process inherits it; see bundle.py), or else exactly
    one line from stdin, which may stay open."""
    preset = os.environ.pop(REQUEST_ENV, None)
    if preset:
        return decode_request(preset)
    return sys.stdin.buffer.readline()


def main() -> None:
    """Read one request line, run it, always finish with a ``result`` line."""
    out = Emitter(sys.stdout.buffer)
    req: Optional[Request] = None
    try:
        req = parse_request(read_request_line())
        result = dispatch(req, out)
        report_runs(req, out)
        out.emit("result", ok=True, **result)
    except AgentError as exc:
        report_runs(req, out)
        out.emit("result", ok=False, error=exc.to_json())
    except (Exception, KeyboardInterrupt) as exc:
        error = internal_error(exc, req.workdir if req is not None else None)
        if error.kind == "internal":
            traceback.print_exc(file=sys.stderr)
        out.emit("result", ok=False, error=error.to_json())


if __name__ == "__main__":
    main()
