"""What deploy says about a process is what happened to it, and no secret leaves its log.

The agent (remote/agent/) runs locally (as the ``local`` transport runs it), with small real
processes: a process that never started is a failure with its exit code and log, a process
that finished its work before it was ready is ``finished`` (not a failure), and a secret value
a process prints never reaches the error, the events, run.json or the status.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.support.agent import PY, R1, Box, error_of, names, sleeper
from tests.support.processes import alive

SECRET = "hf_TRUTHsecret0123456789"


def test_process_without_ready_whose_binary_is_missing_fails_with_127(box: Box) -> None:
    events, result = box.deploy([{"name": "nope", "argv": ["/nonexistent/binary"]}])
    err = error_of(result, "exited")
    assert err["exit_code"] == 127 and err["process"] == "nope"
    assert "never ran" in err["message"] and "PATH" in err["message"]
    assert any("cannot execute" in line for line in err["excerpt"])
    assert "ready" not in [e["event"] for e in events]
    assert box.run_json()["status"] == "failed"


def test_process_without_ready_exiting_1_at_once_fails_with_its_log(box: Box) -> None:
    script = "import sys; print('ImportError: no module named torch', flush=True); sys.exit(1)"
    events, result = box.deploy([sleeper("good"), {"name": "bad", "argv": [PY, "-c", script]}])
    err = error_of(result, "exited")
    assert err["exit_code"] == 1 and err["process"] == "bad"
    assert err["excerpt"] == ["ImportError: no module named torch"]
    good = next(e["pid"] for e in events if e["event"] == "launched" and e["process"] == "good")
    assert not alive(good), "what the failed deploy launched is stopped"
    run = box.run_json()
    assert run["status"] == "failed" and run["error"]["exit_code"] == 1


def test_process_without_ready_is_started_once_alive_through_the_settle_window(box: Box) -> None:
    events, result = box.deploy([sleeper("svc")], settle=0.5)
    assert result["ok"] is True, result
    ready = [e for e in events if e["event"] == "ready"]
    assert [(e["process"], e["via"]) for e in ready] == [("svc", "alive")]
    assert ready[0]["elapsed"] >= 0.5
    (record,) = result["processes"]
    assert record["outcome"] == "ready" and alive(record["pid"])
    assert result["status"] == "running" and box.run_json()["status"] == "running"


def test_log_ready_process_exiting_0_before_ready_is_finished(box: Box) -> None:
    done = "print('Training complete: epoch 3 of 3 already done', flush=True)"
    events, result = box.deploy([{"name": "trainer", "argv": [PY, "-c", done],
                                  "ready": {"log": r"Training epoch \d+", "timeout": 30}}])
    assert result["ok"] is True, result
    assert result["status"] == "finished"
    (finished,) = [e for e in events if e["event"] == "finished"]
    assert finished["process"] == "trainer" and finished["exit_code"] == 0
    assert "Training complete" in finished["last_line"]
    (record,) = result["processes"]
    assert record["outcome"] == "finished" and record["exit_code"] == 0
    run = box.run_json()
    assert run["status"] == "finished" and run["processes"][0]["outcome"] == "finished"
    _, status = box.agent({"op": "status"})
    (shown,) = status["runs"]
    assert shown["status"] == "finished"
    assert (shown["processes"][0]["state"], shown["processes"][0]["exit_code"]) == ("exited", 0)


def test_exit_0_before_ready_fails_when_a_later_process_waits_for_it(box: Box) -> None:
    server = {"name": "server", "argv": [PY, "-c", "print('bye')"],
              "ready": {"log": "^listening$", "timeout": 30}}
    client = sleeper("client", after=["server"])
    events, result = box.deploy([server, client])
    err = error_of(result, "exited")
    assert err["exit_code"] == 0 and err["process"] == "server"
    assert "client waits for it" in err["message"]
    assert names(events, "launched") == ["server"]


def test_one_shot_exit_ready_is_decided_as_before(box: Box) -> None:
    _, result = box.deploy([{"name": "prep", "argv": [PY, "-c", "raise SystemExit(0)"],
                             "ready": {"exit": True, "timeout": 10}}])
    assert result["ok"] is True and result["processes"][0]["outcome"] == "ready"
    assert result["status"] == "running"


def leaky(code: str, **extra: Any) -> dict[str, Any]:
    """A process that prints its secret and then does ``code``."""
    script = f"import os, sys, time; print('token=' + os.environ['HF_TOKEN'], flush=True); {code}"
    proc: dict[str, Any] = {"name": "leaky", "argv": [PY, "-c", script], "stop_grace": 1}
    proc.update(extra)
    return proc


def assert_no_secret(box: Box, *documents: Any) -> None:
    for document in documents:
        assert SECRET not in json.dumps(document)
    assert SECRET not in (box.workdir / "runs" / R1 / "run.json").read_text()


@pytest.mark.parametrize("code, ready, kind", [
    ("sys.exit(1)", {"log": "never", "timeout": 30}, "exited"),
    ("sys.exit(1)", None, "exited"),
    ("time.sleep(60)", {"log": "never", "timeout": 1}, "timeout"),
    ("print('FATAL ' + os.environ['HF_TOKEN'], flush=True); time.sleep(60)",
     {"log": "never", "timeout": 30}, "fatal_log"),
])
def test_secret_printed_before_ready_is_redacted_from_error_events_and_run_json(
        box: Box, code: str, ready: Any, kind: str) -> None:
    events, result = box.deploy([leaky(code, ready=ready, fatal=["^FATAL"])],
                                secrets={"HF_TOKEN": SECRET})
    err = error_of(result, kind)
    assert "token=***" in err["excerpt"]
    assert SECRET in box.log("leaky"), "the process's own log keeps what it wrote"
    assert_no_secret(box, events, result)


def test_secret_in_waiting_lines_and_status_tails_is_redacted(box: Box) -> None:
    events, result = box.deploy(
        [leaky("time.sleep(1.5); print('READY', flush=True); time.sleep(60)",
               ready={"log": "^READY$", "timeout": 30})],
        secrets={"HF_TOKEN": SECRET}, progress_interval=0.2)
    assert result["ok"] is True, result
    waiting = [e["last_line"] for e in events if e["event"] == "waiting"]
    assert "token=***" in waiting
    assert result["processes"][0]["secret_keys"] == ["HF_TOKEN"]
    deadline = time.monotonic() + 10
    while "READY" not in box.log("leaky") and time.monotonic() < deadline:
        time.sleep(0.05)
    _, status = box.agent({"op": "status", "log_lines": 5, "progress_bytes": 4096,
                           "markers": ["token="]})
    proc = status["runs"][0]["processes"][0]
    assert proc["log_tail"] == ["token=***", "READY"]
    assert "token=***" in proc["tail_text"] and proc["markers"]["token="] == "token=***"
    _, logs = box.agent({"op": "logs", "run_id": R1, "lines": 5})
    assert logs["logs"]["leaky"] == ["token=***", "READY"]
    assert_no_secret(box, events, result, status, logs)
