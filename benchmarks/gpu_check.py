"""The one-shot GPU check (issue 34): measured device memory per phase beside rllava.memory's plan, on real sizes.

    python benchmarks/gpu_check.py [--out gpu_check.md] [--models qwen2.5-vl-3b qwen3-vl-4b] [--engines single fsdp2]
    python benchmarks/gpu_check.py --tiny --device cpu --out /tmp/gpu_check.md     # the same code, in the fast suite

For each model x train engine, 3 GRPO steps through rllava's normal path (`rlvr.train(load_config([...]))`, the
counting task's config `examples/tasks/counting/tiny_cpu.yaml` with the sizes below), each run in its own process
on a GPU (a clean allocator, and an OOM in one run leaves the others' rows; on CPU all in this process).
Models: random-init Qwen2.5-VL-3B and Qwen3-VL-4B built from their published config (`rllava.memory.SEED_MODELS`)
with the tiny models' offline tokenizer and processor (`rllava.model.tiny`; the special-token ids are the
tokenizer's, the vocabulary stays the real one), saved with `save_pretrained` (under --root, reused by the second
engine and by a rerun) and loaded by the run; bf16, sdpa, gradient checkpointing, HF rollout.
Engines: `actor.strategy=single`, and `fsdp2` as one rank (rllava's own world-of-one process group, no torchrun).

Sizes: 4 prompts x rollout.n 4 = 16 sequences a step, prompt <= 256 tokens (a 224 px image: 64 image tokens on
Qwen2.5-VL), response 128 tokens (random weights rarely stop early); mini-batch 2 prompts (two optimizer steps a
step, so the old-log-prob pass runs and the rollout-vs-trainer gap is logged), micro-batch 4 sequences,
log-prob micro-batch 8, one generate call of 4 prompts x 4 samples.

Measured, per run:
  peak per phase   torch.cuda.max_memory_allocated over each call of Rollout.generate (rollout), Actor.compute_
                   logprobs (old log-prob), Actor.update less its optimizer steps (update) and the train engine's
                   optimizer_step (optimizer); the peak stats are reset as each phase starts (a nested phase: the
                   outer one's peak so far is kept, and reset again after it); the max over the 3 steps. CPU: n/a.
  planned          rllava.memory.plan(cfg) for the same config, the same phase names (fsdp2: one rank, planned
                   through FSDP2 itself; made before the run's own process group exists).
  tokens/s         rllava's `perf/tokens_per_s` (prompt + response tokens of a step / step seconds), mean of steps
                   after the first (the first compiles kernels), from the run's metrics.jsonl.
  MFU              6 x trainable params x update tokens (attention-masked tokens of the batch, each forwarded and
                   back-propagated once) / update seconds (Actor.update's wall time, its optimizer steps included,
                   steps after the first) / the bf16 matmul peak measured
                   here (8192^3 torch.matmul, timed with CUDA events). Gradient checkpointing's extra forward is not
                   counted (as MFU conventionally does not). CPU: n/a.
  logprob gap      rllava's `rollout/logprob_gap_mean`: |HF generate's sampling log-prob - the trainer's old
                   log-prob| over the trained tokens, mean over the steps.

The final model save (`outputs/final`) is skipped (a no-op save_model): it would write GBs per run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {"qwen2.5-vl-3b": "Qwen/Qwen2.5-VL-3B-Instruct", "qwen3-vl-4b": "Qwen/Qwen3-VL-4B-Instruct"}
TINY_MODELS = {"tiny-qwen2.5-vl": "qwen2_5_vl"}  # --tiny: rllava.model.tiny's arch, size "small"
ENGINES = ("single", "fsdp2")
PHASES = ("rollout", "old log-prob", "update", "optimizer")
GiB = 1024 ** 3


def overrides(model_dir: str, data: dict, run_dir: str, engine: str, device: str, tiny: bool) -> list[str]:
    """The run's config: the counting task's, at the sizes of the module docstring (--tiny: 1 step, shorter)."""
    from rllava.train.outputs import keys_for

    sizes = dict(steps=1, response=8, prompt=128, pixels=12544) if tiny else \
        dict(steps=3, response=128, prompt=256, pixels=224 * 224)
    return ["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model_dir}",
            f"data.train_files={data['train']}", "data.val_files=null",
            "data.train_batch_size=4", "rollout.n=4", "rollout.micro_batch_size=4", "actor.ppo_mini_batch_size=2",
            "actor.ppo_micro_batch_size=4", "actor.log_prob_micro_batch_size=8",
            f"data.max_prompt_length={sizes['prompt']}", f"data.max_response_length={sizes['response']}",
            f"data.max_pixels={sizes['pixels']}", f"trainer.max_steps={sizes['steps']}",
            "actor.model.enable_gradient_checkpointing=true", "actor.model.attn_implementation=sdpa",
            f"actor.model.torch_dtype={'bfloat16' if device == 'cuda' else 'float32'}", f"actor.strategy={engine}",
            f"trainer.device={device}", "trainer.val_before_train=false", "trainer.val_freq=-1",
            "trainer.save_freq=-1", "trainer.logger=[jsonl]", "trainer.overwrite=true", *keys_for(run_dir)]


def build_model(name: str, out_dir: str, device: str) -> str:
    """A random-init checkpoint of seed model `name` (hub id) at `out_dir`: the published architecture, bf16, with
    rllava.model.tiny's offline tokenizer and processor (whose special-token ids the config takes)."""
    import torch
    from transformers import AutoModelForImageTextToText

    from rllava.memory import model_config
    from rllava.model.tiny import SIZES, _model_and_processor, build_tokenizer
    from rllava.utils.fs import atomic_directory

    if os.path.isdir(out_dir):
        return out_dir
    config = model_config(name)
    tok = build_tokenizer()
    _, _, processor = _model_and_processor(config.model_type, tok, SIZES["small"])  # only its processor
    for key, token in (("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
                       ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")):
        setattr(config, key, tok.convert_tokens_to_ids(token))
    text = config.get_text_config()
    text.bos_token_id, text.eos_token_id, text.pad_token_id = tok.pad_token_id, tok.eos_token_id, tok.pad_token_id
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = tok.pad_token_id, tok.eos_token_id
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out_dir


class PhasePeaks:
    """Peak device memory and seconds per phase, by wrapping the roles' and engines' methods (see the docstring)."""

    def __init__(self, cuda: bool):
        self.cuda, self.stack = cuda, []
        self.peak, self.calls = {}, []  # calls: (phase, seconds, tokens) in order
        self.originals = []  # (class, method name, original), for `unwrap`

    @contextlib.contextmanager
    def phase(self, name: str, tokens: int = 0):
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            if self.stack:  # keep the outer phase's peak so far
                outer = self.stack[-1]
                self.peak[outer] = max(self.peak.get(outer, 0), torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
        self.stack.append(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.synchronize()
                self.peak[name] = max(self.peak.get(name, 0), torch.cuda.max_memory_allocated())
                torch.cuda.reset_peak_memory_stats()
            self.calls.append((name, time.perf_counter() - start, tokens))
            self.stack.pop()

    def wrap(self, cls, method: str, name: str, tokens=lambda *a: 0) -> None:
        original = getattr(cls, method)
        self.originals.append((cls, method, original))

        @functools.wraps(original)
        def run(*args, **kwargs):
            with self.phase(name, tokens(*args)):
                return original(*args, **kwargs)
        setattr(cls, method, run)

    def unwrap(self) -> None:
        for cls, method, original in reversed(self.originals):
            setattr(cls, method, original)
        self.originals = []


def matmul_peak(device: str, n: int = 8192, reps: int = 20) -> float:
    """Measured bf16 dense matmul FLOP/s on `device` (0 on CPU: no MFU there)."""
    import torch

    if device != "cuda":
        return 0.0
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * n ** 3 * reps / (start.elapsed_time(end) / 1e3)


def run_one(model: str, engine: str, root: str, device: str, tiny: bool) -> dict:
    """One run (in this process): build the model dir if absent, plan, train with the phases wrapped; the results."""
    cwd = os.getcwd()
    os.chdir(REPO)  # the task config names ./examples/... paths (format prompt, reward function)
    try:
        return _run_one(model, engine, os.path.abspath(os.path.join(cwd, root)), device, tiny)
    finally:
        os.chdir(cwd)


def _run_one(model: str, engine: str, root: str, device: str, tiny: bool) -> dict:
    import torch

    from rllava.config import load_config
    from rllava.engine.train.fsdp2 import FSDP2Engine
    from rllava.engine.train.single import SingleDeviceEngine
    from rllava.memory import plan
    from rllava.roles.actor import Actor
    from rllava.roles.rollout import Rollout
    from rllava.train import loop
    from rllava.train.pipeline import rlvr

    model_dir = os.path.join(root, "models", model)
    if tiny:
        from rllava.model.tiny import build_tiny
        if not os.path.isdir(model_dir):
            build_tiny(TINY_MODELS[model], model_dir, size="small")
    else:
        build_model(MODELS[model], model_dir, device)
    data = {"train": os.path.join(root, "data", "train.jsonl")}
    run_dir = os.path.join(root, "runs", f"{model}-{engine}")
    cfg = load_config(overrides(model_dir, data, run_dir, engine, device, tiny))
    planned = {row["phase"]: row["peak"] for row in plan(cfg, device=device)}

    cuda = device == "cuda"
    peaks, params = PhasePeaks(cuda), []
    peaks.wrap(Rollout, "generate", "rollout")
    peaks.wrap(Actor, "compute_logprobs", "old log-prob")
    peaks.wrap(Actor, "update", "update", lambda actor, batch, *a: (
        params.append(sum(p.numel() for p in actor.model.parameters() if p.requires_grad)) or
        int(batch.attention_mask.sum()) * actor.ppo_epochs))
    for cls in (SingleDeviceEngine, FSDP2Engine):
        peaks.wrap(cls, "optimizer_step", "optimizer")
    save_model, loop.save_model = loop.save_model, lambda *a, **k: None  # no outputs/final: GBs of writing per run
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        rlvr.train(cfg)
    finally:
        peaks.unwrap()
        loop.save_model = save_model

    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    steps = [s for s in steps if "perf/tokens_per_s" in s]
    later = steps[1:] or steps  # after the first step (kernel compilation, allocator warm-up)

    def mean(key, rows):
        values = [r[key] for r in rows if key in r]
        return sum(values) / len(values) if values else None

    updates = [c for c in peaks.calls if c[0] == "update"]
    updates = updates[len(updates) // len(steps):] if len(steps) > 1 else updates  # steps after the first
    return {"model": model, "engine": engine, "measured": {p: peaks.peak.get(p) for p in PHASES},
            "planned": {p: planned.get(p) for p in PHASES}, "tokens_per_s": mean("perf/tokens_per_s", later),
            "logprob_gap": mean("rollout/logprob_gap_mean", steps), "trainable_params": params[0] if params else 0,
            "update_tokens": sum(c[2] for c in updates), "update_seconds": sum(c[1] for c in updates),
            "steps": len(steps)}


def gib(x) -> str:
    return "n/a" if not x else f"{x / GiB:.2f}"


def table(results: list[dict], flops: float, device: str, sizes: str) -> str:
    """The markdown table: a row per (model, engine, phase), then a row per run."""
    lines = [f"GPU check on {device} ({sizes}); peaks in GiB, tensors only (torch.cuda.max_memory_allocated)",
             "",
             "| model | engine | phase | measured peak GiB | planned peak GiB | ratio |",
             "|---|---|---|---:|---:|---:|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['engine']} | (failed) | {r['error']} | | |")
            continue
        for p in PHASES:
            m, pl = r["measured"].get(p), r["planned"].get(p)
            ratio = f"{m / pl:.2f}" if m and pl else "n/a"
            lines.append(f"| {r['model']} | {r['engine']} | {p} | {gib(m)} | {gib(pl)} | {ratio} |")
    lines += ["", "| model | engine | steps | tokens/s | update MFU | logprob gap | trainable params |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        if "error" in r:
            continue
        mfu = 6 * r["trainable_params"] * r["update_tokens"] / r["update_seconds"] / flops \
            if flops and r["update_seconds"] else None
        gap = "n/a" if r["logprob_gap"] is None else f"{r['logprob_gap']:.4f}"
        mfu = "n/a" if mfu is None else f"{100 * mfu:.1f} %"
        lines.append(f"| {r['model']} | {r['engine']} | {r['steps']} | {r['tokens_per_s'] or 0:.1f} | {mfu} | {gap} | "
                     f"{r['trainable_params'] / 1e6:.1f} M |")
    if flops:
        lines += ["", f"bf16 matmul peak measured: {flops / 1e12:.0f} TFLOP/s"]
    return "\n".join(lines) + "\n"


def run_isolated(model: str, engine: str, root: str, device: str, args, out: str) -> dict:
    """`run_one` in a process of its own (a clean allocator; an OOM or a hang costs only this run's row)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--root", root, "--device", device,
           *(["--tiny"] if args.tiny else []), "--one", model, engine, out]
    start = time.time()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout, cwd=REPO)
        error = None if res.returncode == 0 else (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        if error:
            print(res.stderr[-4000:], file=sys.stderr)
    except subprocess.TimeoutExpired:
        error = f"timed out after {args.run_timeout} s"
    print(f"{model} {engine}: {'ok' if not error else error} ({time.time() - start:.0f} s)", flush=True)
    if error:
        return {"model": model, "engine": engine, "error": error.replace("|", "/")[:200]}
    with open(out) as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="gpu_check.md")
    p.add_argument("--models", nargs="+", default=None,
                   help=f"default: {' '.join(MODELS)} (--tiny: {' '.join(TINY_MODELS)})")
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--tiny", action="store_true", help="rllava.model.tiny's Qwen2.5-VL, 1 step (the fast test)")
    p.add_argument("--device", default=None, help="cuda | cpu (default: cuda when available)")
    p.add_argument("--root", default=None, help="models, data and runs go here (default: a temporary directory)")
    p.add_argument("--run-timeout", type=int, default=240, help="seconds per run (model build included)")
    p.add_argument("--subprocess", action="store_true", help="each run in its own process on CPU too (as on a GPU)")
    p.add_argument("--one", nargs=3, metavar=("MODEL", "ENGINE", "JSON"), help=argparse.SUPPRESS)  # internal
    args = p.parse_args(argv)
    sys.path.insert(0, REPO)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.one:  # a child: one run, its results as JSON
        model, engine, out = args.one
        with open(out, "w") as f:
            json.dump(run_one(model, engine, args.root, device, args.tiny), f)
        return out
    models = args.models or list(TINY_MODELS if args.tiny else MODELS)
    known = TINY_MODELS if args.tiny else MODELS
    if unknown := [m for m in models if m not in known]:
        p.error(f"--models: unknown {unknown}; choose from {list(known)}")

    from rllava.data.synthetic import make_dataset

    root = os.path.abspath(args.root or tempfile.mkdtemp(prefix="rllava-gpu-check-"))
    make_dataset("counting", os.path.join(root, "data"), n_train=64, n_val=0, seed=0, size=112 if args.tiny else 224)
    sizes = ("1 GRPO step, tiny sizes" if args.tiny else "3 GRPO steps, 4 prompts x 4 samples, prompt <= 256, "
             "response 128") + f", {'bf16' if device == 'cuda' else 'fp32'}, sdpa, gradient checkpointing, HF rollout"
    flops, name = matmul_peak(device), torch.cuda.get_device_name() if device == "cuda" else device
    results, text = [], ""
    for model in models:
        for engine in args.engines:
            out = os.path.join(root, f"{model}-{engine}.json")
            if device != "cuda" and not args.subprocess:  # CPU (the fast test): in this process, nothing to isolate
                results.append(run_one(model, engine, root, device, args.tiny))
            else:
                results.append(run_isolated(model, engine, root, device, args, out))
            text = table(results, flops, name, sizes)
            with open(args.out, "w") as f:  # after each run: a machine taken back mid-check keeps the rows so far
                f.write(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
