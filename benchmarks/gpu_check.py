"""The one-shot GPU check (issue 34): measured device memory per phase beside rllava.train.memory's plan, on real sizes.

    python benchmarks/gpu_check.py [--out gpu_check.md] [--models qwen2.5-vl-3b qwen3-vl-4b] [--engines single fsdp2]
    python benchmarks/gpu_check.py --tiny --device cpu --out /tmp/gpu_check.md     # the same code, in the fast suite

For each model x train engine, 3 GRPO steps through rllava's normal path (`rlvr.train(load_config([...]))`, the
counting task's config `examples/tasks/counting/tiny_cpu.yaml` with the sizes below), each run in its own process
on a GPU (a clean allocator, and an OOM in one run leaves the others' rows; on CPU all in this process).
Models: random-init Qwen2.5-VL-3B and Qwen3-VL-4B built from their published config
(`rllava.train.memory.planner.SEED_MODELS`) with the tiny models' offline tokenizer and processor
(`rllava.model.tiny`; the special-token ids are the tokenizer's, the vocabulary stays the real one), saved with
`save_pretrained` (under --root, reused by the second engine and by a rerun) and loaded by the run; bf16, sdpa,
gradient checkpointing, HF rollout.
Engines: `actor.strategy=single`, and `fsdp2` as one rank (rllava's own world-of-one process group, no torchrun).
`--engines accelerate` (issue 56): `actor.strategy=accelerate` with Accelerate's FSDP2 plugin (the file
ACCELERATE_FSDP2: bf16, fsdp_version 2, TRANSFORMER_BASED_WRAP), its process as a torchrun of one (LOCAL_RANK=0:
Accelerate picks FSDP under a launcher only). It checks the path the CPU tests emulate: 3 steps finish (HF
generate on the gathered root, the update, the optimizer step), and the logprob gap stays that of the fsdp2 row
(bf16 noise; a gap near 1 or a crash in the rollout is the sharded root of issue 56 back):
    python benchmarks/gpu_check.py --models qwen2.5-vl-3b --engines fsdp2 accelerate --out accelerate.md

Sizes: 4 prompts x rollout.n 4 = 16 sequences a step, prompt <= 256 tokens (a 224 px image: 64 image tokens on
Qwen2.5-VL), response 128 tokens (random weights rarely stop early); mini-batch 2 prompts (two optimizer steps a
step, so the old-log-prob pass runs and the rollout-vs-trainer gap is logged), micro-batch 4 sequences,
log-prob micro-batch 8, one generate call of 4 prompts x 4 samples.

Measured, per run:
  peak per phase   torch.cuda.max_memory_allocated over each call of Rollout.generate (rollout), Actor.compute_
                   logprobs (old log-prob), Actor.update less its optimizer steps (update) and the train engine's
                   optimizer_step (optimizer); the peak stats are reset as each phase starts (a nested phase: the
                   outer one's peak so far is kept, and reset again after it); the max over the 3 steps. CPU: n/a.
  planned          rllava.train.memory.planner.plan(cfg) for the same config, the same phase names (fsdp2: one
                   rank, planned through FSDP2 itself; made before the run's own process group exists).
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

Issue 46's two scenarios (`--scenario`, one run each, the engine chosen by the config as a user's would be):
  rllava24   RLLaVA's own `examples/config.yaml` as the file is (16 prompts x 5, prompt / response 512, micro-batch
             1, gradient checkpointing, CPU offload switches: `actor.strategy=auto` = FSDP2 with CPU offload on one
             GPU, the KL loss's reference) on a random-init Qwen3-VL-4B, the card capped at 24 GiB
             (`torch.cuda.set_per_process_memory_fraction`); the data are counting records in RLLaVA's keys
             (problem / answer / images) with images of 448-640 px (up to 441 image tokens, inside the 512-token
             prompt, so `filter_overlong_prompts` keeps them all), scored by RLLaVA's math reward. rllava's own
             rollout keys (no RLLaVA key: it samples with vLLM) at `rollout.micro_batch_size=8` (40 sequences a
             generate call). The reference's log-prob pass is a phase of its own here.
  research   research scale on the whole card: random-init Qwen2.5-VL-3B, 32 prompts x 8 = 256 sequences a step,
             responses of 512 tokens (random weights do not stop early), 512 px images, one optimizer step a step
             (micro-batch 16), no KL (as TRL's default beta=0), the reward of benchmarks/vs_trl.py; then TRL's
             GRPOTrainer on the same GPU, model, data, reward and sizes (`benchmarks/vs_trl.py --side trl`: HF
             generate, bf16, gradient checkpointing, 16 sequences a micro-batch, one optimizer step a generation).
             tokens/s/GPU is verl's `perf/throughput`: every prompt + response token of a step / step seconds / GPUs
             (rllava's `perf/tokens_per_s`, one GPU), of the steps after the first; the rollout's share is
             `timing/rollout / timing/step`.
             The A/B of the HF engine's decode path (issue 46; on an H200 2026-11-28 compiled was no faster, so
             eager stays the default), rllava alone, one model directory for both (--root):
                 python benchmarks/gpu_check.py --scenario research --no-trl --root /tmp/gc --out eager.md
                 python benchmarks/gpu_check.py --scenario research --no-trl --root /tmp/gc --out compiled.md \
                     --keys rollout.hf_decode=compiled      # (and =static: the cache alone, no compile)
             compare tokens/s and the rollout share (the first step, which compiles, is left out of both); the
             log-prob gap must stay that of the eager run.
`--keys k=v ...` go to every run's config (after the scenario's) and head the table.
Each writes its rows as soon as a phase is measured (a run cut off by its timeout keeps the phases it reached).
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
TINY_MODELS = {"tiny-qwen2.5-vl": "qwen2_5_vl", "tiny-qwen3-vl": "qwen3_vl"}  # --tiny: rllava.model.tiny, "small"
ENGINES = ("single", "fsdp2")
PHASES = ("rollout", "old log-prob", "ref log-prob", "update", "optimizer")
# scenario: (model, tiny model, engines, card cap in GiB or None, image sizes in px)
SCENARIOS = {"check": (list(MODELS), ["tiny-qwen2.5-vl"], ENGINES, None, (224,)),
             "rllava24": (["qwen3-vl-4b"], ["tiny-qwen3-vl"], ("auto",), 24, (448, 512, 576, 640)),
             "research": (["qwen2.5-vl-3b"], ["tiny-qwen2.5-vl"], ("auto",), None, (512,))}
GiB = 1024 ** 3
ACCELERATE_FSDP2 = ("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nmixed_precision: bf16\n"
                    "num_processes: 1\nnum_machines: 1\nfsdp_config:\n  fsdp_version: 2\n"
                    "  fsdp_reshard_after_forward: true\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n")
MAX_EVENTS = 4_000_000  # --trace's ring of allocation events (a phase with more: the replay says it is cut)


def overrides(model_dir: str, data: dict, run_dir: str, engine: str, device: str, tiny: bool,
              scenario: str = "check") -> list[str]:
    """The run's config: the scenario's, at the sizes of the module docstring (--tiny: 1 step, shorter)."""
    from rllava.train.outputs import keys_for

    common = [f"actor.model.model_path={model_dir}", f"data.train_files={data['train']}", "data.val_files=null",
              f"trainer.device={device}", "trainer.val_before_train=false", "trainer.val_freq=-1",
              "trainer.save_freq=-1", "trainer.logger=[jsonl]", "trainer.overwrite=true", *keys_for(run_dir)]
    dtype = f"actor.model.torch_dtype={'bfloat16' if device == 'cuda' else 'float32'}"
    tiny_sizes = ["data.train_batch_size=4", "rollout.n=4", "data.max_response_length=8", "data.max_pixels=12544",
                  "trainer.max_steps=1"]
    if scenario == "rllava24":  # RLLaVA's file as it is: only model, data, the rollout's batching and steps given
        return ["config=examples/config.yaml", *common, "rollout.micro_batch_size=8", "trainer.max_steps=3",
                *(tiny_sizes + [dtype] if tiny else [])]
    if scenario == "research":
        return ["config=examples/tasks/counting/tiny_cpu.yaml", *common, dtype, f"actor.strategy={engine}",
                "data.train_batch_size=32", "rollout.n=8", "rollout.micro_batch_size=32",
                "actor.ppo_mini_batch_size=32", "actor.ppo_micro_batch_size=16", "actor.log_prob_micro_batch_size=32",
                "data.max_prompt_length=512", "data.max_response_length=512", f"data.max_pixels={512 * 512}",
                "trainer.max_steps=3", "algorithm.use_kl_loss=false", "actor.model.enable_gradient_checkpointing=true",
                "actor.model.attn_implementation=sdpa", "actor.optim.lr_scheduler_type=constant",
                f"reward.reward_function={os.path.join(REPO, 'benchmarks', 'vs_trl.py')}:compute_score",
                *(tiny_sizes + ["actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=8"] if tiny else [])]
    sizes = dict(steps=1, response=8, prompt=128, pixels=12544) if tiny else \
        dict(steps=3, response=128, prompt=256, pixels=224 * 224)
    return ["config=examples/tasks/counting/tiny_cpu.yaml", *common,
            "data.train_batch_size=4", "rollout.n=4", "rollout.micro_batch_size=4", "actor.ppo_mini_batch_size=2",
            "actor.ppo_micro_batch_size=4", "actor.log_prob_micro_batch_size=8",
            f"data.max_prompt_length={sizes['prompt']}", f"data.max_response_length={sizes['response']}",
            f"data.max_pixels={sizes['pixels']}", f"trainer.max_steps={sizes['steps']}",
            "actor.model.enable_gradient_checkpointing=true", "actor.model.attn_implementation=sdpa", dtype,
            f"actor.strategy={engine}"]


def build_model(name: str, out_dir: str, device: str) -> str:
    """A random-init checkpoint of seed model `name` (hub id) at `out_dir`: the published architecture, bf16, with
    rllava.model.tiny's offline tokenizer and processor (whose special-token ids the config takes)."""
    import torch
    from transformers import AutoModelForImageTextToText

    from rllava.train.memory.planner import model_config
    from rllava.model.tiny import SIZES, _model_and_processor, build_tokenizer
    from rllava.utils.fs import atomic_directory

    if os.path.isdir(out_dir):
        return out_dir
    config = model_config(name)
    tok = build_tokenizer()
    _, _, processor = _model_and_processor(config.model_type, tok, SIZES["small"])  # only its processor
    size = processor.image_processor.size  # up to 1024^2 px as they come (the tiny one's 448^2 would shrink them)
    if isinstance(size, dict):
        size["longest_edge"] = 1024 * 1024
    else:  # transformers' SizeDict
        size.longest_edge = 1024 * 1024
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

    def __init__(self, cuda: bool, trace=(), trace_out: str | None = None):
        self.cuda, self.stack = cuda, []
        self.peak, self.calls = {}, []  # calls: (phase, seconds, tokens) in order
        self.originals = []  # (class, method name, original), for `unwrap`
        self.on_phase = lambda name: None  # called as each phase ends
        self.trace, self.trace_out = set(trace) if cuda else set(), trace_out  # --trace: phases left to trace

    @contextlib.contextmanager
    def phase(self, name: str, tokens: int = 0):
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            if self.stack:  # keep the outer phase's peak so far
                outer = self.stack[-1]
                self.peak[outer] = max(self.peak.get(outer, 0), torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
        tracing, start_bytes = name in self.trace, torch.cuda.memory_allocated() if self.cuda else 0
        if tracing:  # its first call: every allocation recorded, with its Python stack
            torch.cuda.memory._record_memory_history(max_entries=MAX_EVENTS, stacks="python")
        self.stack.append(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            if tracing:
                self.trace.discard(name)
                with open(self.trace_out, "a") as f:
                    try:
                        f.write(peak_breakdown(name, torch.cuda.memory._snapshot(), start_bytes))
                    except Exception as e:  # noqa: BLE001 - a failed trace must not cost the run its measurement
                        f.write(f"## {name}: the trace failed: {e!r}\n\n")
                torch.cuda.memory._record_memory_history(enabled=None)
            if self.cuda:
                torch.cuda.synchronize()
                self.peak[name] = max(self.peak.get(name, 0), torch.cuda.max_memory_allocated())
                torch.cuda.reset_peak_memory_stats()
            self.calls.append((name, time.perf_counter() - start, tokens))
            self.stack.pop()
            self.on_phase(name)

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


def peak_breakdown(phase: str, snapshot: dict, start_bytes: int, top: int = 30) -> str:
    """What was live at a phase's peak (--trace): the recorded allocations replayed in order to the peak, grouped by
    where they were made (the innermost frame, and the innermost rllava / transformers / torch.distributed frame)."""
    events = [e for trace in snapshot["device_traces"] for e in trace]
    now, peak, at = start_bytes, start_bytes, -1
    for i, e in enumerate(events):
        now += e["size"] if e["action"] == "alloc" else -e["size"] if e["action"] == "free_completed" else 0
        if now > peak:
            peak, at = now, i
    live = {}
    for e in events[:at + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    groups, counts = {}, {}
    for e in live.values():
        frames = [f"{f['filename'].split('site-packages/')[-1]}:{f['line']} {f['name']}" for f in e["frames"]]
        ours = next((f for f in frames if any(k in f for k in ("rllava/", "transformers/", "distributed/"))), "")
        key = f"{frames[0] if frames else '?'}  <  {ours}"
        groups[key], counts[key] = groups.get(key, 0) + e["size"], counts.get(key, 0) + 1
    lines = [f"## {phase}: peak {peak / GiB:.3f} GiB = {start_bytes / GiB:.3f} live at its start + "
             f"{sum(groups.values()) / GiB:.3f} allocated in it and live at the peak ({len(events)} events"
             f"{', CUT: the ring was full' if len(events) >= MAX_EVENTS else ''})"]
    lines += [f"{size / GiB:8.3f} GiB {counts[k]:5d}x  {k}" for k, size in sorted(groups.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines[:top + 1]) + "\n\n"


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


def run_one(model: str, engine: str, root: str, device: str, tiny: bool, scenario: str = "check",
            out: str | None = None, steps: int | None = None, extra: tuple = (), planned: bool = True,
            trace: tuple = ()) -> dict:
    """One run (in this process): build the model dir if absent, plan, train with the phases wrapped; the results
    (also written to `out` as each phase ends, so a run cut off keeps what it measured)."""
    cwd = os.getcwd()
    os.chdir(REPO)  # the task config names ./examples/... paths (format prompt, reward function)
    try:
        return _run_one(model, engine, os.path.abspath(os.path.join(cwd, root)), device, tiny, scenario, out, steps,
                        extra, planned, trace)
    finally:
        os.chdir(cwd)


def ensure_model(model: str, root: str, device: str, tiny: bool) -> str:
    """The model's directory under root/models, built if absent."""
    model_dir = os.path.join(root, "models", model)
    if tiny:
        from rllava.model.tiny import build_tiny
        if not os.path.isdir(model_dir):
            build_tiny(TINY_MODELS[model], model_dir, size="small")
        return model_dir
    return build_model(MODELS[model], model_dir, device)


def make_data(root: str, scenario: str, tiny: bool) -> dict:
    """The scenario's counting records (problem / answer / images, RLLaVA's keys too), images resized in turn to
    the scenario's sizes (the first one generated)."""
    from PIL import Image

    from rllava.data.synthetic import make_dataset

    out = os.path.join(root, f"data-{scenario}")
    sizes = (112,) if tiny else SCENARIOS[scenario][4]
    if not os.path.isdir(out):
        files = make_dataset("counting", out, n_train=64 if tiny else 128, n_val=0, seed=0, size=sizes[0])
        for i, line in enumerate(open(files["train"])):
            if len(sizes) > 1 and (size := sizes[i % len(sizes)]) != sizes[0]:
                path = os.path.join(out, json.loads(line)["images"][0])
                Image.open(path).resize((size, size)).save(path)
    return {"train": os.path.join(out, "train.jsonl"), "dir": out}


def run_path(root: str, scenario: str, model: str, engine: str) -> str:
    return os.path.join(root, "runs", f"{scenario}-{model}-{engine}")


def config_keys(model_path: str, root: str, engine: str, device: str, tiny: bool, scenario: str,
                steps: int | None, extra) -> list[str]:
    run_dir = run_path(root, scenario, os.path.basename(model_path), engine)
    data = {"train": os.path.join(root, f"data-{scenario}", "train.jsonl")}
    accelerate = []
    if engine == "accelerate":
        accelerate = [f"trainer.accelerate_config={os.path.join(root, 'accelerate_fsdp2.yaml')}"]
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, "accelerate_fsdp2.yaml"), "w") as f:
            f.write(ACCELERATE_FSDP2)
    return [*overrides(model_path, data, run_dir, engine, device, tiny, scenario), *accelerate,
            *([f"trainer.max_steps={steps}"] if steps else []), *extra]


def planned_peaks(cfg, scenario: str, device: str) -> dict:
    """rllava.train.memory's plan of `cfg`, phase -> peak bytes (the scenario's card cap as the GPU's size); its
    `auto` sizes first, as the run resolves them for that cap (rllava.train.memory.auto)."""
    import copy

    from rllava.train.memory import auto
    from rllava.train.memory.planner import plan

    cap, cfg = SCENARIOS[scenario][3], copy.deepcopy(cfg)
    auto.resolve(cfg, cap and cap * GiB, device)
    cfg.trainer.memory_budget_gb = None
    return {row["phase"]: row["peak"] for row in plan(cfg, gpu_bytes=cap and cap * GiB, device=device)}


def _run_one(model: str, engine: str, root: str, device: str, tiny: bool, scenario: str, out: str | None,
             steps: int | None, extra, planned: bool, trace: tuple = ()) -> dict:
    import torch

    from rllava.config import load_config
    from rllava.engine.train.fsdp2 import FSDP2Engine
    from rllava.engine.train.single import SingleDeviceEngine
    from rllava.roles.actor import Actor
    from rllava.roles.reference import Reference
    from rllava.roles.rollout import Rollout
    from rllava.train import loop
    from rllava.train.pipeline import rlvr

    model_dir = ensure_model(model, root, device, tiny)
    make_data(root, scenario, tiny)
    cfg = load_config(config_keys(model_dir, root, engine, device, tiny, scenario, steps, extra))
    run_dir, cap = run_path(root, scenario, model, engine), SCENARIOS[scenario][3]
    planned = planned_peaks(cfg, scenario, device) if planned else {}

    cuda = device == "cuda"
    if engine == "accelerate" and cuda:
        os.environ.setdefault("LOCAL_RANK", "0")  # a torchrun of one: Accelerate's FSDP (see the docstring)
    result = {"model": model, "engine": engine, "scenario": scenario, "planned": planned, "steps": 0}
    peaks, params = PhasePeaks(cuda, trace, out and os.path.join(os.path.dirname(out), "trace.txt")), []

    def dump(*_):  # after every phase: what is measured so far
        result["measured"] = dict(peaks.peak)
        result["seconds"] = {c[0]: round(sum(d[1] for d in peaks.calls if d[0] == c[0]), 1) for c in peaks.calls}
        if out:
            with open(out, "w") as f:
                json.dump(result, f)
    peaks.on_phase = dump
    peaks.wrap(Rollout, "generate", "rollout")
    peaks.wrap(Actor, "compute_logprobs", "old log-prob")
    peaks.wrap(Reference, "compute_logprobs", "ref log-prob")
    peaks.wrap(Actor, "update", "update", lambda actor, batch, *a: (
        params.append(sum(p.numel() for p in actor.model.parameters() if p.requires_grad)) or
        int(batch.attention_mask.sum()) * actor.ppo_epochs))
    for cls in (SingleDeviceEngine, FSDP2Engine):
        peaks.wrap(cls, "optimizer_step", "optimizer")
    save_model, loop.save_model = loop.save_model, lambda *a, **k: None  # no outputs/final: GBs of writing per run
    if cuda:
        if cap:  # the card as a 24 GiB one: the caching allocator refuses past it (CUDA's context not counted)
            torch.cuda.set_per_process_memory_fraction(cap * GiB / torch.cuda.get_device_properties(0).total_memory)
        torch.cuda.reset_peak_memory_stats()
    try:
        rlvr.train(cfg)
    finally:
        peaks.unwrap()
        loop.save_model = save_model

    metrics = step_metrics(run_dir)
    updates = [c for c in peaks.calls if c[0] == "update"]
    updates = updates[len(updates) // metrics["steps"]:] if metrics["steps"] > 1 else updates  # after the first
    result.update(metrics, measured=dict(peaks.peak), trainable_params=params[0] if params else 0,
                  update_tokens=sum(c[2] for c in updates), update_seconds=sum(c[1] for c in updates))
    dump()
    return result


def step_metrics(run_dir: str) -> dict:
    """Throughput of the run's steps from its metrics.jsonl: means over the steps after the first (kernel
    compilation, allocator warm-up), the log-prob gap over all."""
    path = os.path.join(run_dir, "metrics.jsonl")
    rows = [json.loads(line) for line in open(path) if line.strip()] if os.path.exists(path) else []
    rows = [r for r in rows if "perf/tokens_per_s" in r]
    later = rows[1:] or rows

    def mean(key, some):
        values = [r[key] for r in some if key in r]
        return sum(values) / len(values) if values else None
    return {"steps": len(rows), "tokens_per_s": mean("perf/tokens_per_s", later),
            "logprob_gap": mean("rollout/logprob_gap_mean", rows), "step_s": mean("timing/step", later),
            "rollout_s": mean("timing/rollout", later)}


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
        for p in PHASES:
            m, pl = r.get("measured", {}).get(p), r.get("planned", {}).get(p)
            if m is None and pl is None:
                continue
            ratio = f"{m / pl:.2f}" if m and pl else "n/a"
            lines.append(f"| {r['model']} | {r['engine']} | {p} | {gib(m)} | {gib(pl)} | {ratio} |")
    lines += ["", "| model | engine | steps | tokens/s | step s | rollout share | update MFU | logprob gap | "
              "trainable params |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        if not r.get("steps"):
            continue
        mfu = 6 * r["trainable_params"] * r["update_tokens"] / r["update_seconds"] / flops \
            if flops and r["update_seconds"] else None
        gap = "n/a" if r["logprob_gap"] is None else f"{r['logprob_gap']:.4f}"
        mfu = "n/a" if mfu is None else f"{100 * mfu:.1f} %"
        share = f"{100 * r['rollout_s'] / r['step_s']:.0f} %" if r.get("rollout_s") and r.get("step_s") else "n/a"
        lines.append(f"| {r['model']} | {r['engine']} | {r['steps']} | {r['tokens_per_s'] or 0:.1f} | "
                     f"{r.get('step_s') or 0:.1f} | {share} | {mfu} | {gap} | {r['trainable_params'] / 1e6:.1f} M |")
    for r in results:
        if "trl" in r:
            t = r["trl"]
            ratio = f"{r['tokens_per_s'] / t['tokens_per_s']:.2f}x" if t.get("tokens_per_s") and \
                r.get("tokens_per_s") else "n/a"
            lines.append(f"| TRL GRPOTrainer, {r['model']} | HF generate | {t.get('steps', 0)} | "
                         f"{t.get('tokens_per_s') or 0:.1f} | {t.get('step_s') or 0:.1f} | | | | rllava/TRL "
                         f"tokens/s: {ratio} {t.get('error', '')} |")
    if flops:
        lines += ["", f"bf16 matmul peak measured: {flops / 1e12:.0f} TFLOP/s"]
    return "\n".join(lines) + "\n"


def run_isolated(model: str, engine: str, root: str, device: str, args, out: str) -> dict:
    """`run_one` in a process of its own (a clean allocator; an OOM or a hang costs only this run's row); the plan
    is made here meanwhile (for the seed model's published config: the same architecture)."""
    from rllava.config import load_config

    cmd = [sys.executable, os.path.abspath(__file__), "--root", root, "--device", device, "--scenario",
           args.scenario, *(["--tiny"] if args.tiny else []), *(["--steps", str(args.steps)] if args.steps else []),
           *(["--cap-gib", str(args.cap_gib)] if args.cap_gib else []),
           *(["--trace", *args.trace] if args.trace else []), "--no-plan", "--keys", *args.keys,
           "--one", model, engine, out]
    path = ensure_model(model, root, device, True) if args.tiny else MODELS[model]  # a real one: the child builds
    planned = {}

    def plan_meanwhile():
        planned.update(planned_peaks(load_config(config_keys(path, root, engine, device, args.tiny, args.scenario,
                                                             args.steps, args.keys)), args.scenario, device))
    make_data(root, args.scenario, args.tiny)  # here, before the child needs it
    error = run_child(cmd, args.run_timeout, f"{model} {engine}", plan_meanwhile)
    result = {"model": model, "engine": engine}
    if os.path.exists(out):  # what the run measured, all of it or up to where it stopped
        with open(out) as f:
            result = json.load(f)
    result["planned"] = planned
    if error and not result.get("update_seconds"):  # cut off: the steps it finished, from their metrics
        result.update(step_metrics(run_path(root, args.scenario, model, engine)), update_seconds=0,
                      trainable_params=0, update_tokens=0)
    if error:
        result["error"] = error.replace("|", "/")[:200]
    return result


def run_child(cmd: list[str], timeout: int, name: str, meanwhile=lambda: None) -> str | None:
    """Run `cmd` from the repo root within `timeout` seconds, `meanwhile()` here as it runs; None, or the error's
    last line."""
    start = time.time()
    with tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True, cwd=REPO)
        try:
            meanwhile()
        except Exception as e:  # noqa: BLE001 - the plan's failure is a note, the run goes on
            print(f"{name}: the plan failed: {e}", file=sys.stderr)
        try:
            code = child.wait(timeout=max(1, timeout - (time.time() - start)))
            err.seek(0)
            tail = err.read()[-4000:]
            error = None if code == 0 else (tail.strip().splitlines() or [f"exit {code}"])[-1]
            if error:
                print(tail, file=sys.stderr)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            error = f"timed out after {timeout} s"
    print(f"{name}: {'ok' if not error else error} ({time.time() - start:.0f} s)", flush=True)
    return error


def run_trl(result: dict, root: str, device: str, args) -> dict:
    """TRL's GRPOTrainer on the research scenario's model, data, reward and sizes (benchmarks/vs_trl.py)."""
    model_dir = os.path.join(root, "models", result["model"])
    data, run_dir = os.path.join(root, f"data-{args.scenario}"), os.path.join(root, "runs", "trl")
    tiny = args.tiny
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "vs_trl.py"), "--side", "trl", "--model", model_dir,
           "--data", data, "--run", run_dir, "--steps", str(args.steps or (1 if tiny else 3)), "--device", device,
           "--prompts", str(4 if tiny else 32), "--k", str(4 if tiny else 8),
           "--new-tokens", str(8 if tiny else 512), "--micro", str(16)]
    os.makedirs(run_dir, exist_ok=True)
    error = run_child(cmd, args.run_timeout, "TRL GRPOTrainer")
    trl = {"error": error.replace("|", "/")[:200]} if error else {}
    if os.path.exists(steps := os.path.join(run_dir, "steps.json")):
        rows = json.load(open(steps))
        later = rows[1:] or rows
        seconds = sum(r["seconds"] for r in later)
        trl.update(steps=len(rows), step_s=seconds / len(later),
                   tokens_per_s=sum(r.get("tokens", 0) for r in later) / seconds)
    return trl


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="gpu_check.md")
    p.add_argument("--scenario", default="check", choices=list(SCENARIOS))
    p.add_argument("--models", nargs="+", default=None, help="default: the scenario's (see the docstring)")
    p.add_argument("--engines", nargs="+", default=None, choices=(*ENGINES, "auto", "accelerate"))
    p.add_argument("--tiny", action="store_true", help="rllava.model.tiny's models, 1 step (the fast test)")
    p.add_argument("--device", default=None, help="cuda | cpu (default: cuda when available)")
    p.add_argument("--root", default=None, help="models, data and runs go here (default: a temporary directory)")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps a run (default: the scenario's)")
    p.add_argument("--run-timeout", type=int, default=240, help="seconds per run (model build included)")
    p.add_argument("--no-trl", action="store_true", help="research: rllava alone")
    p.add_argument("--keys", nargs="*", default=[], help="extra config keys for the runs (key=value)")
    p.add_argument("--trace", nargs="*", default=[], choices=PHASES, help="GPU: what was live at these phases' "
                   "peaks (their first call), by where it was allocated, into trace.txt beside the run's JSON")
    p.add_argument("--no-plan", action="store_true", help=argparse.SUPPRESS)  # internal: the parent plans
    p.add_argument("--cap-gib", type=float, default=None, help="cap the card at this many GiB (default: the "
                   "scenario's: rllava24 24, else none)")
    p.add_argument("--subprocess", action="store_true", help="each run in its own process on CPU too (as on a GPU)")
    p.add_argument("--one", nargs=3, metavar=("MODEL", "ENGINE", "JSON"), help=argparse.SUPPRESS)  # internal
    args = p.parse_args(argv)
    sys.path.insert(0, REPO)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.cap_gib:
        SCENARIOS[args.scenario] = (*SCENARIOS[args.scenario][:3], args.cap_gib, SCENARIOS[args.scenario][4])
    if args.one:  # a child: one run, its results as JSON
        model, engine, out = args.one
        run_one(model, engine, args.root, device, args.tiny, args.scenario, out, args.steps, args.keys,
                not args.no_plan, args.trace)
        return out
    real, tiny_models, engines, _, _ = SCENARIOS[args.scenario]
    known = TINY_MODELS if args.tiny else MODELS
    models = args.models or (tiny_models if args.tiny else real)
    if unknown := [m for m in models if m not in known]:
        p.error(f"--models: unknown {unknown}; choose from {list(known)}")

    root = os.path.abspath(args.root or tempfile.mkdtemp(prefix="rllava-gpu-check-"))
    sizes = {"check": "3 GRPO steps, 4 prompts x 4 samples, prompt <= 256, response 128, bf16, sdpa, gradient "
                      "checkpointing, HF rollout",
             "rllava24": "RLLaVA's examples/config.yaml as the file is, 16 prompts x 5, prompt / response 512, "
                         "448-640 px images, HF rollout 40 sequences a call; the card capped at 24 GiB",
             "research": "32 prompts x 8 = 256 sequences a step, response 512, 512 px images, one optimizer step, "
                         "micro-batch 16, bf16, gradient checkpointing, HF rollout"}[args.scenario]
    if args.tiny:
        sizes = f"{args.scenario}, tiny sizes, {'bf16' if device == 'cuda' else 'fp32'}"
    if args.keys:
        sizes += "; keys: " + " ".join(args.keys)
    flops, name = matmul_peak(device), torch.cuda.get_device_name() if device == "cuda" else device
    results, text = [], ""

    def write():
        nonlocal text
        text = table(results, flops, name, sizes)
        with open(args.out, "w") as f:  # after each run: a machine taken back mid-check keeps the rows so far
            f.write(text)
    for model in models:
        for engine in args.engines or engines:
            out = os.path.join(root, f"{args.scenario}-{model}-{engine}.json")
            if device != "cuda" and not args.subprocess:  # CPU (the fast test): in this process, nothing to isolate
                results.append(run_one(model, engine, root, device, args.tiny, args.scenario, None, args.steps,
                                       args.keys))
            else:
                results.append(run_isolated(model, engine, root, device, args, out))
            write()
            if args.scenario == "research" and not args.no_trl:
                results[-1]["trl"] = run_trl(results[-1], root, device, args)
                write()
    print(text)
    return text


if __name__ == "__main__":
    main()
