"""Contract: ``outrig evaluate --dataset`` reads vLLM's sets with vLLM's own classes.

The agent's loader (remote/agent/vllm_datasets.py) runs in the real vLLM's interpreter (the
CPU build 0.32, ``$OUTRIG_VLLM_PYTHON``, with pandas: vLLM's bench extra, .ci/venvs) on small
files in the sets' published schemas (tests/fixtures/vllm-datasets): every prompt vLLM's own
``SpecBench`` / ``SpeedBench`` gives is written, labelled with its category, the categories
interleaved; a category the file lacks and a missing folder are refused with what to do.
The refusals where the class or pandas is missing are tests/integration/
test_evaluate_datasets.py (stand-in trees)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from remote.agent.events import AgentError
from remote.agent.vllm_datasets import load_dataset

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-datasets"
OWN = """
import json, sys
from vllm.benchmarks.datasets.datasets import SpecBench, SpeedBench
out = []
for a in json.loads(sys.argv[1]):
    cls = SpecBench if a["name"] == "spec_bench" else SpeedBench
    kw = {"dataset_path": a["path"], "category": a["category"]}
    if a["name"] == "speed_bench":
        kw["dataset_subset"] = "qualitative"
    out.append([d["prompt"] for d in cls(**kw).data])
print(json.dumps(out))
"""


def own(python: str, asks: list[dict[str, str]]) -> list[list[str]]:
    """What vLLM's own class gives for each of these arguments, in its own order (one
    interpreter: importing vLLM costs seconds)."""
    done = subprocess.run([python, "-c", OWN, json.dumps(asks)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_vllms_classes_give_the_prompts_with_their_categories(vllm_python: str,
                                                              tmp_path: Path) -> None:
    spec = {"name": "spec_bench", "path": str(FIXTURES / "question.jsonl"),
            "python": vllm_python, "out": "ds/spec.jsonl"}
    answer = load_dataset(spec, str(tmp_path))
    assert answer["cls"] == "vllm.benchmarks.datasets.datasets.SpecBench"
    assert answer["categories"] == {"translation": 2, "summarization": 2,
                                    "math_reasoning": 2, "qa": 2}
    written = lines(tmp_path / "ds" / "spec.jsonl")
    assert len(written) == answer["prompts"] == 8
    # interleaved: the first four are one of each category
    assert [w["category"] for w in written[:4]] == ["translation", "summarization",
                                                    "math_reasoning", "qa"]
    asks = [{"name": "spec_bench", "path": spec["path"], "category": c}
            for c in answer["categories"]]
    asks.append({"name": "speed_bench", "path": str(FIXTURES / "speed-bench"),
                 "category": "math"})
    *theirs, speed_theirs = own(vllm_python, asks)
    for category, prompts in zip(answer["categories"], theirs, strict=True):
        assert [w["messages"][0]["content"] for w in written  # type: ignore[index]
                if w["category"] == category] == prompts
    assert all(w["messages"][0]["role"] == "user" for w in written)  # type: ignore[index]

    speed = {"name": "speed_bench", "category": "math", "path": str(FIXTURES / "speed-bench"),
             "python": vllm_python, "out": "ds/speed.jsonl"}
    answer = load_dataset(speed, str(tmp_path))
    assert answer["categories"] == {"math": 2}
    written = lines(tmp_path / "ds" / "speed.jsonl")
    assert [w["messages"][0]["content"] for w in written] == speed_theirs  # type: ignore[index]

    with pytest.raises(AgentError, match="has no category 'poetry'; its categories: coding, "
                                         "math, writing"):
        load_dataset({**speed, "category": "poetry"}, str(tmp_path))
    with pytest.raises(AgentError, match="NeMo-Skills' speed-bench prepare.py") as caught:
        load_dataset({**speed, "path": str(tmp_path / "nowhere")}, str(tmp_path))
    assert caught.value.kind == "not_found"
