"""A fake ``dmesg`` for the sandbox box: the kernel log a GPU box would show, so the agent's
Xid reading (remote/agent/gpus.py ``read_xid_lines``) runs against lines of the real form.

Why a fake: the sandbox is this machine, whose kernel log has no NVIDIA driver in it; and a
test must be able to give one GPU an Xid, or refuse the log to the user, at will. The state
is ``kernel-log.json`` in the fake GPU state dir (``$OUTRIG_FAKE_GPU_DIR``, as the fake
nvidia-smi): ``{"lines": [...], "denied": false}``. Without it the log holds the NVRM lines
of the H200 capture (docs/real-gpu.md): a healthy box.

Formats, from real output: plain ``dmesg`` stamps each line ``[    0.685698] `` (seconds
since boot); a refused read prints util-linux's ``dmesg: read kernel buffer failed:
Operation not permitted`` and exits 1 (``kernel.dmesg_restrict=1``, not root); an Xid is
``NVRM: Xid (PCI:0000:2b:00): 79, pid=..., name=..., GPU has fallen off the bus.`` (NVIDIA's
Xid catalog; the PCI address is domain:bus:device of the GPU).

This file runs on the "box" side as a script (copied into the sandbox's bin dir with a
shebang), so it uses only the standard library and never imports outrig.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

STATE_ENV = "OUTRIG_FAKE_GPU_DIR"  # the fake nvidia-smi's state dir (nvidia_smi.STATE_ENV)
LOG_FILE = "kernel-log.json"
# The NVRM lines of the H200 capture (gpu-health.txt), as dmesg printed them.
HEALTHY_LINES = [
    "[    0.685698] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  "
    "Release Build  (nixbld@)  ",
    "[    1.285853] NVRM: gpuClearFbhubPoisonIntrForBug2924523_GA100: FBHUB Interrupt "
    "detected. Clearing it.",
    "[    3.748358] NVRM: Persistence mode is deprecated and will be removed in a future "
    "release. Please use nvidia-persistenced instead.",
]
DENIED = "dmesg: read kernel buffer failed: Operation not permitted"
XID_TEXT = {
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
        "at partition 0, subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap row.",
    79: "GPU has fallen off the bus.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No",
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
        "0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
}


def state_dir() -> Path:
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(env)
    script = sys.argv[0] if sys.argv and sys.argv[0] else __file__
    return Path(os.path.abspath(script)).parent.parent / "gpu"


def xid_line(bus_id: str, xid: int, seconds: float = 1234.5, pid: Optional[int] = None,
             name: str = "python3") -> str:
    """One Xid line as the driver logs it, for the GPU at nvidia-smi's ``bus_id``
    (``00000000:00:06.0`` → ``PCI:0000:00:06``)."""
    domain, bus, rest = bus_id.split(":")
    device = rest.split(".")[0]
    who = f"pid={pid}, name={name}, " if pid is not None else ""
    text = XID_TEXT.get(xid, "Xid error")
    return (f"[{seconds:12.6f}] NVRM: Xid (PCI:{int(domain, 16):04x}:{bus.lower()}:"
            f"{device.lower()}): {xid}, {who}{text}")


def write_kernel_log(gpu_dir: Path, lines: Optional[List[str]] = None, *,
                     denied: bool = False) -> Path:
    """The log the fake shows: the healthy lines plus ``lines``; ``denied``: refused."""
    path = Path(gpu_dir) / LOG_FILE
    data: Dict[str, Any] = {"lines": [*HEALTHY_LINES, *(lines or [])], "denied": denied}
    tmp = Path(gpu_dir) / f".{LOG_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
    return path


def main(argv: Optional[List[str]] = None, gpu_dir: Optional[Path] = None) -> int:
    """Print the log (any arguments are ignored, as the agent passes none)."""
    del argv
    path = (gpu_dir if gpu_dir is not None else state_dir()) / LOG_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {"lines": HEALTHY_LINES, "denied": False}
    if data.get("denied"):
        print(DENIED, file=sys.stderr)
        return 1
    for line in data.get("lines") or []:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
