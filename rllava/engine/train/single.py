"""One process, one device: plain PyTorch (AdamW, gradient clipping, LR schedule)."""

from __future__ import annotations

import math

import torch


class SingleDeviceEngine:
    def __init__(self, device: torch.device, max_grad_norm: float, skip_grad_norm: float | None = None):
        self.device = device
        self.max_grad_norm = max_grad_norm
        self.skip_grad_norm = skip_grad_norm  # skip the update when the pre-clip norm exceeds it (or is not finite)
        self.model = self.optimizer = self.scheduler = None

    def prepare(self, model, optimizer, scheduler):
        self.model, self.optimizer, self.scheduler = model.to(self.device), optimizer, scheduler
        return self.model, optimizer, scheduler

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def optimizer_step(self) -> float:
        """Clip, step, advance the LR schedule, zero grads; returns the gradient norm before clipping."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)) if params else 0.0
        if math.isfinite(norm) and (self.skip_grad_norm is None or norm <= self.skip_grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        return norm

    def unwrap_model(self, model) -> torch.nn.Module:
        return model

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
