"""Run by tests/engine/test_sharded_engines.py under `torchrun --nproc_per_node=2`: for each model directory given,
rllava's training forward (`token_logprobs`, entropy with grad) and backward in float64 on the same 4 rows on
both ranks, with and without Ulysses (`rllava.model.ulysses`, groups of 2), padded and packed. Without it each
rank computes everything; with it each its half of every sequence, and the ranks' gradients summed / 2 (the
engines' mean) must be the whole gradient.

    python -m torch.distributed.run --nproc_per_node=2 ulysses_worker.py OUT_JSON ATTN MODEL_DIR...

Writes OUT_JSON (rank 0): per model and layout, the largest |log-prob difference| and |gradient difference| (over
every parameter, relative to the largest gradient)."""

import json
import sys

import torch
import torch.distributed as dist

from rllava import distributed as D
from rllava.data.protocol import Sample, Segment, Trajectory, collate
from rllava.model import ulysses
from rllava.model.forward import token_logprobs
from rllava.model.loader import load_model

from actor_worker import global_batch  # noqa: E402  (this script's own folder is on sys.path)


def text_batch():
    g = torch.Generator().manual_seed(1)
    return collate([Trajectory(sample=Sample(i, [], [], None), group_id=i, mm_inputs={}, segments=[
        Segment(torch.randint(20, 1000, (p,), generator=g).tolist(), trained=False),
        Segment(torch.randint(20, 1000, (r,), generator=g).tolist(), trained=True)])
        for i, (p, r) in enumerate([(5, 9), (12, 2), (3, 1), (8, 14)])], 0)


def run(model, batch, packed: bool, sequence_parallel: bool):
    saved = ulysses._group
    ulysses._group = saved if sequence_parallel else None  # the same model, cut or whole
    try:
        model.zero_grad(set_to_none=True)
        lp, ent = token_logprobs(model, batch, padding_free=packed, chunk_size=4, with_entropy=True,
                                 entropy_grad=True)
        w = torch.randn(lp.shape, generator=torch.Generator().manual_seed(3), dtype=lp.dtype)
        ((lp * w).sum() + ent.sum()).backward()
    finally:
        ulysses._group = saved
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    if sequence_parallel:
        for g in grads.values():
            dist.all_reduce(g)
            g /= 2
    return lp.detach(), grads


def main(out, attn, *paths):
    D.init("cpu")
    ulysses.init(2)
    results = {}
    for path in paths:
        torch.manual_seed(0)
        model = load_model(path, dtype=torch.float64, attn_implementation=attn)
        ulysses.enable(model)
        batch = text_batch() if not hasattr(model.config, "vision_config") else global_batch(path)
        for packed in (False, True):
            (lp0, g0), (lp1, g1) = run(model, batch, packed, False), run(model, batch, packed, True)
            scale = max(g.abs().max().item() for g in g0.values())
            results[f"{path} {'packed' if packed else 'padded'}"] = {
                "logprob": (lp0 - lp1).abs().max().item(), "same_params": g0.keys() == g1.keys(),
                "grad": max((g1[n] - g).abs().max().item() for n, g in g0.items()) / scale}
    if D.is_main():
        json.dump(results, open(out, "w"))
    D.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
    D.exit_process(0)
