"""The ``status``, ``logs`` and ``check`` ops, and what status adds for the workstation's
progress parser and GPU table (raw text and facts; the workstation parses)."""

from __future__ import annotations

import json
import os
import platform
from typing import Dict, List, Optional, Tuple

from .checkpoints import newest_checkpoint
from .constants import PROBE_TIMEOUT_S, JSONDict
from .events import AgentError, Emitter, bad_request, redact
from .gpus import describe_pid, gather_facts, gpu_audit_queried
from .hangs import hang_request, hang_sample
from .layout import Layout, all_pointers, nearest_existing
from .logs import last_lines_containing, tail_lines, tail_text
from .procs import read_stat, require_proc
from .runs import process_state, resolve_run, run_secret_keys, run_secrets
from .stopping import Stopper, load_run, valid_record
from .validation import Request, get_bool, get_int, get_opt_name, get_str_list


def op_status(req: Request, out: Emitter) -> JSONDict:
    """What runs and how each process is doing, with a short log tail."""
    raw = req.raw
    playbook = get_opt_name(raw, "playbook", "")
    run_id = get_opt_name(raw, "run_id", "")
    log_lines = get_int(raw, "log_lines", "", 5, 0, 10000)
    # Extensions for `outrig status` (docs/logs-and-status.md): raw progress text, GPU holders.
    progress_bytes = get_int(raw, "progress_bytes", "", 0, 0, 1 << 20)
    markers = get_str_list(raw, "markers", "")
    want_gpus = get_bool(raw, "gpu_holders", "", False)
    hang = hang_request(req)  # samples for the workstation's hang judge (hangs.py)
    layout = Layout(req.workdir)
    require_proc("cannot tell which of its processes run")
    if run_id is not None or playbook is not None:
        targets = [(playbook, resolve_run(layout, playbook, run_id))]
    else:
        targets = [(pb, rid) for pb, rid in all_pointers(layout).items()]
    stopper = Stopper(out, layout=layout)
    runs = []
    for pb, rid in targets:
        run = load_run(layout, rid, out)
        if run is None:
            unknown: JSONDict = {"run_id": rid, "playbook": pb, "status": "unknown"}
            unknown.update({"created": None, "processes": []})
            runs.append(unknown)
            continue
        procs = []
        hidden = run_secrets(run, stopper)
        for rec in run["processes"]:
            tree: List[JSONDict] = []
            if valid_record(rec) and stopper.leader_state(rec) != "reused":
                # recorded as seen (for a later cleanup) whether the leader lives or not: the
                # orphans of a killed server are what a cleanup must still find
                tree = process_tree(stopper.member_proofs(rid, rec, stopper.leader_state(rec)))
            if isinstance(rec, dict):
                proc_state = process_state(rec, stopper, log_lines, hidden)
                proc_state["tree"] = tree
                if hang is not None and proc_state.get("state") == "running":
                    proc_state["hang"] = hang_sample(rec, [t["pid"] for t in tree], hang)
                proc_state.update(status_extras(rec, proc_state, progress_bytes, markers,
                                                hidden))
                procs.append(proc_state)
        runs.append(
            {
                "run_id": rid,
                "playbook": run.get("playbook", pb),
                "status": run.get("status"),
                "created": run.get("created"),
                "error": run.get("error"),
                "secret_keys": run_secret_keys(run),
                "processes": procs,
            }
        )
    if not want_gpus:
        return {"facts": gather_facts(), "runs": runs}
    audit, queried = gpu_audit_queried(layout, stopper)
    facts = gather_facts(queried)  # the audit's nvidia-smi answer: not run a second time
    return {"facts": facts, "runs": runs, "gpu_holders": audit["holders"],
            "gpu_audit_error": audit["error"]}


def process_tree(proofs: Dict[int, str]) -> List[JSONDict]:
    """The live processes of one record but its leader, each with what a person recognises
    it by (comm, command line, parent, group, session) and the rule that proves it ours."""
    tree: List[JSONDict] = []
    for pid in sorted(proofs):
        info = describe_pid(pid)
        st = read_stat(pid)
        tree.append({"pid": pid, "comm": info.get("comm"), "cmdline": info.get("cmdline"),
                     "ppid": st.ppid if st else None, "pgid": st.pgid if st else None,
                     "sid": st.sid if st else None, "proof": proofs[pid]})
    return tree


def op_logs(req: Request, out: Emitter) -> JSONDict:
    """The last N lines of the run's process logs (read from the end of each file)."""
    raw = req.raw
    playbook = get_opt_name(raw, "playbook", "")
    run_id = get_opt_name(raw, "run_id", "")
    if playbook is None and run_id is None:
        raise bad_request("logs: give run_id or playbook")
    lines = get_int(raw, "lines", "", 50, 0, 1000000)
    wanted: Optional[List[str]] = None
    if raw.get("processes") is not None:
        wanted = get_str_list(raw, "processes", "")
    layout = Layout(req.workdir)
    rid = resolve_run(layout, playbook, run_id)
    run = load_run(layout, rid, out)
    paths: Dict[str, str] = {}
    hidden = run_secrets(run, Stopper(out)) if run is not None else []
    if run is not None:
        for rec in run["processes"]:
            if isinstance(rec, dict) and isinstance(rec.get("name"), str):
                log = rec.get("log")
                paths[rec["name"]] = log if isinstance(log, str) else ""
    else:  # fall back to whatever logs exist
        logs_dir = os.path.join(layout.run_dir(rid), "logs")
        try:
            for fname in sorted(os.listdir(logs_dir)):
                if fname.endswith(".log"):
                    paths[fname[: -len(".log")]] = os.path.join(logs_dir, fname)
        except OSError:
            pass
    if wanted is not None:
        unknown = [n for n in wanted if n not in paths]
        if unknown:
            have = ", ".join(sorted(paths)) or "none"
            raise AgentError(
                "not_found", f"run {rid} has no process {', '.join(unknown)} (it has {have})"
            )
        paths = {n: paths[n] for n in wanted}
    return {"run_id": rid, "secret_keys": run_secret_keys(run) if run is not None else [],
            "logs": {n: tail_lines(p, lines, hidden) if p else [] for n, p in paths.items()}}


def op_check(req: Request, out: Emitter) -> JSONDict:
    """Facts, whether the workdir is writable, free disk, python version. Creates nothing."""
    facts = gather_facts()
    out.emit("facts", **facts)
    base = nearest_existing(req.workdir)
    writable = False
    if os.path.isdir(req.workdir):
        probe = os.path.join(req.workdir, f".outrig-probe.{os.getpid()}")
        try:
            with open(probe, "wb") as f:
                f.write(b"ok")
            os.unlink(probe)
            writable = True
        except OSError:
            writable = False
    elif os.path.isdir(base):
        writable = os.access(base, os.W_OK | os.X_OK)
    try:
        st = os.statvfs(base)
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = 0
    return {
        "workdir_writable": writable,
        "disk_free_bytes": free,
        "python": platform.python_version(),
        "facts": facts,
    }


def argv_option(argv: List[str], flag: str) -> Optional[str]:
    """The value of ``--flag X`` or ``--flag=X`` in an argv (last one wins), or None."""
    value: Optional[str] = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def http_get(url: str, timeout: float = PROBE_TIMEOUT_S) -> Tuple[Optional[int], bytes, str]:
    """(status code or None, body (≤ 64 KiB), error text) of a GET; proxies ignored."""
    import urllib.error
    import urllib.request  # lazily: ~20 ms of imports that most calls never need

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            return int(resp.status), resp.read(65536), ""
    except urllib.error.HTTPError as exc:
        return int(exc.code), b"", ""
    except Exception as exc:  # refused, timeout, reset, bad status line...
        return None, b"", str(getattr(exc, "reason", exc))[:200]


def server_facts(ready_url: str, argv: List[str]) -> JSONDict:
    """/health and the served model ids for an HTTP process that looks like vLLM."""
    from urllib.parse import urlsplit

    parts = urlsplit(ready_url)
    base = f"{parts.scheme}://{parts.netloc}"
    facts: JSONDict = {"url": ready_url, "health": None, "health_error": None, "models": None}
    looks_vllm = parts.path.rstrip("/") in ("/health", "/v1/models") or any(
        "vllm" in a for a in argv)
    if not looks_vllm:
        return facts
    code, _, err = http_get(base + "/health")
    facts["health"], facts["health_error"] = code, err or None
    code, body, _ = http_get(base + "/v1/models")
    if code == 200:
        try:
            data = json.loads(body.decode("utf-8"))
            facts["models"] = [str(m.get("id")) for m in data.get("data") or []
                               if isinstance(m, dict)]
        except (ValueError, AttributeError):
            facts["models"] = None
    return facts


def status_extras(rec: JSONDict, state: JSONDict, progress_bytes: int,
                  markers: List[str], secrets: Optional[List[str]] = None) -> JSONDict:
    """Fields ``status`` adds to one process: record facts, raw progress text, checkpoint,
    and for a running HTTP server its /health and model ids."""
    raw_argv = rec.get("argv")
    argv = [str(a) for a in raw_argv] if isinstance(raw_argv, list) else []
    extra: JSONDict = {"pgid": rec.get("pgid"), "gpus": rec.get("gpus") or [],
                       "started_at": rec.get("started_at"), "argv": argv}
    log = rec.get("log")
    if progress_bytes > 0 and isinstance(log, str):
        extra["tail_text"] = redact(tail_text(log, progress_bytes), secrets or [])
        extra["markers"] = (last_lines_containing(log, markers, secrets=secrets)
                            if markers else {})
    save = argv_option(argv, "--save-path")
    if save is not None:
        raw_cwd = rec.get("cwd")
        cwd = raw_cwd if isinstance(raw_cwd, str) else "/"
        max_steps = argv_option(argv, "--max-steps")
        extra["checkpoint"] = newest_checkpoint(
            os.path.normpath(os.path.join(cwd, save)),
            argv_option(argv, "--scheduler-type") != "none",
            int(max_steps) if max_steps is not None and max_steps.isdigit() else None)
    spec = rec.get("ready")
    if state.get("state") == "running" and isinstance(spec, dict) and isinstance(
            spec.get("http"), str):
        extra["server"] = server_facts(spec["http"], argv)
    return extra
