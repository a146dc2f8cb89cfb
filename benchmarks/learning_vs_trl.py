"""Learning per second: rllava and TRL's GRPOTrainer train the same SFT-warmed model for the same wall-clock budget;
one evaluator scores both at fixed marks. Slow (about 15 minutes at the defaults on 2 CPU cores).

    python benchmarks/learning_vs_trl.py [--budget 240] [--marks 8] [--lr 1e-4] [--out outputs/bench/learning_vs_trl]

The task is the proof's counting (`rllava.commands.proof`): a tiny random Qwen2-VL (demo size) warmed up by rllava's SFT
(examples/tasks/counting/tiny_cpu_sft.yaml), 4000 synthetic training records, 200 held-out. Both trainers then
run the counting recipe (examples/tasks/counting/tiny_cpu.yaml): K=8 samples of 8 prompts per step, at most 10 new
tokens at temperature 1, lr 1e-4 (`--lr`) constant (a decaying schedule would depend on each side's step count), no KL,
token-mean loss, one optimizer step per step, the counting reward (examples/reward_function/counting.py).

The clock is each side's own training time: the sum of its steps' seconds (rollout, reward, update), without
start-up and without the saves made for this benchmark. At each mark (budget x i / marks) the weights as they were
at that moment are kept: TRL's through a callback (benchmarks/vs_trl.py: `run_trl`), rllava's from its per-step
checkpoints (`trainer.save_freq=1`, hf_model only; the newest checkpoint at or before the mark). The shared
evaluator is one `trainer.val_only=true` run per snapshot (the same held-out set, sampling, seed and reward for
both), sampled accuracy (n=2 at temperature 1, the proof's metric) and greedy accuracy.

Prints the two curves and when rllava first reaches TRL's final and TRL's best sampled accuracy (goal: TRL's
final in at most half the budget);
writes learning_vs_trl.png and results.json under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vs_trl import REPO, _counting, bench_env, ensure_trl_venv, keys_for, run_trl  # noqa: E402

CONFIG = "examples/tasks/counting/tiny_cpu.yaml"
LR, NEW_TOKENS = 1e-4, 10  # at the proof's 3e-4 TRL collapses within 40 steps (docs/performance.md)


def counting_score(response: str, ground_truth) -> dict:
    return _counting().score_one(response, ground_truth)


def rl_keys(common: list[str], lr: float = LR) -> list[str]:
    return [f"config={CONFIG}", *common, f"actor.optim.lr={lr}", "actor.optim.lr_scheduler_type=constant",
            f"data.max_response_length={NEW_TOKENS}", "trainer.logger=[jsonl]", "trainer.overwrite=true"]


# ---- rllava's side: train, keeping the checkpoint that was newest at each mark ----------------------------------

def run_rllava(sft: str, common: list[str], run_dir: str, budget: float, marks: list[float], env: dict,
               lr: float = LR) -> int:
    """Train from `sft` until its steps have taken `budget` seconds; run_dir/marks/<mark>/ = the weights at each
    mark. Returns the steps taken."""
    cmd = [sys.executable, "-m", "rllava.train.pipeline.rlvr", *rl_keys(common, lr), f"actor.model.model_path={sft}",
           "trainer.max_steps=100000", "trainer.val_before_train=false", "trainer.val_freq=-1",
           "trainer.save_freq=1", "trainer.save_limit=3", "actor.checkpoint.save_contents=[hf_model]",
           *keys_for(run_dir)]
    metrics, checkpoints = os.path.join(run_dir, "metrics.jsonl"), os.path.join(run_dir, "checkpoints")
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "log.txt"), "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        ends, pending = [0.0], list(marks)  # ends[N]: the clock when step N ended
        while pending:
            if proc.poll() is not None:
                raise SystemExit(f"rllava stopped early ({run_dir}/log.txt)")
            time.sleep(0.1)
            if os.path.exists(metrics):
                rows = [json.loads(line) for line in open(metrics)]
                ends = [0.0]
                for r in rows:
                    if "timing/step" in r:
                        ends.append(ends[-1] + r["timing/step"])
            while pending and ends[-1] > pending[0]:  # checkpoint N is written before step N + 1 runs
                mark = pending.pop(0)
                step = max(n for n, end in enumerate(ends) if end <= mark)
                source = (sft if step == 0 else
                          os.path.join(checkpoints, f"global_step_{step}", "actor", "huggingface"))
                if not os.path.isdir(source):
                    raise SystemExit(f"checkpoint of step {step} pruned before it was kept; raise save_limit")
                shutil.copytree(source, os.path.join(run_dir, "marks", f"{mark:g}"))
        proc.terminate()
        proc.wait()
    return len(ends) - 1


# ---- the shared evaluator ---------------------------------------------------------------------------------------

def evaluate(model: str, common: list[str], out: str, env: dict) -> dict:
    """Held-out sampled and greedy accuracy of the model directory `model` (one val_only run)."""
    cmd = [sys.executable, "-m", "rllava.train.pipeline.rlvr", *rl_keys(common), f"actor.model.model_path={model}",
           "trainer.val_only=true", *keys_for(out)]
    with open(out + ".log", "w") as log:
        subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    row = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))][-1]
    return {"sampled": row["val/accuracy"], "greedy": row["val_greedy/accuracy"]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=240.0, help="seconds of training for each side")
    p.add_argument("--marks", type=int, default=8, help="evaluations over the budget (besides the start)")
    p.add_argument("--lr", type=float, default=LR, help="both sides' constant learning rate")
    p.add_argument("--out", default="outputs/bench/learning_vs_trl")
    p.add_argument("--side", choices=["trl"], help="TRL's side alone (used by the orchestration)")
    p.add_argument("--model"), p.add_argument("--data"), p.add_argument("--run")
    a = p.parse_args(argv)
    marks = [round(a.budget * i / a.marks, 3) for i in range(1, a.marks + 1)]
    if a.side == "trl":
        return run_trl(a.model, a.data, a.run, 100000, lr=a.lr, new_tokens=NEW_TOKENS, score=counting_score,
                       budget_s=a.budget, marks=tuple(marks))

    from rllava.commands.proof import TASKS, prepare, warm_up

    out = os.path.abspath(a.out)
    env = bench_env()
    sft = os.path.join(out, "sft", "final")
    common = prepare(TASKS["counting"], out) if not os.path.isdir(sft) else [
        f"data.train_files={out}/data/train.jsonl", f"data.val_files={out}/data/val.jsonl", "trainer.seed=0"]
    if not os.path.isdir(sft):
        warm_up(TASKS["counting"], out, common)
    trl_python = ensure_trl_venv()
    for side in ("trl", "rllava"):
        shutil.rmtree(os.path.join(out, side), ignore_errors=True)
    print(f"TRL: {a.budget:g} s of training ...", flush=True)
    os.makedirs(os.path.join(out, "trl"))
    with open(os.path.join(out, "trl", "log.txt"), "w") as log:
        subprocess.run([trl_python, os.path.abspath(__file__), "--side", "trl", "--model", sft, "--data",
                        os.path.join(out, "data"), "--run", os.path.join(out, "trl"), "--budget", str(a.budget),
                        "--marks", str(a.marks), "--lr", str(a.lr)],
                       cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    steps = {"trl": len(json.load(open(os.path.join(out, "trl", "steps.json"))))}
    print(f"rllava: {a.budget:g} s of training ...", flush=True)
    steps["rllava"] = run_rllava(sft, common, os.path.join(out, "rllava"), a.budget, marks, env, a.lr)

    start = evaluate(sft, common, os.path.join(out, "eval_start"), env)
    curves = {side: [(0.0, start)] for side in ("trl", "rllava")}
    for side in ("trl", "rllava"):
        for mark in marks:
            print(f"evaluating {side} at {mark:g} s ...", flush=True)
            curves[side].append((mark, evaluate(os.path.join(out, side, "marks", f"{mark:g}"), common,
                                                os.path.join(out, f"eval_{side}_{mark:g}"), env)))
    results = {"budget": a.budget, "lr": a.lr, "steps": steps, "curves": curves}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(report(results))
    plot(results, os.path.join(out, "learning_vs_trl.png"))


def report(results: dict) -> str:
    curves, budget, steps = results["curves"], results["budget"], results["steps"]
    lines = [f"Held-out counting accuracy (200 records) after s seconds of training, from one SFT-warmed tiny "
             f"Qwen2-VL, lr {results.get('lr', LR):g}; TRL took {steps['trl']} steps in {budget:g} s, rllava "
             f"{steps['rllava']}", "",
             "| s | TRL sampled | rllava sampled | TRL greedy | rllava greedy |", "|---|---|---|---|---|"]
    for (s, t), (_, r) in zip(curves["trl"], curves["rllava"]):
        lines.append(f"| {s:g} | {100 * t['sampled']:.1f} % | {100 * r['sampled']:.1f} % | "
                     f"{100 * t['greedy']:.1f} % | {100 * r['greedy']:.1f} % |")
    lines.append("")
    for name, (mark, target) in (("final", (budget, curves["trl"][-1][1]["sampled"])),
                                 ("best", max(((s, r["sampled"]) for s, r in curves["trl"][1:]), key=lambda x: x[1]))):
        reached = next((s for s, r in curves["rllava"] if r["sampled"] >= target), None)
        lines.append(f"TRL's {name} sampled accuracy {100 * target:.1f} % (at {mark:g} s): rllava first reaches it at "
                     + (f"{reached:g} s = {reached / budget:.2f} of the budget" if reached is not None
                        else "no mark (not within the budget)"))
    if curves["trl"][-1][1]["sampled"] <= curves["trl"][0][1]["sampled"]:
        lines.append("(TRL ended at or below the start: the 'final' goal (<= 0.50 of the budget) is met trivially)")
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for side, colour in (("trl", "tab:blue"), ("rllava", "tab:red")):
        points = results["curves"][side]
        ax.plot([s for s, _ in points], [100 * r["sampled"] for _, r in points], marker="o", color=colour,
                label=f"{side} ({results['steps'][side]} steps)")
    ax.axhline(100 * results["curves"]["trl"][-1][1]["sampled"], color="tab:blue", ls=":", lw=1)
    ax.set_xlabel("seconds of training"), ax.set_ylabel("held-out accuracy, sampled (%)")
    ax.set_title("GRPO on counting, same SFT start, same budget")
    ax.grid(alpha=0.3), ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
