"""The algorithm object: which advantage estimator and policy loss run, with which hyperparameters.

`PPO` turns the config into the two calls the loop makes, `compute_advantage(batch)` (stage 3) and
`policy_loss(inputs)` (inside stage 4). Both dispatch through the registries, so a new estimator or loss is one
registered function; a whole new algorithm may subclass PPO and override these two methods.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

from rllava.errors import ConfigError
from rllava.algorithms import advantage as _advantage  # noqa: F401  (registers the built-in estimators)
from rllava.algorithms import losses as _losses  # noqa: F401  (registers the built-in losses)
from rllava.algorithms.losses import LossInputs
from rllava.algorithms.registry import ADV_ESTIMATORS, POLICY_LOSSES, call_with_params, lookup
from rllava.data.protocol import Batch


class PPO:
    def __init__(self, algorithm_cfg, actor_cfg, loss_mode: str | None = None):
        self.estimator_name = algorithm_cfg.adv_estimator
        self.loss_name = loss_mode or actor_cfg.policy_loss.loss_mode
        self.estimator = lookup(ADV_ESTIMATORS, self.estimator_name, "algorithm.adv_estimator")
        self.loss_fn = lookup(POLICY_LOSSES, self.loss_name, "actor.policy_loss.loss_mode")
        # The pool of hyperparameters an estimator may declare (keyword-only, by these names).
        self.adv_params = {"norm_adv_by_std_in_grpo": algorithm_cfg.norm_adv_by_std_in_grpo,
                           "gamma": algorithm_cfg.gamma, "lam": algorithm_cfg.lam}
        # The pool for policy losses: RLLaVA's actor.* and actor.policy_loss.* names.
        self.loss_params = {
            "clip_ratio_low": actor_cfg.clip_ratio_low, "clip_ratio_high": actor_cfg.clip_ratio_high,
            "clip_ratio_c": actor_cfg.clip_ratio_c,
            **{k: v for k, v in vars(actor_cfg.policy_loss).items() if k != "loss_mode"},
        }

    def compute_advantage(self, batch: Batch) -> torch.Tensor:
        """Stage 3: advantages [B, T] from the batch's scores."""
        return call_with_params(self.estimator, (batch.need("scores"), batch.group_ids, batch.loss_mask),
                                self.adv_params, "algorithm.adv_estimator")

    def policy_loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict]:
        """Per-token policy loss [B, T] and its metrics."""
        return call_with_params(self.loss_fn, (inputs,), self.loss_params, "actor.policy_loss.loss_mode")


def load_plugins(paths: list[str]) -> None:
    """Import user files that register estimators/losses (`algorithm.plugins=[path/to/my_algo.py]`)."""
    for path in paths:
        if not os.path.isfile(path):
            raise ConfigError(f"algorithm.plugins: file {path!r} does not exist")
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
            raise ConfigError(f"algorithm.plugins: importing {path} failed: {type(e).__name__}: {e}") from e
