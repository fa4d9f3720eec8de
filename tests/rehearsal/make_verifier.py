"""Generate a tiny random Qwen3 verifier and a conversations file, with nothing downloaded.

The CPU rehearsal (tests/rehearsal/README.md) runs the *real* speculators 0.9 trainer against
the vLLM stand-in ``tests/standins/hs_vllm.py``. Both need a model directory that the real
loaders accept:

* ``transformers.AutoConfig`` / ``AutoModelForCausalLM`` (the stand-in computes hidden states
  with it) and ``AutoProcessor`` (``speculators prepare-data`` and the trainer's mask-token
  lookup load it): ``config.json`` with ``model_type: qwen3``, ``tokenizer.json`` +
  ``tokenizer_config.json`` with a chat template;
* speculators' ``utils/loading.py::load_model_layers``, which reads ``embed_tokens``,
  ``lm_head`` and the final norm through ``model.safetensors.index.json`` (it falls back to a
  single file with a warning; the index also gives outrig's ``model_facts`` probe a size).

The chat template is ChatML (what Qwen3 uses) without the ``<think>`` handling, so every
assistant turn has a stable render boundary: speculators derives loss masks from the
difference between two renders (``preprocessing.py::_render_boundary_rows``).

Run it as a script with the rehearsal interpreter (it needs torch, transformers, tokenizers
and safetensors)::

    python tests/rehearsal/make_verifier.py OUT_DIR [--conversations N]

which writes ``OUT_DIR/model`` and ``OUT_DIR/conversations.jsonl`` and prints their paths as
JSON. :func:`make_verifier` and :func:`write_conversations` do the same from Python.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any, Dict, List

# Qwen3's special tokens (ChatML). <|endoftext|> is pad and bos-less eos, as in Qwen3.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# A small fixed vocabulary for the synthetic conversations; the BPE tokenizer is trained on
# the text generated from it, so every conversation tokenizes without unknown pieces.
WORDS = [
    "the", "a", "an", "model", "train", "draft", "token", "layer", "hidden", "state", "block",
    "anchor", "verify", "speculate", "accept", "reject", "loss", "step", "epoch", "save",
    "resume", "gpu", "box", "server", "client", "render", "batch", "sample", "quick", "brown",
    "fox", "jumps", "over", "lazy", "dog", "red", "green", "blue", "small", "large", "fast",
    "slow", "tiny", "random", "what", "how", "why", "when", "where", "which", "answer",
    "question", "please", "thanks", "explain", "describe", "list", "one", "two", "three", "four",
    "five", "six", "seven", "eight", "nine", "ten", "and", "or", "but", "so", "because", "then",
]

DEFAULT_CONFIG: Dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": None,
    "initializer_range": 0.02,
    # Real Qwen3 checkpoints are bf16; vLLM then writes bf16 hidden states, which is what
    # the trainer's --hidden-states-dtype default expects.
    "dtype": "bfloat16",
}

# The sizes vLLM's CPU attention accepts (cpu_attn supports head_dim 32/64/80/96/112/128/...;
# head_dim 16 starts, then fails at the first request with "Unsupported CPU attention
# configuration: head_dim=16"). ``--preset vllm-cpu`` applies them; the stand-ins work with
# either.
VLLM_CPU_CONFIG: Dict[str, Any] = {
    "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 64,
}
PRESETS: Dict[str, Dict[str, Any]] = {"default": {}, "vllm-cpu": VLLM_CPU_CONFIG}


def _sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def conversations(count: int, seed: int = 0) -> List[Dict[str, Any]]:
    """``count`` deterministic conversations: one or two user/assistant exchanges each.

    Two-exchange conversations give two training rows (one per assistant turn), which is
    speculators' per-turn fan-out; their lengths vary so the multipack sampler packs
    several samples per batch.
    """
    rng = random.Random(seed)
    out: List[Dict[str, Any]] = []
    for _ in range(count):
        turns: List[Dict[str, str]] = []
        for _ in range(rng.choice((1, 1, 2))):
            turns.append({"role": "user", "content": _sentence(rng, 4, 14) + "?"})
            turns.append({"role": "assistant", "content": _sentence(rng, 10, 40) + "."})
        out.append({"conversations": turns})
    return out


def write_conversations(path: Path, count: int = 48, seed: int = 0) -> Path:
    """Write the conversations as JSONL in the ``conversations`` format prepare-data reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in conversations(count, seed):
            f.write(json.dumps(row) + "\n")
    return path


def _train_tokenizer(corpus: List[str], vocab_size: int) -> Any:
    """A byte-level BPE (Qwen's kind) trained on ``corpus``: any text encodes, no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def make_verifier(out: Path, *, seed: int = 0, config: Dict[str, Any] | None = None,
                  tokenizer_vocab: int = 400, spare_vocab: int = 16,
                  device: str = "cpu") -> Path:
    """Write a random Qwen3 model directory at ``out`` and return it.

    ``spare_vocab`` embedding rows are left beyond the tokenizer so speculators' DFlash
    mask-token resolution takes its "add <|MASK|> in an unused slot" branch
    (``train/utils.py::resolve_mask_token_id``), as with real Qwen3 (151,669 tokens in a
    151,936-row embedding). ``device`` is where the random weights are drawn (``cuda``
    makes a Qwen3.6-wide verifier in seconds instead of minutes); they are saved from the CPU.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    corpus = [t["content"] for row in conversations(400, seed + 1) for t in row["conversations"]]
    raw = _train_tokenizer(corpus, tokenizer_vocab)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"], model_max_length=4096)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(out))  # transformers 5 writes chat_template.jinja
    # ...and older readers (transformers 4, some vLLM paths) look in tokenizer_config.json.
    tok_cfg_path = out / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_path.read_text())
    tok_cfg["chat_template"] = CHAT_TEMPLATE
    tok_cfg_path.write_text(json.dumps(tok_cfg, indent=2) + "\n")

    cfg = dict(DEFAULT_CONFIG)
    cfg.update(config or {})
    cfg["vocab_size"] = len(tokenizer) + spare_vocab
    cfg["eos_token_id"] = tokenizer.convert_tokens_to_ids("<|im_end|>")
    cfg["pad_token_id"] = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    cfg["bos_token_id"] = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(out)),
                                                 dtype=torch.bfloat16)
    state = {k: v.detach().to(torch.bfloat16).cpu().contiguous()
             for k, v in model.state_dict().items()}
    del model
    shard = "model-00001-of-00001.safetensors"
    save_file(state, str(out / shard), metadata={"format": "pt"})
    total = sum(v.numel() * v.element_size() for v in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict.fromkeys(sorted(state), shard)}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": cfg["eos_token_id"], "pad_token_id": cfg["pad_token_id"]}) + "\n")
    return out


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("out", type=Path, help="folder for model/ and conversations.jsonl")
    parser.add_argument("--conversations", type=int, default=48)
    parser.add_argument("--layers", type=int, default=DEFAULT_CONFIG["num_hidden_layers"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default",
                        help="model sizes: default (hidden 64, head_dim 16) or vllm-cpu "
                        "(hidden 128, head_dim 64: what the real CPU vLLM can serve)")
    parser.add_argument("--config", type=json.loads, default={},
                        help="JSON object of config.json keys to override last")
    args = parser.parse_args(argv)
    config = {**PRESETS[args.preset], "num_hidden_layers": args.layers, **args.config}
    model = make_verifier(args.out / "model", seed=args.seed, config=config)
    convs = write_conversations(args.out / "conversations.jsonl", args.conversations, args.seed)
    print(json.dumps({"model": str(model), "conversations": str(convs)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
