"""GPUs: nvidia-smi facts, and who holds which GPU (ours or foreign), waiting for memory
to be released after a stop."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Set, Tuple

from .constants import KILL_WAIT_S, POLL_S, JSONDict
from .events import Emitter
from .gpu_judge import HEALTH_FIELDS
from .layout import Layout, list_run_ids, read_json
from .procs import boot_id, read_stat, scan_procs
from .stopping import Stopper, valid_record

CSV_INT_MAX = 2 ** 53  # no count, MiB or pid nvidia-smi prints comes near it


def _csv_int(text: str) -> Optional[int]:
    """An nvidia-smi number; "[N/A]", "N/A" and the like become None, and so does a value
    that lies: not a number, not finite (``nan``, ``inf``, ``1e400``), negative or past
    :data:`CSV_INT_MAX` (:func:`csv_lie` tells the two apart)."""
    text = text.strip()
    if not text or "N/A" in text or text.startswith("["):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or not 0 <= value <= CSV_INT_MAX:
        return None
    return int(value)


def csv_lie(text: str) -> bool:
    """Whether nvidia-smi gave a value (not ``N/A``) that :func:`_csv_int` cannot believe."""
    text = text.strip()
    return bool(text) and "N/A" not in text and not text.startswith("[") \
        and _csv_int(text) is None


GPU_QUERY = (
    "index,uuid,name,memory.total,memory.used,memory.free,utilization.gpu,pci.bus_id,"
    "driver_version"
)
# The inventory's numbers, with where each is counted from the right of a CSV line.
INVENTORY_NUMBERS = (("memory.total", -6), ("memory.used", -5), ("memory.free", -4),
                     ("utilization.gpu", -3))
HEALTH_QUERY = ",".join(HEALTH_FIELDS)  # asked in the same nvidia-smi run (query_gpus)
APPS_QUERY = "pid,used_memory,gpu_uuid,process_name"


def run_nvidia_smi(args: List[str]) -> Tuple[Optional[str], Optional[str]]:
    """(stdout, None) or (None, why not). Found on the env-extended PATH; bounded to 10 s."""
    exe = shutil.which("nvidia-smi", path=os.environ.get("PATH", os.defpath))
    if exe is None:
        return None, "nvidia-smi not found on PATH"
    try:
        proc = subprocess.run(
            [exe, *args], stdin=subprocess.DEVNULL, capture_output=True, timeout=10, check=False
        )
    except subprocess.TimeoutExpired:
        return None, "nvidia-smi timed out after 10 s"
    except OSError as exc:
        return None, f"cannot run nvidia-smi: {exc}"
    out = proc.stdout.decode("utf-8", errors="replace")
    if proc.returncode != 0:
        why = (proc.stderr.decode("utf-8", errors="replace") + out).strip().splitlines()
        return None, f"nvidia-smi failed (exit {proc.returncode}): {why[0] if why else ''}".strip()
    return out, None


def parse_gpu_csv(text: str, health: bool = False) -> List[JSONDict]:
    """Parse ``--query-gpu=GPU_QUERY --format=csv,noheader,nounits`` lines.

    The same 9-field form as the real H200 captures in tests/fixtures, so the fixtures are
    exactly what this function reads on a box. Names may contain commas: the fields after the
    name are counted from the right. With ``health`` the line goes on with the
    :data:`HEALTH_FIELDS` (never a comma in them); each GPU then carries them raw, as
    nvidia-smi wrote them, under ``health``: the workstation judges (gpu_judge.py). A line
    too short for them is read as the inventory alone (``health`` empty: judged unknown).
    """
    gpus: List[JSONDict] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 9:
            continue
        extra = len(HEALTH_FIELDS) if health and len(cells) >= 9 + len(HEALTH_FIELDS) else 0
        raw = cells[len(cells) - extra:] if extra else []
        cells = cells[:len(cells) - extra]
        index = _csv_int(cells[0])
        if index is None:
            continue
        gpu: JSONDict = {
            "index": index,
            "uuid": cells[1],
            "name": ",".join(cells[2:-6]).strip(),
            "memory_total_mib": _csv_int(cells[-6]),
            "memory_used_mib": _csv_int(cells[-5]),
            "memory_free_mib": _csv_int(cells[-4]),
            "utilization_pct": _csv_int(cells[-3]),
            "pci_bus_id": cells[-2],
            "driver": cells[-1],
        }
        lies = {field: cells[at][:40] for field, at in INVENTORY_NUMBERS if csv_lie(cells[at])}
        if lies:  # judged unknown, each field named (gpu_judge.judge_gpu)
            gpu["bad_values"] = lies
        if health:
            gpu["health"] = dict(zip(HEALTH_FIELDS, raw))
        gpus.append(gpu)
    return gpus


# Why the driver refused the health fields, once it has (an old driver that does not know
# one of them answers "is not a valid field" and exits 2): this agent process then asks for
# the inventory alone, so the GPU list never depends on the health fields.
_health_refused: List[str] = []


def query_gpus() -> Tuple[List[JSONDict], Optional[str]]:
    """GPUs as nvidia-smi reports them, or ([], why not). One nvidia-smi process answers
    both the inventory and the health fields; a driver that does not know a health field
    gets the inventory query alone (:func:`health_refusal` says why)."""
    if not _health_refused:
        out, error = run_nvidia_smi([f"--query-gpu={GPU_QUERY},{HEALTH_QUERY}",
                                     "--format=csv,noheader,nounits"])
        if out is not None:
            return parse_gpu_csv(out, health=True), None
        if error is None or "not a valid field" not in error:
            return [], error
        _health_refused.append(error)
    out, error = run_nvidia_smi([f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"])
    if out is None:
        return [], error
    return parse_gpu_csv(out), None


def health_refusal() -> Optional[str]:
    """Why this box's nvidia-smi gave no health fields (None when it gave them)."""
    return _health_refused[0] if _health_refused else None


XID_MARK = "NVRM: Xid"
XID_LINES_KEPT = 50  # the newest Xid lines sent; a flood of one fault is the same fault


def read_xid_lines() -> JSONDict:
    """The kernel log's Xid lines (``{lines, error}``): ``dmesg``, bounded to 5 s. Where
    the kernel refuses its log to this user (``kernel.dmesg_restrict``) ``lines`` is None
    and ``error`` says why: an unknown, never a failure of the call."""
    exe = shutil.which("dmesg", path=os.environ.get("PATH", os.defpath))
    if exe is None:
        return {"lines": None, "error": "dmesg not found on PATH"}
    try:
        proc = subprocess.run([exe], stdin=subprocess.DEVNULL, capture_output=True, timeout=5,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"lines": None, "error": "dmesg timed out after 5 s"}
    except OSError as exc:
        return {"lines": None, "error": f"cannot run dmesg: {exc}"}
    if proc.returncode != 0:
        why = proc.stderr.decode("utf-8", errors="replace").strip().splitlines()
        return {"lines": None, "error": (why[0] if why else f"dmesg exited {proc.returncode}")
                [:200]}
    text = proc.stdout.decode("utf-8", errors="replace")
    lines = [line[:300] for line in text.splitlines() if XID_MARK in line]
    return {"lines": lines[-XID_LINES_KEPT:], "error": None}


GpuQuery = Tuple[List[JSONDict], Optional[str]]  # query_gpus' answer: (gpus, why not)


def gather_facts(queried: Optional[GpuQuery] = None) -> JSONDict:
    """What the box is (the ``facts`` event), with its GPUs' health fields and the kernel
    log's Xid lines. ``queried``: the answer of a :func:`query_gpus` this call already made
    (status's GPU audit), so that nvidia-smi, 0.1-0.5 s on a real box, is not run twice for
    one request. ``dmesg`` runs beside nvidia-smi (only where nvidia-smi is on the PATH: a
    box without GPUs has no Xids to read)."""
    xid_box: List[JSONDict] = []
    worker: Optional[threading.Thread] = None
    present = shutil.which("nvidia-smi", path=os.environ.get("PATH", os.defpath)) is not None
    if present:
        worker = threading.Thread(target=lambda: xid_box.append(read_xid_lines()), daemon=True)
        worker.start()
    gpus, gpu_error = queried if queried is not None else query_gpus()
    if worker is not None:
        worker.join(6)
    facts: JSONDict = {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "boot_id": boot_id(),
        "gpus": gpus,
        "gpu_error": gpu_error,
        # the box has a driver tool that failed (exit 9, a hang): its GPUs cannot be read,
        # which is not the same as a box without GPUs (no nvidia-smi at all)
        "gpu_unreadable": present and gpu_error is not None,
    }
    if gpus:
        facts["xid"] = xid_box[0] if xid_box else {"lines": None,
                                                   "error": "dmesg gave no answer in 6 s"}
        facts["gpu_health_error"] = health_refusal()
    return facts


#
# Who holds which GPU, and is it ours? nvidia-smi --query-compute-apps gives (pid, memory,
# gpu uuid); it shows the executable, not vLLM's renamed titles, so titles come from
# /proc/PID/comm. In containers nvidia-smi often cannot see pids at all: an open
# /dev/nvidia<N> file descriptor (from /proc/PID/fd) is then the only sign of a holder.

NVIDIA_DEV_RE = re.compile(r"^/dev/nvidia(\d+)$")
GPU_WAIT_DEFAULT_S = 60.0
GPU_WAIT_BEAT_S = 2.0


def query_compute_apps() -> Tuple[List[JSONDict], Optional[str]]:
    """[{pid, used_mib, gpu_uuid, process_name}] from nvidia-smi, or ([], why not)."""
    out, error = run_nvidia_smi(
        [f"--query-compute-apps={APPS_QUERY}", "--format=csv,noheader,nounits"]
    )
    if out is None:
        return [], error
    return parse_compute_apps(out), None


def parse_compute_apps(text: str) -> List[JSONDict]:
    """Parse ``pid, used_memory, gpu_uuid, process_name`` CSV lines (noheader, nounits).

    nvidia-smi's process_name is the executable path, not vLLM's renamed title; titles come
    from /proc/PID/comm (see describe_pid). A path may contain commas: it is the rest.
    """
    apps: List[JSONDict] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 3:
            continue
        pid = _csv_int(cells[0])
        if pid is None:
            continue
        apps.append({"pid": pid, "used_mib": _csv_int(cells[1]), "gpu_uuid": cells[2],
                     "process_name": ",".join(cells[3:]).strip() or None})
    return apps


def nvidia_fd_holders() -> Dict[int, List[int]]:
    """pid → /dev/nvidia<N> minor numbers it has open (unreadable processes are skipped)."""
    out: Dict[int, List[int]] = {}
    for st in scan_procs():
        if not st.live():
            continue
        fd_dir = f"/proc/{st.pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        minors: Set[int] = set()
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            match = NVIDIA_DEV_RE.match(target)
            if match:
                minors.add(int(match.group(1)))
        if minors:
            out[st.pid] = sorted(minors)
    return out


def describe_pid(pid: int) -> JSONDict:
    """What a person needs to recognise a process: user, title, command line."""
    info: JSONDict = {"pid": pid, "user": None, "comm": None, "cmdline": None}
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        info["uid"] = uid
        try:
            import pwd

            info["user"] = pwd.getpwuid(uid).pw_name
        except (KeyError, ImportError):
            info["user"] = str(uid)
    except OSError:
        pass
    with contextlib.suppress(OSError), open(f"/proc/{pid}/comm", encoding="utf-8",
                                            errors="replace") as f:
        info["comm"] = f.read().strip()
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
        raw = b" ".join(f.read().replace(b"\0", b" ").split())  # no newlines in messages
        info["cmdline"] = raw.decode("utf-8", errors="replace")[:300]
    st = read_stat(pid)
    if st is not None:
        info["state"] = st.state
        info["pgid"] = st.pgid
    return info


class Owners:
    """Maps live pids to (run_id, process name) for every run recorded in the workdir.

    Built once per audit from the run manifests plus the markers, with the same rules the
    Stopper uses, so "ours" means the same thing in the audit and in cleanup.
    """

    def __init__(self, layout: Layout, stopper: Stopper) -> None:
        self.by_pid: Dict[int, Tuple[str, str]] = {}
        self.playbook_of: Dict[str, str] = {}
        for run_id in list_run_ids(layout):
            try:
                run = read_json(layout.run_json(run_id))
            except (OSError, ValueError):
                continue
            if not isinstance(run, dict):
                continue
            self.playbook_of[run_id] = str(run.get("playbook") or "?")
            for rec in run.get("processes") or []:
                if not valid_record(rec):
                    continue
                state = stopper.leader_state(rec)
                if state == "alive":
                    self.by_pid[rec["pid"]] = (run_id, rec["name"])
                if state != "reused":
                    for pid in stopper.members(run_id, rec, state):
                        self.by_pid.setdefault(pid, (run_id, rec["name"]))
        for st in scan_procs():
            if st.live() and st.pid not in self.by_pid and st.pid not in stopper.protected:
                run, name = stopper.markers(st)
                if run is not None:
                    self.by_pid[st.pid] = (run, name or "?")

    def owner(self, pid: int) -> Optional[JSONDict]:
        found = self.by_pid.get(pid)
        if found is None:
            return None
        return {"run_id": found[0], "process": found[1],
                "playbook": self.playbook_of.get(found[0])}


def gpu_audit(layout: Layout, stopper: Stopper) -> JSONDict:
    """Every GPU and every process holding one, each classified as ours (which run) or foreign."""
    return gpu_audit_queried(layout, stopper)[0]


def gpu_audit_queried(layout: Layout, stopper: Stopper) -> Tuple[JSONDict, GpuQuery]:
    """:func:`gpu_audit`, and the GPU query it made (for :func:`gather_facts`)."""
    # The two nvidia-smi queries run side by side: each costs 0.1-0.5 s on a real box.
    apps_box: List[Tuple[List[JSONDict], Optional[str]]] = []
    worker = threading.Thread(target=lambda: apps_box.append(query_compute_apps()), daemon=True)
    worker.start()
    gpus, gpu_error = query_gpus()
    fds = nvidia_fd_holders()
    worker.join(15)
    apps, apps_error = apps_box[0] if apps_box and not gpu_error else ([], None)
    owners = Owners(layout, stopper)
    by_uuid = {g["uuid"]: g for g in gpus}
    holders: List[JSONDict] = []
    seen: Set[int] = set()
    for app in apps:
        gpu = by_uuid.get(app["gpu_uuid"])
        holder = describe_pid(app["pid"])
        holder.update(
            gpu_index=gpu["index"] if gpu else None,
            gpu_uuid=app["gpu_uuid"],
            used_mib=app["used_mib"],
            source="nvidia-smi",
            owner=owners.owner(app["pid"]),
        )
        holders.append(holder)
        seen.add(app["pid"])
    for pid, minors in sorted(fds.items()):
        if pid in seen or pid in stopper.protected:
            continue
        holder = describe_pid(pid)
        holder.update(gpu_index=None, gpu_uuid=None, used_mib=None, devices=minors,
                      source="fd", owner=owners.owner(pid))
        holders.append(holder)
    present = shutil.which("nvidia-smi", path=os.environ.get("PATH", os.defpath)) is not None
    audit = {"gpus": gpus, "holders": holders, "error": gpu_error or apps_error,
             # nvidia-smi is there but failed or hung: who holds a GPU was not seen
             "unreadable": present and gpu_error is not None}
    return audit, (gpus, gpu_error)


def holder_line(h: JSONDict) -> str:
    """``GPU 0: pid 812 (alice, python3 train.py, 10240 MiB)`` for messages."""
    where = f"GPU {h['gpu_index']}" if h.get("gpu_index") is not None else (
        "/dev/nvidia" + ",".join(str(m) for m in h.get("devices") or []))
    mem = f", {h['used_mib']} MiB" if h.get("used_mib") is not None else ""
    title = h.get("cmdline") or h.get("comm") or "?"
    if h.get("comm") and h.get("cmdline") and not str(h["cmdline"]).startswith(str(h["comm"])):
        title = f"[{h['comm']}] {title}"
    owner = h.get("owner")
    whose = f"run {owner['run_id']} process {owner['process']}" if owner else "not outrig's"
    return f"{where}: pid {h['pid']} ({h.get('user') or '?'}, {title[:120]}{mem}; {whose})"


def release_verdict(left: List[JSONDict], missing: Dict[int, int], held_before: Dict[int, int],
                    used_before: Dict[int, int], used_after: Dict[int, int], seconds: float,
                    timeout: float) -> JSONDict:
    """What :func:`wait_gpus_released` found: released or not, the numbers, and a message
    saying who still holds what (or that the driver kept the memory)."""
    stuck = [h for h in left if (h.get("state") or "") == "D"]
    freed = {
        index: max(0, used_before.get(index, 0) - used_after.get(index, 0))
        for index in held_before
    }
    verdict: JSONDict = {
        "released": not left and not missing,
        "seconds": round(seconds, 2),
        "held_before_mib": held_before,
        "freed_mib": freed,
        "still_holding": left,
        "memory_not_back_mib": missing,
        "stuck_in_kernel": [h["pid"] for h in stuck],
    }
    if left:
        verdict["message"] = (
            f"{len(left)} process(es) of ours still hold a GPU after {timeout:g} s: "
            + "; ".join(holder_line(h) for h in left)
            + (". Processes in D state are stuck in the kernel (usually the GPU driver): only "
               "a reboot frees them." if stuck else "")
        )
    elif missing:
        verdict["message"] = (
            "no process of ours holds a GPU any more, but memory did not come back on "
            + ", ".join(f"GPU {i} ({mib} MiB)" for i, mib in sorted(missing.items()))
            + f" within {timeout:g} s. Look at `nvidia-smi`; if no process is listed, the "
            "driver is holding it (a process stuck in D state): only a reboot frees it."
        )
    return verdict


def wait_gpus_released(
    layout: Layout,
    stopper: Stopper,
    out: Emitter,
    run_ids: Set[str],
    before: JSONDict,
    timeout: float,
    extra_pids: Optional[Set[int]] = None,
) -> JSONDict:
    """Wait (bounded) until no process of ``run_ids`` (or ``extra_pids``) holds a GPU and the
    memory they held is back. Returns the final audit plus a verdict and numbers."""
    extra = set(extra_pids or set())

    def ours(h: JSONDict) -> bool:
        owner = h.get("owner")
        return bool(owner and owner["run_id"] in run_ids) or h["pid"] in extra

    held_before: Dict[int, int] = {}
    for h in before["holders"]:
        if ours(h) and h.get("gpu_index") is not None and h.get("used_mib"):
            held_before[h["gpu_index"]] = held_before.get(h["gpu_index"], 0) + h["used_mib"]
    used_before = {g["index"]: g.get("memory_used_mib") or 0 for g in before["gpus"]}
    t0 = time.monotonic()
    if not any(ours(h) for h in before["holders"]):
        # Nothing of ours held a GPU before the stop, so nothing of ours can hold one now:
        # skip a second audit (two nvidia-smi runs, a /proc scan) on the common CPU-only path.
        return {"audit": before, "verdict": {
            "released": True, "seconds": 0.0, "held_before_mib": {}, "freed_mib": {},
            "still_holding": [], "memory_not_back_mib": {}, "stuck_in_kernel": []}}
    next_beat = t0 + GPU_WAIT_BEAT_S
    while True:
        stopper.reap()
        after = gpu_audit(layout, stopper)
        left = [h for h in after["holders"] if ours(h) and read_stat(h["pid"]) is not None]
        used_after = {g["index"]: g.get("memory_used_mib") or 0 for g in after["gpus"]}
        missing: Dict[int, int] = {}
        for index, held in held_before.items():
            total = next((g.get("memory_total_mib") or 0 for g in after["gpus"]
                          if g["index"] == index), 0)
            slack = max(256, total // 50)
            expected = used_before.get(index, 0) - held
            if used_after.get(index, 0) > expected + slack:
                missing[index] = used_after.get(index, 0) - expected
        if not left and not missing:
            break
        if time.monotonic() - t0 >= timeout:
            break
        if time.monotonic() >= next_beat:
            next_beat += GPU_WAIT_BEAT_S
            out.emit("gpu_wait", elapsed=round(time.monotonic() - t0, 1), timeout=timeout,
                     holders=len(left), missing_mib=sum(missing.values()))
        time.sleep(0.5)
    verdict = release_verdict(left, missing, held_before, used_before, used_after,
                              time.monotonic() - t0, timeout)
    return {"audit": after, "verdict": verdict}


def force_kill_foreign(pids: List[int], stopper: Stopper, out: Emitter,
                       grace: float = 10.0) -> List[JSONDict]:
    """Kill exactly the pids the user listed with --force-foreign, after saying what each is."""
    results: List[JSONDict] = []
    targets: List[Tuple[int, int]] = []
    for pid in pids:
        st = read_stat(pid)
        info = describe_pid(pid)
        if st is None or not st.live():
            results.append({**info, "how": "gone"})
            continue
        if pid in stopper.protected or pid <= 1:
            results.append({**info, "how": "refused",
                            "why": "it is the agent, its SSH session or init"})
            out.warning(f"--force-foreign {pid}: refused: it is the agent, its SSH session or "
                        "init")
            continue
        out.emit("force_kill", pid=pid, user=info.get("user"), comm=info.get("comm"),
                 cmdline=info.get("cmdline"))
        stopper.kill(pid, signal.SIGTERM)
        targets.append((pid, st.start_ticks))
    deadline = time.monotonic() + grace
    t0 = time.monotonic()
    pending = list(targets)
    while pending and time.monotonic() < deadline:
        pending = [(p, t) for p, t in pending if _same_live(p, t)]
        time.sleep(POLL_S)
    for pid, ticks in targets:
        how = "term"
        if _same_live(pid, ticks):
            stopper.kill(pid, signal.SIGKILL)
            how = "kill"
        end = time.monotonic() + KILL_WAIT_S
        while _same_live(pid, ticks) and time.monotonic() < end:
            time.sleep(POLL_S)
        results.append({**describe_pid(pid), "pid": pid, "how": how,
                        "seconds": round(time.monotonic() - t0, 2),
                        "alive": _same_live(pid, ticks)})
    return results


def _same_live(pid: int, ticks: int) -> bool:
    st = read_stat(pid)
    return st is not None and st.start_ticks == ticks and st.live()
