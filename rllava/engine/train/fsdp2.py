"""FSDP2 (`torch.distributed.fsdp.fully_shard`): every rank holds 1/N of each parameter, gradient and optimizer
state; a layer's full weights exist only while it runs. Launched with plain torchrun (NCCL on GPUs, gloo on
CPUs), one rank per device.

    actor.strategy=fsdp2                                   (RLLaVA's `fsdp` is the same engine)
    actor.fsdp.mixed_precision={param_dtype: bf16, reduce_dtype: fp32}
    actor.fsdp.reshard_after_forward=true                  (false: keep gathered weights until backward)
    actor.fsdp.enable_cpu_offload=true                     (shards on the CPU, optimizer steps there)
    actor.fsdp.offload_params=true                         (the same: RLLaVA's FSDP2 reads this key for it)
    actor.fsdp.offload_optimizer=true                      (Adam's state on the CPU outside the update)
    actor.fsdp.forward_prefetch=true                       (each unit starts the next one's all-gather)
    actor.fsdp.keep_gathered_units=N | auto                (the last N units gathered from forward to backward)

With either CPU offload switch, `actor.strategy=auto` runs this engine on one GPU too (a process group of one):
the parameters wait on the host and only the layer running is gathered on the device, as in RLLaVA.

Each decoder layer / vision block (the classes HF lists in `_no_split_modules`) is one FSDP unit, the root
module another. With CPU offload each all-gather starts with the shard's host-to-device copy: forward_prefetch
overlaps the next unit's with this one's compute (FSDP2 prefetches one unit ahead in backward by itself), and
keep_gathered_units spares the last units their second copy, for the backward (and its checkpointed recompute),
at the memory of their gathered weights (docs/performance.md). Gradients are averaged over ranks by the reduce-scatter, so a rank's loss must be scaled to
its share of the global batch (the Actor's normalisers do that: see `rllava.roles.batching.mini_batches`).
"""

from __future__ import annotations

import types
from contextlib import contextmanager

import torch
from torch.distributed.fsdp import (CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard,
                                    register_fsdp_forward_method)

from rllava.engine.train.single import SingleDeviceEngine
from rllava.errors import ConfigError
from rllava.model.forward import FSDP_FORWARD_METHOD, _token_logprobs

MP_KEYS = ("param_dtype", "reduce_dtype", "output_dtype")


def mixed_precision_policy(spec: dict | None) -> MixedPrecisionPolicy:
    """`actor.fsdp.mixed_precision` ({param_dtype: bf16, reduce_dtype: fp32, ...}) as FSDP2's policy."""
    from rllava.model.loader import DTYPES

    spec = dict(spec or {})
    spec.pop("buffer_dtype", None)  # FSDP1's; FSDP2 keeps buffers in the module's dtype
    unknown = set(spec) - set(MP_KEYS)
    if unknown:
        raise ConfigError(f"actor.fsdp.mixed_precision: unknown keys {sorted(unknown)} (valid: {', '.join(MP_KEYS)})")
    bad = {k: v for k, v in spec.items() if v is not None and v not in DTYPES}
    if bad:
        raise ConfigError(f"actor.fsdp.mixed_precision: {bad} — dtypes are one of {', '.join(DTYPES)}")
    return MixedPrecisionPolicy(**{k: DTYPES[v] for k, v in spec.items() if v is not None})


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The submodules to shard one by one: instances of the classes any HF model inside lists as
    `_no_split_modules` (decoder layers, vision blocks), innermost first."""
    names = {name for m in model.modules() for name in getattr(m, "_no_split_modules", None) or []}
    return [m for m in model.modules() if type(m).__name__ in names and m is not model]


def shard_model(model: torch.nn.Module, device: torch.device, *, mp: MixedPrecisionPolicy | None = None,
                cpu_offload: bool = False, reshard_after_forward: bool = True, forward_prefetch: bool = False,
                mesh=None) -> torch.nn.Module:
    """fully_shard each unit, then the root (whose parameters are whatever no unit took: embeddings, head).
    `forward_prefetch`: each unit's pre-forward also starts the next unit's all-gather
    (FSDPModule.set_modules_to_forward_prefetch). `mesh`: the ranks' device mesh (None: all ranks of the default
    process group)."""
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if cpu_offload else OffloadPolicy()
    kwargs = dict(mp_policy=mp or MixedPrecisionPolicy(), offload_policy=offload,
                  reshard_after_forward=reshard_after_forward, mesh=mesh)
    if not cpu_offload:
        model.to(device)
    units = shard_units(model)
    for unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    for unit, following in zip(units, units[1:]) if forward_prefetch else ():  # registration order: forward's
        unit.set_modules_to_forward_prefetch([following])
    # FSDP2 picks its root lazily, as the first module to run forward; HF generate may call a submodule (e.g.
    # the vision tower) before the root's forward, so make the root the root now (torch has no public call).
    model._get_fsdp_state()._lazy_init()
    if not hasattr(model, "value_head"):  # a policy: the training forward runs as a method of the root
        setattr(model, FSDP_FORWARD_METHOD, types.MethodType(_token_logprobs, model))
        register_fsdp_forward_method(model, FSDP_FORWARD_METHOD)
    return model


@contextmanager
def gathered_to_backward(root: torch.nn.Module, n: int, reshard_after_forward: bool = True):
    """The last `n` units (forward order) keep their gathered weights from their forward to their backward
    (set_reshard_after_forward(False); the backward reshards them): one all-gather, with CPU offload one
    host-to-device copy, per unit and micro-batch instead of two. Back to `reshard_after_forward` after."""
    units = [m for m in root.modules() if isinstance(m, FSDPModule) and m is not root][-n:] if n > 0 else []
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.set_reshard_after_forward(reshard_after_forward, recurse=False)
            unit.reshard()


class FSDP2Engine:
    def __init__(self, device: torch.device, max_grad_norm: float, skip_grad_norm: float | None = None, *,
                 mixed_precision: dict | None = None, reshard_after_forward: bool = True,
                 forward_prefetch: bool = False, keep_gathered_units: int = 0,
                 offload_params: bool = False, offload_optimizer: bool = False, cpu_optimizer: bool = False):
        self.device = device
        self.max_grad_norm, self.skip_grad_norm = max_grad_norm, skip_grad_norm
        self.mp = mixed_precision_policy(mixed_precision)
        self.reshard_after_forward = reshard_after_forward
        self.forward_prefetch, self.keep_gathered_units = forward_prefetch, keep_gathered_units
        # offload_params is RLLaVA's FSDP2 switch for CPUOffloadPolicy (its enable_cpu_offload is FSDP1's): the same
        self.offload_optimizer, self.cpu_optimizer = offload_optimizer, cpu_optimizer or offload_params
        self.model = self.optimizer = self.scheduler = self.root = None  # root: the module FSDP2 sharded last

    def prepare(self, model, make_optimizer, make_scheduler):
        self.model = self.root = shard_model(model, self.device, mp=self.mp, cpu_offload=self.cpu_optimizer,
                                             reshard_after_forward=self.reshard_after_forward,
                                             forward_prefetch=self.forward_prefetch)
        self.optimizer = make_optimizer([p for p in self.model.parameters() if p.requires_grad])
        self.scheduler = make_scheduler(self.optimizer)
        return self.model

    def shard_frozen(self, model: torch.nn.Module, cpu_offload: bool = False) -> torch.nn.Module:
        """A model that only runs forward (the reference, a teacher) sharded the same way; `cpu_offload`: its
        shards wait in host memory between forwards (FSDP2's CPU offload), as the policy's do with its own."""
        return shard_model(model.requires_grad_(False), self.device, mp=self.mp,
                           cpu_offload=self.cpu_optimizer or cpu_offload, reshard_after_forward=True,
                           forward_prefetch=self.forward_prefetch)

    masters: dict = {}  # no CPU fp32 masters (FSDP2's CPU offload steps on the shards): a plain optimizer step
    backward, optimizer_step = SingleDeviceEngine.backward, SingleDeviceEngine.optimizer_step

    @contextmanager
    def update_phase(self):
        """The single engine's (Adam's state on the device inside, with offload_optimizer), the last
        keep_gathered_units units gathered from each forward to its backward."""
        with SingleDeviceEngine.update_phase(self), gathered_to_backward(self.root, self.keep_gathered_units,
                                                                         self.reshard_after_forward):
            yield

    @contextmanager
    def rollout_phase(self, shares_model: bool):
        """HF generate (`shares_model`): every unit under the root gathered once for the whole rollout (ranks run
        different numbers of forwards, which would desynchronise per-forward all-gathers), then set back to its
        `reshards_after_forward`. A separate rollout engine: nothing to do (with CPU offload the shards are on the
        host already)."""
        if shares_model:
            units = [m for m in self.root.modules() if isinstance(m, FSDPModule)]
            for m in units:
                m.set_reshard_after_forward(False, recurse=False)
                m.unshard()
            try:
                yield
            finally:
                for m in units:
                    m.reshard()
                    m.set_reshard_after_forward(self.reshards_after_forward(m), recurse=False)
        else:
            yield

    def reshards_after_forward(self, unit: FSDPModule) -> bool:
        """`unit`'s setting outside rollouts: shard_model gives every unit actor.fsdp.reshard_after_forward."""
        return self.reshard_after_forward

    def state_dict(self) -> dict:
        """Sharded model + optimizer state (DTensors) for torch.distributed.checkpoint, which reshards on load."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optim = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optim,
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None}

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        # not strict: parameters that never had a gradient have no optimizer state (`checkpoint.load_engine`
        # has already checked that every weight is there)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"], options=StateDictOptions(strict=False))
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The unsharded weights on rank 0's CPU (empty elsewhere); every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
