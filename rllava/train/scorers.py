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

A scorer sees the fields the scorers before it filled (the built-in ones come first, in the order above).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable

import torch

from rllava.algorithms.registry import SCORERS, register_scorer
from rllava.data.protocol import Batch
from rllava.errors import ConfigError
from rllava.roles.rollout import logprob_gap_metrics
from rllava.train import builders as B  # builders imports this module only inside build_actor: no cycle


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


# ---- the built-in scorers, in the order learn runs them -------------------------------------------------------
@register_scorer("reference")
def reference(cfg, parts: Parts) -> Scorer | None:
    ref = B.build_reference_role(cfg, parts.policy, parts.device, parts.engine)
    return None if ref is None else Scorer(  # resets move the reference: exact resume needs its weights
        "ref_logprobs", ref.compute_logprobs, "ref", role=ref, engines={"ref": ref} if ref.reset_freq else {},
        after_update=lambda batch, step: ref.after_update(parts.policy, step))


@register_scorer("teachers")
def teachers(cfg, parts: Parts) -> Scorer | None:
    """On-policy distillation (algorithm.distill): the teachers score the samples before the update (a sampled
    loss) or inside it (loss=full: the Actor runs them); the Actor adds the dense term either way."""
    distill = B.build_distillation(cfg, parts.processor, parts.policy, parts.device, parts.engine)
    if distill is None:
        return None
    before = distill.needs("teacher_logprobs")
    return Scorer("teacher_logprobs", distill.teachers.compute_logprobs, "teacher", role=distill,
                  when=lambda batch: before)


@register_scorer("critic")
def critic(cfg, parts: Parts) -> Scorer | None:
    c = B.build_critic(cfg, parts.device, parts.steps, parts.algorithm)
    return None if c is None else Scorer("values", c.compute_values, "values", role=c, engines={"critic": c.engine},
                                         after_update=lambda batch, step: c.update(batch))  # its own, same batch


@register_scorer("kl_in_reward")
def kl_in_reward(cfg, parts: Parts) -> Scorer | None:
    """r_t - beta * KL(pi_old || pi_ref)_t, beta from algorithm.kl_ctrl (fixed or adaptive); the exact KL over the
    vocabulary with algorithm.kl_penalty=full (the reference's hidden states, then the policy's forward)."""
    ctrl, ref = B.build_kl_controller(cfg), parts.built.get("ref_logprobs")
    if ctrl is None:
        return None

    def score(batch: Batch):
        exact = ref.role.full_kl(batch, parts.policy) if ctrl.estimator == "full" else None
        return ctrl.penalize(batch.scores, batch.loss_mask, batch.old_logprobs, batch.ref_logprobs, exact)

    return Scorer("token_rewards", score, "kl_in_reward", reads=("old_logprobs",), role=ctrl,
                  states={"kl_ctrl": ctrl})


__all__ = ["Parts", "Scorer", "build_scorers", "old_logprobs", "register_scorer"]
