"""Metric sinks selected by `trainer.logger`: console, jsonl (`outputs_dir/metrics.jsonl`), tensorboard, wandb."""

from __future__ import annotations

import json
import os
import time
import warnings
from contextlib import contextmanager

# What the console line shows, in order, when present (everything goes to the other sinks).
CONSOLE_KEYS = ["reward/mean", "reward/accuracy_mean", "val/accuracy", "val/reward_mean", "val_greedy/accuracy",
                "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac", "actor/grad_norm",
                "response_length/mean", "timing/step", "perf/tokens_per_s"]


class Tracker:
    """`loggers=None` (ranks other than 0 under torchrun): a tracker that writes nothing."""

    def __init__(self, loggers: list[str] | None, outputs_dir: str, project: str, experiment: str, config: dict):
        self.enabled = loggers is not None
        self.jsonl = self.tb = self.wandb = None
        self.console = self.enabled and "console" in loggers
        if not self.enabled:
            return
        os.makedirs(outputs_dir, exist_ok=True)
        # metrics.jsonl is always written: it is what plots, tests and resumed runs read.
        self.jsonl = open(os.path.join(outputs_dir, "metrics.jsonl"), "a")
        if "tensorboard" in loggers:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(os.environ.get("TENSORBOARD_DIR", os.path.join(outputs_dir, "tensorboard")))
        if "wandb" in loggers:
            try:
                import wandb
            except ImportError:
                warnings.warn("trainer.logger includes wandb but wandb is not installed (pip install wandb): "
                              "skipping it")
            else:
                self.wandb = wandb.init(project=project, name=experiment, config=config, dir=outputs_dir)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if not self.enabled:
            return
        self.jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self.jsonl.flush()
        if self.tb is not None:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        if self.console:
            shown = " ".join(f"{k}={metrics[k]:.4g}" for k in CONSOLE_KEYS if k in metrics)
            print(f"[step {step}] {shown}", flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


class Timer:
    """Accumulates wall time per named stage: `with timer("rollout"): ...`; `timer.pop()` -> {timing/name: s}."""

    def __init__(self):
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        out, self.times = {f"timing/{k}": v for k, v in self.times.items()}, {}
        return out
