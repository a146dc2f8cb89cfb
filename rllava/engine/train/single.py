"""One process, one device: plain PyTorch (AdamW, gradient clipping, LR schedule), with RLLaVA's three CPU
offload switches (actor.fsdp.*, read by every engine):

- `offload_params`: parameters and gradients on the CPU while a rollout engine with its own weights samples
  (`rollout_phase()`).
- `offload_optimizer`: Adam's two moments (8 bytes per parameter) on the CPU outside `update_phase()`.
- `enable_cpu_offload` (ZeRO-Offload's split, like FSDP's CPU offload): the optimizer runs on the CPU over fp32
  *master* copies of the trainable parameters, copied into the device parameters after each step; the device
  holds only the model and its gradients (and with a bf16 model the updates stay in fp32).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch

from rllava.engine.train.checkpoint import optimizer_state_by_index, optimizer_state_by_name

HOST = torch.device("cpu")


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    for state in optimizer.state.values():
        for k, v in state.items():
            if isinstance(v, torch.Tensor) and k != "step":  # Adam keeps `step` on the CPU
                state[k] = v.to(device)


def release_device_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()  # hand the freed blocks back, e.g. to a rollout engine


def clipped_step(model, optimizer, scheduler, max_grad_norm: float, skip_grad_norm: float | None, step) -> float:
    """Clip `model`'s gradients by their global norm (FSDP2: over every rank's shards), call `step()` unless the norm is
    not finite or above `skip_grad_norm`, zero the grads, advance the LR schedule; returns the norm before clipping."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm) if params else torch.tensor(0.0)
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP2's norm is a DTensor
    if math.isfinite(norm) and (skip_grad_norm is None or norm <= skip_grad_norm):
        step()
    model.zero_grad(set_to_none=True)
    optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()
    return norm


@contextmanager
def optimizer_on_device(optimizer: torch.optim.Optimizer, device: torch.device, offload: bool):
    """With `offload`, the optimizer state lives on the CPU and comes to `device` only inside the block."""
    if offload:
        move_optimizer_state(optimizer, device)
    try:
        yield
    finally:
        if offload:
            move_optimizer_state(optimizer, HOST)
            release_device_memory(device)


class SingleDeviceEngine:
    def __init__(self, device: torch.device, max_grad_norm: float, skip_grad_norm: float | None = None, *,
                 offload_params: bool = False, offload_optimizer: bool = False, cpu_optimizer: bool = False):
        self.device, self.max_grad_norm, self.skip_grad_norm = device, max_grad_norm, skip_grad_norm
        self.offload_params, self.offload_optimizer, self.cpu_optimizer = offload_params, offload_optimizer, cpu_optimizer
        self.model = self.optimizer = self.scheduler = None
        self.masters: dict[torch.nn.Parameter, torch.Tensor] = {}  # device param -> its CPU fp32 master

    def prepare(self, model, make_optimizer, make_scheduler):
        """Move the model to the device; build the optimizer over its trainable parameters (cpu_optimizer: over
        CPU fp32 masters of them) and the LR schedule."""
        self.model = model.to(self.device)
        params = [p for p in model.parameters() if p.requires_grad]
        if self.cpu_optimizer:
            self.masters = {p: p.detach().to(HOST, torch.float32, copy=True).requires_grad_(True) for p in params}
            params = list(self.masters.values())
        self.optimizer = make_optimizer(params)
        self.scheduler = make_scheduler(self.optimizer)
        return self.model

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def optimizer_step(self) -> float:
        return clipped_step(self.model, self.optimizer, self.scheduler, self.max_grad_norm, self.skip_grad_norm,
                            self._step_on_host if self.masters else self.optimizer.step)

    def _step_on_host(self) -> None:
        for p, master in self.masters.items():
            master.grad = None if p.grad is None else p.grad.detach().to(HOST, torch.float32)
        self.optimizer.step()
        with torch.no_grad():
            for p, master in self.masters.items():
                p.copy_(master)

    @contextmanager
    def update_phase(self):
        """The optimizer steps of one training stage: optimizer state on the device inside (offload_optimizer); a
        CPU optimizer's state never leaves the CPU. (The FSDP2 engine's too.)"""
        with optimizer_on_device(self.optimizer, self.device, self.offload_optimizer and not self.cpu_optimizer):
            yield

    @contextmanager
    def rollout_phase(self, shares_model: bool):
        """While a rollout engine samples: parameters and gradients on the CPU (offload_params), unless the
        engine samples with this very model (`shares_model`, HF generate)."""
        if shares_model or not self.offload_params:
            yield
            return
        self.model.to(HOST)  # nn.Module.to moves each parameter's .grad along with it
        release_device_memory(self.device)
        try:
            yield
        finally:
            self.model.to(self.device)

    def _param_names(self) -> dict[torch.Tensor, str]:
        """Optimizer parameter (the device parameter, or its CPU master) -> the parameter's name."""
        names = {p: n for n, p in self.model.named_parameters()}
        return {m: names[p] for p, m in self.masters.items()} if self.masters else names

    def state_dict(self) -> dict:  # keyed by parameter name, as FSDP2's (see `checkpoint.py`)
        return {"model": self.model.state_dict(),
                "optimizer": optimizer_state_by_name(self.optimizer, self._param_names()),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None}

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(optimizer_state_by_index(state["optimizer"], self.optimizer,
                                                                self._param_names()))
        if self.masters:  # the masters follow the loaded weights
            with torch.no_grad():
                for p, master in self.masters.items():
                    master.copy_(p)
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
