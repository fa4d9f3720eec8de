"""``requires:``: what the box itself must offer a playbook (Python, NVIDIA driver, free
disk), parsed from the request and checked before anything is installed (docs/provision.md).

Each check fails with the error kind a person acts on (``driver``, ``disk``) and says the fix;
nothing here installs or changes the box.
"""

from __future__ import annotations

import os
import shutil
from typing import List, Optional, Set

from .constants import JSONDict
from .events import AgentError, bad_request
from .layout import nearest_existing
from .validation import get_dict, get_num, get_opt_str
from .versions import version_satisfies


def parse_requires(raw: JSONDict) -> JSONDict:
    """``requires: {python, driver, disk_gb}``, validated."""
    req = get_dict(raw, "requires", "")
    out: JSONDict = {"python": get_opt_str(req, "python", "requires."),
                     "driver": get_opt_str(req, "driver", "requires."),
                     "disk_gb": None}
    for key in ("python", "driver"):
        spec = out[key]
        if spec is not None and version_satisfies("1", spec) is None:
            raise bad_request(f"requires.{key}: cannot read {spec!r}; write it like '>=3.10'")
    if req.get("disk_gb") is not None:
        out["disk_gb"] = get_num(req, "disk_gb", "requires.", 0.0, positive=True)
    unknown = sorted(set(req) - {"python", "driver", "disk_gb"})
    if unknown:
        raise bad_request(f"requires: unknown key(s) {', '.join(unknown)}; known: python, "
                          "driver, disk_gb")
    return out


def check_driver(spec: Optional[str], gpus: List[JSONDict], gpu_error: Optional[str]) -> JSONDict:
    """The NVIDIA driver against ``requires.driver`` (``driver`` error when it falls short)."""
    version = next((str(g.get("driver")) for g in gpus if g.get("driver")), None)
    check: JSONDict = {"driver": version, "required": spec, "ok": True}
    if spec is None:
        return check
    if version is None:
        raise AgentError(
            "driver",
            f"the playbook requires NVIDIA driver {spec} but nvidia-smi gave no driver version "
            f"({gpu_error or 'no GPUs listed'}); install the NVIDIA driver (and make nvidia-smi "
            "reachable through the host file's env: PATH) on the box, or use another box",
        )
    if version_satisfies(version, spec) is not True:
        raise AgentError(
            "driver",
            f"NVIDIA driver {version} on the box is older than the playbook requires ({spec}); "
            "use a box with a newer driver (CUDA wheels such as torch+cu130 need it) or relax "
            "requires.driver if you know the stack runs on this one",
        )
    return check


def check_disk(paths: List[str], need_gb: Optional[float]) -> List[JSONDict]:
    """Free space where each environment (and the workdir) will live, one entry per filesystem."""
    seen: Set[int] = set()
    checks: List[JSONDict] = []
    for path in paths:
        base = nearest_existing(path)
        try:
            st = os.stat(base)
            usage = shutil.disk_usage(base)
        except OSError:
            continue
        if st.st_dev in seen:
            continue
        seen.add(st.st_dev)
        free_gb = usage.free / 1e9
        entry = {"path": path, "checked_at": base, "free_gb": round(free_gb, 1),
                 "required_gb": need_gb}
        checks.append(entry)
        if need_gb is not None and free_gb < need_gb:
            raise AgentError(
                "disk",
                f"only {free_gb:.1f} GB free at {base} (for {path}); the playbook requires "
                f"{need_gb:g} GB (requires.disk_gb). Free space (old venvs, HF cache, "
                "checkpoints) or rent a box with a larger disk; nothing was installed",
            )
    return checks
