"""``evaluate.dataset`` / ``--dataset``: the setting parsed and refused with its key, the
settings it makes, and the bench op's fields (the loader on the box gets the set, the server's
interpreter and the file to write; the sends read that file)."""

from __future__ import annotations

from outrig.evaluation.datasets import Dataset, box_file, parse_dataset
from outrig.evaluation.section import EvaluateSpec
from outrig.evaluation.spec import bench_fields, settings_for

KEYS = ("--dataset", "--dataset-path", "evaluate.dataset_subset")


def test_the_names_categories_paths_and_subsets() -> None:
    ds, problems = parse_dataset("speed_bench:coding", "/d/speed", None, KEYS)
    assert problems == [] and ds == Dataset("speed_bench", "coding", "/d/speed", "qualitative")
    assert box_file(ds) == "evaluations/datasets/speed_bench-qualitative-coding.jsonl"
    ds, _ = parse_dataset("spec_bench", "q.jsonl", None, KEYS)
    assert ds is not None and ds.category is None and ds.text == "spec_bench"
    assert box_file(ds) == "evaluations/datasets/spec_bench-all.jsonl"
    ds, _ = parse_dataset("speed_bench", "/d", "throughput_8k", KEYS)
    assert ds is not None and ds.subset == "throughput_8k"
    for text, path, subset, needle in (
            ("mt_bench", "/p", None, "--dataset 'mt_bench': give spec_bench or speed_bench"),
            ("spec_bench:", "/p", None, "give spec_bench or speed_bench"),
            ("spec_bench", None, None, "--dataset-path: spec_bench needs its files on the box"),
            ("speed_bench", None, None, "NeMo-Skills' speed-bench prepare.py"),
            ("spec_bench", "/p", "qualitative", "only speed_bench has subsets"),
            ("speed_bench", "/p", "throughput_4k", "give one of qualitative, throughput_1k")):
        ds, problems = parse_dataset(text, path, subset, KEYS)
        assert ds is None and any(needle in p for p in problems), (text, problems)


def test_the_settings_and_the_bench_fields() -> None:
    spec = EvaluateSpec.model_validate({
        "model": "/m", "speculative": {"method": "ngram"}, "dataset": "spec_bench:qa",
        "dataset_path": "data/question.jsonl", "server": {"python": "/v/bin/python"}})
    settings, problems = settings_for(spec, None, {}, "p.yaml")
    assert problems == [] and settings is not None
    assert settings.prompts.kind == "dataset"
    assert settings.prompts.paths == ("evaluations/datasets/spec_bench-qa.jsonl",)
    check = bench_fields(settings, None, check_only=True)
    assert check["dataset"] == {"name": "spec_bench", "category": "qa",
                                "path": "data/question.jsonl", "subset": "qualitative",
                                "python": "/v/bin/python",
                                "out": "evaluations/datasets/spec_bench-qa.jsonl"}
    assert "prompts_path" not in check
    send = bench_fields(settings, None, concurrency=2)
    assert send["prompts_path"] == "evaluations/datasets/spec_bench-qa.jsonl"
    assert "dataset" not in send

    both = EvaluateSpec.model_validate({"model": "/m", "speculative": {"method": "ngram"},
                                        "dataset": "spec_bench", "prompts": "smoke"})
    settings, problems = settings_for(both, None, {}, "p.yaml")
    assert settings is None
    assert "p.yaml: evaluate.prompts and evaluate.dataset: give one" in problems
    assert any("p.yaml: evaluate.dataset_path: spec_bench needs" in p for p in problems)
