"""Will it fit? The device memory of one configured RL step, planned without weights and without a GPU:

    python -m rllava.commands.memory config=examples/tasks/counting/tiny_cpu.yaml k=v ... [--gpu-memory 24GiB] [--world-size N]

What each phase holds and how it is planned: rllava.train.memory (the library's planner; this is its CLI).
"""

from __future__ import annotations

import re
import sys

from rllava.commands import command_parser
from rllava.train.memory import auto, planner
from rllava.train.memory.planner import GiB, show
from rllava.errors import RllavaError



def parse_size(text: str) -> int:
    """'24GiB', '80GB', '24G', '512MiB' or a number of bytes -> bytes (GB and G are read as GiB, as GPUs are sold)."""
    match = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)(i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise RllavaError(f"--gpu-memory={text!r}: expected a size such as 24GiB or 80GB")
    return int(float(match.group(1)) * 1024 ** "_KMGT".index(match.group(2).upper() or "_"))


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
        budget = gpu if cfg.trainer.memory_budget_gb is None else int(cfg.trainer.memory_budget_gb * GiB)
        sized = auto.resolve(cfg, budget, world=args.world_size)  # actor.*=auto, as a run sizes them
        for line in sized:
            print(line)
        for what in planner.unplanned(cfg):
            print(f"note: {what}")
        rows = planner.plan(cfg, gpu, world=args.world_size)
        print(assumptions(cfg, args.world_size))
        print(table(rows, gpu))
        if gpu and max(r["peak"] for r in rows) > gpu:
            print("changes, each planned again:")
            given = [o for o in args.overrides if not o.startswith("trainer.memory_budget_gb=")] + [
                line.split(" (")[0].replace("=auto -> ", "=") for line in sized]  # the sizes chosen
            for change, peak in planner.suggest(given, gpu, world=args.world_size):
                print(f"  {change}: step peak {show(peak)} ({'fits' if peak <= gpu else 'does NOT fit'})")
    except RllavaError as e:
        print(f"rllava: error: {e}", file=sys.stderr)
        sys.exit(2)


