"""Helpers of the real-vLLM ``outrig evaluate`` tests (tests/realvllm/test_evaluate.py and
the trained drafter's, tests/rehearsal/test_evaluate_trained.py): the evaluation server's
settings, the command, and what vLLM itself logged."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.network import free_port
from tests.support.processes import group_members, marked

SPEC_LINE = re.compile(r"SpecDecoding metrics: Mean acceptance length: ([\d.]+), .*"
                       r"Accepted: (\d+) tokens, Drafted: (\d+) tokens")
EVALUATE_TIMEOUT = 1800  # two CPU vLLM starts on a loaded 2-core machine


def server_settings(python: str) -> dict[str, Any]:
    return {"python": python, "port": free_port(), "gpus": [], "max_model_len": 512,
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOG_STATS_INTERVAL": "1"},
            # --enforce-eager: no graph compile at start (~45 s to /health here instead of
            # minutes); the speculative decoding path is the same
            "extra_args": ["--dtype", "bfloat16", "--enforce-eager"], "ready_timeout": 900}


def outrig(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    binary = Path(sys.executable).parent / "outrig"
    return subprocess.run([str(binary), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=EVALUATE_TIMEOUT)


def logged(workdir: Path, run_id: str) -> tuple[int, int, list[float]]:
    """(accepted, drafted, mean lengths) summed over the server's own SpecDecoding lines."""
    text = (workdir / "runs" / run_id / "logs" / "server.log").read_text(errors="replace")
    found = SPEC_LINE.findall(text)
    return (sum(int(a) for _, a, _ in found), sum(int(d) for _, _, d in found),
            [float(m) for m, _, _ in found])


def check_stopped(doc: dict[str, Any], workdir: Path) -> None:
    """Nothing of the evaluation's servers is left: no process with their marker, and none
    in their recorded process groups (vLLM's renamed children keep the group, not the
    marker: setproctitle clears what /proc/PID/environ shows)."""
    for run_id in doc["server_runs"]:
        assert marked(run_id) == [], f"server run {run_id} left processes behind"
        record = json.loads((workdir / "runs" / run_id / "run.json").read_text())
        for proc in record["processes"]:
            assert group_members(int(proc["pgid"])) == [], (
                f"server run {run_id}: group {proc['pgid']} still has processes")
