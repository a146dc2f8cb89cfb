"""`make demo`: the whole pipeline on a CPU in a few minutes, with numbers that show RL working.

    python -m rllava.commands.demo --out outputs/demo [--sft-steps 50] [--rl-steps 240] [--seed 0]

1. build a tiny random Qwen2-VL (`rllava.model.tiny`, ~4.8 M parameters) and a synthetic counting set
   (`rllava.data.synthetic`, 4000 train / 200 held-out images with 1-5 shapes);
2. warm it up with SFT (`rllava.train.pipeline.sft`) on `<answer>N</answer>` targets, briefly, so it answers in
   format but counts well below perfectly;
3. run GRPO (`rllava.train.pipeline.rlvr`) with a strict reward;
4. print held-out accuracy of the SFT model and after GRPO: sampled at the rollout temperature (what RL
   optimises) and greedy beside it; write the GRPO run's curves (`python -m rllava.commands.plot`) to grpo/plots/.

Steps 2 and 3 are the real command lines a user runs (printed before they start), as subprocesses. One
evaluation of a tiny model jumps by whole count classes, so "after" averages the last `--average` evaluations.
"""

from __future__ import annotations

import os
import subprocess

from rllava.commands import command_parser
from rllava.commands.plot import plot
from rllava.commands.proof import TASKS, run_task


def run_demo(out: str, sft_steps: int = 50, rl_steps: int = 240, val_freq: int = 40, average: int = 3,
             seed: int = 0) -> dict:
    """Build, warm up, train (the counting row of `rllava.commands.proof`); returns the summary that is printed (also
    written to `out/summary.json`)."""
    return run_task(TASKS["counting"], out, sft_steps=sft_steps, rl_steps=rl_steps, val_freq=val_freq,
                    average=average, seed=seed)


def report(s: dict) -> str:
    steps = ", ".join(map(str, s["after_steps"]))
    return "\n".join([
        "",
        "held-out counting accuracy (200 images; sampled at the rollout temperature, 2 samples each; greedy beside)",
        f"  {'':<46}{'sampled':>9}{'greedy':>9}",
        f"  {'SFT warm-up (before RL)':<46}{s['sampled_before']:>8.1f}%{s['greedy_before']:>8.1f}%",
        f"  {'after GRPO (mean of steps ' + steps + ')':<46}{s['sampled_after']:>8.1f}%{s['greedy_after']:>8.1f}%",
        f"  {'lift (points)':<46}{s['sampled_lift']:>+9.1f}{s['greedy_lift']:>+9.1f}",
        f"training reward (mean of {s['train_reward_window']} steps): first {s['train_reward_first']:.3f} -> "
        f"last {s['train_reward_last']:.3f}",
        f"wall time: SFT {s['sft_seconds']:.0f}s, GRPO {s['rl_seconds']:.0f}s, total {s['total_seconds']:.0f}s; "
        f"runs, metrics.jsonl and models in {s['outputs']}",
    ])


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("demo", __doc__)
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
    print("curves (python -m rllava.commands.plot):", " ".join(plot(os.path.join(summary["outputs"], "grpo"))))


if __name__ == "__main__":
    main()
