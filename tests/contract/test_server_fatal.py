"""Contract: the dflash recipe's fatal pattern for a vLLM worker that died without a
traceback of its own matches the line vLLM's own source logs.

The line (vllm/v1/executor/multiproc_executor.py, ``monitor_workers``) is the only place the
worker's exit code shows up: with it a deploy's error says "exit code: -9" (killed: the OOM
killer, or something that kills by pid) instead of the engine's fatal line alone. Read from
the installed CPU build (``$OUTRIG_VLLM_PYTHON``, which CI sets); skipped with a hint when it
is unset.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

import pytest

from outrig.recipes.dflash import SERVER_FATAL

MODULE = Path("vllm", "v1", "executor", "multiproc_executor.py")


def vllm_source() -> str:
    python = os.environ.get("OUTRIG_VLLM_PYTHON")
    if not python:
        pytest.skip("OUTRIG_VLLM_PYTHON is not set: the contract reads the real vLLM's source "
                    "(tests/realvllm/README.md says how to install it)")
    done = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, timeout=60,
                          check=True)
    return (Path(done.stdout.strip()) / MODULE).read_text()


def worker_death_format(source: str) -> tuple[str, int]:
    """The format string of the logger.error call that says a worker died, and its line."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "error" and \
                node.args and isinstance(node.args[0], (ast.Constant, ast.JoinedStr)):
            text = "".join(part.value for part in ast.walk(node.args[0])
                           if isinstance(part, ast.Constant) and isinstance(part.value, str))
            if "died unexpectedly" in text:
                return text, node.lineno
    raise AssertionError(f"no logger.error about a worker that died unexpectedly in {MODULE}")


def test_a_worker_that_died_is_a_fatal_line_that_names_its_exit_code() -> None:
    text, line = worker_death_format(vllm_source())
    logged = (f"(EngineCore pid=4401) ERROR 12-03 00:50:59 [multiproc_executor.py:{line}] "
              + text % ("VllmWorker-0", -9))
    matching = [p for p in SERVER_FATAL if re.search(p, logged)]
    assert matching == [r"Worker proc \S+ died unexpectedly"], logged
    assert "exit code: -9" in logged
