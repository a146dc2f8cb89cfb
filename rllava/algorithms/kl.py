"""KL to the reference as a reward penalty (`algorithm.use_kl_in_reward`; in the loss, `algorithm.use_kl_loss`, it
is `Actor.update`'s), with its coefficient controllers. The penalty shapes the per-token reward before the advantage
stage (Ziegler et al. 2019, arXiv:1909.08593; InstructGPT):

    r_t = -beta * KL_t + [t is the last response token] * score          KL_t = kl_penalty(logp_old, logp_ref)

(`algorithm.kl_penalty=full`: the exact KL(pi_old || pi_ref) over the vocabulary, `Reference.full_kl`), and beta
is fixed (`algorithm.kl_ctrl.type=fixed`) or adapted towards `target_kl` (`adaptive`) by the whole batch of all
ranks, KL its token mean and n_steps its sequences (verl/trainer/ppo/ray_trainer.py@b178a3c `apply_kl_penalty`
L100-104, whose KL is the mean of each sequence's token mean), so every rank holds the one-process run's beta:

    e = clip(KL / target_kl - 1, -0.2, 0.2);   beta <- beta * (1 + e * n_steps / horizon)
"""

from __future__ import annotations

import torch

from rllava import distributed as D
from rllava.algorithms.losses import kl_penalty


def outcome_token_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] zeros with each row's score at its last trained token (no trained token: the row stays 0)."""
    out = torch.zeros(mask.shape, dtype=scores.dtype)
    has = mask.sum(-1) > 0
    last = mask.shape[1] - 1 - mask.flip(-1).float().argmax(-1)  # index of the last 1 in each row
    out[has, last[has]] = scores[has]
    return out


def token_rewards_of(batch) -> torch.Tensor:
    """The batch's per-token rewards [B, T]: KL-shaped if KL is in the reward, else the outcome rewards."""
    if batch.token_rewards is not None:
        return batch.token_rewards
    return outcome_token_rewards(batch.need("scores"), batch.loss_mask)


class KLController:
    """Holds beta for KL in the reward; `penalize` shapes token rewards and updates beta (adaptive)."""

    def __init__(self, kind: str, kl_coef: float, *, estimator: str, target_kl: float = 0.1, horizon: int = 10000):
        self.kind, self.value, self.estimator = kind, kl_coef, estimator
        self.target_kl, self.horizon = target_kl, horizon

    def state_dict(self) -> dict:
        """What a checkpoint keeps: beta (the adaptive controller moves it every step)."""
        return {"kl_coef": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["kl_coef"])

    def penalize(self, scores: torch.Tensor, mask: torch.Tensor, old_logprobs: torch.Tensor,
                 ref_logprobs: torch.Tensor, kl: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """(token rewards [B, T] of this rank's rows, metrics); then beta moves by the batch of all ranks (a
        collective). `kl` [B, T]: the KL itself when not estimated from the log-probs (`full`, over the vocabulary)."""
        kl = (kl_penalty(old_logprobs, ref_logprobs, self.estimator) if kl is None else kl) * mask
        token_rewards = outcome_token_rewards(scores, mask) - self.value * kl
        total, tokens, rows = D.all_sum([float(kl.sum()), float(mask.sum()), float(len(scores))])
        current = total / max(tokens, 1.0)
        metrics = {"actor/reward_kl": current, "actor/reward_kl_coef": self.value}
        if self.kind == "adaptive":  # the module docstring's e, with n_steps = the rows of all ranks
            error = min(max(current / self.target_kl - 1.0, -0.2), 0.2)
            self.value *= 1.0 + error * rows / self.horizon
        return token_rewards, metrics
