"""Ask a running vLLM for one prompt's hidden states and compare them with the stand-in's.

Run with the rehearsal interpreter (speculators 0.9 + torch + transformers), while a server
started with the ``extract_hidden_states`` speculative config and ExampleHiddenStatesConnector
listens::

    python tests/rehearsal/hidden_states_probe.py http://127.0.0.1:P MODEL '[1, 2, 3, 4]' TEXT

It sends what the speculators trainer sends (``POST /v1/completions`` with the prompt's token
ids, ``max_tokens: 1`` and ``kv_transfer_params: {}``), reads the file named by the answer's
``kv_transfer_params.hidden_states_path`` with speculators' own reader (hs_connectors
``FileTransfer.get_generated``, which waits on the ``.lock`` file as the trainer does), and
computes the same prompt's states with tests/standins/hs_vllm.py's ``Verifier`` (transformers
forward hooks). Prints one JSON object: the file's tensor names, shapes and dtypes, and how
far the stand-in's states are from the server's. This is the contract between the stand-in
and the real vLLM for hidden states (tests/rehearsal/README.md).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any, Dict, List

STANDIN = Path(__file__).resolve().parents[1] / "standins" / "hs_vllm.py"


def _standin() -> Any:
    spec = importlib.util.spec_from_file_location("hs_vllm", STANDIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: List[str]) -> int:
    endpoint, model, layer_ids, text = argv[0], argv[1], json.loads(argv[2]), argv[3]
    import torch
    from hs_connectors.transfer import FileTransfer

    verifier = _standin().Verifier(model, layer_ids, "auto", None, False)
    ids = verifier.tokenizer.encode(text, add_special_tokens=False)
    body = json.dumps({"model": model, "prompt": ids, "max_tokens": 1,
                       "kv_transfer_params": {}}).encode()
    request = urllib.request.Request(f"{endpoint}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        reply = json.load(answer)
    params: Dict[str, Any] = reply["kv_transfer_params"]
    path = Path(params["hidden_states_path"])
    real = FileTransfer(path.parent).get_generated(params)
    assert real is not None, f"no file at {path}"
    want, _ = verifier.forward(ids)
    got = real["hidden_states"]
    diff = (got.float() - want.float()).abs()
    cosine = [float(torch.nn.functional.cosine_similarity(
        got[:, j].float().flatten(), want[:, j].float().flatten(), dim=0))
        for j in range(len(verifier.layer_ids))]
    print(json.dumps({
        "path": str(path),
        "tensors": {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
                    for k, v in sorted(real.items())},
        "prompt_tokens": len(ids),
        "token_ids_equal": real["token_ids"].tolist() == ids,
        "standin_shape": list(want.shape),
        "standin_dtype": str(want.dtype).replace("torch.", ""),
        "max_abs_diff": float(diff.max()) if diff.numel() else 0.0,
        "max_abs_value": float(want.float().abs().max()) if want.numel() else 0.0,
        "cosine": cosine,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
