"""A fake ``nvidia-smi`` for the sandbox box: same CLI shapes and output formats as the real one.

Why: outrig reads GPU inventory and GPU-holding processes through ``nvidia-smi`` (see
docs/agent-protocol.md, ``facts``) and its cleanup audits GPUs after killing a run. To test
that against processes that misbehave the way vLLM's renamed workers do, the GPU "memory"
must belong to real, live processes. So GPU-using stand-ins write ``holders/<pid>.json`` into
the state dir, and this tool counts a holder only while its pid is alive (not a zombie): kill
the process and its memory is "freed", exactly what outrig has to observe on a real box.

The state dir is ``$OUTRIG_FAKE_GPU_DIR``, else ``<dir of this script>/../gpu``. It holds
``inventory.json``: ``{"gpus": [{"index", "uuid", "name", "memory_total_mib"}], "driver"}``.

Output formats copy the real captures in tests/fixtures/h200-1gpu (driver 580.159.04):
``", "`` separated CSV, units ``" MiB"``/``" %"`` unless ``nounits``, and the full table.

This file runs on the "box" side as a script (copied into the sandbox's bin dir with a
shebang), so it uses only the standard library and never imports outrig.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

DEFAULT_DRIVER = "580.159.04"
CUDA_VERSION = "13.0"
STATE_ENV = "OUTRIG_FAKE_GPU_DIR"

# Memory the driver keeps for itself: the H200 capture shows total 143771, used 0, free 143156.
_RESERVED_FRACTION = 615 / 143771

GPU_FIELDS = {
    "index": "index",
    "uuid": "uuid",
    "gpu_uuid": "uuid",
    "name": "name",
    "gpu_name": "name",
    "memory.total": "memory.total",
    "memory.used": "memory.used",
    "memory.free": "memory.free",
    "memory.reserved": "memory.reserved",
    "utilization.gpu": "utilization.gpu",
    "pci.bus_id": "pci.bus_id",
    "gpu_bus_id": "pci.bus_id",
    "driver_version": "driver_version",
    "count": "count",
    # health (the agent's probe, remote/agent/gpu_judge.py HEALTH_FIELDS), as in the H200
    # capture's --query-gpu line; the old clocks_throttle_reasons name is answered under the
    # new clocks_event_reasons header, as driver 580 does
    "ecc.mode.current": "ecc.mode.current",
    "ecc.errors.corrected.volatile.total": "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total": "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total": "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.pending": "retired_pages.pending",
    "remapped_rows.pending": "remapped_rows.pending",
    "remapped_rows.failure": "remapped_rows.failure",
    "remapped_rows.correctable": "remapped_rows.correctable",
    "remapped_rows.uncorrectable": "remapped_rows.uncorrectable",
    "clocks_throttle_reasons.active": "clocks_event_reasons.active",
    "clocks_event_reasons.active": "clocks_event_reasons.active",
    "temperature.gpu": "temperature.gpu",
    "power.draw": "power.draw",
    "pstate": "pstate",
    "pcie.link.gen.current": "pcie.link.gen.current",
    "pcie.link.gen.max": "pcie.link.gen.max",
    "pcie.link.width.current": "pcie.link.width.current",
    "pcie.link.width.max": "pcie.link.width.max",
}
# What a healthy H200 answers (the capture's --query-gpu line, driver 580.159.04); the busy
# values differ only where a working GPU differs: not idle (reason bit 0x1 off), more power.
# The link maxima are the H200's (PCIe gen 5, x16), which the capture's current values equal.
HEALTHY = {
    "ecc.mode.current": "Enabled",
    "ecc.errors.corrected.volatile.total": "0",
    "ecc.errors.uncorrected.volatile.total": "0",
    "ecc.errors.uncorrected.aggregate.total": "0",
    "retired_pages.pending": "[N/A]",  # Hopper remaps rows instead (NVML: NotSupported)
    "remapped_rows.pending": "No",
    "remapped_rows.failure": "No",
    "remapped_rows.correctable": "0",
    "remapped_rows.uncorrectable": "0",
    "clocks_event_reasons.active": "0x0000000000000001",
    "temperature.gpu": "40",
    "power.draw": "102.18",
    "pstate": "P0",
    "pcie.link.gen.current": "5",
    "pcie.link.gen.max": "5",
    "pcie.link.width.current": "16",
    "pcie.link.width.max": "16",
}
BUSY = {"clocks_event_reasons.active": "0x0000000000000000", "power.draw": "124.00",
        "temperature.gpu": "45"}
# The faults a rented box comes with, as the fields a sick GPU answers (the knobs of
# set_gpu_health). An "older driver" refuses the fields instead: inventory "refuse_fields".
FAULTS = {
    "uncorrectable_ecc": {"ecc.errors.uncorrected.volatile.total": "2",
                          "ecc.errors.uncorrected.aggregate.total": "2"},
    "correctable_ecc": {"ecc.errors.corrected.volatile.total": "37"},
    "remap_pending": {"remapped_rows.pending": "Yes", "remapped_rows.uncorrectable": "1"},
    "remap_failure": {"remapped_rows.failure": "Yes"},
    "retired_pending": {"retired_pages.pending": "Yes"},
    "thermal_slowdown": {"clocks_event_reasons.active": "0x0000000000000040",
                         "temperature.gpu": "91"},
    "power_brake": {"clocks_event_reasons.active": "0x0000000000000080"},
    "slow_pstate": {"pstate": "P8", "clocks_event_reasons.active": "0x0000000000000000"},
    "pcie_x4": {"pcie.link.width.current": "4"},
    "ecc_off": {"ecc.mode.current": "Disabled",
                "ecc.errors.corrected.volatile.total": "[N/A]",
                "ecc.errors.uncorrected.volatile.total": "[N/A]",
                "ecc.errors.uncorrected.aggregate.total": "[N/A]"},
    "not_supported": {k: "[N/A]" for k in HEALTHY},
}
_GPU_UNITS = {
    "memory.total": "MiB",
    "memory.used": "MiB",
    "memory.free": "MiB",
    "memory.reserved": "MiB",
    "utilization.gpu": "%",
    "power.draw": "W",
}
# header names that are not the requested name (the capture: the old clocks name asked for,
# the new one in the header)
_GPU_HEADER = {"clocks_event_reasons.active": "clocks_event_reasons.active"}
REMAPPED_FIELDS = {f: GPU_FIELDS[f] for f in (
    "gpu_bus_id", "gpu_uuid", "remapped_rows.correctable", "remapped_rows.uncorrectable",
    "remapped_rows.pending", "remapped_rows.failure")}
APP_FIELDS = {
    "pid": "pid",
    "used_memory": "used_memory",
    "used_gpu_memory": "used_memory",
    "gpu_uuid": "gpu_uuid",
    "gpu_bus_id": "gpu_bus_id",
    "process_name": "process_name",
    "name": "process_name",
}
# The real tool names the memory column "used_gpu_memory [MiB]" in headers whatever alias is used.
_APP_HEADER = {"used_memory": "used_gpu_memory [MiB]"}


class FieldError(ValueError):
    """A field name the real tool would reject (it exits 2)."""

    def __init__(self, field: str) -> None:
        self.field = field
        super().__init__(f'Field "{field}" is not a valid field to query.')


# ---------------------------------------------------------------------------- state
def state_dir() -> Path:
    """Where inventory and holders live: the env var, else next to the script's bin dir."""
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(env)
    script = sys.argv[0] if sys.argv and sys.argv[0] else __file__
    return Path(os.path.abspath(script)).parent.parent / "gpu"


def bus_id(index: int) -> str:
    """A PCI bus id in the real format; GPU 0 gets the captured H200's ``00000000:00:06.0``."""
    return f"00000000:00:{(6 + index) & 0xFF:02X}.0"


def make_inventory(gpus: int, memory_mib: int, name: str, *, driver: str = DEFAULT_DRIVER,
                   seed: str = "sandbox") -> Dict[str, Any]:
    """An inventory dict with stable, distinct, real-looking UUIDs."""
    import hashlib

    entries: List[Dict[str, Any]] = []
    for i in range(gpus):
        h = hashlib.sha1(f"{seed}:{i}".encode()).hexdigest()
        uuid = f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        entries.append({"index": i, "uuid": uuid, "name": name, "memory_total_mib": memory_mib})
    return {"gpus": entries, "driver": driver}


def write_inventory(gpu_dir: Path, inventory: Dict[str, Any]) -> Path:
    """Write ``inventory.json`` atomically and make sure ``holders/`` exists."""
    gpu_dir = Path(gpu_dir)
    (gpu_dir / "holders").mkdir(parents=True, exist_ok=True)
    path = gpu_dir / "inventory.json"
    tmp = gpu_dir / f".inventory.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(inventory, indent=1))
    os.replace(tmp, path)
    return path


def set_gpu_health(gpu_dir: Path, index: int, fault: Optional[str] = None) -> None:
    """Give GPU ``index`` one of :data:`FAULTS` (None: healthy again)."""
    set_gpu_fields(gpu_dir, index, dict(FAULTS[fault]) if fault is not None else {})


def set_gpu_fields(gpu_dir: Path, index: int, fields: Dict[str, str]) -> None:
    """GPU ``index`` answers ``fields`` (nvidia-smi field name → the text it prints, e.g.
    ``{"remapped_rows.pending": "Yes"}``) instead of the healthy values."""
    inv = load_inventory(gpu_dir)
    for g in inv.get("gpus") or []:
        if int(g["index"]) == index:
            g["health"] = {GPU_FIELDS.get(k, k): v for k, v in fields.items()}
    write_inventory(gpu_dir, inv)


# What nvidia-smi answered for a GPU whose process hangs, read on a real H200 (driver
# 580.159.04; docs/real-gpu.md "What a hang looks like", tests/fixtures/h200-hang/): a rank
# stopped by SIGSTOP reads 0 % with its memory still held and its power unchanged; a rank
# waiting in a collective (a kernel spinning on a flag, as NCCL's do) reads 100 % at 1980 MHz.
# Memory comes from the live holders, as on the real GPU: the process keeps it either way.
HANG_SHAPES: Dict[str, Dict[str, str]] = {
    "stopped": {"utilization.gpu": "0", "utilization.memory": "0", "power.draw": "129.20"},
    "collective": {"utilization.gpu": "100", "clocks.sm": "1980", "power.draw": "129.10"},
}


def set_gpu_hang(gpu_dir: Path, index: int, shape: Optional[str]) -> None:
    """GPU ``index`` answers as a real one whose process hangs (:data:`HANG_SHAPES`;
    None: as before)."""
    if shape is not None and shape not in HANG_SHAPES:
        raise ValueError(f"hang shape {shape!r}: one of {', '.join(HANG_SHAPES)}")
    set_gpu_fields(gpu_dir, index, dict(HANG_SHAPES[shape]) if shape is not None else {})


def refuse_fields(gpu_dir: Path, fields: Sequence[str]) -> None:
    """Answer like an older driver that does not know ``fields`` (exit 2, "not a valid
    field"), as a driver before remapped rows or the clocks reasons does."""
    inv = load_inventory(gpu_dir)
    inv["refuse_fields"] = list(fields)
    write_inventory(gpu_dir, inv)


# How a broken driver answers (set_driver_failure): "unreachable" is the real tool's answer
# when the kernel module is not loaded or the GPU fell off the bus (exit 9, on stdout);
# "hang" never answers (the agent gives up after its 10 s bound).
DRIVER_FAILURES = ("unreachable", "hang")
UNREACHABLE = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.")


def set_driver_failure(gpu_dir: Path, failure: Optional[str]) -> None:
    """Every call fails as :data:`DRIVER_FAILURES` says (None: the driver answers again)."""
    if failure is not None and failure not in DRIVER_FAILURES:
        raise ValueError(f"driver failure {failure!r}: one of {', '.join(DRIVER_FAILURES)}")
    inv = load_inventory(gpu_dir)
    inv["driver_failure"] = failure
    write_inventory(gpu_dir, inv)


def load_inventory(gpu_dir: Path) -> Dict[str, Any]:
    """Read ``inventory.json``; a missing file reads as a box without GPUs."""
    try:
        data = json.loads((Path(gpu_dir) / "inventory.json").read_text())
    except FileNotFoundError:
        return {"gpus": [], "driver": DEFAULT_DRIVER}
    if not isinstance(data, dict):
        raise ValueError(f"{gpu_dir}/inventory.json is not a JSON object")
    return data


def register_holder(gpu_dir: Path, pid: int, physical_gpu: int, mib: int,
                    util: int = 0) -> Path:
    """Record that ``pid`` holds ``mib`` MiB on physical GPU ``physical_gpu`` (atomic write).

    The start time (field 22 of /proc/PID/stat) is stored too, so a holder file left by a dead
    process never counts for an unrelated process that later gets the same pid.
    """
    holders = Path(gpu_dir) / "holders"
    holders.mkdir(parents=True, exist_ok=True)
    rec = {"pid": pid, "gpu": physical_gpu, "mib": mib, "util": util,
           "start_ticks": _start_ticks(pid)}
    path = holders / f"{pid}.json"
    tmp = holders / f".{pid}.{physical_gpu}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(rec))
    os.replace(tmp, path)
    return path


def _stat_fields(pid: int) -> Optional[List[str]]:
    """Fields of /proc/PID/stat after the comm (which may contain spaces), or None if gone.

    Not the agent's parser (remote/agent/procs.py): this file runs on the sandbox box as a
    standalone program and imports nothing of outrig."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()


def _start_ticks(pid: int) -> Optional[int]:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (a zombie holds no GPU memory)."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] != "Z"  # type: ignore[index]


def live_holders(gpu_dir: Path) -> List[Dict[str, Any]]:
    """Holder records whose process is alive, is the same process that registered, and whose
    GPU exists. Unreadable or half-written files are skipped, never fatal."""
    out: List[Dict[str, Any]] = []
    hdir = Path(gpu_dir) / "holders"
    try:
        names = sorted(os.listdir(hdir))
    except OSError:
        return out
    for fname in names:
        if not fname.endswith(".json") or fname.startswith("."):
            continue
        try:
            rec = json.loads((hdir / fname).read_text())
            pid, gpu, mib = int(rec["pid"]), int(rec["gpu"]), int(rec["mib"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        ticks = rec.get("start_ticks")
        alive = pid_alive(pid) and (ticks is None or _start_ticks(pid) == ticks)
        if not alive and not rec.get("sticky"):
            continue
        # "sticky" memory stays used after its process died, and the process is no longer
        # listed: what a real driver shows when a process is stuck in D state in nvidia_uvm.
        out.append({"pid": pid, "gpu": gpu, "mib": mib, "util": int(rec.get("util") or 0),
                    "dead": not alive})
    return out


def process_name(pid: int) -> str:
    """What the real tool shows: argv[0] of the process (the capture shows ``python3`` for a
    process started as ``python3 x.py`` and the venv path for spawned children, never the
    renamed comm), falling back to the executable path."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        if argv0:
            return argv0
    except OSError:
        pass
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return "[Not Found]"


# ---------------------------------------------------------------------------- queries
def gpu_rows(gpu_dir: Path) -> List[Dict[str, Any]]:
    """Every GPU with its current used/free memory and utilization, from live holders."""
    inv = load_inventory(gpu_dir)
    holders = live_holders(gpu_dir)
    rows: List[Dict[str, Any]] = []
    gpus = inv.get("gpus") or []
    for g in gpus:
        idx = int(g["index"])
        total = int(g["memory_total_mib"])
        reserved = round(total * _RESERVED_FRACTION)
        mine = [h for h in holders if h["gpu"] == idx]
        used = min(sum(h["mib"] for h in mine), total - reserved)
        util = max([h["util"] for h in mine] or [0])
        rows.append({
            **HEALTHY, **(BUSY if mine else {}),
            "index": idx, "uuid": str(g["uuid"]), "name": str(g["name"]),
            "memory.total": total, "memory.used": used, "memory.reserved": reserved,
            "memory.free": total - reserved - used, "utilization.gpu": util,
            "pci.bus_id": bus_id(idx), "driver_version": str(inv.get("driver") or DEFAULT_DRIVER),
            "count": len(gpus),
            # what set_gpu_fields set wins, inventory numbers too (a driver that lies)
            **{str(k): str(v) for k, v in (g.get("health") or {}).items()},
        })
    return rows


def app_rows(gpu_dir: Path) -> List[Dict[str, Any]]:
    """One row per live holder, ordered by GPU then pid, like the real tool."""
    by_index = {r["index"]: r for r in gpu_rows(gpu_dir)}
    rows: List[Dict[str, Any]] = []
    for h in sorted(live_holders(gpu_dir), key=lambda h: (h["gpu"], h["pid"])):
        if h.get("dead"):
            continue
        g = by_index.get(h["gpu"])
        if g is None:
            continue
        rows.append({"pid": h["pid"], "used_memory": h["mib"], "gpu_uuid": g["uuid"],
                     "gpu_bus_id": g["pci.bus_id"], "process_name": process_name(h["pid"]),
                     "gpu": h["gpu"]})
    return rows


def parse_fields(spec: str, known: Dict[str, str],
                 refused: Sequence[str] = ()) -> List[str]:
    """Split a comma-separated field list; raise :class:`FieldError` on the first unknown
    (or ``refused``: what an older driver does not know)."""
    fields = [f.strip() for f in spec.split(",") if f.strip()]
    if not fields:
        raise FieldError(spec)
    for f in fields:
        if f not in known or f in refused:
            raise FieldError(f)
    return fields


def format_csv(rows: Sequence[Dict[str, Any]], fields: Sequence[str], known: Dict[str, str],
               units: Dict[str, str], *, header: bool, with_units: bool,
               header_names: Optional[Dict[str, str]] = None) -> List[str]:
    """CSV lines joined by ``", "`` exactly like the real tool (header keeps its units)."""
    lines: List[str] = []
    if header:
        names = []
        for f in fields:
            canon = known[f]
            if header_names and canon in header_names:
                names.append(header_names[canon])
            else:
                names.append(f + (f" [{units[canon]}]" if canon in units else ""))
        lines.append(", ".join(names))
    for row in rows:
        cells = []
        for f in fields:
            canon = known[f]
            val = str(row[canon])
            if with_units and canon in units:
                val += f" {units[canon]}"
            cells.append(val)
        lines.append(", ".join(cells))
    return lines


def query_gpu(gpu_dir: Path, spec: str, *, header: bool = False, with_units: bool = False,
              ids: Optional[Sequence[int]] = None) -> List[str]:
    """Lines for ``--query-gpu=SPEC``; ``ids`` restricts to those indices (``-i``)."""
    refused = load_inventory(gpu_dir).get("refuse_fields") or []
    fields = parse_fields(spec, GPU_FIELDS, refused)
    rows = gpu_rows(gpu_dir)
    if ids is not None:
        rows = [r for r in rows if r["index"] in ids]
    return format_csv(rows, fields, GPU_FIELDS, _GPU_UNITS, header=header, with_units=with_units,
                      header_names=_GPU_HEADER)


def query_remapped_rows(gpu_dir: Path, spec: str, *, header: bool = False,
                        with_units: bool = False) -> List[str]:
    """Lines for ``--query-remapped-rows=SPEC`` (one per GPU, as the capture shows)."""
    fields = parse_fields(spec, REMAPPED_FIELDS)
    return format_csv(gpu_rows(gpu_dir), fields, REMAPPED_FIELDS, {}, header=header,
                      with_units=with_units)


def query_apps(gpu_dir: Path, spec: str, *, header: bool = False,
               with_units: bool = False) -> List[str]:
    """Lines for ``--query-compute-apps=SPEC``."""
    fields = parse_fields(spec, APP_FIELDS)
    return format_csv(app_rows(gpu_dir), fields, APP_FIELDS, {"used_memory": "MiB"},
                      header=header, with_units=with_units, header_names=_APP_HEADER)


def render_table(gpu_dir: Path, now: Optional[float] = None) -> List[str]:
    """The no-argument table, column for column like the real 580 driver's."""
    inv = load_inventory(gpu_dir)
    driver = str(inv.get("driver") or DEFAULT_DRIVER)
    gpus = gpu_rows(gpu_dir)
    apps = app_rows(gpu_dir)
    rule = "+" + "-" * 89 + "+"
    cell_rule = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    lines = [
        time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(now)) + " " * 7,
        rule,
        "| " + f"NVIDIA-SMI {driver:<23}Driver Version: {driver:<15}CUDA Version: {CUDA_VERSION:<9}"
        + "|",
        cell_rule,
        "| GPU  Name                 Persistence-M |"
        " Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |"
        "           Memory-Usage | GPU-Util  Compute M. |",
        "|" + " " * 41 + "|" + " " * 24 + "|               MIG M. |",
        "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
    ]
    for g in gpus:
        busy = g["memory.used"] > 0
        temp, power = (38, 124) if busy else (37, 79)
        name = g["name"] if len(g["name"]) <= 31 else g["name"][:28] + "..."
        mem = f"{g['memory.used']}MiB / {g['memory.total']}MiB"
        lines += [
            f"|{g['index']:>4}  {name:<31}On  |{g['pci.bus_id']:>19} Off |{'0':>21} |",
            f"| N/A   {temp:>2}C    P0{str(power) + 'W':>16} / {'700W':>5} |{mem:>23} |"
            f"{g['utilization.gpu']:>7}%      Default |",
            "|" + " " * 41 + "|" + " " * 24 + "|" + f"{'Disabled':>21} |",
            cell_rule,
        ]
    lines += [
        "",
        rule,
        "| Processes:" + " " * 78 + "|",
        "|  GPU   GI   CI              PID   Type   Process name"
        "                        GPU Memory |",
        "|        ID   ID" + " " * 63 + "Usage      |",
        "|" + "=" * 89 + "|",
    ]
    if not apps:
        lines.append("|" + "  No running processes found".ljust(89) + "|")
    for a in apps:
        pname = a["process_name"]
        if len(pname) > 37:
            pname = "..." + pname[-34:]
        lines.append(f"|{a['gpu']:>5}   N/A  N/A{a['pid']:>16}      C   {pname:<37}"
                     f"{str(a['used_memory']) + 'MiB':>9} |")
    lines.append(rule)
    return lines


def list_gpus(gpu_dir: Path) -> List[str]:
    """``nvidia-smi -L``: ``GPU 0: NVIDIA H200 (UUID: GPU-...)``."""
    return [f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})" for g in gpu_rows(gpu_dir)]


# ---------------------------------------------------------------------------- CLI
def _opt_value(argv: List[str], i: int, name: str) -> tuple[str, int]:
    """Value of ``--name=v`` or ``--name v`` at argv[i]; returns (value, next index)."""
    arg = argv[i]
    if "=" in arg:
        return arg.split("=", 1)[1], i + 1
    if i + 1 >= len(argv):
        raise SystemExit(f"Option {name} requires a value.")
    return argv[i + 1], i + 2


def main(argv: Optional[List[str]] = None, gpu_dir: Optional[Path] = None) -> int:
    """Entry point; returns the exit code (0 ok, 2 bad arguments or field, like the real one)."""
    args = list(sys.argv[1:] if argv is None else argv)
    gdir = gpu_dir if gpu_dir is not None else state_dir()
    query_gpu_spec: Optional[str] = None
    query_apps_spec: Optional[str] = None
    query_remap_spec: Optional[str] = None
    fmt: Optional[str] = None
    ids: Optional[List[int]] = None
    failure = load_inventory(gdir).get("driver_failure")
    if failure == "hang":
        time.sleep(3600)
    if failure == "unreachable":
        print(UNREACHABLE, end="\n\n")
        return 9
    i = 0
    try:
        while i < len(args):
            a = args[i]
            if a.startswith("--query-gpu"):
                query_gpu_spec, i = _opt_value(args, i, "--query-gpu")
            elif a.startswith("--query-compute-apps"):
                query_apps_spec, i = _opt_value(args, i, "--query-compute-apps")
            elif a.startswith("--query-remapped-rows"):
                query_remap_spec, i = _opt_value(args, i, "--query-remapped-rows")
            elif a.startswith("--format"):
                fmt, i = _opt_value(args, i, "--format")
            elif a in ("-i", "--id") or a.startswith("--id="):
                val, i = _opt_value(args, i, "--id")
                ids = [int(x) for x in val.split(",") if x.strip()]
            elif a in ("-L", "--list-gpus"):
                print("\n".join(list_gpus(gdir)))
                return 0
            elif a in ("--version", "-h", "--help"):
                inv = load_inventory(gdir)
                drv = inv.get("driver") or DEFAULT_DRIVER
                print(f"NVIDIA-SMI version  : {drv}\nDRIVER version      : {drv}\n"
                      f"CUDA Version        : {CUDA_VERSION}")
                return 0
            else:
                print(f'Invalid combination of input arguments. Please run "nvidia-smi -h" '
                      f"for help. (unknown argument {a!r})", file=sys.stderr)
                return 2
    except (SystemExit, ValueError) as e:
        print(str(e), file=sys.stderr)
        return 2
    if query_gpu_spec is None and query_apps_spec is None and query_remap_spec is None:
        print("\n".join(render_table(gdir)))
        return 0
    if fmt is None:
        print("'--format' is required with --query-* options (e.g. --format=csv).",
              file=sys.stderr)
        return 2
    opts = {o.strip() for o in fmt.split(",")}
    if "csv" not in opts or not opts <= {"csv", "noheader", "nounits"}:
        print(f'"{fmt}" is not a valid format.', file=sys.stderr)
        return 2
    header, with_units = "noheader" not in opts, "nounits" not in opts
    try:
        if query_gpu_spec is not None:
            lines = query_gpu(gdir, query_gpu_spec, header=header, with_units=with_units, ids=ids)
        elif query_remap_spec is not None:
            lines = query_remapped_rows(gdir, query_remap_spec, header=header,
                                        with_units=with_units)
        else:
            assert query_apps_spec is not None
            lines = query_apps(gdir, query_apps_spec, header=header, with_units=with_units)
    except FieldError as e:
        print(str(e), end="\n\n")
        return 2
    if lines:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
