"""``outrig evaluate --dataset`` refuses a set that cannot be had, on the sandbox box (a real
sshd), before any server starts (exit 2, the reason and what to do, no server run): no path
given, an interpreter without vLLM, a vLLM without the dataset class (an older one: a
stand-in tree, tests/standins/vllm_tree.py), a vLLM whose classes lack pandas (its bench
extra). Reading the sets with the real vLLM 0.32 classes is tests/contract/
test_vllm_datasets.py; an evaluation of one is tests/realvllm/test_evaluate.py."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.integration.test_evaluate import outrig, refused, write
from tests.standins.vllm_tree import make_vllm

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-datasets"
SPEC_CLASS = "class SpecBench(CustomDataset):\n    pass\n"


def playbook(python: str) -> dict[str, object]:
    return {"evaluate": {"model": "/models/m", "speculative": {"method": "ngram"},
                         "server": {"python": python, "gpus": []}}}


def test_a_set_that_cannot_be_had_is_refused_before_any_server(
        box_project: Path, box_host: Path, tmp_path: Path) -> None:
    host = ("evaluate", "--host", box_host.stem, "--playbook", "ds")
    question = str(FIXTURES / "question.jsonl")
    write(box_project, "ds", playbook(sys.executable))
    refused(outrig(box_project, *host, "--dataset", "spec_bench"), box_host,
            "--dataset-path: spec_bench needs its files on the box")
    refused(outrig(box_project, *host, "--dataset-path", question), box_host,
            "--dataset-path goes with --dataset")
    refused(outrig(box_project, *host, "--dataset", "spec_bench", "--dataset-path", question),
            box_host, "has no vLLM, so vLLM's spec_bench cannot be read",
            "set evaluate.server.python")

    old = make_vllm(tmp_path / "old", "0.9.0", {"engine/arg_utils.py": ""})
    write(box_project, "ds", playbook(old))
    refused(outrig(box_project, *host, "--dataset", "spec_bench:qa", "--dataset-path",
                   question), box_host,
            "vLLM 0.9.0 (", "has no SpecBench in vllm.benchmarks.datasets",
            "give the prompts as a JSONL file")

    bare = make_vllm(tmp_path / "bare", "0.32.0",
                     {"benchmarks/datasets/datasets.py": SPEC_CLASS})
    write(box_project, "ds", {"evaluate": {**playbook(bare)["evaluate"],  # type: ignore[dict-item]
                                           "dataset": "spec_bench",
                                           "dataset_path": question}})
    refused(outrig(box_project, *host), box_host, "vLLM 0.32.0 (",
            "cannot read spec_bench: its dataset classes need pandas",
            "pip install 'vllm[bench]'")
