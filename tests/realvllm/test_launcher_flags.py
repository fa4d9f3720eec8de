"""Contract: outrig's table of vLLM's and torchrun's parallel flags (outrig/launchers/flags.py)
is the real parsers' (vLLM's ``make_arg_parser`` and ``vllm serve``'s, torch's ``torchrun``),
and outrig's reader gets the same sizes from a command line as those parsers do.

The parsers are built by the real vLLM's interpreter (tests/realvllm/launcher_parsers.py);
no server is started."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from outrig.launchers import read_launch
from outrig.launchers.flags import (
    TORCHRUN_BOOLEAN,
    TORCHRUN_NNODES,
    TORCHRUN_NPROC,
    VLLM_BOOLEAN,
    VLLM_CONFIG,
    VLLM_SIZES,
    VLLM_SPANNING,
)

SCRIPT = Path(__file__).with_name("launcher_parsers.py")
# Command lines after ``vllm`` (``serve ...``: the CLI's parser) or after
# ``-m vllm.entrypoints.openai.api_server`` (the API server's)
VLLM_CASES = [
    ["serve", "M", "--tensor-parallel-size", "2", "--data-parallel-size", "2"],
    ["serve", "M", "-tp", "4", "-pp", "2"],
    ["serve", "M", "-tp=2", "-dp=3", "--port", "8000"],
    ["serve", "M", "--tensor_parallel_size=2", "--pipeline_parallel_size", "2"],
    ["serve", "M", "-tp", "1", "-tp", "8"],
    ["serve", "M", "-pcp", "2", "--max-model-len", "4096"],
    ["serve", "M", "-tp", "2", "--nnodes", "2", "--node-rank", "1", "--headless"],
    ["serve", "M", "-dp", "4", "-dpl", "2", "-dpa", "10.0.0.1", "-dpr", "2"],
    ["serve", "M", "--data-parallel-rank", "1", "-n", "1"],
    ["--model", "M", "-tp", "2", "--data-parallel-size=2", "--enforce-eager"],
    ["--model", "M", "--pipeline-parallel-size=3", "-r", "0"],
]
TORCHRUN_CASES = [
    ["--nproc-per-node", "4", "train.py"],
    ["--standalone", "--nproc_per_node=2", "-m", "speculators.train", "--nnodes", "9"],
    ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--nproc-per-node", "gpu", "t.py"],
    ["--no-python", "--nnodes=2", "--max-restarts", "0", "echo", "--nproc-per-node", "7"],
    ["-t", "3", "--run-path", "--nproc_per_node", "3", "t.py"],
]


@pytest.fixture(scope="module")
def real(vllm_python: str) -> dict[str, Any]:
    cases = {"vllm": VLLM_CASES, "torchrun": TORCHRUN_CASES}
    done = subprocess.run([vllm_python, str(SCRIPT)], input=json.dumps(cases),
                          capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def by_dest(options: list[dict[str, Any]]) -> dict[str, set[str]]:
    return {o["dest"]: set(o["strings"]) for o in options}


def test_vllms_parallel_flags_and_aliases_are_the_real_parsers(real: dict[str, Any]) -> None:
    dests = by_dest(real["vllm_options"])
    for dest, flags in {**VLLM_SIZES, **VLLM_SPANNING}.items():
        assert dests.get(dest) == set(flags), dest
    flagless = {s for o in real["vllm_options"] if o["nargs"] == 0 for s in o["strings"]}
    ours = {f for flags in {**VLLM_SIZES, **VLLM_SPANNING}.values() for f in flags}
    assert flagless & ours == VLLM_BOOLEAN
    assert any(VLLM_CONFIG in o["strings"] for o in real["vllm_options"])


def test_no_real_vllm_flag_is_taken_for_an_abbreviation_of_ours(real: dict[str, Any]) -> None:
    """The reader calls a long flag that begins one of its own an abbreviation (argparse
    would expand it); a real flag of that shape would be misread."""
    ours = [f for flags in {**VLLM_SIZES, **VLLM_SPANNING}.values() for f in flags
            if f.startswith("--")]
    real_long = {s for o in real["vllm_options"] for s in o["strings"] if s.startswith("--")}
    clashes = sorted(r for r in real_long - set(ours) for f in ours if f.startswith(r))
    assert clashes == []


def test_torchruns_flags_are_the_real_parsers(real: dict[str, Any]) -> None:
    dests = by_dest(real["torchrun_options"])
    assert dests["nproc_per_node"] == set(TORCHRUN_NPROC)
    assert dests["nnodes"] == set(TORCHRUN_NNODES)
    flagless = {s for o in real["torchrun_options"] if o["nargs"] == 0 for s in o["strings"]}
    assert flagless == TORCHRUN_BOOLEAN


@pytest.mark.parametrize("index", range(len(VLLM_CASES)))
def test_the_reader_gets_vllms_own_sizes(real: dict[str, Any], index: int) -> None:
    argv = VLLM_CASES[index]
    head = ["vllm"] if argv[0] == "serve" else ["python", "-m",
                                                 "vllm.entrypoints.openai.api_server"]
    launch = read_launch([*head, *argv])
    assert launch.program == "vllm"
    parsed = real["vllm"][index]
    for dest in VLLM_SIZES:
        assert int(launch.flags.get(dest, "1")) == parsed[dest], dest
    for dest in VLLM_SPANNING:  # read as given, or absent and the parser's default
        if dest in launch.flags:
            want = "true" if parsed[dest] is True else str(parsed[dest])
            assert launch.flags[dest] == want, dest
        else:
            assert parsed[dest] == real["vllm_defaults"][dest], dest


@pytest.mark.parametrize("index", range(len(TORCHRUN_CASES)))
def test_the_reader_gets_torchruns_own_ranks_and_nodes(real: dict[str, Any],
                                                       index: int) -> None:
    launch = read_launch(["torchrun", *TORCHRUN_CASES[index]])
    parsed = real["torchrun"][index]
    assert launch.flags.get("nproc_per_node", "1") == parsed["nproc_per_node"]
    assert launch.flags.get("nnodes", "1:1") == parsed["nnodes"]
