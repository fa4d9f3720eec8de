"""vLLM's own prompt sets as an evaluation's prompts: ``evaluate.dataset`` /
``--dataset spec_bench|speed_bench[:CATEGORY]`` (docs/evaluate.md "vLLM's datasets").

Pure: the setting parsed and checked here; the set is read on the box by vLLM's own
``SpecBench`` / ``SpeedBench`` in the server's interpreter (remote/agent/vllm_datasets.py),
written to :func:`box_file` in the workdir, and sent from there as any prompts file on the
box, each prompt labelled with its category. Both classes read a local path in vLLM 0.32 to
0.34 (Spec-Bench's question.jsonl; a SPEED-Bench folder of ``<subset>.jsonl`` prepared from
the Hugging Face hub by NVIDIA NeMo-Skills' prepare.py), so ``dataset_path`` is required.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAMES = ("spec_bench", "speed_bench")
SUBSETS = ("qualitative", "throughput_1k", "throughput_2k", "throughput_8k", "throughput_16k",
           "throughput_32k")  # vLLM's --speed-bench-dataset-subset choices (0.32-0.34)
_SPEC = re.compile(r"^(?P<name>[a-z_]+)(?::(?P<category>[A-Za-z0-9_. -]+))?$")
DATASET_DIR = "evaluations/datasets"  # in the box's workdir


@dataclass(frozen=True)
class Dataset:
    """One of vLLM's sets: its name, one category or all, where it is on the box."""

    name: str
    category: str | None
    path: str
    subset: str = "qualitative"

    @property
    def text(self) -> str:
        return self.name + (f":{self.category}" if self.category else "")


def parse_dataset(text: str, path: str | None, subset: str | None,
                  keys: tuple[str, str, str]) -> tuple[Dataset | None, list[str]]:
    """``spec_bench[:CATEGORY]`` with its path (and SPEED-Bench's subset); every problem
    names its key (``keys``: how the dataset, its path and its subset are given here)."""
    key, path_key, subset_key = keys
    match = _SPEC.match(text.strip())
    if match is None or match.group("name") not in NAMES:
        return None, [f"{key} {text!r}: give spec_bench or speed_bench, optionally with one "
                      "category, e.g. speed_bench:coding"]
    name = match.group("name")
    problems: list[str] = []
    if not path:
        what = ("Spec-Bench's question.jsonl (data/spec_bench/question.jsonl of "
                "github.com/hemingkx/Spec-Bench)" if name == "spec_bench" else
                "the folder NVIDIA NeMo-Skills' speed-bench prepare.py writes from "
                "nvidia/SPEED-Bench (it holds qualitative.jsonl, throughput_1k.jsonl, ...)")
        problems.append(f"{path_key}: {name} needs its files on the box: vLLM reads {what} "
                        "from a local path; give that path")
    chosen = subset or "qualitative"
    if subset and name != "speed_bench":
        problems.append(f"{subset_key}: only speed_bench has subsets; leave it out")
    elif chosen not in SUBSETS:
        problems.append(f"{subset_key} {chosen!r}: give one of {', '.join(SUBSETS)}")
    if problems:
        return None, problems
    return Dataset(name=name, category=match.group("category"), path=str(path),
                   subset=chosen), []


def box_file(dataset: Dataset) -> str:
    """Where the set's prompts are written on the box (relative to the workdir): one file per
    name, subset and category, rewritten by each evaluation."""
    parts = [dataset.name]
    if dataset.name == "speed_bench":
        parts.append(dataset.subset)
    parts.append(re.sub(r"[^A-Za-z0-9_.-]", "_", dataset.category) if dataset.category
                 else "all")
    return f"{DATASET_DIR}/{'-'.join(parts)}.jsonl"
