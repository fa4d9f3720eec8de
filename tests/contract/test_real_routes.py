"""Contract: the vLLM server the dflash recipe starts really serves the routes the run uses.

``test_real_parsers.py`` proves vLLM *accepts* the rendered ``vllm serve`` argv. That is not
enough: vLLM 0.33 accepts a command without ``--enable-scale-out`` and starts fine, but then
answers ``POST /v1/chat/completions/render`` with 403 ("Scale-out endpoints are disabled"),
speculators' ``prepare-data`` treats that 403 as final, drops every conversation and exits
"No samples remain". Only the route's behaviour shows the bug, so these tests build vLLM's own
FastAPI app from the parsed argv, on CPU and without loading a model, and send it requests:

* the app ``vllm serve`` builds for the rendered argv (both playbooks, normal and ``--test``)
  routes the render request to the real render handler, and has ``/health`` and
  ``/v1/models`` (the readiness checks);
* the same argv without ``--enable-scale-out`` gets the exact 403, so the check can fail;
* with the rendered flags and a tiny local model in place of the 55 GB one, the app renders
  the very requests speculators sends (``truncate_prompt_tokens`` = prepare's
  ``--seq-length``) into the tokens of the model's chat template, and serves the model id;
* the real render-only server (``vllm launch render``) runs on CPU against that tiny model
  and answers the same requests; its responses are recorded in ``tests/fixtures/vllm-render``
  so stand-ins can be compared with vLLM's real format.

Every asserted behaviour names the vLLM 0.33.0 file:line it comes from. CI has no vLLM (a
multi-GB install) and skips this module; run it from the contract venv (docs/dflash.md,
"Contract with the real tools"). Set ``OUTRIG_RECORD_VLLM_FIXTURES=1`` to re-record the
fixtures after a vLLM upgrade, then review the diff.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

from tests.support.network import free_port
from tests.support.plans import SKIP, cases, rendered

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-render"
RECORD = os.environ.get("OUTRIG_RECORD_VLLM_FIXTURES") == "1"
RENDER = "/v1/chat/completions/render"

# vllm/entrypoints/scale_out/factories.py:101-104 (the text) and :107-111 (403, the type).
SCALE_OUT_403 = {"error": {
    "message": "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out "
               "to enable them.",
    "type": "PermissionDeniedError", "param": None, "code": 403}}

# One two-turn conversation; speculators renders conv[:1] with the generation prompt and
# conv[:2] without it, and takes the loss-mask boundary where the second extends the first
# (speculators data_generation/preprocessing.py::_render_boundary_rows).
CONVERSATION = [
    {"role": "user", "content": "What does the draft model do?"},
    {"role": "assistant", "content": "It proposes tokens that the verifier accepts or rejects."},
]

# A ChatML template, as Qwen3 uses (without its <think> handling).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def speculators_body(messages: list[dict[str, str]], *, add_generation_prompt: bool,
                     truncate: int) -> dict[str, Any]:
    """The JSON speculators 0.9.0 posts (data_generation/render_client.py:74-85, called from
    preprocessing.py::_encode_render with right-side truncation at ``max_length`` =
    prepare's ``--seq-length``). It names no model."""
    return {"messages": messages, "add_generation_prompt": add_generation_prompt,
            "truncate_prompt_tokens": truncate, "truncation_side": "right"}


@pytest.fixture(scope="module")
def serve_parser() -> tuple[Any, Any]:
    """(parser, serve subcommand) exactly as ``vllm.entrypoints.cli.main`` builds them.

    Same construction as ``test_real_parsers.vllm_serve``; see that module for why the
    platform's device type is set to ``cuda`` on a machine without GPUs.
    """
    pytest.importorskip("vllm", reason=SKIP.format("vllm"))
    import vllm.platforms

    if not vllm.platforms.current_platform.device_type:
        vllm.platforms.current_platform.device_type = "cuda"
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
    return parser, command


def parse_serve(serve_parser: tuple[Any, Any], argv: list[str]) -> Namespace:
    """The Namespace ``vllm serve`` runs with, from a full rendered server argv."""
    parser, command = serve_parser
    assert argv[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]
    args = parser.parse_args(argv[3:])
    command.validate(args)
    args.model = args.model_tag  # vllm/entrypoints/cli/serve.py:56-57
    return args


def serve_app(args: Namespace) -> Any:
    """The FastAPI app each ``vllm serve`` API server builds, without an engine.

    ``build_and_serve`` (vllm/entrypoints/launchers/api_server/entry.py:132-136) calls
    ``build_app(args, supported_tasks, model_config)`` with the engine's tasks, which is
    ``("generate",)`` for a text-generation model (vllm/v1/worker/gpu_model_runner.py:
    3124-3132). build_app needs nothing else: route registration reads only ``args``
    (vllm/entrypoints/launchers/app.py:19-56, api_server/routers.py:68-71); ``model_config``
    is used only for SageMaker and pooling routes. With DP=2 (the 8x96 playbook) vLLM starts
    ``--api-server-count`` = 2 API servers (cli/serve.py:113-152), each building this app.
    """
    from vllm.entrypoints.launchers.app import build_app

    return build_app(args, ("generate",))


def request(app: Any, method: str, path: str,
            body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """Send one request to ``app`` in process (no socket, no lifespan); (status, JSON or text).

    Exceptions become responses, as under uvicorn, so a missing engine shows as a 5xx.
    """
    import httpx

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://vllm") as client:
            return await client.request(method, path, json=body)

    response = asyncio.run(send())
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


def routes(app: Any) -> dict[tuple[str, str], str]:
    """{(METHOD, path): endpoint function name} of the app's API routes."""
    from fastapi.routing import APIRoute

    return {(method, route.path): route.endpoint.__name__
            for route in app.routes if isinstance(route, APIRoute)
            for method in route.methods}


@pytest.mark.parametrize(("playbook", "test"), cases())
def test_rendered_server_serves_render_route(serve_parser: tuple[Any, Any], playbook: str,
                                             test: bool) -> None:
    """The rendered argv gives an app whose render route reaches vLLM's render handler."""
    args = parse_serve(serve_parser, rendered(playbook, test=test).processes["server"].argv)
    app = serve_app(args)
    table = routes(app)
    # vllm/entrypoints/scale_out/factories.py:129 includes render/api_router.py's router when
    # enabled; :115-127 would register ``disabled_scale_out`` on the same path instead.
    assert table.get(("POST", RENDER)) == "render_chat_completion", (
        f"{RENDER} is served by {table.get(('POST', RENDER))}, not vLLM's render handler: "
        "prepare-data would get 403 (does the server argv have --enable-scale-out?)")
    # /health: serve/instrumentator/health.py:22; /v1/models: openai/models/api_router.py:20.
    assert table.get(("GET", "/health")) == "health"
    assert table.get(("GET", "/v1/models")) == "show_available_models"
    status, body = request(app, "POST", RENDER, speculators_body(
        CONVERSATION[:1], add_generation_prompt=True, truncate=8192))
    assert status != 403, body
    # No engine, so no ``serving_render`` state: render/api_router.py:42-46 raises
    # NotImplementedError, mapped to 501 (serve/exception_handling/register.py:39). A 501
    # with this text proves the real handler ran, not the scale-out refusal.
    assert (status, body["error"]["message"]) == (
        501, "The model does not support Chat Completions Render API"), body


def test_render_route_is_refused_without_enable_scale_out(
        serve_parser: tuple[Any, Any]) -> None:
    """Without ``--enable-scale-out`` vLLM 0.33 answers the render route with 403.

    This is the bug the recipe must avoid, so it proves the test above can fail.
    """
    argv = rendered("dflash-qwen36").processes["server"].argv
    args = parse_serve(serve_parser, [a for a in argv if a != "--enable-scale-out"])
    assert args.enable_scale_out is False  # entrypoints/common/cli_args.py:216, default off
    app = serve_app(args)
    body = speculators_body(CONVERSATION[:1], add_generation_prompt=True, truncate=8192)
    status, answer = request(app, "POST", RENDER, body)
    # vllm/entrypoints/scale_out/factories.py:98-111: neither "render" among the tasks nor
    # --tokens-only nor --enable-scale-out, so every scale-out route answers this 403.
    assert (status, answer) == (403, SCALE_OUT_403)
    assert routes(app).get(("POST", RENDER)) == "disabled_scale_out"
    check_fixture("scale-out-disabled-403", body, status, answer)
    # The readiness routes are not gated: /health and /v1/models exist either way, which is
    # why a server without the flag looks ready and the failure comes later, in prepare.
    assert ("GET", "/health") in routes(app)
    assert ("GET", "/v1/models") in routes(app)


def write_tiny_model(out: Path, max_position_embeddings: int) -> Path:
    """A Qwen3 model directory with config and tokenizer only: all the render path reads.

    Rendering never loads weights (the render-only server has no engine), so none are
    written. The tokenizer is byte-level BPE (Qwen's kind) trained on a fixed text with the
    ``tokenizers`` library, and the chat template is ChatML; nothing is downloaded.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    text = [turn["content"] for turn in CONVERSATION] * 4 + ["user assistant system"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainer=trainers.BpeTrainer(
        vocab_size=320, special_tokens=special, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    ids = {name: tok.token_to_id(name) for name in special}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "model_max_length": max_position_embeddings}, indent=2))
    (out / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": False, "dtype": "bfloat16",
        "vocab_size": tok.get_vocab_size() + 16, "eos_token_id": ids["<|im_end|>"],
        "bos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"]},
        indent=2))
    return out


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, long enough for the recipe's ``--max-model-len`` (8193)."""
    pytest.importorskip("vllm", reason=SKIP.format("vllm"))
    return write_tiny_model(tmp_path_factory.mktemp("vllm-render") / "model", 32768)


def template_ids(model: Path, messages: list[dict[str, str]], *,
                 add_generation_prompt: bool) -> list[int]:
    """Token ids of the model's own chat template (transformers), what render must return."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                         tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def normalized(answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` without what varies per request or per tokenizer: the random request id
    (token_in_token_out/protocol.py:222-229), the token ids, and ``max_tokens`` (model length
    minus prompt length). The tests check those three against their own rules instead."""
    out = json.loads(json.dumps(answer))
    out["request_id"] = "<request id>"
    out["token_ids"] = "<token ids>"
    out["sampling_params"]["max_tokens"] = "<max_model_len - len(token_ids)>"
    return out


def check_fixture(name: str, body: dict[str, Any], status: int, answer: Any) -> None:
    """Compare (status, answer) to ``body`` with ``tests/fixtures/vllm-render/<name>.json``, or
    write that file under ``OUTRIG_RECORD_VLLM_FIXTURES=1``. The file keeps the exact
    response; for 200 answers the :func:`normalized` fields are left out of the comparison."""
    path = FIXTURES / f"{name}.json"
    sent = {"method": "POST", "path": RENDER, "body": body}
    if RECORD:
        import vllm

        FIXTURES.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"vllm": vllm.__version__, "request": sent, "status": status,
                                    "response": answer}, indent=2) + "\n")
    recorded = json.loads(path.read_text())
    assert recorded["request"] == sent, f"{path} was recorded for another request"
    want, got = recorded["response"], answer
    if status == 200:
        want, got = normalized(want), normalized(got)
    assert (status, got) == (recorded["status"], want), (
        f"vLLM's answer differs from {path}; if vLLM was upgraded on purpose, re-record with "
        "OUTRIG_RECORD_VLLM_FIXTURES=1 and review the diff")


def check_render_answers(post: Any, model: Path, max_model_len: int, seq_length: int, *,
                         records: bool) -> None:
    """Send speculators' requests through ``post(body) -> (status, json)`` and check them.

    The two renders of one assistant turn must return exactly the model template's tokens,
    the first a prefix of the second (the loss-mask boundary speculators derives). A
    truncation above ``max_model_len`` is a 400, which speculators treats as final. Each
    answer is compared with its fixture; while re-recording, only the caller that
    ``records`` (the real render server) writes them and the other skips the comparison.
    """
    compare = records or not RECORD
    for name, messages, generation in (("chat-render-prompt", CONVERSATION[:1], True),
                                       ("chat-render-full", CONVERSATION, False)):
        body = speculators_body(messages, add_generation_prompt=generation, truncate=seq_length)
        status, answer = post(body)
        assert status == 200, f"speculators' render request got {status}: {answer}"
        want = template_ids(model, messages, add_generation_prompt=generation)
        # render/serving.py:148-165 renders with the server's chat template and returns the
        # prompt's token ids; :167-177 and serve/utils/api_utils.py:253 set max_tokens to
        # the room left in the model length.
        assert answer["token_ids"] == want
        assert answer["sampling_params"]["max_tokens"] == max_model_len - len(want)
        if compare:
            check_fixture(name, body, status, answer)
    prompt = template_ids(model, CONVERSATION[:1], add_generation_prompt=True)
    full = template_ids(model, CONVERSATION, add_generation_prompt=False)
    assert full[:len(prompt)] == prompt
    # vllm/renderers/params.py:286-298: truncate_prompt_tokens above the model length is a
    # VLLMValidationError, a 400 (serve/exception_handling/error_response.py:43-46).
    body = speculators_body(CONVERSATION[:1], add_generation_prompt=True,
                            truncate=max_model_len + 1)
    status, answer = post(body)
    assert status == 400 and answer["error"]["param"] == "truncate_prompt_tokens", answer
    if compare:
        check_fixture("truncate-over-max-model-len-400", body, status, answer)


def flag(argv: list[str], name: str) -> int:
    """The integer value of ``name`` in a rendered argv."""
    return int(argv[argv.index(name) + 1])


@pytest.mark.parametrize(("playbook", "test"), cases())
def test_rendered_server_renders_speculators_requests(
        serve_parser: tuple[Any, Any], tiny_model: Path, playbook: str, test: bool) -> None:
    """With the rendered flags, vLLM renders what speculators sends and serves the model id.

    Only the model path is swapped for the tiny model (the real one is 55 GB on the box).
    ``vllm serve`` fills the render state through ``init_app_state``, which needs a running
    engine; the render-only server fills the same ``ServingRender`` from a ``VllmConfig``
    alone (launchers/render/app_state.py:22-126, factories.py:32-55), so that is used here,
    with the config built as ``vllm launch render`` builds it (render/entry.py:79-98).
    """
    from vllm import AsyncEngineArgs
    from vllm.config import VllmConfig
    from vllm.entrypoints.launchers.render.app_state import init_render_app_state

    plan = rendered(playbook, test=test)
    argv = list(plan.processes["server"].argv)
    argv[argv.index("serve") + 1] = str(tiny_model)
    args = parse_serve(serve_parser, argv)
    # speculators truncates renders at max_length = --seq-length (preprocessing.py:897).
    seq_length = flag(plan.processes["prepare"].argv, "--seq-length")

    engine_args = AsyncEngineArgs.from_cli_args(args)
    model_config = engine_args.create_model_config()
    model_config.quantization = None
    config = VllmConfig(model_config=model_config,
                        logging_config=engine_args.create_logging_config(),
                        structured_outputs_config=engine_args.create_structured_outputs_config())
    app = serve_app(args)
    asyncio.run(init_render_app_state(config, app.state, args))

    max_model_len = flag(argv, "--max-model-len")
    assert model_config.max_model_len == max_model_len
    check_render_answers(lambda body: request(app, "POST", RENDER, body), tiny_model,
                         max_model_len, seq_length, records=False)
    # Readiness: no engine means healthy (serve/instrumentator/health.py:26-28); the served
    # id is the model string itself when there is no --served-model-name
    # (render/app_state.py:34-41), which the trainer's --verifier-name-or-path must equal.
    assert request(app, "GET", "/health")[0] == 200
    status, models = request(app, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == [str(tiny_model)]
    assert models["data"][0]["max_model_len"] == max_model_len


def test_render_only_server_runs_on_cpu(procs: Any, tiny_model: Path, tmp_path: Path) -> None:
    """``vllm launch render`` runs on a CPU-only machine against a config+tokenizer directory.

    This is vLLM's real HTTP server (uvicorn, its own process), started as a user would.
    ``VLLM_TARGET_DEVICE=cpu`` selects the CPU platform (vllm/platforms/__init__.py:174-177);
    the render server builds no engine (launchers/render/entry.py:65-98). Its answers are
    the recorded fixtures, and must match what the ``vllm serve`` app gives (test above).
    """
    import httpx

    plan = rendered("dflash-qwen36")
    max_model_len = flag(plan.processes["server"].argv, "--max-model-len")
    seq_length = flag(plan.processes["prepare"].argv, "--seq-length")
    port = free_port()
    log = tmp_path / "render.log"
    with log.open("w") as out:
        proc = procs.spawn(
            [sys.executable, "-m", "vllm.entrypoints.cli.main", "launch", "render",
             str(tiny_model), "--host", "127.0.0.1", "--port", str(port),
             "--max-model-len", str(max_model_len)],
            env={"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"},
            stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    with httpx.Client(base_url=base, timeout=30) as client:
        while True:
            assert proc.poll() is None, f"vllm launch render exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no /health in 240 s:\n{log.read_text()[-3000:]}"
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)

        def post(body: dict[str, Any]) -> tuple[int, Any]:
            response = client.post(RENDER, json=body)
            return response.status_code, response.json()

        check_render_answers(post, tiny_model, max_model_len, seq_length, records=True)
        models = client.get("/v1/models").json()
        assert [m["id"] for m in models["data"]] == [str(tiny_model)]
