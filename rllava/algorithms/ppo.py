"""The algorithm object: `PPO` turns the config into the loop's two calls, `compute_advantage(batch)` (stage 3) and
`policy_loss(inputs)` (inside stage 4), each dispatched through the registries, so a new estimator or loss is one
registered function; a whole new algorithm may subclass PPO and override these two methods.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys

import torch

from rllava.algorithms import advantage as _advantage  # noqa: F401  (registers the built-in estimators)
from rllava.algorithms import distill as _distill  # noqa: F401  (registers the distillation losses)
from rllava.algorithms.hybrid import HYBRID_LOSS_KEYS  # (the import registers the SFT+RL hybrid losses)
from rllava.algorithms.kl import token_rewards_of
from rllava.algorithms.losses import LossInputs  # (the import registers the built-in losses)
from rllava.algorithms.registry import ADV_ESTIMATORS, ALGORITHMS, POLICY_LOSSES, call_with_params, lookup
from rllava.data.protocol import Batch
from rllava.errors import ConfigError


class PPO:
    """Stage 3 and the loss of stage 4, as the config picks them. `algorithm.adv_estimator` names a registered
    estimator function, or a PPO subclass registered with `@register_ppo` (which then overrides methods)."""

    def __init__(self, algorithm_cfg, actor_cfg, loss_mode: str | None = None, *, discount: float = 0.95):
        self.estimator_name = algorithm_cfg.adv_estimator
        self.loss_name = loss_mode or actor_cfg.policy_loss.loss_mode
        self.estimator = ADV_ESTIMATORS.get(self.estimator_name)
        if self.estimator is None and type(self).compute_advantage is PPO.compute_advantage:
            lookup({**ADV_ESTIMATORS, **ALGORITHMS}, self.estimator_name, "algorithm.adv_estimator")  # raises
        self.loss_fn = lookup(POLICY_LOSSES, self.loss_name, "actor.policy_loss.loss_mode")
        # The pool of hyperparameters an estimator may declare (keyword-only, by these names).
        self.adv_params = {"discount": discount, **{k: getattr(algorithm_cfg, k) for k in (
            "norm_adv_by_std_in_grpo", "gamma", "lam", "step_advantage_w", "gigpo_mean_std_cross_steps")}}
        # The pool for policy losses: RLLaVA's actor.* and actor.policy_loss.* names.
        self.loss_params = {
            "clip_ratio_low": actor_cfg.clip_ratio_low, "clip_ratio_high": actor_cfg.clip_ratio_high,
            "clip_ratio_c": actor_cfg.clip_ratio_c, "success_reward_threshold": algorithm_cfg.success_reward_threshold,
            **{k: getattr(actor_cfg, k) for k in HYBRID_LOSS_KEYS},  # read by the SFT+RL hybrid losses
            **{k: v for k, v in vars(actor_cfg.policy_loss).items() if k != "loss_mode"},
        }

    def needs(self, name: str) -> bool:
        """Does the estimator declare `name` (e.g. `values`, `baseline_scores`), so the pipeline must make it?"""
        return self.estimator is not None and name in inspect.signature(self.estimator).parameters

    def compute_advantage(self, batch: Batch) -> torch.Tensor:
        """Stage 3: advantages [B, T]. Outcome estimators read `scores` (with KL in the reward: the sum of the
        shaped token rewards); token-level ones declare `token_rewards` (and `values`, `baseline_scores`)."""
        token_rewards = token_rewards_of(batch)
        tensors = {"token_rewards": token_rewards, "values": batch.values, "baseline_scores": batch.baseline_scores,
                   "turn_index": batch.turn_index, "turn_anchors": batch.turn_anchors, "turn_rewards": batch.turn_rewards}
        return call_with_params(self.estimator, (token_rewards.sum(-1), batch.group_ids, batch.loss_mask),
                                {**self.adv_params, **tensors}, "algorithm.adv_estimator")

    def policy_loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict]:
        """Per-token policy loss [B, T] and its metrics."""
        return call_with_params(self.loss_fn, (inputs,), self.loss_params, "actor.policy_loss.loss_mode")


def build_algorithm(algorithm_cfg, actor_cfg, loss_mode: str | None = None, **kwargs) -> PPO:
    """PPO, or the subclass registered under algorithm.adv_estimator (`discount`: rollout.discount)."""
    return ALGORITHMS.get(algorithm_cfg.adv_estimator, PPO)(algorithm_cfg, actor_cfg, loss_mode, **kwargs)


def load_plugins(paths: list[str], key: str = "algorithm.plugins") -> None:
    """Import the user files that register estimators/losses (`algorithm.plugins`), tools (`rollout.agent.plugins`)."""
    for path in paths:
        if not os.path.isfile(path):
            raise ConfigError(f"{key}: file {path!r} does not exist")
        name = f"rllava_plugin_{abs(hash(os.path.abspath(path)))}"
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            sys.modules.pop(name, None)
            raise ConfigError(f"{key}: importing {path} failed: {type(e).__name__}: {e}") from e
