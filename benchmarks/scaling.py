"""How rllava's step grows with the work: step time by stage and peak memory as K, the response length, the
prompts per step and the image size each grow (the others at benchmarks/vs_trl.py's recipe).

    python benchmarks/scaling.py [--steps 4] [--out outputs/bench/scaling] [--keys k=v ...]

Each point is a separate rllava run of `--steps` GRPO steps on the tiny random Qwen2-VL (`--size demo`) and a
synthetic counting set drawn at that image size; its first step is excluded. The peak RSS is the run's own
(`os.wait4`). Prints one table per swept quantity, and the growth of each stage between the smallest and largest
point against the growth of the work (x); writes `scaling.png` (seconds per stage against each quantity).
A random model rarely ends a response early, so the response length is the budget.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vs_trl import K, NEW_TOKENS, PROMPTS, REPO, bench_env, rllava_command, rllava_steps  # noqa: E402

IMAGE = 112
SWEEPS = {  # quantity -> (values, keys of one point)
    "K": ([4, 8, 16], lambda v: [f"rollout.n={v}"]),
    "response tokens": ([16, 32, 64], lambda v: [f"data.max_response_length={v}"]),
    "prompts per step": ([4, 8, 16], lambda v: [f"data.train_batch_size={v}", f"actor.ppo_mini_batch_size={v}"]),
    "image side (px)": ([56, 112, 224], lambda v: []),
}
STAGES = ("rollout", "update", "reward", "advantage")


def run_point(model_dir: str, data_dir: str, run_dir: str, steps: int, keys: list[str]) -> dict:
    """One run: mean seconds per step and per stage (its first step excluded) and its peak RSS."""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "log.txt"), "w") as log:
        proc = subprocess.Popen(rllava_command(model_dir, data_dir, run_dir, steps, keys), cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT, env=bench_env())
        _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"run failed ({run_dir}/log.txt)")
    rows = rllava_steps(run_dir)[1:]
    out = {"step_s": sum(r["seconds"] for r in rows) / len(rows), "peak_rss_mb": usage.ru_maxrss / 1024}
    for stage in STAGES:
        out[stage] = sum(r.get(stage, 0.0) for r in rows) / len(rows)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", default="outputs/bench/scaling")
    p.add_argument("--keys", nargs="*", default=[],
                   help="rllava keys for every point (e.g. actor.model.shared_prefix=false)")
    a = p.parse_args(argv)
    from rllava.data.synthetic import make_dataset
    from rllava.model.tiny import build_tiny

    out = os.path.abspath(a.out)
    model_dir = os.path.join(out, "model")
    if not os.path.isdir(model_dir):
        build_tiny("qwen2_vl", model_dir, size="demo", seed=0)
    results = {}
    for name, (values, keys_of) in SWEEPS.items():
        for v in values:
            size = v if name.startswith("image") else IMAGE
            data_dir = os.path.join(out, f"data_{size}")
            if not os.path.isdir(data_dir):
                make_dataset("counting", data_dir, n_train=256, n_val=8, seed=0, size=size)
            keys = [f"data.max_pixels={size * size}", f"data.min_pixels={min(size * size, 3136)}", *keys_of(v), *a.keys]
            run = os.path.join(out, f"{name.split()[0]}_{v}")
            print(f"{name} = {v} ...", flush=True)
            results.setdefault(name, []).append((v, run_point(model_dir, data_dir, run, a.steps, keys)))
    with open(os.path.join(out, "scaling.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(report(results))
    plot(results, os.path.join(out, "scaling.png"))


def report(results: dict) -> str:
    lines = [f"rllava step by stage as the work grows (base: K={K}, {PROMPTS} prompts, <= {NEW_TOKENS} new tokens, "
             f"{IMAGE} px images; tiny random Qwen2-VL, {os.cpu_count()} CPU threads)", ""]
    for name, points in results.items():
        lines += [f"| {name} | step s | " + " | ".join(f"{s} s" for s in STAGES) + " | peak RSS MB |",
                  "|---|---|" + "---|" * len(STAGES) + "---|"]
        for v, r in points:
            lines.append(f"| {v} | {r['step_s']:.2f} | " + " | ".join(f"{r[s]:.2f}" for s in STAGES)
                         + f" | {r['peak_rss_mb']:.0f} |")
        (v0, r0), (v1, r1) = points[0], points[-1]
        growth = ", ".join(f"{s} x{r1[s] / r0[s]:.1f}" for s in ("rollout", "update") if r0[s] > 0)
        lines += [f"\n{name} x{v1 / v0:g}: step x{r1['step_s'] / r0['step_s']:.1f} ({growth})", ""]
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.4), squeeze=False)
    for ax, (name, points) in zip(axes[0], results.items()):
        xs = [v for v, _ in points]
        for key in ("step_s", "rollout", "update"):
            ax.plot(xs, [r[key] for _, r in points], marker="o", label=key.replace("_s", ""))
        ax.set_xlabel(name), ax.set_ylabel("seconds per step"), ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
