"""Synchronous vs asynchronous RL on this machine: completions/s, held-out accuracy per wall-clock second, the
per-phase costs, and from them the expected gain at 8 GPUs (on paper).

    python benchmarks/async.py [--rl-steps 60] [--val-freq 20] [--staleness 1] [--out outputs/bench/async]

One SFT-warmed tiny Qwen2-VL on the synthetic counting task (`rllava.commands.proof`'s recipe: 50 SFT steps), then the
same GRPO run twice from it: synchronous in one process with 2 threads (rollout and update take turns, each on
both cores), and asynchronous under torchrun, 1 trainer + 1 rollout process of 1 thread each
(`trainer.async_training=true trainer.rollout_ranks=1`, `--staleness`, token-level TIS). Each run's first step
(warm-up) is left out of the means.

The estimate at 8 GPUs compares a colocated synchronous run on 8 GPUs with 4 rollout + 4 train GPUs:

    sync_8  = R_4 / 2^a + T_4 / 2^b + S        async_4+4 = max(R_4, T_4 + W)       gain = sync_8 / async_4+4

R_4, T_4: a step's rollout (+ reward) and learning (log-probs, advantage, update) on 4 GPUs, in the ratio measured
here at one thread each; a, b: how each phase speeds up when its workers double, measured here from 1 to 2 threads
(a = log2(R_1 / R_2), b likewise; 1 = linear); S: what the colocated run pays per step to switch (engine wake-up,
weight sync into it, sleep), 0 here (the HF engine samples with the training model); W: the async trainer's
blocking share of publishing weights, measured. It assumes the 1 -> 2 scaling measured on CPU threads holds for
4 -> 8 GPUs, staleness >= 1 (the rollout of step s+1 overlaps the update of s) and no other overhead; with
linear scaling (a = b = 1) and S = W = 0 the gain is (R + T) / (2 max(R, T)) <= 1: splitting the GPUs pays
when rollout or training scale sublinearly (long generation tails, small per-GPU batches) or switching costs.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from rllava.commands.plot import read_metrics  # noqa: E402
from rllava.commands.proof import TASKS, prepare, summarize, train_rl, warm_up  # noqa: E402

RUNS = {"sync (1 process, 2 threads)": ("2", 1, ()),
        "async (1 + 1 processes, 1 thread each)": ("1", 2, ("trainer.async_training=true", "trainer.rollout_ranks=1",
                                                             "algorithm.rollout_is=token"))}


def phases(rows: list[dict]) -> dict[str, float]:
    """Mean seconds per step of each timing (first step left out), and the completions in a step."""
    steps = [r for r in rows if "timing/step" in r and r["step"] > 1]
    keys = sorted({k for r in steps for k in r if k.startswith("timing/")})
    out = {k.removeprefix("timing/"): sum(r.get(k, 0.0) for r in steps) / len(steps) for k in keys}
    out["steps"] = len(steps)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/bench/async")
    parser.add_argument("--rl-steps", type=int, default=60)
    parser.add_argument("--val-freq", type=int, default=20)
    parser.add_argument("--sft-steps", type=int, default=50)
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--n-train", type=int, default=4000)
    args = parser.parse_args(argv)
    task, out = TASKS["counting"], os.path.abspath(args.out)
    common = prepare(task, out, n_train=args.n_train)
    warm_up(task, out, common, args.sft_steps)
    results = {}
    for name, (threads, procs, keys) in RUNS.items():
        os.environ["OMP_NUM_THREADS"] = threads
        folder = "sync" if procs == 1 else "async"
        keys = keys + ((f"trainer.max_staleness={args.staleness}",) if procs > 1 else ())
        seconds = train_rl(task, out, common, folder, keys, args.rl_steps, args.val_freq, processes=procs)
        rows = read_metrics(os.path.join(out, folder))
        results[name] = (phases(rows), summarize(task, rows, average=1), seconds)
    completions = 8 * 8  # data.train_batch_size x rollout.n of examples/tasks/counting/tiny_cpu.yaml
    print("\n| run | step s | completions/s | rollout + reward s | learn s | waits for rollout s | held-out "
          "(sampled) start -> end | points per minute of steps | whole run s |\n|---|---|---|---|---|---|---|---|---|")
    for name, (p, s, seconds) in results.items():
        rollout = p.get("rollout", 0.0) + p.get("reward", 0.0)
        learn = p["step"] - p.get("wait_rollout", rollout)
        minutes = p["step"] * args.rl_steps / 60
        print(f"| {name} | {p['step']:.3f} | {completions / p['step']:.1f} | {rollout:.3f} | {learn:.3f} | "
              f"{p.get('wait_rollout', 0.0):.3f} | {s['sampled_before']:.1f} -> {s['sampled_after']:.1f} | "
              f"{(s['sampled_after'] - s['sampled_before']) / minutes:+.2f} | {seconds:.0f} |")
    (sp, _, _), (ap, _, _) = results.values()
    e = estimate(sp, ap)
    print(f"\nper phase: rollout R_1 = {e['R_1']:.3f} s, R_2 = {e['R_2']:.3f} s (a = {e['a']:.2f}); learning "
          f"T_1 = {e['T_1']:.3f} s, T_2 = {e['T_2']:.3f} s (b = {e['b']:.2f}); publishing weights W = {e['W']:.4f} s")
    print(f"8 GPUs, on paper: sync_8 = {e['sync_8']:.3f}, async_4+4 = max(R_4, T_4 + W) = {e['async_4+4']:.3f} (in "
          f"units of this machine's 1-thread seconds): gain {e['gain']:.2f}x; with linear scaling (a = b = 1): "
          f"{e['gain_linear']:.2f}x")


def estimate(sync: dict, asyn: dict) -> dict:
    """The module docstring's formula from the two runs' `phases` (S = 0: the HF engine shares the model)."""
    w = asyn.get("publish_weights", 0.0)
    r1, t1 = asyn["rollout"] + asyn.get("reward", 0.0), asyn["step"] - asyn["wait_rollout"] - w
    r2 = sync["rollout"] + sync.get("reward", 0.0)
    t2 = sync["step"] - r2
    a, b = math.log2(r1 / r2), math.log2(t1 / t2)
    sync8, async44 = r1 / 2 ** a + t1 / 2 ** b, max(r1, t1 + w)
    return {"R_1": r1, "R_2": r2, "T_1": t1, "T_2": t2, "W": w, "a": a, "b": b, "sync_8": sync8,
            "async_4+4": async44, "gain": sync8 / async44, "gain_linear": (r1 + t1) / 2 / async44}

if __name__ == "__main__":
    main()
