"""A trainer checkpoint as a plain `save_pretrained` directory, after the fact:

    python -m rllava.commands.export CHECKPOINT OUT [--no-merge-lora]

CHECKPOINT is a `global_step_N` directory or a directory of them (the newest is taken), written by any number
of ranks. The model is rebuilt from the checkpoint alone: its config and processor (`actor/huggingface/`), its
run config (`config.yaml`, for LoRA) and its name-keyed weights (`actor/`, read through DCP). OUT loads with
`transformers` alone; a LoRA policy is merged (with --no-merge-lora: the base weights, and the adapter in
OUT/adapter either way). Saving with `actor.checkpoint.save_contents=[..., hf_model]` writes the same directory
at every checkpoint (CHECKPOINT/actor/huggingface).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings

import torch
from transformers import AutoConfig

from rllava.commands import command_parser
from rllava.config import load_config
from rllava.engine.train.checkpoint import load_weights, read_metadata
from rllava.errors import RllavaError
from rllava.model.loader import auto_class, save_model
from rllava.model.processor import load_processor
from rllava.train.checkpoint import resolve_checkpoint


def saved_dtype(path: str) -> torch.dtype:
    """The dtype the engine checkpoint at `path` holds its weights in (what training ran in)."""
    meta = read_metadata(path).state_dict_metadata
    return next(m.properties.dtype for k, m in meta.items() if k.startswith("model.") and hasattr(m, "properties"))


def export(checkpoint: str, out: str, merge_lora: bool = True) -> str:
    path = resolve_checkpoint(checkpoint, "checkpoint")
    hf, weights = os.path.join(path, "actor", "huggingface"), os.path.join(path, "actor")
    with warnings.catch_warnings():  # keys the run's strategy ignored were reported when it ran
        warnings.simplefilter("ignore")
        m = load_config([f"config={os.path.join(path, 'config.yaml')}"]).actor.model
    config = AutoConfig.from_pretrained(hf, trust_remote_code=m.trust_remote_code)
    model = auto_class(config).from_config(config, dtype=saved_dtype(weights), trust_remote_code=m.trust_remote_code)
    if m.use_peft:  # the same adapters as in training (fresh; their weights come from the checkpoint)
        from rllava.model.lora import apply_lora

        model = apply_lora(model, dataclasses.replace(m, lora_weight_path=""))
    state = model.state_dict()
    load_weights(state, weights)
    model.load_state_dict(state)
    return save_model(model, load_processor(hf, m.trust_remote_code), out, merge_lora=merge_lora)


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("export", __doc__)
    parser.add_argument("checkpoint", help="a global_step_N directory, or a directory of them (newest taken)")
    parser.add_argument("out", help="the save_pretrained directory to write")
    parser.add_argument("--no-merge-lora", action="store_true", help="LoRA: save the base weights, not merged")
    args = parser.parse_args(argv)
    try:
        print(export(args.checkpoint, args.out, merge_lora=not args.no_merge_lora))
    except RllavaError as e:
        print(f"rllava: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
