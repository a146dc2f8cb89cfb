"""The train-engine interface: the roles and the loop never ask which engine runs.

    model = engine.prepare(model, make_optimizer, make_scheduler)   # shard/move, then build the optimizer
    with engine.update_phase():                                     # optimizer state on the device
        engine.backward(loss); grad_norm = engine.optimizer_step()
    with engine.rollout_phase(shares_model):                        # weights ready for a rollout engine
        ...
    engine.state_dict() / load_state_dict(state)                   # torch.distributed.checkpoint-ready
    engine.full_state_dict()                                        # plain tensors, for save_pretrained

The optimizer is built *after* the model is prepared (FSDP2 replaces parameters with sharded ones), so
`prepare` takes factories: `make_optimizer(params)` and `make_scheduler(optimizer)`.
Single device (`single.py`), FSDP2 (`fsdp2.py`), DeepSpeed ZeRO (`deepspeed.py`) and Accelerate implement it.
"""

from __future__ import annotations

from typing import Callable, ContextManager, Protocol

import torch


class TrainEngine(Protocol):
    device: torch.device
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object

    def prepare(self, model, make_optimizer: Callable, make_scheduler: Callable) -> torch.nn.Module: ...
    def backward(self, loss: torch.Tensor) -> None: ...
    def optimizer_step(self) -> float: ...
    def update_phase(self) -> ContextManager: ...
    def rollout_phase(self, shares_model: bool) -> ContextManager: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...
    def full_state_dict(self) -> dict[str, torch.Tensor]: ...
