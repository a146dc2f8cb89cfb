"""The train-engine interface (after HF Accelerate's): the loop never asks which one runs.

    model, optimizer, scheduler = engine.prepare(model, optimizer, scheduler)
    engine.backward(loss); grad_norm = engine.optimizer_step()
    raw = engine.unwrap_model(model)

Single device, FSDP2 and DeepSpeed implement it.
"""

from __future__ import annotations

from typing import Protocol

import torch


class TrainEngine(Protocol):
    device: torch.device

    def prepare(self, model, optimizer, scheduler): ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def optimizer_step(self) -> float: ...

    def unwrap_model(self, model) -> torch.nn.Module: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...
