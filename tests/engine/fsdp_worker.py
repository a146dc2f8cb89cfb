"""Run by tests/engine/test_sharded_engines.py under `torchrun --nproc_per_node=W` (or plain
python for W=1): one optimizer step of a tiny Qwen2-VL on a fixed global batch, each rank on its contiguous
share of the rows, the loss through the training forward (`token_logprobs`).

    python fsdp_worker.py MODEL_DIR OUT_DIR STRATEGY [save_dcp|load_dcp DCP_DIR]

STRATEGY: single | fsdp2 | fsdp2-offload-prefetch (CPU offload, forward prefetch, 2 units kept gathered to the
backward, gradient checkpointing) | deepspeed{1,2,3} (fp32) | deepspeed{2,3}-offload (ZeRO-Offload, DeepSpeedCPUAdam).
Writes OUT_DIR/result.pt (rank 0): the global loss and the full weights after the step.
"""

import os
import sys

import torch

from rllava import distributed as D
from rllava.data.protocol import Sample, Segment, Trajectory, collate
from rllava.engine.train.checkpoint import load_engine, save_engine
from rllava.engine.train.fsdp2 import FSDP2Engine
from rllava.engine.train.single import SingleDeviceEngine
from rllava.model.forward import token_logprobs
from rllava.model.loader import load_model

ROWS, LENGTH = 4, 12


def global_batch():
    """4 rows of a 3-token prompt and a response of 9, 5, 9 and 2 trained tokens: the normaliser must be the
    global token count."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(20, 1000, (ROWS, LENGTH), generator=g).tolist()
    lengths = [LENGTH, 8, LENGTH, 5]
    return collate([Trajectory(Sample(i, [], [], None), i, [Segment(row[:3], False), Segment(row[3:n], True)], {})
                    for i, (row, n) in enumerate(zip(ids, lengths))], pad_token_id=0)


def make_engine(strategy: str, device: torch.device):
    if strategy == "fsdp2":
        return FSDP2Engine(device, max_grad_norm=1.0)
    if strategy == "fsdp2-offload-prefetch":  # CPU offload, forward prefetch, the last 2 units kept to backward
        return FSDP2Engine(device, max_grad_norm=1.0, offload_params=True, forward_prefetch=True,
                           keep_gathered_units=2)
    if strategy == "accelerate":  # Accelerate's DDP on CPUs (FSDP2's state-dict code)
        from rllava.engine.train.accelerate import AccelerateEngine

        return AccelerateEngine(device, max_grad_norm=1.0)
    if strategy.startswith("deepspeed"):  # deepspeed3, deepspeed2-offload, ...
        from rllava.config.schema import DeepSpeedConfig
        from rllava.engine.train.deepspeed import DeepSpeedEngine

        cfg = DeepSpeedConfig(zero_stage=int(strategy[9]), torch_dtype="fp32",
                              enable_cpu_offload=strategy.endswith("-offload"))
        return DeepSpeedEngine(device, max_grad_norm=1.0, deepspeed_config=cfg)
    return SingleDeviceEngine(device, max_grad_norm=1.0)


def moments(engine) -> float:
    """Sum of |Adam's first moment| over all parameters and ranks (0 for a fresh optimizer)."""
    local = [s["exp_avg"] for s in engine.optimizer.state.values() if "exp_avg" in s]
    total = D.all_sum([sum(float((t.to_local() if hasattr(t, "to_local") else t).abs().sum()) for t in local)])[0]
    ddp = type(engine).__name__ == "AccelerateEngine" and not any(hasattr(t, "to_local") for t in local)
    return total / D.world_size() if ddp else total  # Accelerate's DDP (CPUs): every rank holds the whole state


def units_gathered(engine) -> list[bool]:
    """FSDP2: whether each unit (not the root) holds its gathered weights now; prefetching: each unit's targets."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in engine.model.modules() if isinstance(m, FSDPModule) and m is not engine.model]
    return [m._get_fsdp_state()._fsdp_param_group.is_unsharded for m in units]


def forward_prefetch(engine) -> list[int]:
    from torch.distributed.fsdp import FSDPModule

    return [len(m._get_fsdp_state()._states_to_forward_prefetch) for m in engine.model.modules()
            if isinstance(m, FSDPModule) and m is not engine.model]


def main(model_dir, out_dir, strategy, mode=None, dcp_dir=None):
    device = D.init("cpu")
    torch.manual_seed(0)
    model = load_model(model_dir, dtype=torch.float32)
    if strategy == "fsdp2-offload-prefetch":  # each unit's checkpointed recompute runs on the gathered weights
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable({"use_reentrant": False})
    engine = make_engine(strategy, device)
    engine.prepare(model, lambda p: torch.optim.AdamW(p, lr=1e-2), lambda o: None)
    if mode == "load_dcp":
        load_engine(engine, dcp_dir)
    loaded_moments = moments(engine)
    batch = global_batch()
    num_tokens = batch.loss_mask.sum()
    batch = batch.select(D.shard(list(range(ROWS)), "rows"))
    with engine.update_phase():
        logp, _ = token_logprobs(engine.model, batch)
        gathered = units_gathered(engine)  # after the forward: the units that will not be gathered again
        # gradients are averaged over ranks: scale this rank's sum to its share of the global mean
        loss = -(logp * batch.loss_mask).sum() / num_tokens * D.world_size()
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
                    "loaded_moments": loaded_moments, "saved_moments": saved_moments,
                    **({"gathered": gathered, "prefetch": forward_prefetch(engine),
                        "after": units_gathered(engine)} if strategy.startswith("fsdp2") else {})}, os.path.join(out_dir, "result.pt"))
    D.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
    D.exit_process(0)  # as the pipelines end under torchrun: no race with gloo's threads at exit
