"""Write a random DFlash drafter for a tiny verifier, as a speculators 0.9 checkpoint folder.

Run with the speculators interpreter (``$OUTRIG_REHEARSAL_PYTHON``)::

    python tests/realvllm/make_dflash_drafter.py VERIFIER SAVE_PATH [--block-size 4]

It builds the drafter the way speculators' trainer does (``DFlashDraftModel.
from_training_args`` with the verifier's config cut to one layer, as train.py's
``create_transformer_layer_config`` does; speculators/models/dflash/core.py), with random
weights, and saves it with ``save_pretrained`` into ``SAVE_PATH/0``: the model files vLLM
loads. The files the trainer writes beside them at each save (optimizer and scheduler state,
then ``training_state.json``, in that order: speculators train/trainer.py
``maybe_save_checkpoint``) are written too, so that outrig's completeness rule sees the folder
as one finished save of epoch 0. The drafter is untrained: vLLM's counters show drafts and
acceptance near 1.00, which is what a test of the measurement needs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("verifier")
    parser.add_argument("save_path")
    parser.add_argument("--block-size", type=int, default=4)
    args = parser.parse_args()

    import torch
    from speculators.models.dflash import DFlashDraftModel
    from transformers import AutoConfig

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(args.verifier)
    vocab = int(config.vocab_size)
    config.num_hidden_layers = 1
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types)[:1]
    model = DFlashDraftModel.from_training_args(
        config, draft_vocab_size=vocab, block_size=args.block_size,
        verifier_name_or_path=args.verifier, target_layer_ids=[0, 1], mask_token_id=1,
        draft_attn_impl="sdpa")
    folder = Path(args.save_path) / "0"
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    torch.save({}, folder / "optimizer_state_dict.pt")
    torch.save({}, folder / "scheduler_state_dict.pt")
    (folder / "training_state.json").write_text(json.dumps(
        {"epoch": 0, "local_step": 0, "global_step": 1}))
    json.dump({"checkpoint": str(folder)}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
