"""The ``bench`` op: send an evaluation's prompts to a server on the box and read its counters.

The server listens on 127.0.0.1 of the box, so the requests go from here, not from the
workstation: no tunnel, and the timing is the server's, not the link's. One call reads
``/metrics``, sends the prompts (``/v1/completions`` for ``{"prompt": ...}``,
``/v1/chat/completions`` for ``{"messages": [...]}``; ``concurrency`` threads), then reads
``/metrics`` again until two reads ``settle`` seconds apart agree: vLLM updates its Prometheus
counters from the output loop, which may run just after an answer went out. It returns the
``vllm:spec_decode`` lines of both reads (the workstation parses them), the completion tokens
(``usage.completion_tokens``), the wall time and the errors, and one record per request
(``per_request``): its prompt's ``category``, its tokens, the time to the first streamed
token, each gap between streamed chunks (what ``vllm bench serve`` calls ITL), its latency,
and vLLM's per-request ``metrics.speculative_decoding`` when the server was started with
``--per-request-spec-decode-metrics`` (vLLM puts it on the final usage chunk of a stream, so
every request is streamed with ``stream_options.include_usage``).

With ``check_only`` it only reads the prompts (a file on the box, or the last conversations of
training files) and says how many there are, so a missing or malformed file is refused before
any server is started. The JSONL rules are shared with the workstation, which checks a local
prompts file with :func:`parse_prompt_lines` before sending its lines in the request.
Stdlib only, Python 3.8.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, List, Optional, Tuple

from .constants import JSONDict
from .events import AgentError, Emitter, bad_request
from .protocol import EXITED, NOT_FOUND
from .validation import Request, get_bool, get_num, get_str
from .vllm_datasets import load_dataset

METRIC_PREFIX = "vllm:spec_decode"
MAX_ERRORS_KEPT = 5
SETTLE_READS = 10  # /metrics reads after the last answer, at most, until two agree
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "system": "system", "model": "assistant", "chatgpt": "assistant"}


def _message(turn: Any) -> Optional[JSONDict]:
    """A ``{role, content}`` chat message from one turn (``role``/``content`` or ShareGPT's
    ``from``/``value``), or None when the turn has neither."""
    if not isinstance(turn, dict):
        return None
    role = turn.get("role", turn.get("from"))
    content = turn.get("content", turn.get("value"))
    if not isinstance(role, str) or not isinstance(content, str):
        return None
    role = ROLES.get(role.lower(), role)
    return {"role": role, "content": content}


def check_item(obj: Any) -> Optional[str]:
    """Why one prompts line cannot be sent, or None when it can."""
    if not isinstance(obj, dict):
        return "not a JSON object"
    if isinstance(obj.get("prompt"), str):
        return None if obj["prompt"] else "\"prompt\" is empty"
    messages = obj.get("messages")
    if isinstance(messages, list) and messages:
        for i, turn in enumerate(messages):
            if _message(turn) is None:
                return f"messages[{i}] has no role and content"
        return None
    return "has neither \"prompt\" (a string) nor \"messages\" (a list of {role, content})"


def parse_prompt_lines(text: str, where: str) -> Tuple[List[JSONDict], List[str]]:
    """The prompts of a JSONL text and the problems of its lines (each naming ``where`` and
    the line). Blank lines are skipped."""
    items: List[JSONDict] = []
    problems: List[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            problems.append(f"{where}:{number}: not JSON ({exc})")
            continue
        why = check_item(obj)
        if why:
            problems.append(f"{where}:{number}: {why}")
        else:
            item: JSONDict = ({"prompt": obj["prompt"]} if isinstance(obj.get("prompt"), str)
                              else {"messages": [_message(t) for t in obj["messages"]]})
            category = obj.get("category")
            if isinstance(category, str) and category:
                item["category"] = category
            elif category is not None:
                problems.append(f"{where}:{number}: \"category\" must be a non-empty string")
                continue
            items.append(item)
    return items, problems


def prompts_digest(prompts: List[JSONDict]) -> str:
    """sha256 of the prompts as sent (canonical JSON, category included): the prompt set's
    identity in an evaluation's provenance and in the cached baseline's key."""
    import hashlib

    text = json.dumps(prompts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def conversation_prompt(record: Any) -> Optional[JSONDict]:
    """A training conversation as an evaluation prompt: its messages up to its last user turn
    (what the model is asked to answer), or None when it has no user turn."""
    if not isinstance(record, dict):
        return None
    turns = record.get("conversations", record.get("messages"))
    if not isinstance(turns, list):
        return None
    messages = [m for m in (_message(t) for t in turns) if m is not None]
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    if last_user < 0:
        return None
    return {"messages": messages[: last_user + 1]}


def _training_files(path: str) -> List[str]:
    if os.path.isdir(path):
        return sorted(os.path.join(path, n) for n in os.listdir(path)
                      if n.endswith((".jsonl", ".json")))
    return [path]


def read_conversations(paths: List[str], count: int) -> List[JSONDict]:
    """The last ``count`` usable conversations of the training files, in file order."""
    records: List[Any] = []
    for raw in paths:
        for path in _training_files(raw):
            try:
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
            except OSError as exc:
                raise AgentError(NOT_FOUND, f"training conversations {path}: {exc.strerror}; "
                                 "set evaluate.prompts to a prompts file instead") from None
            if path.endswith(".json") and text.lstrip().startswith("["):
                try:
                    records.extend(json.loads(text))
                except ValueError:
                    raise bad_request(f"{path}: not a JSON list of conversations") from None
                continue
            for line in text.splitlines():
                try:
                    records.append(json.loads(line) if line.strip() else None)
                except ValueError:
                    records.append(None)
    prompts = [p for p in (conversation_prompt(r) for r in records) if p is not None]
    if not prompts:
        raise bad_request(f"no conversation with a user turn in {', '.join(paths)}; set "
                          "evaluate.prompts to a prompts file")
    return prompts[-count:]


def load_prompts(req: Request, count: int) -> List[JSONDict]:
    """The prompts of the request: inline, a file on the box, or training conversations."""
    raw = req.raw
    inline = raw.get("prompts")
    if isinstance(inline, list):
        return inline[:count]
    path = raw.get("prompts_path")
    dataset = raw.get("dataset")
    if isinstance(dataset, dict):  # vLLM's own set, which op_bench wrote to a file first
        path = str(dataset.get("out"))
    if isinstance(path, str) and path:
        full = os.path.join(req.workdir, os.path.expanduser(path))
        try:
            with open(full, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise AgentError(NOT_FOUND, f"prompts file {full} on the box: {exc.strerror}; "
                             "put it there (outrig stage, or files: in the playbook) or fix "
                             "evaluate.prompts") from None
        items, problems = parse_prompt_lines(text, full)
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            raise bad_request(f"prompts file {full} is not JSONL of prompts: "
                              f"{'; '.join(problems[:3])}{more}. Each line must be "
                              "{\"prompt\": \"...\"} or {\"messages\": [...]}")
        if not items:
            raise bad_request(f"prompts file {full} holds no prompt")
        return items[:count]
    conversations = raw.get("conversations")
    if isinstance(conversations, list) and conversations:
        return read_conversations([str(p) for p in conversations], count)
    raise bad_request("prompts, prompts_path or conversations: give one")


def _http(url: str, body: Optional[JSONDict], timeout: float) -> Tuple[int, str]:
    """(status, body text) of a GET (``body`` None) or a JSON POST; status 0 when the server
    could not be reached."""
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    data = None if body is None else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(url, data=data, headers={"Content-Type":
                                                              "application/json"})
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (OSError, ValueError) as exc:
        return 0, str(exc)


def read_metrics(base_url: str) -> str:
    """The ``vllm:spec_decode`` lines of ``/metrics`` (their HELP and TYPE lines too)."""
    status, text = _http(base_url + "/metrics", None, 30.0)
    if status != 200:
        raise AgentError(EXITED, f"{base_url}/metrics answered {status or 'nothing'}: "
                         f"{text[:200]}")
    return "\n".join(line for line in text.splitlines() if METRIC_PREFIX in line) + "\n"


def _stream(url: str, body: JSONDict, timeout: float) -> Tuple[int, str, JSONDict]:
    """POST a streaming request; (status, error text, what was measured). Measured: the
    seconds from sending to the first chunk that carries text (``ttft``), the gaps between
    such chunks (``itl``), the total (``latency``), and the last ``usage`` and ``metrics``
    seen (vLLM sends both on the final chunk when ``include_usage`` is set)."""
    import http.client
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"),
                                     headers={"Content-Type": "application/json"})
    got: JSONDict = {"ttft": None, "itl": [], "usage": None, "metrics": None}
    started = time.monotonic()
    last = None
    try:
        with opener.open(request, timeout=timeout) as response:
            for raw in response:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    continue
                if isinstance(chunk.get("error"), dict):
                    return 500, json.dumps(chunk)[:300], got
                if chunk.get("usage"):
                    got["usage"] = chunk["usage"]
                if chunk.get("metrics"):
                    got["metrics"] = chunk["metrics"]
                if _has_text(chunk):
                    now = time.monotonic()
                    if last is None:
                        got["ttft"] = now - started
                    else:
                        got["itl"].append(now - last)
                    last = now
            got["latency"] = time.monotonic() - started
            return response.status, "", got
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace"), got
    except (OSError, ValueError, http.client.HTTPException) as exc:
        # a server that died mid-answer: IncompleteRead is an HTTPException, not an OSError
        return 0, f"{type(exc).__name__}: {exc}", got


def _has_text(chunk: JSONDict) -> bool:
    """A chunk that carries generated text (a completion's ``text``, a chat ``delta``)."""
    for choice in chunk.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if choice.get("text") or (isinstance(delta, dict) and (
                delta.get("content") or delta.get("reasoning_content")
                or delta.get("reasoning"))):
            return True
    return False


def _ms(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else round(seconds * 1000.0, 3)


class Sender:
    """The requests of one bench, sent by ``concurrency`` threads; counts, errors and one
    record per answered request."""

    def __init__(self, base_url: str, model: str, prompts: List[JSONDict], max_tokens: int,
                 temperature: float, timeout: float,
                 chat_kwargs: Optional[JSONDict] = None) -> None:
        self.base_url, self.model, self.prompts = base_url, model, prompts
        self.max_tokens, self.temperature, self.timeout = max_tokens, temperature, timeout
        self.chat_kwargs = chat_kwargs
        self.lock = threading.Lock()
        self.next = 0
        self.done = 0
        self.tokens = 0
        self.failed = 0
        self.errors: List[str] = []
        self.records: List[JSONDict] = []
        self.finished = 0.0  # time.monotonic() of the last answer

    def one(self, item: JSONDict) -> None:
        body: JSONDict = {"model": self.model, "max_tokens": self.max_tokens,
                          "temperature": self.temperature, "stream": True,
                          "stream_options": {"include_usage": True}}
        if "prompt" in item:
            route = "/v1/completions"
            body["prompt"] = item["prompt"]
        else:
            route = "/v1/chat/completions"
            body["messages"] = item["messages"]
            if self.chat_kwargs:
                body["chat_template_kwargs"] = self.chat_kwargs
        status, text, got = _stream(self.base_url + route, body, self.timeout)
        tokens, error = None, None
        if status == 200:
            try:
                tokens = int(got["usage"]["completion_tokens"])
            except (KeyError, TypeError, ValueError):
                error = f"{route}: a stream without usage.completion_tokens"
        else:
            error = f"{route} answered {status or 'nothing'}: {text[:300]}"
        record: JSONDict = {}
        if tokens is not None:
            metrics = got.get("metrics")
            if not isinstance(metrics, dict):
                metrics = {}
            record = {"category": item.get("category"), "tokens": tokens,
                      "ttft_ms": _ms(got.get("ttft")), "latency_ms": _ms(got.get("latency")),
                      "itl_ms": [_ms(g) for g in got["itl"]],
                      "spec": metrics.get("speculative_decoding")}
        with self.lock:
            self.done += 1
            self.finished = time.monotonic()
            if tokens is not None:
                self.tokens += tokens
                self.records.append(record)
            else:
                self.failed += 1
                if len(self.errors) < MAX_ERRORS_KEPT:
                    self.errors.append(str(error))

    def work(self) -> None:
        while True:
            with self.lock:
                if self.next >= len(self.prompts):
                    return
                item = self.prompts[self.next]
                self.next += 1
            self.one(item)


def settled_metrics(base_url: str, settle: float) -> Tuple[str, int]:
    """``/metrics`` once two reads ``settle`` seconds apart agree (at most
    :data:`SETTLE_READS` reads), and how many reads it took."""
    last = read_metrics(base_url)
    for reads in range(2, SETTLE_READS + 1):
        time.sleep(settle)
        now = read_metrics(base_url)
        if now == last:
            return now, reads
        last = now
    return last, SETTLE_READS


def run_bench(out: Emitter, sender: Sender, concurrency: int, interval: float) -> float:
    """Send every prompt; a progress event every ``interval`` seconds; the wall time from
    the first request to the last answer."""
    threads = [threading.Thread(target=sender.work, daemon=True)
               for _ in range(min(concurrency, len(sender.prompts)))]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    report_at = started + interval
    while True:
        alive = [t for t in threads if t.is_alive()]
        if not alive:
            break
        alive[0].join(0.2)
        if time.monotonic() >= report_at:
            report_at += interval
            out.emit("bench_progress", done=sender.done, total=len(sender.prompts),
                     tokens=sender.tokens, failed=sender.failed,
                     elapsed=round(time.monotonic() - started, 1))
    return max(sender.finished, started) - started


def op_bench(req: Request, out: Emitter) -> JSONDict:
    """See the module docstring."""
    raw = req.raw
    count = int(get_num(raw, "requests", "", 32, positive=True))
    dataset = raw.get("dataset")
    loaded = load_dataset(dataset, req.workdir, out) if isinstance(dataset, dict) else None
    prompts = load_prompts(req, count)
    kinds = sorted({"messages" if "messages" in p else "prompt" for p in prompts})
    if get_bool(raw, "check_only", "", False):
        return {"prompts": len(prompts), "kinds": kinds,
                "prompts_sha256": prompts_digest(prompts), "dataset": loaded}
    base_url = get_str(raw, "base_url", "").rstrip("/")
    model = get_str(raw, "model", "")
    sender = Sender(base_url, model, prompts, int(get_num(raw, "max_tokens", "", 64, True)),
                    get_num(raw, "temperature", "", 0.0),
                    get_num(raw, "timeout", "", 600.0, positive=True),
                    raw.get("chat_template_kwargs") if isinstance(
                        raw.get("chat_template_kwargs"), dict) else None)
    out.step(f"sending {len(prompts)} request(s), {int(get_num(raw, 'concurrency', '', 4))} "
             f"at a time, to {base_url}")
    before = read_metrics(base_url)
    wall = run_bench(out, sender, int(get_num(raw, "concurrency", "", 4, positive=True)),
                     get_num(raw, "progress_interval", "", 2.0, positive=True))
    try:
        after, reads = settled_metrics(base_url, get_num(raw, "settle", "", 2.0))
    except AgentError:
        if not sender.failed:
            raise
        after, reads = "", 0  # the server died under the requests: their errors say why
    return {"prompts": len(prompts), "kinds": kinds, "sent": sender.done,
            "failed": sender.failed, "errors": sender.errors,
            "completion_tokens": sender.tokens, "seconds": round(wall, 3),
            "metrics_before": before, "metrics_after": after, "metric_reads": reads,
            "per_request": sender.records}


