"""Metric sinks selected by `trainer.logger`: console, jsonl (`outputs_dir/metrics.jsonl`), tensorboard, wandb, and
the outside trackers of rllava.train.tracker_hub (mlflow, swanlab, trackio); plus `outputs_dir/samples.jsonl`, a few
training generations every trainer.samples_freq steps, and `outputs_dir/val_generations.jsonl`, validation's.

Each metrics.jsonl row also carries `time/elapsed_s`: wall-clock seconds since the tracker started (model loaded,
checkpoint restored), summed over resumes from the value logged at the checkpoint's step, so steps redone after a
resume and the restart itself are not counted. `python -m rllava.commands.compare` plots curves against it."""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager

from rllava.train import tracker_hub
from rllava.utils.fs import write_text_atomic

# What the console line shows, in order, when present (everything goes to the other sinks), then the timings.
CONSOLE_KEYS = ["reward/mean", "reward/accuracy_mean", "reward/score", "val/accuracy", "val/score", "val/reward_mean",
                "val_greedy/accuracy", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac",
                "actor/grad_norm", "response_length/mean", "timing/step", "perf/tokens_per_s"]
# Files holding one row per step, rewound to the checkpoint's step on resume.
STEP_FILES = ("metrics.jsonl", "samples.jsonl", "val_generations.jsonl")


class Tracker:
    """`loggers=None` (ranks other than 0 under torchrun): a tracker that writes nothing."""

    def __init__(self, loggers: list[str] | None, outputs_dir: str, project: str, experiment: str, config: dict):
        self.enabled, self.outputs_dir = loggers is not None, outputs_dir
        self.jsonl = self.tb = self.wandb = None
        self.hubs = []  # tracker_hub's backends
        self.started, self.elapsed_before = time.monotonic(), 0.0  # time/elapsed_s = elapsed_before + since started
        self.console = self.enabled and "console" in loggers
        if not self.enabled:
            return
        os.makedirs(outputs_dir, exist_ok=True)
        # metrics.jsonl is always written: it is what plots, tests and resumed runs read.
        self.jsonl = open(os.path.join(outputs_dir, "metrics.jsonl"), "a")
        self.tb = self._tensorboard() if "tensorboard" in loggers else None
        self.wandb = start_wandb(project, experiment, config, outputs_dir) if "wandb" in loggers else None
        self.hubs = tracker_hub.start(loggers, project, experiment, config, outputs_dir)

    def _tensorboard(self, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(os.environ.get("TENSORBOARD_DIR", os.path.join(self.outputs_dir, "tensorboard")),
                             purge_step=purge_step)

    def rewind(self, step: int) -> None:
        """Resumed from `step`'s checkpoint: drop what was logged after it (tensorboard: purge_step; the outside
        trackers: a new run, metrics.jsonl's rows up to `step` logged again), each step once."""
        if not self.enabled:
            return
        self.jsonl.close()
        for path in [os.path.join(self.outputs_dir, name) for name in STEP_FILES]:
            if os.path.isfile(path):  # keep the rows whose "step" is <= `step`, rewritten atomically
                with open(path) as f:
                    kept = [line for line in f if line.strip() and json.loads(line).get("step", 0) <= step]
                write_text_atomic(path, "".join(kept))
        with open(os.path.join(self.outputs_dir, "metrics.jsonl")) as f:
            times = [r["time/elapsed_s"] for r in map(json.loads, filter(str.strip, f)) if "time/elapsed_s" in r]
        self.started, self.elapsed_before = time.monotonic(), times[-1] if times else 0.0
        self.jsonl = open(os.path.join(self.outputs_dir, "metrics.jsonl"), "a")
        if self.tb is not None:
            self.tb.close()
            self.tb = self._tensorboard(purge_step=step + 1)
        tracker_hub.replay(self.hubs, self.outputs_dir)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if not self.enabled:
            return
        elapsed = self.elapsed_before + time.monotonic() - self.started
        self.jsonl.write(json.dumps({"step": step, **metrics, "time/elapsed_s": round(elapsed, 3)}) + "\n")
        self.jsonl.flush()
        if self.tb is not None:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        for hub in self.hubs:
            hub.log(metrics, step)
        if self.console:
            shown = " ".join(f"{k}={metrics[k]:.4g}" for k in CONSOLE_KEYS if k in metrics)
            stages = " ".join(f"{k[7:]}={v:.2f}s" for k, v in metrics.items()
                              if k.startswith("timing/") and k != "timing/step")
            print(f"[step {step}] " + " | ".join(part for part in (shown, stages) if part), flush=True)

    def log_samples(self, rows: list[dict], step: int) -> None:
        """One json line per generation in outputs_dir/samples.jsonl (a ground truth that is not JSON: its str)."""
        if not self.enabled:
            return
        self._append("samples.jsonl", rows, step)

    def log_generations(self, rows: list[dict], step: int) -> None:
        """Validation generations: lines of outputs_dir/val_generations.jsonl, and a table where the tracker has one
        (wandb: a Table at `val/generations`; tracker_hub's)."""
        if not self.enabled or not rows:
            return
        self._append("val_generations.jsonl", rows, step)
        if self.wandb is not None:
            import wandb

            columns, cells = tracker_hub.table_columns(rows, step)
            self.wandb.log({"val/generations": wandb.Table(columns=columns, data=cells)}, step=step)
        for hub in self.hubs:
            hub.table(rows, step)

    def _append(self, name: str, rows: list[dict], step: int) -> None:
        with open(os.path.join(self.outputs_dir, name), "a") as f:
            f.writelines(json.dumps({"step": step, **r}, default=str) + "\n" for r in rows)

    def close(self) -> None:
        if not self.enabled:
            return
        self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
        for hub in self.hubs:
            hub.close()


def start_wandb(project: str, experiment: str, config: dict, outputs_dir: str):
    """A wandb run, offline (files under outputs_dir/wandb, `wandb sync` later) unless an API key is set or
    WANDB_MODE says otherwise; not installed: the run stopped before its model loaded (tracker_hub.require)."""
    import wandb

    netrc = os.path.expanduser("~/.netrc")
    logged_in = os.environ.get("WANDB_API_KEY") or (os.path.isfile(netrc) and "api.wandb.ai" in open(netrc).read())
    mode = os.environ.get("WANDB_MODE") or ("online" if logged_in else "offline")
    return wandb.init(project=project, name=experiment, config=config, dir=outputs_dir, mode=mode)


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
