"""Long runs hold steady: N RLVR steps on the tiny model, and what grows while they run.

    python benchmarks/soak.py [--steps 300] [--every 0] [--keep DIR]

Builds the tiny Qwen2-VL and the synthetic counting set in a temporary directory, runs `--steps` GRPO steps of
`examples/tasks/counting/tiny_cpu.yaml` (no validation, no checkpoints, jsonl metrics) in this process, and
after every step records the resident memory (RSS), the step's time, and the live objects of the kinds a
leak would pile up: tensors, PIL images, trajectories/samples (generations) and gc-tracked objects overall.
Prints a table every `--every` steps (default: 10 rows), then

    RSS growth   RSS at the end - RSS after the warm-up (the first 10% of steps, at least 5)   goal < 50 MB
    step drift   mean step time over the last 10% / over the 10% after the warm-up          goal ~ 1.0
    objects      tensors / images / trajectories alive at the end vs after the warm-up       goal: flat

Not run by CI (minutes of CPU). Measured with --steps 60 on 2 shared CPU cores (35 s): RSS 744 -> 755 MB,
growth after the warm-up -5 MB (the allocator moves it +-35 MB between steps), step-time drift 0.90x, and
tensors 263 -> 263, images 8 -> 8, trajectories 64 -> 64 (the current step's), gc objects flat.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def live_objects() -> dict[str, int]:
    """Counts of the objects a step creates and must not keep: tensors, images, generations."""
    import torch
    from PIL import Image

    from rllava.data.protocol import Sample, Trajectory

    gc.collect()
    counts = {"tensors": 0, "images": 0, "trajectories": 0, "samples": 0}
    objects = gc.get_objects()
    with warnings.catch_warnings():  # isinstance on torch's deprecated module attributes warns
        warnings.simplefilter("ignore", FutureWarning)
        for o in objects:
            if isinstance(o, torch.Tensor):
                counts["tensors"] += 1
            elif isinstance(o, Image.Image):
                counts["images"] += 1
            elif isinstance(o, Trajectory):
                counts["trajectories"] += 1
            elif isinstance(o, Sample):
                counts["samples"] += 1
    counts["gc_objects"] = len(objects)
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=0, help="table row every N steps (0: steps // 10)")
    parser.add_argument("--keep", default=None, help="build model, data and outputs here instead of a temp dir")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path.insert(0, REPO)
    os.chdir(REPO)  # the task config names ./examples/... paths

    from rllava.config import load_config
    from rllava.data.synthetic import make_counting
    from rllava.model.tiny import build_tiny
    from rllava.train import loop
    from rllava.train.pipeline import rlvr

    root = args.keep or tempfile.mkdtemp(prefix="rllava-soak-")
    model = build_tiny("qwen2_vl", os.path.join(root, "model"), size="small")
    data = os.path.join(root, "counting")
    make_counting(data, n_train=256, n_val=8, seed=0)
    cfg = load_config(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model}",
                       f"data.train_files={data}/train.jsonl", "data.val_files=null",
                       f"trainer.max_steps={args.steps}", "trainer.val_before_train=false", "trainer.val_freq=-1",
                       "trainer.save_freq=-1", "trainer.logger=[jsonl]", "trainer.overwrite=true",
                       f"trainer.outputs_dir={os.path.join(root, 'outputs')}"])

    every = args.every or max(1, args.steps // 10)
    warmup = max(5, args.steps // 10)
    rows, times, marks = [], [], {}
    check_finite = loop.check_finite

    def record(metrics, step, cfg):  # called once per step, after the step's metrics are complete
        check_finite(metrics, step, cfg)
        times.append(metrics["timing/step"])
        rss = rss_mb()
        if step == warmup or step == args.steps:
            marks[step] = (rss, live_objects())
        if step % every == 0 or step in (1, warmup, args.steps):
            rows.append((step, rss, metrics["timing/step"], metrics.get("reward/mean", float("nan"))))
            print(f"step {step:4d}  rss {rss:8.1f} MB  step {metrics['timing/step']:6.3f} s", flush=True)

    loop.check_finite = record
    start = time.time()
    rlvr.train(cfg)
    loop.check_finite = check_finite

    print(f"\n{args.steps} steps in {time.time() - start:.0f}s ({root})\n")
    print("| step | RSS (MB) | step time (s) | reward/mean |\n|---:|---:|---:|---:|")
    for step, rss, t, reward in rows:
        print(f"| {step} | {rss:.1f} | {t:.3f} | {reward:.3f} |")
    (rss0, obj0), (rss1, obj1) = marks[warmup], marks[args.steps]
    span = max(1, args.steps // 10)
    early = sum(times[warmup:warmup + span]) / len(times[warmup:warmup + span])
    late = sum(times[-span:]) / span
    print(f"\nRSS growth after the warm-up (step {warmup} -> {args.steps}): {rss1 - rss0:+.1f} MB (goal < 50 MB)")
    print(f"step-time drift: {late / early:.2f}x (mean {early:.3f}s over steps {warmup + 1}-{warmup + span}, "
          f"{late:.3f}s over the last {span})")
    print("live objects (step {} -> {}): {}".format(warmup, args.steps, ", ".join(
        f"{k} {obj0[k]} -> {obj1[k]}" for k in obj0)))


if __name__ == "__main__":
    main()
