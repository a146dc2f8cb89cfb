"""`make demo`: the whole pipeline on a CPU in a few minutes, with numbers that show RL working.

    python -m rllava.demo --out outputs/demo [--sft-steps 50] [--rl-steps 240] [--seed 0]

1. build a tiny random Qwen2-VL (`rllava.model.tiny`, ~4.8 M parameters) and a synthetic counting set
   (`rllava.data.synthetic`, 4000 train / 200 held-out images with 1-5 shapes);
2. warm it up with SFT (`rllava.train.pipeline.sft`) on `<answer>N</answer>` targets, briefly, so it answers in
   format but counts well below perfectly;
3. run GRPO (`rllava.train.pipeline.rlvr`) with a strict reward;
4. print held-out accuracy of the SFT model and after GRPO: sampled at the rollout temperature (what RL
   optimises) and greedy beside it.

Steps 2 and 3 are the real command lines a user runs (printed before they start), as subprocesses. One
evaluation of a tiny model jumps by whole count classes, so "after" averages the last `--average` evaluations.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

from rllava.data.synthetic import make_counting
from rllava.model.tiny import build_tiny

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SFT_CONFIG = "examples/tasks/counting/tiny_cpu_sft.yaml"
RL_CONFIG = "examples/tasks/counting/tiny_cpu.yaml"


def _run(module: str, args: list[str]) -> float:
    """Run `python -m module args` from the repository root, streaming its output; returns seconds taken."""
    cmd = [sys.executable, "-m", module, *args]
    print("\n$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    start = time.time()
    subprocess.run(cmd, cwd=REPO, check=True)
    return time.time() - start


def _metrics(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _mean(rows: list[dict], key: str) -> float:
    return 100.0 * sum(r[key] for r in rows) / len(rows)


def run_demo(out: str, sft_steps: int = 50, rl_steps: int = 240, val_freq: int = 40, average: int = 3,
             seed: int = 0) -> dict:
    """Build, warm up, train; returns the summary that is printed (also written to `out/summary.json`)."""
    start = time.time()
    out = os.path.abspath(out)
    model_dir, data_dir = os.path.join(out, "model"), os.path.join(out, "data")
    build_tiny("qwen2_vl", model_dir, size="demo", seed=seed)
    data = make_counting(data_dir, n_train=4000, n_val=200, seed=seed)
    print(f"built a tiny Qwen2-VL in {model_dir} and 4000/200 counting images in {data_dir} "
          f"({time.time() - start:.0f}s)", flush=True)
    common = [f"data.train_files={data['train']}", f"data.val_files={data['val']}", f"trainer.seed={seed}"]

    sft_dir, rl_dir = os.path.join(out, "sft"), os.path.join(out, "grpo")
    sft_time = _run("rllava.train.pipeline.sft", [
        f"config={SFT_CONFIG}", f"actor.model.model_path={model_dir}", *common,
        f"trainer.max_steps={sft_steps}", "trainer.val_freq=0", f"trainer.outputs_dir={sft_dir}"])
    rl_time = _run("rllava.train.pipeline.rlvr", [
        f"config={RL_CONFIG}", f"actor.model.model_path={os.path.join(sft_dir, 'final')}", *common,
        f"trainer.max_steps={rl_steps}", f"trainer.val_freq={val_freq}", "trainer.val_before_train=true",
        f"trainer.outputs_dir={rl_dir}"])

    rows = _metrics(rl_dir)
    rewards = [row["reward/mean"] for row in rows if "reward/mean" in row]
    vals = [row for row in rows if "val/accuracy" in row]
    before, after = [v for v in vals if v["step"] == 0], [v for v in vals if v["step"] > 0][-average:]
    summary = {
        "sampled_before": _mean(before, "val/accuracy"), "sampled_after": _mean(after, "val/accuracy"),
        "greedy_before": _mean(before, "val_greedy/accuracy"), "greedy_after": _mean(after, "val_greedy/accuracy"),
        "after_steps": [v["step"] for v in after],
        "train_reward_first": sum(rewards[:20]) / len(rewards[:20]),
        "train_reward_last": sum(rewards[-20:]) / len(rewards[-20:]),
        "sft_seconds": sft_time, "rl_seconds": rl_time,
        "total_seconds": time.time() - start, "outputs": out,
    }
    summary["sampled_lift"] = summary["sampled_after"] - summary["sampled_before"]
    summary["greedy_lift"] = summary["greedy_after"] - summary["greedy_before"]
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def report(s: dict) -> str:
    steps = ", ".join(map(str, s["after_steps"]))
    return "\n".join([
        "",
        "held-out counting accuracy (200 images; sampled at the rollout temperature, 2 samples each; greedy beside)",
        f"  {'':<46}{'sampled':>9}{'greedy':>9}",
        f"  {'SFT warm-up (before RL)':<46}{s['sampled_before']:>8.1f}%{s['greedy_before']:>8.1f}%",
        f"  {'after GRPO (mean of steps ' + steps + ')':<46}{s['sampled_after']:>8.1f}%{s['greedy_after']:>8.1f}%",
        f"  {'lift (points)':<46}{s['sampled_lift']:>+9.1f}{s['greedy_lift']:>+9.1f}",
        f"training reward (mean of 20 steps): first {s['train_reward_first']:.3f} -> last {s['train_reward_last']:.3f}",
        f"wall time: SFT {s['sft_seconds']:.0f}s, GRPO {s['rl_seconds']:.0f}s, total {s['total_seconds']:.0f}s; "
        f"runs, metrics.jsonl and models in {s['outputs']}",
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rllava.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/demo")
    parser.add_argument("--sft-steps", type=int, default=50)
    parser.add_argument("--rl-steps", type=int, default=240)
    parser.add_argument("--val-freq", type=int, default=40)
    parser.add_argument("--average", type=int, default=3, help="evaluations averaged for 'after GRPO'")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        summary = run_demo(args.out, args.sft_steps, args.rl_steps, args.val_freq, args.average, args.seed)
    except subprocess.CalledProcessError as e:
        parser.exit(1, f"demo: a training run failed (exit status {e.returncode}); its output is above\n")
    print(report(summary))


if __name__ == "__main__":
    main()
