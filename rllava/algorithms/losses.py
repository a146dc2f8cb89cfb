"""Policy losses, KL penalties and loss aggregation: small pure functions over [B, T] tensors.

A policy loss takes one typed `LossInputs` and its hyperparameters (keyword-only) and returns the per-token
loss [B, T] and a dict of scalar metrics; `aggregate` reduces it (`actor.loss_agg_mode`) separately, so any loss
works with any aggregation. Names follow RLLaVA (`actor.policy_loss.loss_mode`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rllava.algorithms.registry import register_policy_loss


@dataclass(frozen=True)
class LossInputs:
    logprobs: torch.Tensor  # [B, T] log pi_theta(a_t | s_t) from the train engine, with grad
    mask: torch.Tensor  # [B, T] 1 on policy-written tokens
    advantages: torch.Tensor | None = None  # [B, T]
    old_logprobs: torch.Tensor | None = None  # [B, T] log pi_old, the policy that sampled (train engine, no grad)
    ref_logprobs: torch.Tensor | None = None  # [B, T] frozen reference policy
    rollout_logprobs: torch.Tensor | None = None  # [B, T] as reported by the rollout engine
    entropy: torch.Tensor | None = None  # [B, T]

    def need(self, name: str, loss: str) -> torch.Tensor:
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"policy loss {loss!r} needs LossInputs.{name}, which this batch does not carry")
        return value


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


@register_policy_loss("vanilla")
def vanilla(inp: LossInputs, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
            clip_ratio_c: float = 3.0):
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347) with dual clip (Ye et al. 2020,
    arXiv:1912.09729).

        rho = exp(logp - logp_old)
        L   = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))
        for A < 0 the loss is also capped at -A c  (dual clip, c = clip_ratio_c > 1)

    Metrics: `pg_clipfrac` = fraction of tokens where the clipped branch is active (its gradient is zero),
    `ppo_kl` = mean(logp_old - logp) (k1 estimate of KL(old || new)).
    """
    adv, old = inp.need("advantages", "vanilla"), inp.need("old_logprobs", "vanilla")
    log_ratio = (inp.logprobs - old).clamp(-20.0, 20.0)  # clamp keeps exp finite for stale tokens
    ratio = torch.exp(log_ratio)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_clip = torch.maximum(loss_unclipped, loss_clipped)
    loss_cap = -adv * clip_ratio_c
    capped = (loss_clip > loss_cap) & (adv < 0)
    loss = torch.where(capped, loss_cap, loss_clip)
    metrics = {
        "pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), inp.mask).item(),
        "pg_clipfrac_lower": masked_mean(capped.float(), inp.mask).item(),
        "ppo_kl": masked_mean(-log_ratio, inp.mask).item(),
    }
    return loss, metrics


@register_policy_loss("sft")
def sft(inp: LossInputs):
    """Supervised fine-tuning: negative log-likelihood of the target tokens, L_t = -log pi(y_t | y_<t, x)."""
    return -inp.logprobs, {}


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL divergence",
    http://joschu.net/blog/kl-approx.html). With d = logp - logp_ref:

        k1 / kl      : d                        (unbiased, high variance, can be negative)
        abs          : |d|
        k2 / mse     : d^2 / 2
        k3 / low_var_kl : exp(-d) - 1 + d       (unbiased, >= 0, low variance; clamped to [-10, 10] as in verl)
    """
    d = logprobs - ref_logprobs
    if kind in ("kl", "k1"):
        return d
    if kind == "abs":
        return d.abs()
    if kind in ("mse", "k2"):
        return 0.5 * d.square()
    if kind in ("low_var_kl", "k3"):
        return (torch.exp(-d) - 1 + d).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r} (choose kl|k1|abs|mse|k2|low_var_kl|k3)")


def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: str, *, max_len: int, num_tokens: float | None = None,
              num_seqs: float | None = None) -> torch.Tensor:
    """Reduce a per-token loss [B, T] to a scalar (`actor.loss_agg_mode`).

        token-mean              : sum_{i,t} l_it / N_tokens
        seq-mean-token-sum      : sum_i (sum_t l_it) / N_seqs
        seq-mean-token-mean     : sum_i (sum_t l_it / |o_i|) / N_seqs
        seq-mean-token-sum-norm : sum_{i,t} l_it / (N_seqs * L_max)   (Dr.GRPO's constant normaliser; L_max =
                                  `max_len`, the generation budget data.max_response_length)

    The normalisers default to this micro-batch's counts; pass the whole mini-batch's counts (`num_tokens`,
    `num_seqs`) when accumulating gradients over micro-batches, so the result equals the unsplit loss.
    """
    mask = mask.to(loss.dtype)
    seq_has_tokens = (mask.sum(-1) > 0).to(loss.dtype)
    num_tokens = mask.sum().clamp(min=1) if num_tokens is None else num_tokens
    num_seqs = seq_has_tokens.sum().clamp(min=1) if num_seqs is None else num_seqs
    if mode == "token-mean":
        return (loss * mask).sum() / num_tokens
    if mode == "seq-mean-token-sum":
        return (loss * mask).sum() / num_seqs
    if mode == "seq-mean-token-mean":
        return ((loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / num_seqs
    if mode == "seq-mean-token-sum-norm":
        return (loss * mask).sum() / (num_seqs * max_len)
    raise ValueError(f"unknown actor.loss_agg_mode {mode!r}")
