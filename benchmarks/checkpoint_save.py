"""Time a training step loses to a checkpoint save, synchronous vs `actor.checkpoint.async_save=true`.

    python benchmarks/checkpoint_save.py [--steps 21] [--save-freq 2] [--size demo]

Builds the demo model (`rllava.model.tiny`, ~4.5 M parameters; its checkpoint: weights, Adam moments, RNG and
sampler state) and the synthetic counting set in a temporary directory, then runs `--steps` GRPO steps of
`examples/tasks/counting/tiny_cpu.yaml` three times in this process: no saves, saves every `--save-freq` steps,
and the same saves in the background. A step's loop time is `timing/step` + `timing/save_checkpoint` (the
time the loop blocks in `save_checkpoint`; a background write's CPU contention shows in the next steps'
`timing/step`). Time lost per save = (mean loop time with saves - without) x save_freq, over steps 2 .. N-1
(step 1 warms up; the last save is waited for at the end, outside the steps).

Measured on 2 CPU cores shared with other work (OMP_NUM_THREADS=1; each checkpoint ~55 MB), two runs:

| run (steps, a save every 2) | loop time / step (s) | blocking in save_checkpoint (s) | time lost / save (s) |
|---|---:|---:|---:|
| no saves (21 / 41) | 0.720 / 0.675 | - | - |
| sync (21 / 41) | 0.816 / 0.861 | 0.240 / 0.236 | 0.19 / 0.37 |
| async (21 / 41) | 0.796 / 0.877 | 0.081 / 0.090 | 0.15 / 0.40 |

The loop blocks 2.6-3x less (left: staging, RNG / sampler / config files, the HF config); on these two cores the
writer thread competes with training for the same CPUs, so the net time lost is within the noise. The gain is
for a GPU step, whose host CPUs are idle while it runs: not measured here (no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def loop_times(out: str) -> tuple[list[float], list[float]]:
    """Per step (steps 2 .. N-1): loop time (step + blocking save), and the blocking save alone."""
    rows: dict[int, dict] = {}
    for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))):
        rows.setdefault(r["step"], {}).update(r)
    steps = sorted(s for s in rows if "timing/step" in rows[s])[1:-1]
    saves = [rows[s].get("timing/save_checkpoint", 0.0) for s in steps]
    return [rows[s]["timing/step"] + x for s, x in zip(steps, saves)], saves


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=21)
    parser.add_argument("--save-freq", type=int, default=2)
    parser.add_argument("--size", default="demo", help="rllava.model.tiny size")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path.insert(0, REPO)
    os.chdir(REPO)  # the task config names ./examples/... paths

    from rllava.data.synthetic import make_counting
    from rllava.model.tiny import build_tiny
    from rllava.train.outputs import keys_for
    from rllava.train.pipeline import rlvr

    root = tempfile.mkdtemp(prefix="rllava-ckpt-bench-")
    model = build_tiny("qwen2_vl", os.path.join(root, "model"), size=args.size)
    data = os.path.join(root, "counting")
    make_counting(data, n_train=256, n_val=8, seed=0)
    results = {}
    for name, extra in [("no saves", ["trainer.save_freq=-1"]),
                        ("sync", [f"trainer.save_freq={args.save_freq}"]),
                        ("async", [f"trainer.save_freq={args.save_freq}", "actor.checkpoint.async_save=true"])]:
        out = os.path.join(root, name.replace(" ", "_"))
        rlvr.main(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model}",
                   f"data.train_files={data}/train.jsonl", "data.val_files=null", f"trainer.max_steps={args.steps}",
                   "trainer.val_before_train=false", "trainer.val_freq=-1", "trainer.logger=[jsonl]",
                   "trainer.save_limit=2", *keys_for(out), *extra])
        results[name] = loop_times(out)
    base = sum(results["no saves"][0]) / len(results["no saves"][0])
    shutil.rmtree(root)
    print(f"\n{args.steps} steps, a save every {args.save_freq}, model size {args.size}\n")
    print("| run | mean loop time / step (s) | blocking in save_checkpoint / save (s) | time lost / save (s) |")
    print("|---|---:|---:|---:|")
    for name, (times, saves) in results.items():
        mean, blocked = sum(times) / len(times), [x for x in saves if x > 0]
        lost = (mean - base) * args.save_freq if name != "no saves" else 0.0
        block = f"{sum(blocked) / len(blocked):.3f}" if blocked else "-"
        print(f"| {name} | {mean:.3f} | {block} | {lost:+.3f} |")


if __name__ == "__main__":
    main()
