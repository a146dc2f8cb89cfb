"""DeepSpeed ZeRO (stage 1, 2 or 3) as a train engine (`pip install "rllava[deepspeed]"`), imported only for
`actor.strategy=deepspeed` (or `critic.strategy`). Plain torchrun, one rank per device (NCCL on GPUs, gloo on
CPUs), or plain python as one rank.

    actor.strategy=deepspeed
    actor.deepspeed.zero_stage=3             (1: optimizer state sharded; 2: + gradients; 3: + parameters)
    actor.deepspeed.enable_cpu_offload=true  (ZeRO-Offload: fp32 masters + Adam on the CPU, DeepSpeedCPUAdam)
    actor.deepspeed.torch_dtype=bf16         (bf16 weights, fp32 masters in the optimizer; fp32: no casting)
    actor.fsdp.offload_params / offload_optimizer   (RLLaVA's switches, read by every engine)

rllava forms its own micro-batches (a variable number per step with dynamic batching), so DeepSpeed runs with
`managed_gradient_accumulation: false`: `backward` only accumulates, `optimizer_step` is the boundary (reduce,
clip at max_grad_norm, step, schedule). With global counts as loss normalisers, one step equals the
single-process step on the same global batch (tested at 2 ranks, stages 2 and 3).

The training forward must run *through* the DeepSpeed engine (its hooks prepare the backward and, at stage 3,
gather each layer's parameters): it wraps a module whose forward is the log-prob pass, installed as the policy's
forward method (`rllava.model.forward.FSDP_FORWARD_METHOD`), as FSDP2 does.

`state_dict()`: the full fp32 masters and Adam's moments by parameter name (`deepspeed.utils.safe_get_full_*`),
the other engines' format, so a checkpoint resumes across DeepSpeed, FSDP2 and one device, at any world size.
DeepSpeed clips at max_grad_norm and skips a step whose norm is not finite; `skip_grad_norm` is not applied
(DeepSpeed computes the norm inside its step).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

import torch

from rllava import distributed as D
from rllava.engine.train.checkpoint import init_optimizer_state
from rllava.errors import ConfigError
from rllava.model.forward import FSDP_FORWARD_METHOD, _token_logprobs


def ds_config(ds, max_grad_norm: float, *, optimizer: bool = True) -> dict:
    """The DeepSpeed config dict from `actor.deepspeed` (a DeepSpeedConfig, checked when the config loads)."""
    zero = {"stage": ds.zero_stage, "contiguous_gradients": ds.contiguous_gradients,
            "overlap_comm": ds.overlap_comm and ds.zero_stage > 1, "reduce_scatter": ds.reduce_scatter}
    if ds.zero_stage == 3:
        zero.update(stage3_prefetch_bucket_size=int(ds.stage3_prefetch_bucket_size),
                    stage3_param_persistence_threshold=int(ds.stage3_param_persistence_threshold))
    if ds.enable_cpu_offload and optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    return {
        "train_micro_batch_size_per_gpu": 1,  # unused: rllava forms the micro-batches
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,  # backward accumulates; step() is the boundary
        "gradient_clipping": max_grad_norm,
        "bf16": {"enabled": ds.torch_dtype == "bf16"},
        "fp16": {"enabled": ds.torch_dtype == "fp16"},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,  # rllava builds AdamW; tests use SGD to expose the gradient
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }


class LogprobForward(torch.nn.Module):
    """The policy's training forward (`_token_logprobs`) as a module, for DeepSpeed to wrap and run."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch, **kwargs):
        return _token_logprobs(self.model, batch, **kwargs)


def ops_to_build(deepspeed, cpu_adam: bool) -> list[str]:
    """The C++ ops DeepSpeed will compile before this run starts (JIT, with ninja: minutes), since neither the
    install (DS_BUILD_OPS=1) nor an earlier run left them built (torch's extension cache, TORCH_EXTENSIONS_DIR): a
    CPU's shared-memory collectives (deepspeed/comm/torch.py `build_shm_op`) and, for ZeRO-Offload, cpu_adam."""
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import installed_ops
    from torch.utils.cpp_extension import _get_build_directory

    kinds = ("ShareMemCommBuilder", "CPUAdamBuilder")[:1 + cpu_adam]
    builders = [b for b in map(get_accelerator().create_op_builder, kinds) if b is not None]  # None: not here
    return [b.NAME for b in builders if deepspeed.ops.__compatible_ops__.get(b.NAME) and not installed_ops.get(b.NAME)
            and not os.path.exists(os.path.join(_get_build_directory(b.NAME, False), f"{b.NAME}.so"))]


def _wrap(deepspeed, model: torch.nn.Module, config: dict, device: torch.device, **kwargs):
    """deepspeed.initialize around `model` (a policy: around its log-prob forward, installed as its forward
    method); returns (the module the roles call, the DeepSpeed engine)."""
    D.group_of_one(device)  # DeepSpeed needs a process group even for one rank (plain `python -m`)
    policy = not hasattr(model, "value_head")
    module = model
    if policy:
        module = LogprobForward(model)
        # the chunked LM head uses the head's weight outside the head's forward (and in its own backward):
        # ZeRO-3 must gather it for the whole forward and backward of the log-prob pass
        deepspeed.zero.register_external_parameter(module, model.get_output_embeddings().weight)
    ds, *_ = deepspeed.initialize(model=module, config=config, **kwargs)
    if policy:
        setattr(model, FSDP_FORWARD_METHOD, ds.forward)
        return model, ds
    return ds, ds  # the critic calls the engine itself


class DeepSpeedEngine:
    def __init__(self, device: torch.device, max_grad_norm: float, *, deepspeed_config,
                 offload_params: bool = False, offload_optimizer: bool = False):
        try:
            import deepspeed
        except ImportError as e:
            raise ConfigError(f'actor.strategy=deepspeed needs DeepSpeed: pip install "rllava[deepspeed]" ({e})') from e
        self.deepspeed = deepspeed
        self.device, self.max_grad_norm, self.cfg = device, max_grad_norm, deepspeed_config
        self.offload_params, self.offload_optimizer = offload_params, offload_optimizer
        self.model = self.optimizer = self.scheduler = self.ds = None

    # -- build ----------------------------------------------------------------------------------------------
    def prepare(self, model, make_optimizer, make_scheduler):
        """deepspeed.initialize with our AdamW (DeepSpeedCPUAdam over CPU masters when offloading) and LR
        schedule; `self.optimizer` is the torch optimizer over this rank's flat fp32 partitions."""
        building = ops_to_build(self.deepspeed, self.cfg.enable_cpu_offload)
        if building and D.is_main():
            print(f"rllava: DeepSpeed compiles {' and '.join(building)} first (C++, about 3 minutes; once: torch's "
                  "extension cache keeps them for later runs)", file=sys.stderr, flush=True)
        model.to(self.device)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = make_optimizer(params)
        if self.cfg.enable_cpu_offload:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            d = optimizer.defaults
            optimizer = DeepSpeedCPUAdam(params, lr=d["lr"], betas=d["betas"], eps=d["eps"],
                                         weight_decay=d["weight_decay"], adamw_mode=True)
        scheduler = make_scheduler(optimizer)
        self.model, self.ds = _wrap(self.deepspeed, model, ds_config(self.cfg, self.max_grad_norm), self.device,
                                    model_parameters=params, optimizer=optimizer, lr_scheduler=scheduler)
        self.optimizer = self.ds.optimizer.optimizer  # the ZeRO wrapper's torch optimizer
        self.scheduler = scheduler
        return self.model

    def shard_frozen(self, model: torch.nn.Module, cpu_offload: bool = False) -> torch.nn.Module:
        """The reference or a teacher (forward only): partitioned as the policy at stage 3, a full copy per rank
        below. `cpu_offload`: in host memory between forwards (stage 3: ZeRO's `offload_param`; below, the caller
        moves the copy in for its passes)."""
        model.requires_grad_(False).to("cpu" if cpu_offload and self.cfg.zero_stage < 3 else self.device)
        if self.cfg.zero_stage < 3:
            return model
        cfg = ds_config(self.cfg, self.max_grad_norm, optimizer=False)
        if cpu_offload:
            cfg["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
        return _wrap(self.deepspeed, model, cfg, self.device)[0]

    # -- update ---------------------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> None:
        self.ds.backward(loss)

    def optimizer_step(self) -> float:
        """Reduce the accumulated gradients, clip, step (unless the norm is not finite), schedule; returns the
        norm before clipping."""
        self.ds.step()
        norm = self.ds.get_global_grad_norm()
        return float(norm) if norm is not None else 0.0

    @contextmanager
    def update_phase(self):
        """offload_optimizer: Adam's state and the fp32 masters on the CPU outside the update stage (with
        ZeRO-Offload they never leave it)."""
        with self._states_on_host(self.offload_optimizer and not self.cfg.enable_cpu_offload,
                                  ["optim_states", "hp_params"]):
            yield

    @contextmanager
    def rollout_phase(self, shares_model: bool):
        """HF generate (`shares_model`): at stage 3 every parameter gathered for the whole rollout, with ZeRO-3's
        module hooks removed (ranks decode different numbers of steps; the hooks expect the same calls on every
        rank). A separate rollout engine: the weights and gradients, and the optimizer state unless it lives on
        the CPU already, go to the CPU (offload_params) through DeepSpeed's offload_states / reload_states."""
        if shares_model and self.cfg.zero_stage == 3:
            from deepspeed.runtime.zero.stage3 import unwrap_model_for_generation

            with unwrap_model_for_generation(self.ds):
                yield
            return
        device_states = None if not self.cfg.enable_cpu_offload else ["lp_params", "lp_grads", "contiguous_grad_buffer"]
        with self._states_on_host(self.offload_params and not shares_model, device_states):
            yield

    @contextmanager
    def _states_on_host(self, offload: bool, include: list[str] | None):
        if not offload or self.device.type == "cpu":  # nothing to move on a CPU
            yield
            return
        from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum

        self.ds.offload_states(include=None if include is None else [OffloadStateTypeEnum(s) for s in include])
        try:
            yield
        finally:
            self.ds.reload_states()

    # -- state ----------------------------------------------------------------------------------------------
    def _module(self) -> torch.nn.Module:
        """The module whose names the checkpoint uses (the HF model / the value model)."""
        return self.ds.module if self.model is self.ds else self.model

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights (gathered at stage 3) on the CPU; every rank must call it."""
        module = self._module()
        with self.deepspeed.zero.GatheredParameters(list(module.parameters())):
            return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}

    def state_dict(self) -> dict:
        """Full fp32 masters and Adam moments by parameter name (`checkpoint.py`); every rank calls and holds it."""
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        model = self.full_state_dict()
        state, names = {}, []
        step = self._adam_step()
        for name, p in self._module().named_parameters():
            if not p.requires_grad:
                continue
            names.append(name)
            model[name] = safe_get_full_fp32_param(p).detach().cpu()
            if step is not None:
                state[name] = {"step": step.clone(), **{k: safe_get_full_optimizer_state(p, k).detach().cpu()
                                                        for k in ("exp_avg", "exp_avg_sq")}}
        (group,) = self.optimizer.param_groups
        groups = [{**{k: v for k, v in group.items() if k != "params"}, "params": names}]
        return {"model": model, "optimizer": {"state": state, "param_groups": groups},
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None}

    def init_optimizer_state(self) -> None:
        """Adam's state for every parameter before a load fills it (see `checkpoint.init_optimizer_state`)."""
        zero = self.ds.optimizer
        if hasattr(zero, "_set_fp32_optimizer_param_groups"):  # ZeRO-3 hands the optimizer its partitions
            zero._set_fp32_optimizer_param_groups()  # only inside a step
            try:
                init_optimizer_state(self.optimizer)
            finally:
                zero._clear_fp32_optimizer_param_groups()
        else:
            init_optimizer_state(self.optimizer)
            zero._lazy_init_hp_params_optimizer_state()  # ZeRO-1/2 link parameters to their state after a step

    def _adam_step(self) -> torch.Tensor | None:
        states = [s for s in self.optimizer.state.values() if "step" in s]
        return torch.as_tensor(states[0]["step"], dtype=torch.float32).cpu() if states else None

    def load_state_dict(self, state: dict) -> None:
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

        module = self._module()
        with self.deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=0):
            module.load_state_dict(state["model"])
        saved = state["optimizer"]["state"]
        for name, p in module.named_parameters():
            if not p.requires_grad:
                continue
            safe_set_full_fp32_param(p, state["model"][name].to(self.device))
            for k in ("exp_avg", "exp_avg_sq"):
                if name in saved:
                    safe_set_full_optimizer_state(p, saved[name][k].to(self.device), k)
        step = next((s["step"] for s in saved.values()), None)  # the same for every parameter
        for s in self.optimizer.state.values() if step is not None else []:
            s["step"] = torch.as_tensor(step, dtype=torch.float32).clone() if torch.is_tensor(s["step"]) else int(step)
        (group,) = self.optimizer.param_groups
        group.update({k: v for k, v in state["optimizer"]["param_groups"][0].items() if k != "params"})
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
