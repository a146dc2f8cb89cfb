"""Ulysses sequence parallelism on CPU (issue 48): from which sequence length does `actor.model.ulysses_size=2` pay?

    python benchmarks/ulysses.py [--lengths 1024 2048 4096 8192] [--size wide] [--reps 2]      # ~10 min

One micro-batch of one row of L tokens (a text prompt of L/2 tokens, L/2 trained response tokens) through rllava's
training forward (`token_logprobs`, with the entropy) and backward on a random-init tiny Qwen2-VL
(`rllava.model.tiny`, --size), float32, sdpa, gradient checkpointing; sp=1 in one process, sp=2 on two gloo
processes (`torchrun`), each process one thread (OMP_NUM_THREADS=1: per-rank time against one rank's).
  s / step      median wall seconds of forward + backward over --reps (after one warm-up), the slowest rank's
  peak MiB      torch's MemTracker peak (the planner's, rllava.train.memory) of activations + temporaries over one forward + backward, per rank
                (the weights and gradients, the same for both, left out)
Prints the table (markdown)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(model_dir: str, lengths: list[int], reps: int, out: str) -> None:
    import torch

    from rllava.train.memory.torch_private import device_peak
    from rllava import distributed as D
    from rllava.config.schema import ModelConfig
    from rllava.data.protocol import Sample, Segment, Trajectory, collate
    from rllava.model import ulysses
    from rllava.model.forward import token_logprobs
    from rllava.model.loader import load_model, make_trainable

    D.init("cpu")
    ulysses.init(D.world_size())
    torch.manual_seed(0)
    model = make_trainable(load_model(model_dir, dtype=torch.float32), ModelConfig(enable_gradient_checkpointing=True),
                           torch.device("cpu"))
    rows = {}
    for L in lengths:
        g = torch.Generator().manual_seed(L)
        ids = torch.randint(20, model.config.text_config.vocab_size, (L,), generator=g).tolist()
        batch = collate([Trajectory(sample=Sample(0, [], [], None), group_id=0, mm_inputs={}, segments=[
            Segment(ids[:L // 2], trained=False), Segment(ids[L // 2:], trained=True)])], 0)

        def step():
            lp, ent = token_logprobs(model, batch, with_entropy=True)
            (lp.sum() + ent.sum()).backward()
            model.zero_grad(set_to_none=True)
        step()  # warm-up
        seconds = []
        for _ in range(reps):
            D.barrier()
            start = time.perf_counter()
            step()
            seconds.append(time.perf_counter() - start)
        peak = device_peak(step, model, torch.optim.SGD(model.parameters(), lr=0.0))  # the planner's tracker
        act = peak.get("Activation", 0), peak.get("Temp", 0)
        rows[L] = {"s": max(D.gather([statistics.median(seconds)])), "act": max(D.gather([act[0] / 2 ** 20])),
                   "temp": max(D.gather([act[1] / 2 ** 20]))}
    if D.is_main():
        json.dump(rows, open(out, "w"))
    D.close()


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--size", default="wide")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)  # MODEL_DIR OUT: one run's process
    args = p.parse_args(argv)
    sys.path.insert(0, REPO)
    if args.worker:
        worker(args.worker[0], args.lengths, args.reps, args.worker[1])
        from rllava import distributed as D
        D.exit_process(0)
    from rllava.model.tiny import build_tiny

    tmp = tempfile.mkdtemp(prefix="rllava-ulysses-")
    model_dir = os.path.join(tmp, "model")
    build_tiny("qwen2_vl", model_dir, size=args.size)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    results = {}
    for sp in (1, 2):
        out = os.path.join(tmp, f"sp{sp}.json")
        launch = [sys.executable] if sp == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                   f"--nproc_per_node={sp}"]
        subprocess.run([*launch, os.path.abspath(__file__), "--worker", model_dir, out, "--lengths",
                        *map(str, args.lengths), "--reps", str(args.reps)], check=True, env=env, cwd=REPO)
        results[sp] = {int(k): v for k, v in json.load(open(out)).items()}
    lines = [f"Tiny Qwen2-VL ({args.size}), one row, fp32, sdpa, gradient checkpointing, 1 thread a rank",
             "", "| L tokens | sp=1 s | sp=2 s (per rank) | speed-up | sp=1 activations + temporaries MiB | "
             "sp=2 (per rank) |", "|---:|---:|---:|---:|---:|---:|"]
    for L in args.lengths:
        a, b = results[1][L], results[2][L]
        lines.append(f"| {L} | {a['s']:.2f} | {b['s']:.2f} | {a['s'] / b['s']:.2f}x | {a['act']:.0f} + "
                     f"{a['temp']:.0f} | {b['act']:.0f} + {b['temp']:.0f} |")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
