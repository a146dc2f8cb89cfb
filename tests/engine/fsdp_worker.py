"""Run by tests/engine/test_fsdp2.py under `torchrun --nproc_per_node=W` (or plain python for W=1): one
optimizer step of a tiny Qwen2-VL on a fixed global batch, each rank on its contiguous share of the rows.

    python fsdp_worker.py MODEL_DIR OUT_DIR {single|fsdp2} [save_dcp|load_dcp DCP_DIR]

Writes OUT_DIR/result.pt (rank 0): the global loss and the full weights after the step.
"""

import os
import sys

import torch

from rllava import distributed as D
from rllava.engine.train.checkpoint import load_engine, save_engine
from rllava.engine.train.fsdp2 import FSDP2Engine
from rllava.engine.train.single import SingleDeviceEngine
from rllava.model.loader import load_model

ROWS, LENGTH = 4, 12


def global_batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(20, 1000, (ROWS, LENGTH), generator=g)
    mask = torch.ones(ROWS, LENGTH)
    mask[1, 8:] = 0  # rows of different lengths: the normaliser must be the global token count
    mask[3, 5:] = 0
    return ids, mask


def moments(engine) -> float:
    """Sum of |Adam's first moment| over all parameters and ranks (0 for a fresh optimizer)."""
    local = [s["exp_avg"] for s in engine.optimizer.state.values() if "exp_avg" in s]
    return D.all_sum([sum(float((t.to_local() if hasattr(t, "to_local") else t).abs().sum()) for t in local)])[0]


def main(model_dir, out_dir, strategy, mode=None, dcp_dir=None):
    device = D.init("cpu")
    torch.manual_seed(0)
    model = load_model(model_dir, dtype=torch.float32)
    engine = (FSDP2Engine if strategy == "fsdp2" else SingleDeviceEngine)(device, max_grad_norm=1.0)
    engine.prepare(model, lambda p: torch.optim.AdamW(p, lr=1e-2), lambda o: None)
    if mode == "load_dcp":
        load_engine(engine, dcp_dir)
    loaded_moments = moments(engine)
    ids, mask = global_batch()
    rows = D.shard(list(range(ROWS)), "rows")
    num_tokens = mask[:, 1:].sum()
    with engine.update_phase():
        logits = engine.model(input_ids=ids[rows], attention_mask=mask[rows].long()).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[rows][:, 1:], reduction="none")
        # gradients are averaged over ranks: scale this rank's sum to its share of the global mean
        loss = (nll * mask[rows][:, 1:]).sum() / num_tokens * D.world_size()
        engine.backward(loss)
        grad_norm = engine.optimizer_step()
    total = D.all_sum([loss.item() / D.world_size()])[0]
    saved_moments = moments(engine)
    if mode == "save_dcp":
        save_engine(engine, dcp_dir)
    weights = engine.full_state_dict()
    if D.is_main():
        os.makedirs(out_dir, exist_ok=True)
        torch.save({"loss": total, "grad_norm": grad_norm, "weights": weights,
                    "loaded_moments": loaded_moments, "saved_moments": saved_moments}, os.path.join(out_dir, "result.pt"))
    D.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
