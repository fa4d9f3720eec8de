"""Hidden-state vLLM stand-in: ``python -m vllm.entrypoints.cli.main serve MODEL ...`` on a CPU.

Test fixture, not product code. The CPU rehearsal (tests/rehearsal/) runs the *real*
speculators 0.9 ``prepare-data`` and trainer against this server, so what they see on the
wire and on disk must be what vLLM 0.33 gives them. It needs torch + transformers +
safetensors (run it with the rehearsal interpreter, never the CI one) and computes **real**
hidden states from the model directory with transformers. Unlike fake_vllm.py it has no fake
GPUs and no child processes; that is fake_vllm.py's job.

Every behaviour below was traced in the vLLM 0.33.0 wheel (``pip download --no-deps
vllm==0.33.0``) or captured from the real render server on CPU (tests/fixtures/vllm-0.33-cpu/,
README there).

Paths are relative to vllm/ (entrypoints/ omitted for launchers/, scale_out/, serve/,
openai/, common/). EHSC = distributed/kv_transfer/kv_connector/v1/
example_hidden_states_connector.py; EHS = model_executor/models/extract_hidden_states.py.
"golden" = tests/fixtures/vllm-0.33-cpu/.

behaviour reproduced                                vLLM 0.33.0 source
--------------------------------------------------  -----------------------------------------------
--flag_name == --flag-name (underscores in flag     utils/argparse_utils.py:374-380
names)
socket bound before the model loads; a request      launchers/api_server/entry.py:175
sent early waits until the app serves
log line format (APIServer pid=N) INFO MM-DD        logger.py:28-33;
HH:MM:SS [file.py:line] msg                         launchers/api_server/entry.py:166
'Shared storage path is <path>'                     EHSC:183
'Scale-out endpoints are disabled. Restart vllm     scale_out/factories.py:100-105
serve with --enable-scale-out to enable them.'
logged at start
'Starting vLLM server on http://127.0.0.1:P' (the   launchers/api_server/entry.py:139
0.33 wording; older vLLM: 'Starting vLLM API
server 0 on ...')
'Available routes are:', then 'Route: <path>,       launchers/launcher.py:188, :197
Methods: <m>'
uvicorn 'INFO:     Started server process [pid]'    uvicorn; golden render-server-startup.log
... 'Application startup complete.'
GET /health: 200, empty body                        golden (content-length 0)
GET /v1/models: ModelList; id = --served-model-     serve/engine/protocol.py:90-121; golden
name, else MODEL as typed; root = MODEL;            models.json
max_model_len
render and token routes answer 403                  scale_out/factories.py:94-127; error body:
PermissionDeniedError unless --enable-scale-out or  serve/exception_handling/error_response.py
--tokens-only                                       :98-104; golden render_403.json
POST /v1/chat/completions/render: GenerateRequest   scale_out/render/serving.py:117-226;
JSON (request_id chatcmpl-<16 hex>, token_ids,      scale_out/token_in_token_out/protocol.py
sampling_params with max_tokens = max_model_len -   :221-360; serve/utils/api_utils.py:234-270;
prompt, parse_context, ...)                         golden render_gen.json, render_full.json
chat template rendered to text, then encoded        common/cli_args.py:191, :421-428;
without special tokens; template kwargs = defaults  renderers/online_renderer.py:221-232; golden
(cohere_format: cmd4, --default-chat-template-      token ids
kwargs) overlaid by the request's
truncate_prompt_tokens with truncation_side right   renderers/params.py:498-525
keeps the first N tokens (left: the last N)
unknown model: 404 'The model `X` does not exist.   serve/engine/serving.py:75-84;
Valid aliases: <names>.' (paths sanitised to        serve/exception_handling/utils.py:7-15; golden
<path>)                                             render_badmodel.json
prompt longer than --max-model-len: 400 'This       renderers/params.py:536-551;
model's maximum context length is ...'              exceptions.py:49-56 (suffix "(parameter=...,
                                                    value=...)")
truncate_prompt_tokens above --max-model-len: 400   renderers/params.py:286-298;
'truncate_prompt_tokens=N cannot be greater than    openai/chat_completion/protocol.py:699;
max_model_len = M. ...'                             golden ../vllm-render/truncate-over-max-
                                                    model-len-400.json
POST /v1/completions with prompt [ids],             openai/completion/protocol.py:675-722;
return_token_ids: CompletionResponse with           openai/completion/serving.py:636-708
choices[0].prompt_token_ids and token_ids,
finish_reason length, usage, top-level
kv_transfer_params
engine request id cmpl-<16 hex>-0-<8 hex> (an       openai/completion/serving.py:147, :183;
X-Request-Id header replaces the first part)        v1/engine/input_processor.py:354-371;
                                                    utils/__init__.py:11-12
hidden states file <shared_storage_path>/<engine    EHSC:178-180, :496-499
request id>.safetensors (default path /tmp)
lock file <file>.lock, O_CREAT|O_WRONLY|O_TRUNC     EHSC:234-236, :267-287, :329-346, :426-437
0o644, LOCK_EX taken before the response and
released after the write
(use_synchronization_lock, default true)
the file is written by an 8-thread pool             EHSC:216-221, :435-437
(num_writer_threads), possibly after the response
tensors: hidden_states [num_tokens, num_layer_ids,  EHSC:36-45, :415-418, :539-546; EHS:81-90,
hidden] in the model dtype (kv-cache dtype auto);   :244-250, :326-345;
token_ids [num_tokens] int64, the prompt ids        v1/spec_decode/extract_hidden_states.py:129
layer id k = residual stream after decoder layer    model_executor/models/qwen2.py:422-434;
k-1, before the final norm (0 = embeddings, L =     model_executor/models/interfaces.py:1640-1650
last layer un-normed); stacked in ascending layer
order
response kv_transfer_params =                       EHSC:559; openai/completion/serving.py:696-708
{"hidden_states_path": <absolute file>}
a request's own                                     EHSC:225-227, :505-514
kv_transfer_params.hidden_states_path is ignored,
with a warning, unless allow_custom_save_path
unknown route: 404 {"detail":"Not Found"}           FastAPI default; golden
SIGTERM: uvicorn's shutdown lines, exit 0           launchers/api_server/entry.py:168-173; uvicorn

Differences, none of which speculators or outrig relies on: one process (real vLLM spawns
``VLLM::EngineCore``; fake_vllm.py covers the tree); requests are served one forward at a
time, not batched; the one generated token is the greedy argmax (vLLM samples at
temperature 1.0 by default); there are no ``/metrics``, ``/tokenize`` or streaming routes;
multimodal content is not supported.

Standalone: standard library + torch/transformers/safetensors; no outrig import.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fcntl
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

VLLM_VERSION = "0.33.0"
SCALE_OUT_DISABLED = ("Scale-out endpoints are disabled. Restart vllm serve with "
                      "--enable-scale-out to enable them.")
# Routes register_scale_out_api_routers adds either way (403 handlers when disabled).
SCALE_OUT_ROUTES = ["/v1/chat/completions/render", "/v1/messages/render",
                    "/v1/completions/render", "/v1/responses/render",
                    "/v1/chat/completions/derender", "/v1/completions/derender",
                    "/inference/v1/generate"]
MASK_64_BITS = (1 << 64) - 1


def random_uuid() -> str:
    """vllm/utils/__init__.py:11: 16 hex chars."""
    return f"{uuid.uuid4().int & MASK_64_BITS:016x}"


def log(msg: str, where: str, level: str = "INFO") -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"(APIServer pid={os.getpid()}) {level} {stamp} [{where}] {msg}", flush=True)


def uvicorn(msg: str) -> None:
    print(f"INFO:     {msg}", flush=True)


def sanitize_message(message: str) -> str:
    """exception_handling/utils.py:7-15."""
    message = re.sub(r" at 0x[0-9a-fA-F]+>", ">", message)
    message = re.sub(r'\n?\s*File "[^"]+", line \d+, in \S+(\n\s+.*)?', "", message)
    message = re.sub(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+", "<path>",
                     message)
    message = re.sub(r"(?:/[\w\-]+)+/[\w\-]+\.\w+", "<path>", message)
    return message.strip()


def error_body(message: str, err_type: str, code: int,
               param: Optional[str] = None) -> Dict[str, Any]:
    return {"error": {"message": sanitize_message(message), "type": err_type, "param": param,
                      "code": code}}


class HTTPError(Exception):
    def __init__(self, code: int, body: Dict[str, Any]) -> None:
        super().__init__(body)
        self.code = code
        self.body = body


# ----------------------------------------------------------------------------- arguments
def normalize_flags(argv: List[str]) -> List[str]:
    """FlexibleArgumentParser: ``--max_model_len`` means ``--max-model-len``."""
    out = []
    for arg in argv:
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            arg = name.replace("_", "-") + eq + value
        out.append(arg)
    return out


def parse_args(argv: List[str]) -> argparse.Namespace:
    argv = normalize_flags(argv)
    if argv and argv[0] == "serve":
        argv = argv[1:]
    p = argparse.ArgumentParser(prog="vllm serve", allow_abbrev=False)
    p.add_argument("model")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--speculative-config", default=None)
    p.add_argument("--kv-transfer-config", default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--enable-scale-out", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--tokens-only", action="store_true")
    p.add_argument("--chat-template", default=None)
    p.add_argument("--default-chat-template-kwargs", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--trust-remote-code", action="store_true")
    args, unknown = p.parse_known_args(argv)
    args.ignored = unknown  # TP/DP, memory, batching flags: meaningless on one CPU process
    return args


# ----------------------------------------------------------------------------- the model
class Verifier:
    """Tokenizer + model with hooks that read vLLM's aux hidden states.

    On the CPU unless ``HS_VLLM_DEVICE`` names another torch device (``cuda``): the GPU
    memory bench runs a Qwen3.6-wide verifier whose 8k-token forward takes minutes on a CPU.
    Only the last position's logits are computed (the greedy next token is all that is used).
    """

    def __init__(self, path: str, layer_ids: List[int], dtype: str, chat_template: Optional[str],
                 trust_remote_code: bool) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        if chat_template:  # --chat-template: a file or the template itself
            if os.path.isfile(chat_template):
                with open(chat_template) as f:
                    chat_template = f.read()
            self.tokenizer.chat_template = chat_template
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        text = getattr(config, "text_config", None) or config
        self.num_layers = int(text.num_hidden_layers)
        self.hidden_size = int(text.hidden_size)
        self.max_position = int(getattr(text, "max_position_embeddings", 0) or 0)
        torch_dtype = (getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
                       if dtype == "auto" else getattr(torch, dtype))
        if isinstance(torch_dtype, str):
            torch_dtype = getattr(torch, torch_dtype)
        self.dtype = torch_dtype or torch.float32
        self.device = os.environ.get("HS_VLLM_DEVICE") or "cpu"
        self.model = AutoModelForCausalLM.from_pretrained(
            path, dtype=self.dtype, trust_remote_code=trust_remote_code).eval().to(self.device)
        bad = [i for i in layer_ids if not 0 <= i <= self.num_layers]
        if bad:  # the stand-in's own refusal; real vLLM's failure mode here was not traced
            raise ValueError(f"eagle_aux_hidden_state_layer_ids {bad} outside "
                             f"[0, {self.num_layers}]")
        # vLLM collects aux states while walking the layers, so they come out ascending.
        self.layer_ids = sorted(set(layer_ids))
        self.lock = threading.Lock()
        self._captured: Dict[int, Any] = {}
        inner = self.model.model
        inner.embed_tokens.register_forward_hook(self._hook(0))
        for index, layer in enumerate(inner.layers):
            layer.register_forward_hook(self._hook(index + 1))

    def _hook(self, layer_id: int) -> Any:
        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            if layer_id in self.layer_ids:
                tensor = output[0] if isinstance(output, tuple) else output
                self._captured[layer_id] = tensor.detach()
        return hook

    def forward(self, token_ids: List[int]) -> Tuple[Any, int]:
        """(hidden_states [T, len(layer_ids), H] in the model dtype, greedy next token)."""
        torch = self.torch
        with self.lock, torch.no_grad():
            self._captured = {}
            ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
            out = self.model(input_ids=ids, use_cache=False, logits_to_keep=1)
            states = torch.stack([self._captured[i][0] for i in self.layer_ids], dim=1)
            next_token = int(out.logits[0, -1].float().argmax())
        return states.to(self.dtype).cpu().contiguous(), next_token

    def render(self, messages: List[Dict[str, Any]], kwargs: Dict[str, Any],
               tools: Any) -> List[int]:
        text = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                  **kwargs)
        ids: List[int] = self.tokenizer.encode(text, add_special_tokens=False)
        return ids


# ----------------------------------------------------------------------------- the connector
class HiddenStatesWriter:
    """ExampleHiddenStatesConnector's file side: path, lock, async write."""

    def __init__(self, kv_config: Dict[str, Any]) -> None:
        extra = kv_config.get("kv_connector_extra_config") or {}
        self.storage = str(extra.get("shared_storage_path", "/tmp"))
        self.allow_custom = bool(extra.get("allow_custom_save_path", False))
        self.use_lock = bool(extra.get("use_synchronization_lock", True))
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=int(extra.get("num_writer_threads", 8)),
            thread_name_prefix="vllm-hs-save")

    def filename(self, req_id: str, params: Dict[str, Any]) -> str:
        custom = params.get("hidden_states_path")
        if custom is not None and not self.allow_custom:
            log(f"Request {req_id} provided hidden_states_path but allow_custom_save_path is "
                "disabled. Ignoring custom path and using default.",
                "example_hidden_states_connector.py:507", "WARNING")
            custom = None
        return str(custom or os.path.join(self.storage, f"{req_id}.safetensors"))

    def save(self, filename: str, hidden_states: Any, token_ids: List[int]) -> None:
        import torch
        from safetensors.torch import save_file

        lock_fd: Optional[int] = None
        os.makedirs(os.path.dirname(filename), exist_ok=True)
        if self.use_lock:  # wait_for_save: the lock exists before the client has the path
            lock_fd = os.open(filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        tensors = {"hidden_states": hidden_states,
                   "token_ids": torch.tensor(token_ids)}

        def write() -> None:
            try:
                save_file(tensors, filename)
            finally:
                if lock_fd is not None:
                    os.close(lock_fd)  # releases LOCK_EX

        future = self.pool.submit(write)
        future.add_done_callback(self._report)

    @staticmethod
    def _report(future: concurrent.futures.Future[None]) -> None:
        exc = future.exception()
        if exc is not None:
            log(f"Hidden-states write failed: {exc!r}", "example_hidden_states_connector.py:297",
                "ERROR")


# ----------------------------------------------------------------------------- the server
class App:
    def __init__(self, args: argparse.Namespace, verifier: Verifier,
                 writer: HiddenStatesWriter) -> None:
        self.args = args
        self.verifier = verifier
        self.writer = writer
        self.served = list(args.served_model_name or [args.model])
        self.max_model_len = int(args.max_model_len or verifier.max_position or 2048)
        self.scale_out = bool(args.enable_scale_out or args.tokens_only)
        # cli_args.py:421-428 resolve_default_chat_template_kwargs
        self.default_kwargs: Dict[str, Any] = dict(
            json.loads(args.default_chat_template_kwargs or "{}"))
        self.default_kwargs.setdefault("cohere_format", "cmd4")

    # -- helpers
    def check_model(self, model: Optional[str]) -> None:
        if model and model not in self.served:
            raise HTTPError(404, error_body(
                f"The model `{model}` does not exist. Valid aliases: {', '.join(self.served)}.",
                "NotFoundError", 404, "model"))

    @staticmethod
    def validation_error(message: str, param: str, value: Any) -> HTTPError:
        """VLLMValidationError (vllm/exceptions.py:49-56): message + (parameter=, value=)."""
        return HTTPError(400, error_body(f"{message} (parameter={param}, value={value})",
                                         "BadRequestError", 400, param))

    def check_length(self, n: int) -> None:
        if n > self.max_model_len:
            raise self.validation_error(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your prompt contains {n} input tokens, which exceeds this limit even without "
                "any output tokens. Please reduce the length of the input prompt.",
                "input_tokens", n)

    def check_truncation(self, limit: Optional[int]) -> None:
        if limit is not None and limit > self.max_model_len:
            raise self.validation_error(
                f"truncate_prompt_tokens={limit} cannot be greater than max_model_len = "
                f"{self.max_model_len}. Please request a smaller truncation size.",
                "truncate_prompt_tokens", limit)

    @staticmethod
    def truncate(ids: List[int], limit: Optional[int], side: Optional[str]) -> List[int]:
        if limit is None or limit < 0 or limit >= len(ids):
            return ids
        if limit == 0:
            return []
        return ids[-limit:] if side == "left" else ids[:limit]

    # -- routes
    def models(self) -> Dict[str, Any]:
        now = int(time.time())
        cards = [{"id": name, "object": "model", "created": now, "owned_by": "vllm",
                  "root": self.args.model, "parent": None, "max_model_len": self.max_model_len,
                  "permission": [{"id": f"modelperm-{random_uuid()}",
                                  "object": "model_permission", "created": now,
                                  "allow_create_engine": False, "allow_sampling": True,
                                  "allow_logprobs": True, "allow_search_indices": False,
                                  "allow_view": True, "allow_fine_tuning": False,
                                  "organization": "*", "group": None, "is_blocking": False}]}
                 for name in self.served]
        return {"object": "list", "data": cards}

    def render_chat(self, body: Dict[str, Any], request_id: Optional[str]) -> Dict[str, Any]:
        self.check_model(body.get("model"))
        add_gen = bool(body.get("add_generation_prompt", True))
        cont = bool(body.get("continue_final_message", False))
        kwargs = {**self.default_kwargs, **(body.get("chat_template_kwargs") or {}),
                  "add_generation_prompt": add_gen, "continue_final_message": cont}
        ids = self.verifier.render(body.get("messages") or [], kwargs, body.get("tools"))
        limit = body.get("truncate_prompt_tokens")
        self.check_truncation(limit)
        ids = self.truncate(ids, limit, body.get("truncation_side"))
        if not ids:
            raise HTTPError(400, error_body("No token_ids rendered", "BadRequestError", 400))
        self.check_length(len(ids))
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        room = self.max_model_len - len(ids)
        max_tokens = room if max_tokens is None else min(room, int(max_tokens))
        return {
            "request_id": f"chatcmpl-{request_id or random_uuid()}",
            "token_ids": ids, "token_offsets": None, "features": None, "content_parts": None,
            "sampling_params": {
                "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
                "temperature": 1.0, "top_p": 1.0, "min_p": 0.0, "stop": [],
                "stop_token_ids": [], "max_tokens": max_tokens, "output_kind": 2,
                "skip_clone": True, "bad_words": [], "skip_reading_prefix_cache": False},
            "model": body.get("model"), "reasoning_ended": None,
            "reasoning_parser_kwargs": None, "return_token_ids": body.get("return_token_ids"),
            "output_mode": "tokens",
            "parse_context": {"tools": body.get("tools"),
                              "tool_choice": body.get("tool_choice") or "none",
                              "parallel_tool_calls": True, "include_reasoning": True,
                              "chat_template_kwargs": kwargs, "history_tool_call_cnt": 0},
            "stream": bool(body.get("stream", False)), "stream_options": None,
            "cache_salt": body.get("cache_salt"), "priority": int(body.get("priority", 0)),
            "kv_transfer_params": body.get("kv_transfer_params"), "ec_transfer_params": None,
        }

    def completions(self, body: Dict[str, Any], request_id: Optional[str]) -> Dict[str, Any]:
        self.check_model(body.get("model"))
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompts = [self.verifier.tokenizer.encode(prompt)]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompts = [list(prompt)]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            prompts = [list(p) for p in prompt]
        else:
            raise HTTPError(400, error_body("prompt must be a string or token ids",
                                            "BadRequestError", 400, "prompt"))
        base = f"cmpl-{request_id or random_uuid()}"
        params = body.get("kv_transfer_params") or {}
        return_ids = bool(body.get("return_token_ids"))
        choices, kv_params, n_prompt, n_gen = [], None, 0, 0
        for i, ids in enumerate(prompts):
            self.check_length(len(ids))
            engine_id = f"{base}-{i}-{random_uuid()[:8]}"  # input_processor.assign_request_id
            filename = self.writer.filename(engine_id, params)
            states, token = self.verifier.forward(ids)
            self.writer.save(filename, states, ids)
            if kv_params is None:
                kv_params = {"hidden_states_path": filename}
            choices.append({
                "index": i, "text": self.verifier.tokenizer.decode([token]), "logprobs": None,
                "finish_reason": "length", "stop_reason": None,
                "token_ids": [token] if return_ids else None, "prompt_logprobs": None,
                "prompt_token_ids": ids if return_ids else None, "routed_experts": None,
                "weight_versions": None})
            n_prompt += len(ids)
            n_gen += 1
        return {"id": base, "object": "text_completion", "created": int(time.time()),
                "model": body.get("model") or self.served[0], "choices": choices,
                "service_tier": None, "system_fingerprint": None,
                "usage": {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n_gen,
                          "completion_tokens": n_gen, "prompt_tokens_details": None,
                          "completion_tokens_details": None},
                "kv_transfer_params": kv_params, "ec_transfer_params": None, "metrics": None}


def make_handler(app: App) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "uvicorn"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # uvicorn's access line
            pass

        def _send(self, code: int, body: Any) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            try:
                self.send_response(code)
                if body is not None:
                    self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except ConnectionError:
                # The client gave up (e.g. a readiness probe that connected while the model
                # was loading and timed out). uvicorn drops such a response without a
                # traceback; a printed one would trip outrig's "Traceback" fatal pattern.
                self.close_connection = True
                return
            phrase = self.responses.get(code, ("",))[0]
            host, port = self.client_address[:2]
            uvicorn(f'{host}:{port} - "{self.command} {self.path} HTTP/1.1" {code} {phrase}')

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, None)
            elif self.path == "/v1/models":
                self._send(200, app.models())
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            request_id = self.headers.get("X-Request-Id")
            try:
                if self.path in SCALE_OUT_ROUTES and not app.scale_out:
                    raise HTTPError(403, error_body(SCALE_OUT_DISABLED, "PermissionDeniedError",
                                                    403))
                body = json.loads(raw or b"{}")
                if self.path == "/v1/chat/completions/render":
                    self._send(200, app.render_chat(body, request_id))
                elif self.path == "/v1/completions":
                    self._send(200, app.completions(body, request_id))
                else:
                    self._send(404, {"detail": "Not Found"})
            except HTTPError as exc:
                self._send(exc.code, exc.body)
            except Exception as exc:  # vLLM maps unexpected errors to a 500 ErrorResponse
                self._send(500, error_body(str(exc), "InternalServerError", 500))

    return Handler


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    spec = json.loads(args.speculative_config) if args.speculative_config else {}
    kv = json.loads(args.kv_transfer_config) if args.kv_transfer_config else {}
    if spec.get("method") != "extract_hidden_states" or \
            kv.get("kv_connector") != "ExampleHiddenStatesConnector":
        print("hs_vllm.py serves hidden states only: pass --speculative_config with method "
              "extract_hidden_states and --kv_transfer_config with ExampleHiddenStatesConnector",
              file=sys.stderr, flush=True)
        return 2
    layer_ids = list(spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"])
    host = args.host or "0.0.0.0"
    # Bound before the model loads, as vLLM's setup_server: a client that connects early
    # waits instead of being refused.
    server = ThreadingHTTPServer((host, args.port), BaseHTTPRequestHandler,
                                 bind_and_activate=True)
    server.daemon_threads = True
    default_handle_error = server.handle_error

    def handle_error(request: Any, address: Any) -> None:
        """A client that went away is uvicorn's silent case; anything else is a stand-in bug
        and keeps its traceback (which outrig's fatal pattern then reports)."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            default_handle_error(request, address)

    server.handle_error = handle_error  # type: ignore[method-assign]
    log(f"non-default args: {{'model_tag': {args.model!r}, 'host': {host!r}, "
        f"'port': {args.port}}}", "startup.py:96")
    if args.ignored:
        log(f"stand-in ignores: {' '.join(args.ignored)}", "hs_vllm.py")
    writer = HiddenStatesWriter(kv)
    log(json.dumps(kv), "example_hidden_states_connector.py:182")
    log(f"Shared storage path is {writer.storage}", "example_hidden_states_connector.py:183")
    verifier = Verifier(args.model, layer_ids, args.dtype, args.chat_template,
                        args.trust_remote_code)
    app = App(args, verifier, writer)
    log(f"Using max model len {app.max_model_len}", "model.py:2170")
    if not app.scale_out:
        log(SCALE_OUT_DISABLED, "factories.py:105")
    log("Supported tasks: ('generate',)", "entry.py:135")
    log(f"Starting vLLM server on http://{host}:{args.port}", "entry.py:139")
    log("Available routes are:", "launcher.py:188")
    routes = [("/health", "GET"), ("/v1/models", "GET"), ("/v1/completions", "POST"),
              *[(path, "POST") for path in SCALE_OUT_ROUTES]]
    for path, method in routes:
        log(f"Route: {path}, Methods: {method}", "launcher.py:197")
    server.RequestHandlerClass = make_handler(app)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    uvicorn(f"Started server process [{os.getpid()}]")
    uvicorn("Waiting for application startup.")
    thread = threading.Thread(target=server.serve_forever, name="uvicorn", daemon=True)
    thread.start()
    uvicorn("Application startup complete.")
    while not stop.wait(0.5):
        pass
    uvicorn("Shutting down")
    server.shutdown()
    server.server_close()
    uvicorn("Waiting for application shutdown.")
    writer.pool.shutdown(wait=True)
    uvicorn("Application shutdown complete.")
    uvicorn(f"Finished server process [{os.getpid()}]")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except OSError as exc:  # e.g. port in use: vLLM fails the same way, exit 1
        print(f"OSError: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
