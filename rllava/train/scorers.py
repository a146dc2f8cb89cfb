"""Scorers: the passes over a step's batch between the reward (stage 2) and the advantage (stage 3). Each fills
one field of the Batch; `learn` (rllava.train.pipeline.rlvr) runs this run's scorers in order, then the advantage:

    old_logprobs      the Actor before its update   several optimizer steps per batch, or a KL in the reward
    ref_logprobs      the Reference                 a KL to it (algorithm.use_kl_loss / use_kl_in_reward)
    teacher_logprobs  distillation's teachers       a sampled distillation loss (algorithm.distill)
    values            the Critic                    critic.model.model_path (gae)
    token_rewards     the KL-in-reward controller   algorithm.use_kl_in_reward: r_t - beta * KL_t

A new pass (a process reward model's token rewards, a second frozen model's log-probs) is one registration in a
file of `algorithm.plugins`, with no edit to the pipeline (docs/custom_task.md):

    @register_scorer("my_prm")
    def my_prm(cfg, parts: Parts) -> Scorer | None:          # None: this run does not use it
        prm = load_frozen(path, parts.device, key="my_prm", engine=parts.engine)  # rllava.model.loader
        return Scorer("token_rewards", lambda batch: ..., "prm")  # the field, its value, the timer

A scorer sees the fields the scorers before it filled (the built-in ones come first, in the order above; they are
registered in rllava.train.builders, each beside the builder of the role it runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable

import torch

from rllava.algorithms.registry import SCORERS, register_scorer
from rllava.data.protocol import Batch
from rllava.errors import ConfigError
from rllava.roles.rollout import logprob_gap_metrics


@dataclass(kw_only=True)
class Parts:
    """What a scorer's builder may use (frozen copies shard like `engine`); `built`: the earlier scorers, by field."""

    cfg: object
    policy: torch.nn.Module
    engine: object
    processor: object
    device: torch.device
    steps: int
    algorithm: object
    built: dict = field(default_factory=dict)


@dataclass
class Scorer:
    """One pass: `score(batch)` -> the value of `batch.<fills>`, or (that value, metrics to log)."""

    fills: str  # the Batch field it writes
    score: Callable[[Batch], object]
    name: str  # its timer (timing/<name>)
    when: Callable[[Batch], bool] = lambda batch: True  # whether this batch needs it
    after_update: Callable[[Batch, int], dict] | None = None  # after the actor's update of step k: its metrics
    reads: tuple[str, ...] = ()  # the fields it reads that a pass before it fills only when some scorer reads them
    role: object = None  # what computes it (the Actor reads the Reference's and the teachers' inside its update)
    engines: dict = field(default_factory=dict)  # what a checkpoint saves of it with DCP, by name
    states: dict = field(default_factory=dict)  # what a checkpoint saves of it in state.json (state_dict()), by name

    def fill(self, batch: Batch) -> dict[str, float]:
        """Write the field; returns the metrics that came with it."""
        out = self.score(batch)
        value, metrics = out if isinstance(out, tuple) else (out, {})
        setattr(batch, self.fills, value)
        return metrics


def build_scorers(cfg, parts: Parts) -> list[Scorer]:
    """Every registered scorer this run uses, in registration order (plugins loaded by the caller)."""
    scorers, batch_fields = [], {f.name for f in fields(Batch)}
    for name, builder in SCORERS.items():
        scorer = builder(cfg, parts)
        if scorer is None:
            continue
        if scorer.fills not in batch_fields:
            raise ConfigError(f"scorer {name!r} ({builder.__code__.co_filename}) fills batch.{scorer.fills}, which is not a "
                              f"field of the Batch (rllava.data.protocol): one of {', '.join(sorted(batch_fields))}")
        scorers.append(scorer)
        parts.built[scorer.fills] = scorer
    return scorers


def old_logprobs(actor) -> Scorer:
    """pi_old: the Actor's own no-grad pass, when its update takes several optimizer steps or one of its scorers
    reads old_logprobs; logs how far the rollout engine's log-probs are from it."""
    reads = any("old_logprobs" in s.reads for s in actor.scorers)
    def score(batch: Batch):
        batch.old_logprobs = actor.compute_logprobs(batch)
        return batch.old_logprobs, logprob_gap_metrics(batch)  # engine vs trainer on the sampled tokens

    return Scorer("old_logprobs", score, "old_logprob", when=lambda batch: reads or actor.needs_old_logprobs(batch))


__all__ = ["Parts", "Scorer", "build_scorers", "old_logprobs", "register_scorer"]
