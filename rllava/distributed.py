"""The few torch.distributed facts a pipeline needs, valid with or without `torchrun`: `init()` joins the process
group that torchrun's RANK / WORLD_SIZE / LOCAL_RANK describe (NCCL on GPUs, gloo on CPUs) and picks this rank's
device; without torchrun everything here is the single-process identity, so the same pipeline code runs both ways.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import weakref

import torch
import torch.distributed as dist

from rllava.errors import ConfigError

_joined = False  # this process joined a process group (init); see `exit_process`
# trainer.rollout_ranks (asynchronous RL): the launch splits into two worlds, the trainers (the first ranks) and the
# rollout ranks (the last N), each with RANK / WORLD_SIZE rewritten so every collective, FSDP2's mesh and DCP stay
# within it; `bridge()` joins all of them for weights and batches
_split: dict = {}
# engines holding process groups of their own over this one (vLLM): shut down first by `close`, while they live
_leave_first = weakref.WeakSet()


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def split_roles(rollout_ranks: int) -> str:
    """Under torchrun with `rollout_ranks` > 0: this process's role ("train" or "rollout") in its own world, the
    rollout ranks being the last `rollout_ranks` of the launch. Call before `init` (which joins that world)."""
    if rollout_ranks <= 0 or _split:
        return _split.get("role", "train")
    if int(os.environ.get("WORLD_SIZE", "1")) <= rollout_ranks:
        raise ConfigError(f"trainer.rollout_ranks={rollout_ranks} of {os.environ.get('WORLD_SIZE', '1')} processes "
                          "leaves none to train: launch with torchrun --nproc_per_node=<trainers + rollout_ranks>")
    store, grank, world = next(dist.rendezvous("env://"))  # torchrun's store (its agent's, or rank 0's)
    trainers = world - rollout_ranks
    role = "train" if grank < trainers else "rollout"
    sub_rank, sub_world = (grank, trainers) if role == "train" else (grank - trainers, rollout_ranks)
    _split.update(role=role, store=store, rank=grank, world=world, trainers=trainers)
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(sub_rank), str(sub_world)
    return role


def bridge():
    """(gloo group of every process of the launch, this process's rank in it, number of trainers); made once."""
    if "bridge" not in _split:
        _split["bridge"] = dist.ProcessGroupGloo(dist.PrefixStore("rllava_bridge", _split["store"]), _split["rank"],
                                                 _split["world"])
    return _split["bridge"], _split["rank"], _split["trainers"]


def pick_device(device: str = "auto") -> torch.device:
    """This rank's device (trainer.device): auto and cuda take LOCAL_RANK's GPU, if there is one."""
    if device not in ("auto", "cuda"):
        return torch.device(device)
    if torch.cuda.is_available():  # rollout ranks beyond the GPUs there are (a 1-GPU async test run) share them
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


def init(device: str = "auto") -> torch.device:
    """Join the process group when launched with several processes; return this rank's device."""
    chosen = pick_device(device)
    if device in ("auto", "cuda") and chosen.type == "cuda":
        torch.cuda.set_device(chosen)
    backend = "nccl" if chosen.type == "cuda" else "gloo"
    global _joined
    if _split and not dist.is_initialized():  # this role's own world, on the launch's store
        dist.init_process_group(backend, store=dist.PrefixStore(f"rllava_{_split['role']}", _split["store"]),
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
        _joined = True
    elif int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group(backend)
        _joined = True
    return chosen


def group_of_one(device: torch.device) -> None:
    """A process group of one (an in-memory store: no port, nothing to clean up), so `python -m ...
    actor.strategy=fsdp2` (or deepspeed) without torchrun runs the sharded engine instead of dying in the env://
    rendezvous; with the environment torchrun gives a world of one (DeepSpeed asserts LOCAL_RANK is set)."""
    global _joined
    if not dist.is_initialized():
        for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
            os.environ.setdefault(k, v)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1)
        _joined = True


def shard(items: list, what: str = "items") -> list:
    """This rank's contiguous share of `items` (every rank gets the same count)."""
    n, w = len(items), world_size()
    if n % w:
        raise ValueError(f"{n} {what} cannot be split evenly over {w} processes")
    k = n // w
    return items[rank() * k:(rank() + 1) * k]


def all_sum(values: list[float]) -> list[float]:
    """Element-wise sum over ranks (identity on one process)."""
    if world_size() == 1 or not dist.is_initialized():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t)
    return t.tolist()


def all_max(value: int) -> int:
    if world_size() == 1 or not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.long, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def gather(items: list) -> list:
    """Every rank's `items` (any picklable objects), concatenated in rank order, on every rank."""
    if world_size() == 1 or not dist.is_initialized():
        return list(items)
    parts = [None] * world_size()
    dist.all_gather_object(parts, list(items))
    return [x for part in parts for x in part]


def mean_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Each metric averaged over the ranks that report it (identity on one process)."""
    if world_size() == 1 or not dist.is_initialized():
        return metrics
    sums, counts = {}, {}
    for part in gather([metrics]):
        for k, v in part.items():
            sums[k], counts[k] = sums.get(k, 0.0) + v, counts.get(k, 0) + 1
    return {k: sums[k] / counts[k] for k in sums}


def _comm_device() -> torch.device:
    """NCCL reduces CUDA tensors only; gloo CPU tensors."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def barrier(group=None) -> None:
    if dist.is_initialized():
        dist.barrier(group=group)


def leave_first(engine) -> None:
    """`engine.shutdown()` runs in `close`, before the group is destroyed (vLLM tears down its own groups, the
    default one included, and fails on a group already gone: "Invalid process group specified" at exit)."""
    _leave_first.add(engine)


def close() -> None:
    """After the last collective, wait for every rank (none leaves while another sends to it), then leave the group."""
    if dist.is_initialized():
        dist.barrier()
    for engine in list(_leave_first):
        engine.shutdown()
    _leave_first.clear()
    if dist.is_initialized():
        dist.destroy_process_group()
    if "bridge" in _split:  # trainers and rollout ranks leave together
        _split.pop("bridge").barrier().wait()
    gc.collect()


def exit_process(code: int = 0) -> None:
    """End the process with `code`; a process that joined a group skips the interpreter's teardown (call `close()`
    first after a successful run). `destroy_process_group` leaves gloo's (and NCCL's) threads running while DTensor's
    sharding caches (FSDP2) or DeepSpeed's comm module still hold the group, and a normal exit's teardown under them
    now and then aborts a finished rank ("terminate called without an active exception", SIGABRT; torchrun kills the
    others). So: atexit handlers, flushed streams, then `os._exit` with the same code."""
    if not _joined:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
