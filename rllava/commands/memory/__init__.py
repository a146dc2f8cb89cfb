"""Will it fit? The device memory of one configured RL step, planned without weights and without a GPU:

    python -m rllava.commands.memory config=examples/tasks/counting/tiny_cpu.yaml k=v ... [--gpu-memory 24GiB] [--world-size N]

The policy is built from its config.json under torch's FakeTensorMode (tensors with shapes and dtypes, no
storage), with the config's training switches (frozen parts, LoRA, gradient checkpointing), and each phase of
one step runs on it under torch's `MemTracker`, which adds up every live tensor and keeps the peak by kind
(parameters, gradients, optimizer state, activations, temporaries). The forward passes are rllava's own
(`rllava.model.forward._token_logprobs` on a Batch of the planned shapes): the chunked LM head
(actor.logprob_chunk_size), padding_free and shared_prefix run as configured.

  rollout       HF engine: a prefill forward (no grad) of one generate call's prompts, and its KV cache, counted
                from the config: 2 (K, V) x layers x kv_heads x head_dim x dtype bytes per token, for
                rollout.micro_batch_size prompts x rollout.n samples x (max_prompt_length + max_response_length).
                vLLM / SGLang: the engine's reservation, rollout.vllm.gpu_memory_utilization (SGLang:
                rollout.sglang.mem_fraction_static) x --gpu-memory, beside what the trainer keeps on the device
                (not its weights and gradients with actor.fsdp.offload_params), and one weight-sync bucket
                (rollout.bucket_size MB: the policy reaches the engine a bucket at a time). Outside the rollout
                the engine sleeps (vLLM sleep(level=1), SGLang release_memory_occupation): none of it is on the device.
  old log-prob  a forward without grad of one micro-batch: actor.log_prob_micro_batch_size sequences, or with
                actor.model.dynamic_batching as many full-length ones as actor.log_prob_max_token_len_per_gpu holds.
  ref log-prob  with a KL (algorithm.use_kl_loss, use_kl_in_reward): the same on the frozen reference (a copy of
                the starting weights, resident in every phase; for LoRA without ref.model_path the policy itself,
                adapters off), ref.log_prob_micro_batch_size (or ref.log_prob_max_token_len_per_gpu) sequences.
  teacher log-prob  algorithm.distill with a sampled-token loss (k1, k3): the same on each teacher (its own
                config; every teacher resident in every phase, as the reference; engine=vllm|sglang not planned).
  update        a forward + backward of one micro-batch (actor.ppo_micro_batch_size, or
                actor.ppo_max_token_len_per_gpu tokens), beside the gradients of the mini-batch's earlier
                micro-batches where it has several.
  optimizer     gradient clipping and torch.optim.AdamW's step (foreach kernels, as on CUDA): 2 states per
                trainable parameter, in the parameters' dtype; none on the device with actor.fsdp.enable_cpu_offload
                (the step runs on the host), outside the update with actor.fsdp.offload_optimizer.

FSDP2 (actor.strategy fsdp / fsdp2; auto with --world-size > 1, or on a GPU with actor.fsdp.enable_cpu_offload /
offload_params, RLLaVA's offload switches, as rllava runs it): rllava's own `shard_model` shards the model over
a fake process group of --world-size ranks (FSDP2's mixed precision and reshard_after_forward as configured; the
reference sharded too) and torch's `FSDPMemTracker` tracks it; each rank plans its share of the
batch (train_batch_size x n / N rows, mini-batches likewise). With either offload switch the shards, their
gradients and Adam's states are on the host (CPUOffloadPolicy): tracked, but not counted on the device. For HF
generate every unit is gathered for the whole rollout, as rllava does. DeepSpeed plans as FSDP2 (ZeRO-3's sharding).
actor.model.ulysses_size=N (--world-size a multiple of N): the training passes run rllava.model.ulysses on the
fake group, each rank's decoder on 1/N of every sequence beside the all-to-all's buffers (the rollout is whole).

Every phase holds the weights, and the optimizer state a previous step left. Every sequence is as long as the
config allows, every prompt holds one square image as large as data.max_pixels and max_prompt_length allow
(Qwen-VL: one token per merged (patch x 2)^2 pixels; the image's tokens count in the prompt's length), and the
rollout.n samples of a prompt share it; padding_free therefore saves nothing here (no sequence is short). Not
counted: the CUDA context and the allocator's cache and fragmentation (~1-2 GiB on a real GPU), the generate
loop's own transients, a critic, the exact KL's in-update buffers (named under the table).

Modules: planner (the phases), fake (the fake mode), torch_private (all torch private APIs), __init__ (the CLI).
"""

from __future__ import annotations

import re
import sys

from rllava.commands import command_parser
from rllava.commands.memory import planner
from rllava.errors import RllavaError

GiB = 1024 ** 3


def parse_size(text: str) -> int:
    """'24GiB', '80GB', '24G', '512MiB' or a number of bytes -> bytes (GB and G are read as GiB, as GPUs are sold)."""
    match = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)(i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise RllavaError(f"--gpu-memory={text!r}: expected a size such as 24GiB or 80GB")
    return int(float(match.group(1)) * 1024 ** "_KMGT".index(match.group(2).upper() or "_"))


def show(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB / 10 else f"{n / 2 ** 20:.1f} MiB"


def table(rows: list[dict], gpu_bytes: int | None) -> str:
    """The plan as one text table: a row per phase, a column per kind of memory, the peak and whether it fits."""
    cols = ["parameters", "gradients", "optimizer", "activations", "kv_cache", "temporaries", "peak"]
    head = ["phase", *cols] + (["fits"] if gpu_bytes else [])
    body = [[r["phase"], *(show(r[c]) for c in cols)] + (["yes" if r["fits"] else "NO"] if gpu_bytes else [])
            for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(str(x).rjust(w) for x, w in zip(line, widths)) for line in [head, *body]]
    peak = max(r["peak"] for r in rows)
    verdict = "" if not gpu_bytes else f" of {show(gpu_bytes)}: {'fits' if peak <= gpu_bytes else 'does NOT fit'}"
    return "\n".join(lines + [f"step peak {show(peak)}{verdict} (tensors only: add ~1-2 GiB for the CUDA context "
                                  "and the allocator's cache)"])


def assumptions(cfg, world: int, device: str = "cuda") -> str:
    """The line above the table: the engine actor.strategy makes on `world` ranks of `device`, what its offload
    switches put on the host (as `planner.step_of` reads them), the weights' dtype and FSDP2's compute and gradient
    reduction dtypes (actor.fsdp.mixed_precision; unset: the weights'), the rollout engine."""
    import torch

    from rllava.config.schema import resolve_strategy
    from rllava.engine.train.fsdp2 import mixed_precision_policy
    from rllava.model.loader import resolve_dtype

    a, f = cfg.actor, cfg.actor.fsdp
    strategy = resolve_strategy(a.strategy, world, f, device)
    weights = resolve_dtype(a.model.torch_dtype, torch.device(device))
    dtypes = f"weights {str(weights)[6:]}"
    if strategy != "single":
        mp = mixed_precision_policy(f.mixed_precision)
        compute = mp.param_dtype or weights
        dtypes += f", FSDP2 compute {str(compute)[6:]}, gradient reduce {str(mp.reduce_dtype or compute)[6:]}"
    if f.enable_cpu_offload or (strategy != "single" and f.offload_params):
        host = "weights, gradients and Adam states" if strategy != "single" else "the optimizer step"
    else:
        host = "Adam states between updates" if f.offload_optimizer else "nothing"
    return (f"planned for: actor.strategy={a.strategy} -> {strategy} on {world} {device} rank(s) (--world-size), "
            f"{host} on the host (actor.fsdp offload switches), {dtypes}, rollout.name={cfg.rollout.name}")


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("memory", __doc__)
    parser.add_argument("overrides", nargs="*", help="config=FILE and key=value overrides, as for training")
    parser.add_argument("--gpu-memory", type=str, default=None, help="the GPU's memory, e.g. 24GiB or 80GB")
    parser.add_argument("--world-size", type=int, default=1, help="GPUs the run shards over (FSDP2), as torchrun's")
    args = parser.parse_intermixed_args(argv)
    try:
        from rllava.config import load_config

        gpu = parse_size(args.gpu_memory) if args.gpu_memory else None
        cfg = load_config(args.overrides)
        if args.world_size < 1:
            raise RllavaError(f"--world-size={args.world_size} must be at least 1")
        for what in planner.unplanned(cfg):
            print(f"note: {what}")
        rows = planner.plan(cfg, gpu, world=args.world_size)
        print(assumptions(cfg, args.world_size))
        print(table(rows, gpu))
        if gpu and max(r["peak"] for r in rows) > gpu:
            print("changes, each planned again:")
            for change, peak in planner.suggest(args.overrides, gpu, world=args.world_size):
                print(f"  {change}: step peak {show(peak)} ({'fits' if peak <= gpu else 'does NOT fit'})")
    except RllavaError as e:
        print(f"rllava: error: {e}", file=sys.stderr)
        sys.exit(2)


