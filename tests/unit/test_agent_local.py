"""The box agent (remote/agent/) run locally as the `local` transport runs it
(tests/support/agent.py).

Every test works in its own tmp workdir with small real processes and asserts real outcomes
(pids gone in /proc, files, exit codes). Processes are cleaned up by recorded pid (and start
ticks) in the fixture's teardown, even when a test fails; never by name or pattern.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from outrig.agent.client import agent_command, agent_payload
from outrig.sandbox.fulldisk import fill, is_full
from tests.support.agent import PY, R1, R2, Box, error_of, names, sleeper, stat_fields, wait_until
from tests.support.network import free_port
from tests.support.processes import alive

# ---------------------------------------------------------------------------------------- deploy


def test_deploy_after_and_http_readiness(box: Box) -> None:
    port = free_port()
    server = {
        "name": "server",
        "argv": [PY, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        "ready": {"http": f"http://127.0.0.1:{port}/", "timeout": 15},
        "stop_grace": 2,
    }
    client = {
        "name": "client",
        "argv": ["sh", "-c", 'echo "foo=$FOO tok=$HF_TOKEN"; echo client started; sleep 60'],
        "env": {"MODE": "test"},
        "after": ["server"],
        "ready": {"log": r"client \w+ed", "timeout": 10},
        "fatal": ["Traceback"],
    }
    secret = "hf_s3cr3t_value"
    events, result = box.deploy(
        [client, server],  # out of order on purpose: `after` decides
        env={"FOO": "$HOME/x", "BAR": "${FOO}/y"},
        secrets={"HF_TOKEN": secret},
        files=[
            {"path": "pkg/hello.txt", "data_b64": base64.b64encode(b"hi").decode(), "mode": 384}
        ],
    )
    assert result["ok"] is True, result
    kinds = [(ev["event"], ev.get("process")) for ev in events]
    assert kinds.index(("ready", "server")) < kinds.index(("launched", "client"))
    assert next(e for e in events if e["event"] == "facts")["boot_id"]
    ready = {ev["process"]: ev["via"] for ev in events if ev["event"] == "ready"}
    assert ready == {"server": "http", "client": "log"}

    recs = {r["name"]: r for r in result["processes"]}
    for rec in recs.values():
        assert rec["pid"] == rec["pgid"] == rec["sid"]
        assert alive(rec["pid"])
        st = stat_fields(rec["pid"])
        assert st is not None and st[3] == rec["start_ticks"]
    assert recs["client"]["argv"][0] == "sh"
    assert "HF_TOKEN" in recs["client"]["env_keys"] and "MODE" in recs["client"]["env_keys"]

    # files written with their mode; wrapper written; pointer set; run.json running
    hello = box.workdir / "pkg" / "hello.txt"
    assert hello.read_bytes() == b"hi" and (hello.stat().st_mode & 0o777) == 0o600
    assert (box.workdir / ".outrig" / "wrap.py").is_file()
    assert (box.workdir / ".outrig" / "current" / "smoke").read_text().strip() == R1
    run = box.run_json()
    assert run["status"] == "running" and run["marker"] == f"OUTRIG_RUN={R1}"
    assert result["run_dir"] == str(box.workdir / "runs" / R1)

    # env expanded against the box env; secrets reach the process but are recorded nowhere
    assert f"foo={os.environ['HOME']}/x tok={secret}" in box.log("client")
    assert secret not in (box.workdir / "runs" / R1 / "run.json").read_text()
    assert all(secret not in json.dumps(ev) for ev in [*events, result])
    env = (Path(f"/proc/{recs['client']['pid']}/environ")).read_bytes().split(b"\0")
    assert f"OUTRIG_RUN={R1}".encode() in env and b"OUTRIG_PROCESS=client" in env


def test_log_readiness_with_waiting_heartbeats(box: Box) -> None:
    script = (
        "import time; print('loading', flush=True); time.sleep(0.8);"
        "print('READY x', flush=True); time.sleep(60)"
    )
    spec = {"log": r"^READY \w$", "timeout": 10}
    events, result = box.deploy([{"name": "svc", "argv": [PY, "-c", script], "ready": spec}])
    assert result["ok"] is True, result
    waiting = [ev for ev in events if ev["event"] == "waiting"]
    assert waiting and waiting[-1]["last_line"] == "loading"
    assert waiting[0]["timeout"] == 10
    ready = next(ev for ev in events if ev["event"] == "ready")
    assert ready["via"] == "log" and ready["elapsed"] >= 0.7


def test_fatal_log_aborts_and_stops_what_was_launched(box: Box) -> None:
    bad = (
        "import time; print('starting', flush=True);"
        "print('Traceback (most recent call last):', flush=True); time.sleep(60)"
    )
    events, result = box.deploy(
        [
            sleeper("first"),
            {
                "name": "second",
                "argv": [PY, "-c", bad],
                "ready": {"log": "never", "timeout": 20},
                "fatal": ["^Traceback"],
                "stop_grace": 1,
            },
        ]
    )
    err = error_of(result, "fatal_log")
    assert err["process"] == "second"
    assert "Traceback (most recent call last):" in err["excerpt"]
    assert "starting" in err["excerpt"]
    pids = [ev["pid"] for ev in events if ev["event"] == "launched"]
    assert len(pids) == 2
    assert all(not alive(p) for p in pids)
    assert sorted(names(events, "stopped")) == ["first", "second"]
    run = box.run_json()
    assert run["status"] == "failed" and run["error"]["kind"] == "fatal_log"


def test_early_exit_reports_exit_code(box: Box) -> None:
    port = free_port()
    _events, result = box.deploy(
        [
            {
                "name": "crasher",
                "argv": [PY, "-c", "import sys; print('boom', flush=True); sys.exit(3)"],
                "ready": {"http": f"http://127.0.0.1:{port}/health", "timeout": 20},
            }
        ]
    )
    err = error_of(result, "exited")
    assert err["exit_code"] == 3 and err["process"] == "crasher"
    assert "boom" in err["excerpt"]
    assert "code 3" in err["message"]
    exit_file = box.workdir / "runs" / R1 / "exit" / "crasher.json"
    assert json.loads(exit_file.read_text())["code"] == 3


def test_fatal_line_right_before_exit_wins_over_exit(box: Box) -> None:
    script = "import sys; print('RuntimeError: CUDA out of memory'); sys.exit(1)"
    _, result = box.deploy(
        [
            {
                "name": "oom",
                "argv": [PY, "-c", script],
                "ready": {"port": free_port(), "timeout": 20},
                "fatal": ["out of memory"],
            }
        ]
    )
    err = error_of(result, "fatal_log")
    assert err["excerpt"] == ["RuntimeError: CUDA out of memory"]


def test_unexecutable_argv_is_exit_127(box: Box) -> None:
    _, result = box.deploy(
        [{"name": "nope", "argv": ["/nonexistent/binary"], "ready": {"port": 1, "timeout": 10}}]
    )
    err = error_of(result, "exited")
    assert err["exit_code"] == 127
    assert any("cannot execute" in line for line in err["excerpt"])


def test_exit_readiness_for_one_shot(box: Box) -> None:
    prep = {
        "name": "prep",
        "argv": [PY, "-c", "open('prepared', 'w').write('x'); print('prep done')"],
        "ready": {"exit": True, "timeout": 10},
    }
    check = "import os, time; assert os.path.exists('prepared'); time.sleep(60)"
    main = sleeper("main", after=["prep"], argv=[PY, "-c", check])
    events, result = box.deploy([main, prep])
    assert result["ok"] is True, result
    vias = [e["via"] for e in events if e["event"] == "ready" and e["process"] == "prep"]
    assert vias == ["exit"]
    assert (box.workdir / "prepared").exists()
    main_pid = next(r["pid"] for r in result["processes"] if r["name"] == "main")
    assert alive(main_pid)

    # a failing one-shot is an `exited` error with its code
    _, result = box.deploy(
        [{"name": "prep", "argv": [PY, "-c", "raise SystemExit(2)"], "ready": {"exit": True}}],
        run_id=R2,
    )
    assert error_of(result, "exited")["exit_code"] == 2
    assert not alive(main_pid)  # r2 replaced r1 (same playbook) before failing


def test_wait_false_returns_without_waiting(box: Box) -> None:
    t0 = time.monotonic()
    events, result = box.deploy(
        [sleeper("slow", ready={"log": "never printed", "timeout": 30})], wait=False
    )
    assert result["ok"] is True, result
    assert time.monotonic() - t0 < 5
    assert "slow" not in names(events, "ready")
    assert alive(result["processes"][0]["pid"])
    assert box.run_json()["status"] == "running"


def test_redeploy_stops_previous_run(box: Box) -> None:
    _, first = box.deploy([sleeper("a"), sleeper("b", after=["a"])])
    assert first["ok"] is True, first
    old = [r["pid"] for r in first["processes"]]
    assert all(alive(p) for p in old)
    events, second = box.deploy([sleeper("a")], run_id=R2)
    assert second["ok"] is True, second
    stopped = [ev for ev in events if ev["event"] == "stopped"]
    assert [(ev["process"], ev["run_id"]) for ev in stopped] == [("b", R1), ("a", R1)]
    assert all(not alive(p) for p in old)
    assert box.run_json(R1)["status"] == "stopped"
    assert (box.workdir / ".outrig" / "current" / "smoke").read_text().strip() == R2
    assert alive(second["processes"][0]["pid"])


# --------------------------------------------------------------------------------------- cleanup

FAMILY = r"""
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
escaper = "import os, time; os.setsid(); open('escaper.up', 'w').close(); time.sleep(60)"
stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            "open('stubborn.up', 'w').close(); time.sleep(60)")
a = subprocess.Popen([sys.executable, "-c", escaper])
b = subprocess.Popen([sys.executable, "-c", stubborn])
while not (os.path.exists('escaper.up') and os.path.exists('stubborn.up')):
    time.sleep(0.02)
open('pids.txt', 'w').write('%d %d %d' % (os.getpid(), a.pid, b.pid))
print('family up', flush=True)
time.sleep(60)
"""


def family_pids(box: Box) -> list[int]:
    """Leader, setsid escaper, SIGTERM-ignoring child (written by FAMILY)."""
    pids = [int(x) for x in (box.workdir / "pids.txt").read_text().split()]
    for pid in pids:
        box.track(pid)
    return pids


def test_cleanup_finds_setsid_child_and_kills_term_ignorer_after_grace(box: Box) -> None:
    _, result = box.deploy(
        [{"name": "fam", "argv": [PY, "-c", FAMILY], "ready": {"log": "up"}, "stop_grace": 1}]
    )
    assert result["ok"] is True, result
    wrapper = result["processes"][0]["pid"]
    leader, escaper, stubborn = family_pids(box)
    st = stat_fields(escaper)
    assert st is not None and st[2] == escaper  # really in its own session
    _events, result = box.agent({"op": "cleanup", "playbook": "smoke"})
    assert result["ok"] is True, result
    (run,) = result["runs"]
    (rec,) = run["processes"]
    assert rec["process"] == "fam" and rec["how"] == "kill"
    assert rec["seconds"] >= 1.0 and rec["stragglers"] >= 3
    for pid in (wrapper, leader, escaper, stubborn):
        assert not alive(pid), pid
    assert box.run_json()["status"] == "stopped"
    assert not (box.workdir / ".outrig" / "current" / "smoke").exists()
    # the wrapper was SIGKILLed, so the agent wrote the exit file for it
    _, status = box.agent({"op": "status", "run_id": R1})
    assert status["runs"][0]["processes"][0]["state"] == "killed"


def test_cleanup_leaves_reused_pid_alone(box: Box) -> None:
    _, result = box.deploy([sleeper("svc")])
    assert result["ok"] is True, result
    real = result["processes"][0]["pid"]
    stranger = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        box.track(stranger.pid)
        st = stat_fields(stranger.pid)
        assert st is not None
        path = box.workdir / "runs" / R1 / "run.json"
        run = json.loads(path.read_text())
        rec = run["processes"][0]
        rec.update(pid=stranger.pid, pgid=stranger.pid, sid=stranger.pid, start_ticks=st[3] + 7)
        path.write_text(json.dumps(run))
        _events, result = box.agent({"op": "cleanup", "run_id": R1, "stop_grace": 0.5})
        assert result["ok"] is True, result
        hows = {p["process"]: p["how"] for p in result["runs"][0]["processes"]}
        assert hows["svc"] == "reused"
        assert stranger.poll() is None and alive(stranger.pid)  # not ours: untouched
        assert not alive(real)  # the real one still carried the marker: swept
        assert "(marker sweep)" in hows
    finally:
        stranger.kill()
        stranger.wait()


def test_cleanup_with_corrupt_run_json_sweeps_marker(box: Box) -> None:
    _, result = box.deploy(
        [{"name": "fam", "argv": [PY, "-c", FAMILY], "ready": {"log": "up"}, "stop_grace": 1}]
    )
    assert result["ok"] is True, result
    wrapper = result["processes"][0]["pid"]
    pids = [wrapper, *family_pids(box)]
    (box.workdir / "runs" / R1 / "run.json").write_text("{not json")
    events, result = box.agent({"op": "cleanup", "run_id": R1, "stop_grace": 0.3})
    assert result["ok"] is True, result
    assert any(ev["event"] == "warning" and R1 in ev["msg"] for ev in events)
    (sweep,) = result["runs"][0]["processes"]
    assert sweep["process"] == "(marker sweep)" and sweep["how"] == "kill"
    assert sweep["stragglers"] == 4
    for pid in pids:
        assert not alive(pid), pid


def test_cleanup_all_stops_every_live_run(box: Box) -> None:
    _, one = box.deploy([sleeper("a")])
    _, two = box.deploy([sleeper("b")], playbook="other", run_id=R2)
    pids = [one["processes"][0]["pid"], two["processes"][0]["pid"]]
    assert all(alive(p) for p in pids)
    _, result = box.agent({"op": "cleanup", "all": True})
    assert result["ok"] is True, result
    assert sorted(r["run_id"] for r in result["runs"]) == [R1, R2]
    assert all(not alive(p) for p in pids)
    assert not list((box.workdir / ".outrig" / "current").iterdir())
    _, status = box.agent({"op": "status"})
    assert status["runs"] == []


def test_cleanup_without_a_run_is_ok_and_idempotent(box: Box) -> None:
    _, result = box.agent({"op": "cleanup", "playbook": "smoke"})
    assert result["ok"] is True and result["runs"] == []
    _, result = box.agent({"op": "cleanup"})
    assert "run_id" in error_of(result, "bad_request")["message"]


def test_cleanup_stops_a_run_when_the_workdir_disk_is_full(full_box: Box) -> None:
    box = full_box
    # ready once it printed: a print into the full disk would kill it before cleanup could
    _, result = box.deploy([sleeper("hog", ready={"log": "^up$"})])
    assert result["ok"] is True, result
    pid = result["processes"][0]["pid"]
    fill(box.workdir.parent)
    assert is_full(box.workdir)
    assert alive(pid)
    events, result = box.agent({"op": "cleanup", "playbook": "smoke", "stop_grace": 0.5})
    assert result["ok"] is True, result
    assert wait_until(lambda: not alive(pid))
    (run,) = result["runs"]
    assert [p["how"] for p in run["processes"]] == ["term"], events
    # what could not be written is said, in the result and as a warning
    assert any("run.json" in note for note in result["not_recorded"]), result["not_recorded"]
    assert any(ev["event"] == "warning" and "could not record" in ev["msg"] for ev in events)
    assert not (box.workdir / ".outrig" / "current" / "smoke").exists()


def test_deploy_onto_a_full_disk_says_so_and_starts_nothing(full_box: Box) -> None:
    """A disk that is full when deploy writes its run records: the ``disk`` error names the
    cause and the way out, not an internal "OSError: [Errno 28]" that reads like a bug."""
    box = full_box
    _, first = box.deploy([sleeper("first", ready={"log": "^up$"})])
    assert first["ok"] is True, first
    box.agent({"op": "cleanup", "playbook": "smoke", "stop_grace": 0.5})
    fill(box.workdir.parent)
    assert is_full(box.workdir)
    events, result = box.deploy([sleeper("second", ready={"log": "^up$"})], run_id=R2)
    assert result["ok"] is False, result
    error = result["error"]
    assert error["kind"] == "disk", error
    assert "full" in error["message"] and "Free space" in error["message"], error
    assert "`outrig cleanup` still stops" in error["message"], error
    assert not any(ev["event"] == "started" for ev in events), events


# ---------------------------------------------------------------------------------- status, logs


QUITTER = "import time; time.sleep(0.3); raise SystemExit(4)"
VICTIM = "import os, signal, time; time.sleep(0.3); os.kill(os.getpid(), signal.SIGKILL)"


def test_status_running_exited_killed(box: Box) -> None:
    _, result = box.deploy(
        [
            sleeper("runner"),
            {"name": "quitter", "argv": [PY, "-c", QUITTER]},
            {"name": "victim", "argv": [PY, "-c", VICTIM]},
        ],
        wait=False,
    )
    assert result["ok"] is True, result
    exits = box.workdir / "runs" / R1 / "exit"
    assert wait_until(lambda: all((exits / f"{n}.json").exists() for n in ("quitter", "victim")))
    _, status = box.agent({"op": "status", "log_lines": 3})
    assert status["ok"] is True, status
    assert "gpus" in status["facts"]
    (run,) = status["runs"]
    assert run["run_id"] == R1 and run["status"] == "running"
    states = {p["name"]: p for p in run["processes"]}
    assert states["runner"]["state"] == "running" and states["runner"]["uptime"] >= 0
    assert states["runner"]["log_tail"] == ["up"]
    assert (states["quitter"]["state"], states["quitter"]["exit_code"]) == ("exited", 4)
    assert (states["victim"]["state"], states["victim"]["signal"]) == ("killed", 9)


def test_status_reports_a_process_ready_by_its_log_pattern(box: Box) -> None:
    """`ready` was null (`-` for people) for a process made ready by a log line: only http
    and port were re-checked. A line once printed stays true, whether the deploy waited for
    it (recorded) or not (found in the log); a line not printed yet is `false`, not null."""
    ready_later = [PY, "-c", "import time; time.sleep(0.5); print('booted: READY', flush=True);"
                   " time.sleep(60)"]
    _, result = box.deploy([
        {"name": "waited", "argv": [PY, "-c", "print('READY', flush=True);"
                                    " import time; time.sleep(60)"],
         "ready": {"log": "^READY$", "timeout": 10}},
    ])
    assert result["ok"] is True, result
    _, result = box.deploy([
        {"name": "unwatched", "argv": ready_later, "ready": {"log": r"READY$", "timeout": 30}},
        {"name": "never", "argv": ready_later, "ready": {"log": "never printed", "timeout": 30}},
        sleeper("plain"),
    ], playbook="other", run_id=R2, wait=False)
    assert result["ok"] is True, result
    assert wait_until(lambda: "READY" in box.log("unwatched", R2), 10)
    _, status = box.agent({"op": "status"})
    ready = {p["name"]: p["ready"] for run in status["runs"] for p in run["processes"]}
    assert ready == {"waited": True, "unwatched": True, "never": False, "plain": None}


def test_status_says_that_cleanup_or_a_redeploy_stopped_a_process(box: Box) -> None:
    """A run stopped by cleanup showed `killed (signal 15)`, like a crash: the box records who
    stopped each process that was still running, and only those."""
    _, first = box.deploy([sleeper("a"), {"name": "quitter", "argv": [PY, "-c", QUITTER]}],
                          wait=False)
    assert first["ok"] is True, first
    assert wait_until(lambda: (box.workdir / "runs" / R1 / "exit" / "quitter.json").exists())
    _, second = box.deploy([sleeper("a")], run_id=R2)  # replaces R1
    assert second["ok"] is True, second
    _, cleaned = box.agent({"op": "cleanup", "run_id": R2})
    assert cleaned["ok"] is True, cleaned
    states = {}
    for rid in (R1, R2):
        _, status = box.agent({"op": "status", "run_id": rid})
        for proc in status["runs"][0]["processes"]:
            states[(rid, proc["name"])] = (proc["state"], proc["signal"], proc["stopped_by"])
    assert states == {(R1, "a"): ("killed", 15, "redeploy"),
                      (R1, "quitter"): ("exited", None, None),  # it ended by itself
                      (R2, "a"): ("killed", 15, "cleanup")}


def test_status_and_logs_of_unknown_run_are_not_found(box: Box) -> None:
    _, result = box.agent({"op": "status", "run_id": "nope"})
    error_of(result, "not_found")
    _, result = box.agent({"op": "logs", "playbook": "smoke"})
    error_of(result, "not_found")


def test_logs_returns_last_lines(box: Box) -> None:
    script = "import sys\nfor i in range(1, 5001): print('line %d' % i)\nprint('partial', end='')"
    _, result = box.deploy(
        [{"name": "talker", "argv": [PY, "-c", script], "ready": {"exit": True}}, sleeper("quiet")]
    )
    assert result["ok"] is True, result
    _, logs = box.agent({"op": "logs", "playbook": "smoke", "lines": 4})
    assert logs["ok"] is True and logs["run_id"] == R1
    assert logs["logs"]["talker"] == ["line 4998", "line 4999", "line 5000", "partial"]
    assert logs["logs"]["quiet"] == ["up"]
    _, logs = box.agent({"op": "logs", "run_id": R1, "processes": ["talker"], "lines": 1})
    assert logs["logs"] == {"talker": ["partial"]}


# ---------------------------------------------------------------------- refusals: nothing started


def test_lock_held_is_a_lock_error(box: Box) -> None:
    state = box.workdir / ".outrig"
    state.mkdir(parents=True)
    with open(state / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps({"pid": os.getpid(), "op": "deploy", "since": time.time()}))
        f.flush()
        t0 = time.monotonic()
        events, result = box.deploy([sleeper("x")], lock_timeout=0.4)
        assert time.monotonic() - t0 >= 0.4
    err = error_of(result, "lock")
    assert f"pid {os.getpid()}" in err["message"]
    assert not names(events, "launched")
    assert not (box.workdir / "runs" / R1).exists()


FAKE_SMI = """#!/bin/sh
echo "0, GPU-aaaa, NVIDIA H200, 143771, 10, 143146, [N/A], 00000000:00:06.0, 580.159.04"
echo "1, GPU-bbbb, NVIDIA H200, 143771, 20, 143136, 7, 00000000:00:07.0, 580.159.04"
"""


def test_gpu_index_beyond_the_box(box: Box) -> None:
    bindir = box.tmp / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    events, result = box.deploy(
        [sleeper("ok", gpus=[0, 1]), sleeper("greedy", gpus=[1, 5])],
        env={"PATH": f"{bindir}:$PATH"},
    )
    err = error_of(result, "gpu")
    assert err["process"] == "greedy"
    assert "wants GPU 5 but the box has 2 (0-1)" in err["message"]
    facts = next(ev for ev in events if ev["event"] == "facts")
    assert facts["gpu_error"] is None
    assert facts["gpus"][0] == {
        "index": 0,
        "uuid": "GPU-aaaa",
        "name": "NVIDIA H200",
        "memory_total_mib": 143771,
        "memory_used_mib": 10,
        "memory_free_mib": 143146,
        "utilization_pct": None,
        "pci_bus_id": "00000000:00:06.0",
        "driver": "580.159.04",
        "health": {},  # this nvidia-smi answers the inventory alone: judged unknown
    }
    assert not names(events, "launched")
    assert not (box.workdir / "runs").exists()


def test_missing_nvidia_smi_is_reported_not_fatal(box: Box) -> None:
    events, result = box.agent({"op": "check", "env": {"PATH": str(box.tmp)}})
    assert result["ok"] is True, result
    facts = next(ev for ev in events if ev["event"] == "facts")
    assert facts["gpus"] == [] and "not found" in facts["gpu_error"]
    assert result["workdir_writable"] is True  # missing workdir, creatable parent
    assert result["disk_free_bytes"] > 0
    assert not box.workdir.exists()  # check creates nothing


def test_workdir_under_a_regular_file(box: Box) -> None:
    blocker = box.tmp / "plainfile"
    blocker.write_text("x")
    workdir = blocker / "wd"
    events, result = box.deploy([sleeper("x")], workdir=str(workdir))
    err = error_of(result, "workdir")
    assert str(workdir) in err["message"] and "Not a directory" in err["message"]
    assert not names(events, "launched")


def test_bad_requests_name_the_field(box: Box) -> None:
    _, result = box.deploy([{"name": "x", "argv": []}])
    assert "processes[0].argv" in error_of(result, "bad_request")["message"]
    _, result = box.deploy([sleeper("a", after=["b"])])
    assert "processes[0].after" in error_of(result, "bad_request")["message"]
    _, result = box.deploy([sleeper("a", after=["b"]), sleeper("b", after=["a"])])
    assert "cycle" in error_of(result, "bad_request")["message"]
    _, result = box.deploy([sleeper("a", fatal=["(unclosed"])])
    assert "processes[0].fatal[0]" in error_of(result, "bad_request")["message"]
    _, result = box.deploy([sleeper("a")], run_id="../evil")
    assert "run_id" in error_of(result, "bad_request")["message"]
    _, result = box.agent({"op": "deploy", "workdir": "relative/path"})
    assert "workdir" in error_of(result, "bad_request")["message"]
    _, result = box.agent({"op": "explode"})
    assert "op" in error_of(result, "bad_request")["message"]
    proc = subprocess.run(
        agent_command(PY, str(box.workdir)), input=agent_payload() + b"this is not json\n",
        capture_output=True, timeout=20, check=False
    )
    assert proc.returncode == 0
    assert json.loads(proc.stdout.decode().splitlines()[-1])["error"]["kind"] == "bad_request"
    assert not (box.workdir / "runs").exists()


def test_shell_metacharacters_reach_the_process_literally(box: Box) -> None:
    nasty = '"; touch X; echo $HOME `id` $(id) | cat > Y'
    script = "import sys; open('argv.txt', 'w').write(sys.argv[1])"
    _, result = box.deploy(
        [{"name": "lit", "argv": [PY, "-c", script, nasty], "ready": {"exit": True}}]
    )
    assert result["ok"] is True, result
    assert (box.workdir / "argv.txt").read_text() == nasty
    assert not (box.workdir / "X").exists() and not (box.workdir / "Y").exists()
    assert not (box.tmp / "X").exists()
    assert result["processes"][0]["argv"][-1] == nasty


@pytest.mark.parametrize("cache", ["no workdir (from memory)", "unpacked now", "cached"])
def test_bootstrap_exec_does_not_wait_for_eof(box: Box, cache: str) -> None:
    """The way the SSH transport runs a request with secrets: the bootstrap, then the
    compressed bundle and the request on stdin, which stays open; whether the bundle is
    run from memory, unpacked into the workdir first, or found there already."""
    if cache != "no workdir (from memory)":
        box.workdir.mkdir()
    if cache == "cached":
        box.agent({"op": "check"})
    req = {"v": 1, "op": "check", "workdir": str(box.workdir), "env": {}}
    proc = subprocess.Popen(
        agent_command(PY, str(box.workdir)), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(agent_payload() + (json.dumps(req) + "\n").encode())
        proc.stdin.flush()  # and keep it open
        assert proc.wait(timeout=20) == 0
        lines = [json.loads(x) for x in proc.stdout.read().decode().splitlines()]
        assert lines[-1]["event"] == "result" and lines[-1]["ok"] is True
        assert lines[0]["event"] == "facts"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdin is not None:
            proc.stdin.close()


def test_two_identical_deploys_at_once_run_one_after_the_other_and_the_second_names_the_first(
        box: Box) -> None:
    """Both started at the same moment: the workdir lock runs them one after the other, and
    the result of the one that got it second names the run it replaced, that run's status
    and how long ago it started (what lets the workstation say so); only its run is left."""
    results: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {}
    go = threading.Barrier(2)

    def deploy(run_id: str) -> None:
        go.wait()
        results[run_id] = box.deploy([sleeper("server", ready={"log": "^up$", "timeout": 20})],
                                     run_id=run_id, lock_timeout=30)

    threads = [threading.Thread(target=deploy, args=(r,)) for r in (R1, R2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert set(results) == {R1, R2} and all(r["ok"] for _, r in results.values())
    replaced = {run_id: result["replaced"] for run_id, (_, result) in results.items()}
    (first,) = [r for r, rep in replaced.items() if rep is None]
    (second,) = [r for r, rep in replaced.items() if rep is not None]
    assert replaced[second]["run_id"] == first and replaced[second]["status"] == "running"
    assert 0 <= replaced[second]["age"] < 60
    assert box.run_json(first)["status"] == "stopped"
    _, status = box.agent({"op": "status"})
    assert [(run["run_id"], run["status"]) for run in status["runs"]] == [(second, "running")]


def test_outrigs_own_variables_in_a_launched_process_never_start_with_vllm(box: Box) -> None:
    # vLLM warns about every VLLM_* variable it does not know, and refuses to start on one
    # with --fail-on-environ-validation: what outrig adds to a process's environment must
    # never take that prefix (docs/playbooks.md)
    dump = "import json, os; print(json.dumps(sorted(os.environ)), flush=True); print('up')"
    _, result = box.deploy([{"name": "env", "argv": [PY, "-c", dump], "env": {"MINE": "1"},
                             "ready": {"log": "^up$", "timeout": 30}}])
    assert result["ok"] is True, result
    keys = json.loads(box.log("env").splitlines()[0])
    added = set(keys) - set(os.environ) - {"MINE"}
    assert {"OUTRIG_RUN", "OUTRIG_PROCESS"} <= added
    assert not [k for k in added if k.startswith("VLLM_")], added
