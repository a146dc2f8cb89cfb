"""rllava against TRL's GRPOTrainer on this machine: completions/s and tokens/s, side by side.

    python benchmarks/vs_trl.py [--pairs 3] [--steps 6] [--size demo|wide] [--out outputs/bench/vs_trl]

Both train the same tiny random Qwen2-VL directory (`rllava.model.tiny`, `--size wide` = 4x the demo width) on
the same 256 synthetic counting records with the same recipe: K=8 samples of 8 prompts (64 completions) per step,
at most 16 new tokens at temperature 1, lr 1e-5 constant, no KL, token-mean loss (TRL's `dapo`), one optimizer
step per step, gradient norm clipped at 1, the same prompt template and reward (`compute_score` here: the
counting reward plus a small dense term, so that a random model's advantages are not all zero). TRL runs in its own
virtualenv (`.venv-trl`, made here from benchmarks/requirements-trl.txt); its processor is rllava's image-only
one, since there is no CPU torchvision. Runs alternate T R T R ... so a drift of the machine hits both; each
run's first step (warm-up) is excluded. Prints completions/s and completion tokens/s of both, the ratio of each
pair and its median, rllava's stage split, and the update's MFU: the FLOPs the update executes (6 x parameters x
tokens, forward and backward, the vision tower counted over its patches; with the shared-prefix forward a group's
prompt and image count once, not K times) over this machine's fp32 matmul peak, measured here.

A side alone (used by the orchestration, or to profile one): `--side trl|rllava --model DIR --data DIR --run DIR`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRL_VENV = os.path.join(REPO, ".venv-trl")
K, PROMPTS, NEW_TOKENS, LR = 8, 8, 16, 1e-5
TEMPLATE = os.path.join(REPO, "examples", "format_prompt", "counting.jinja")
STAGES = ("rollout", "reward", "old_logprob", "advantage", "update")  # rllava's timing/<stage> of a step


def compute_score(response: str, ground_truth) -> dict:
    """The counting reward (examples/reward_function/counting.py) plus 0.1 x the share of digits in the response,
    so a random model's groups differ in reward and both trainers run a real update (all-zero advantages would
    let either skip work)."""
    score = _counting().score_one(response, ground_truth)
    digits = sum(c.isdigit() for c in response) / max(len(response), 1)
    return {**score, "overall": score["overall"] + 0.1 * digits}


@functools.cache
def _counting():
    import importlib.util

    spec = importlib.util.spec_from_file_location("counting_reward", COUNTING)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


COUNTING = os.path.join(REPO, "examples", "reward_function", "counting.py")


# ---- TRL's side (runs inside .venv-trl) ------------------------------------------------------------------------

def run_trl(model_dir: str, data_dir: str, run_dir: str, steps: int, *, lr: float = LR,
            new_tokens: int = NEW_TOKENS, score=compute_score, budget_s: float | None = None,
            marks: tuple[float, ...] = (), device: str = "cpu", prompts: int = PROMPTS, k: int = K,
            micro: int | None = None) -> None:
    """GRPOTrainer for `steps` steps (or until its steps have taken `budget_s` seconds); writes run_dir/steps.json:
    per step, seconds, mean completion length and tokens (prompt + completion, TRL's `num_tokens`). One optimizer
    step a generation of `prompts` x `k` completions, `micro` sequences a forward/backward (default: all);
    on CUDA in bf16 with gradient checkpointing (benchmarks/gpu_check.py's research scenario). At each of `marks` (seconds of training, saves not counted)
    the weights as they were at that moment go to run_dir/marks/<mark>/ (benchmarks/learning_vs_trl.py)."""
    import jinja2
    import torch
    from datasets import Dataset
    from PIL import Image
    from transformers import AutoModelForImageTextToText, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rllava.model.processor import load_processor

    template = jinja2.Template(open(TEMPLATE).read())
    rows = [json.loads(line) for line in open(os.path.join(data_dir, "train.jsonl"))]

    def example(r):  # TRL puts the images before the user's text, where rllava puts the record's leading <image>
        text = template.render(content=r["problem"].replace("<image>", ""))
        return {"prompt": [{"role": "user", "content": text}], "answer": str(r["answer"]),
                "images": [Image.open(os.path.join(data_dir, r["images"][0])).convert("RGB")]}

    data = Dataset.from_list([example(r) for r in rows])

    def reward(completions, answer, **_):
        return [score(c[0]["content"], a)["overall"] for c, a in zip(completions, answer)]

    class Times(TrainerCallback):
        def __init__(self):
            self.rows, self.start, self.before = [], 0.0, None  # before: the weights when the last step began

        def on_step_begin(self, args, state, control, model=None, **kw):
            if marks:  # kept outside the clock: a mark crossed during this step saves the weights from before it
                self.before = {k: v.detach().clone() for k, v in model.state_dict().items()}
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kw):
            self.rows.append({"seconds": time.perf_counter() - self.start})
            elapsed = sum(r["seconds"] for r in self.rows)
            for mark in [m for m in marks if elapsed - self.rows[-1]["seconds"] <= m < elapsed]:
                snapshot = os.path.join(run_dir, "marks", f"{mark:g}")
                model.save_pretrained(snapshot, state_dict=self.before)
                for name in os.listdir(model_dir):  # the processor's and tokenizer's files, as they came
                    if not name.startswith(("model", "config.json", "generation_config")):
                        shutil.copy(os.path.join(model_dir, name), snapshot)
            if budget_s is not None and elapsed >= budget_s:
                control.should_training_stop = True

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs and self.rows:
                self.rows[-1]["length"] = logs["completions/mean_length"]
                self.rows[-1]["tokens"] = logs["num_tokens"] - sum(r.get("tokens", 0) for r in self.rows[:-1])
                with open(os.path.join(run_dir, "steps.json"), "w") as f:  # as each step ends: a run cut off keeps it
                    json.dump(self.rows, f)

    cuda = device == "cuda"
    micro = micro or k * prompts
    args = GRPOConfig(
        output_dir=run_dir, use_cpu=not cuda, bf16=cuda, fp16=False, seed=0, report_to=[], save_strategy="no",
        logging_steps=1, max_steps=steps, per_device_train_batch_size=micro, num_generations=k,
        steps_per_generation=k * prompts // micro, num_iterations=1, gradient_accumulation_steps=k * prompts // micro,
        gradient_checkpointing=cuda, max_completion_length=new_tokens,
        temperature=1.0, top_p=1.0, learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, beta=0.0, loss_type="dapo", dataloader_num_workers=0,
        disable_tqdm=True)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.bfloat16 if cuda else torch.float32,
                                                        attn_implementation="sdpa")
    times = Times()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                          processing_class=load_processor(model_dir), callbacks=[times])
    trainer.train()
    with open(os.path.join(run_dir, "steps.json"), "w") as f:
        json.dump(times.rows, f)


# ---- rllava's side ---------------------------------------------------------------------------------------------

def keys_for(run_dir: str) -> list[str]:
    from rllava.train.outputs import keys_for as keys  # rllava's venv only: this file also runs in TRL's

    return keys(run_dir)


def rllava_command(model_dir: str, data_dir: str, run_dir: str, steps: int, keys: list[str]) -> list[str]:
    return [sys.executable, "-m", "rllava.train.pipeline.rlvr", "config=examples/tasks/counting/tiny_cpu.yaml",
            f"actor.model.model_path={model_dir}", f"data.train_files={data_dir}/train.jsonl",
            f"data.val_files={data_dir}/val.jsonl", f"data.max_response_length={NEW_TOKENS}",
            f"data.train_batch_size={PROMPTS}", f"rollout.n={K}", f"actor.optim.lr={LR}",
            "actor.optim.lr_scheduler_type=constant", f"trainer.max_steps={steps}", "trainer.val_before_train=false",
            "trainer.val_freq=-1", "trainer.logger=[jsonl]", *keys_for(run_dir),
            "trainer.overwrite=true", f"reward.reward_function={os.path.abspath(__file__)}:compute_score", *keys]


def rllava_steps(run_dir: str) -> list[dict]:
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    rows = [r for r in rows if "timing/step" in r]
    return [{"seconds": r["timing/step"], "length": r["response_length/mean"], "prompt": r["prompt_length/mean"],
             **{k.split("/")[1]: v for k, v in r.items() if k.startswith("timing/") and k != "timing/step"}}
            for r in rows]


# ---- orchestration ---------------------------------------------------------------------------------------------

def bench_env() -> dict:
    """The runs' environment: every core unless OMP_NUM_THREADS says otherwise, output unbuffered."""
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(os.cpu_count())),
            "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def ensure_trl_venv() -> str:
    python = os.path.join(TRL_VENV, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", TRL_VENV], check=True)
        pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run(pip + ["torch==2.13.0"], check=True)  # first, alone: the CPU wheel
        subprocess.run(pip + ["-r", os.path.join(REPO, "benchmarks", "requirements-trl.txt")], check=True, cwd=REPO)
    return python


def matmul_peak(n: int = 1024, repeat: int = 20) -> float:
    """This machine's measured fp32 matmul FLOP/s (best of `repeat` n x n products)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeat))
    return 2 * n ** 3 / best


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def parameter_counts(model_dir: str) -> tuple[int, int, int]:
    """(language-model parameters outside the embedding table, vision-tower parameters, vision patches per
    image) of the model: a matmul-FLOP count per token is 2x the first, per patch 2x the second."""
    import torch
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    visual = model.model.visual
    n_vision = sum(p.numel() for p in visual.parameters())
    n_embed = model.get_input_embeddings().weight.numel()
    n_total = sum(p.numel() for p in model.parameters())
    return n_total - n_vision - n_embed, n_vision, 64  # 112 x 112 px at patch 14: 8 x 8 patches


def summarize(rows: list[dict]) -> dict:
    rows = rows[1:]  # the first step warms up (allocations, lazy imports)
    seconds = sum(r["seconds"] for r in rows)
    tokens = sum(r["length"] for r in rows) * K * PROMPTS
    out = {"completions_per_s": len(rows) * K * PROMPTS / seconds, "tokens_per_s": tokens / seconds,
           "step_s": seconds / len(rows), "length": tokens / (len(rows) * K * PROMPTS)}
    if all("prompt" in r for r in rows):
        out["prompt"] = sum(r["prompt"] for r in rows) / len(rows)
    for stage in STAGES:
        if all(stage in r for r in rows):
            out[stage] = sum(r[stage] for r in rows) / len(rows)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=6, help="steps per run (the first is excluded)")
    p.add_argument("--size", default="demo", choices=["demo", "wide"])
    p.add_argument("--out", default="outputs/bench/vs_trl")
    p.add_argument("--keys", nargs="*", default=[], help="extra rllava keys (e.g. actor.model.shared_prefix=false)")
    p.add_argument("--report-only", action="store_true", help="re-read the runs already in --out, run nothing")
    p.add_argument("--side", choices=["trl", "rllava"], help="run one side only (see the docstring)")
    p.add_argument("--model"), p.add_argument("--data"), p.add_argument("--run")
    p.add_argument("--device", default="cpu"), p.add_argument("--micro", type=int, default=None)
    p.add_argument("--prompts", type=int, default=PROMPTS), p.add_argument("--k", type=int, default=K)
    p.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    a = p.parse_args(argv)
    if a.side == "trl":
        return run_trl(a.model, a.data, a.run, a.steps, device=a.device, prompts=a.prompts, k=a.k, micro=a.micro,
                       new_tokens=a.new_tokens)
    if a.side == "rllava":
        subprocess.run(rllava_command(a.model, a.data, a.run, a.steps, a.keys), check=True, cwd=REPO)
        return None

    from rllava.data.synthetic import make_dataset
    from rllava.model.tiny import build_tiny

    out = os.path.abspath(a.out)
    model_dir, data_dir = os.path.join(out, f"model_{a.size}"), os.path.join(out, "data")
    if not os.path.isdir(model_dir):
        build_tiny("qwen2_vl", model_dir, size=a.size, seed=0)
    if not os.path.isdir(data_dir):
        make_dataset("counting", data_dir, n_train=256, n_val=8, seed=0)
    trl_python = None if a.report_only else ensure_trl_venv()
    env = bench_env()
    results = {"trl": [], "rllava": []}
    for pair in range(a.pairs):
        for side in ("trl", "rllava"):
            run_dir = os.path.join(out, f"{side}_{a.size}_{pair}")
            if not a.report_only:
                os.makedirs(run_dir, exist_ok=True)
                cmd = ([trl_python, os.path.abspath(__file__), "--side", "trl", "--model", model_dir, "--data",
                        data_dir, "--run", run_dir, "--steps", str(a.steps)] if side == "trl"
                       else rllava_command(model_dir, data_dir, run_dir, a.steps, a.keys))
                print(f"[pair {pair}] {side} ...", flush=True)
                with open(os.path.join(run_dir, "log.txt"), "w") as log:
                    subprocess.run(cmd, check=True, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
            rows = (json.load(open(os.path.join(run_dir, "steps.json"))) if side == "trl"
                    else rllava_steps(run_dir))
            results[side].append(summarize(rows))
    print(report(results, model_dir, a.size, a.keys))


def report(results: dict, model_dir: str, size: str, keys: list[str]) -> str:
    ratios = [r["completions_per_s"] / t["completions_per_s"] for t, r in zip(results["trl"], results["rllava"])]
    lines = [f"rllava vs TRL GRPOTrainer, tiny Qwen2-VL ({size}), {K * PROMPTS} completions/step, "
             f"<= {NEW_TOKENS} new tokens, {os.cpu_count()} CPU threads",
             "", "| pair | TRL completions/s | rllava completions/s | ratio | TRL tokens/s | rllava tokens/s |",
             "|---|---|---|---|---|---|"]
    for i, (t, r) in enumerate(zip(results["trl"], results["rllava"])):
        lines.append(f"| {i} | {t['completions_per_s']:.2f} | {r['completions_per_s']:.2f} | {ratios[i]:.2f}x | "
                     f"{t['tokens_per_s']:.1f} | {r['tokens_per_s']:.1f} |")
    lines.append(f"\nmedian ratio: {statistics.median(ratios):.2f}x")
    stages = [s for s in STAGES if s in results["rllava"][0]]
    split = {s: statistics.mean(r[s] for r in results["rllava"]) for s in stages}
    step = statistics.mean(r["step_s"] for r in results["rllava"])
    lines.append("rllava step split: " + ", ".join(f"{s} {v:.2f}s ({100 * v / step:.0f} %)" for s, v in split.items())
                 + f" of {step:.2f}s")
    if "update" in split:
        lm, vision, patches = parameter_counts(model_dir)
        length = statistics.mean(r["length"] for r in results["rllava"])
        prompt_tokens = statistics.mean(r["prompt"] for r in results["rllava"])
        shared = "actor.model.shared_prefix=false" not in keys
        # FLOPs the update executes: with the shared-prefix forward each group's prompt (and image) runs once and
        # its K responses after it; without it, K full copies of prompt and response (what TRL runs)
        rows_flops = lm * (prompt_tokens + K * length) + vision * patches if shared else \
            K * (lm * (prompt_tokens + length) + vision * patches)
        flops = 6 * PROMPTS * rows_flops
        peak = matmul_peak()
        lines.append(f"update MFU: {100 * flops / split['update'] / peak:.1f} % of the measured fp32 matmul peak "
                     f"{peak / 1e9:.1f} GFLOP/s ({lm / 1e6:.1f} M LM + {vision / 1e6:.1f} M vision parameters, "
                     f"{prompt_tokens:.0f} prompt + {length:.1f} response tokens a row, "
                     + ("the prompt counted once per group of K)" if shared else "counted as K separate rows)"))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
