"""The rehearsal's two CPU shims (tests/rehearsal/cpu_shim/, vllm_cpu_shim/), each put alone on
a process's PYTHONPATH, load their shared import machinery (tests/rehearsal/patching.py) from
its path and wait for the modules they patch. Checked without the real tools: the patches
themselves run in the rehearsal tier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REHEARSAL = Path(__file__).resolve().parents[1] / "rehearsal"
FINDERS = ("import json, sys; print(json.dumps([sorted(f.patches) for f in sys.meta_path "
           "if hasattr(f, 'patches') and hasattr(f, 'when')]))")


@pytest.mark.parametrize(("shim", "patched"), [
    ("cpu_shim", ["speculators.train.checkpointer", "speculators.train.distributed",
                  "speculators.train.trainer", "speculators.utils.util"]),
    ("vllm_cpu_shim",
     ["vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"]),
])
def test_each_shim_alone_on_pythonpath_waits_for_its_modules(shim: str,
                                                             patched: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(REHEARSAL / shim)}
    out = subprocess.run([sys.executable, "-c", FINDERS], env=env, capture_output=True,
                         text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == [patched]


def test_without_a_shim_nothing_waits() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", FINDERS], env=env, capture_output=True,
                         text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == []
