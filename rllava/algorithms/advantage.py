"""Advantage estimators: pure functions over tensors, registered by name (`algorithm.adv_estimator`).

Shapes: B sequences, T tokens. `scores` [B] is one scalar reward per sequence, `group_ids` [B] says which prompt
each sequence answers (the K samples of one prompt share an id), `mask` [B, T] is 1 on the tokens the policy
wrote. Every estimator returns advantages [B, T], zero where `mask` is 0.
"""

from __future__ import annotations

import torch

from rllava.algorithms.registry import register_adv_estimator


def group_stats(scores: torch.Tensor, group_ids: torch.Tensor):
    """Per-sequence (group mean, group unbiased std, group size), each [B], vectorised over groups."""
    _, gid = torch.unique(group_ids, return_inverse=True)  # ids -> 0..G-1
    n = torch.bincount(gid).to(scores.dtype)  # [G]
    mean = torch.zeros_like(n).index_add_(0, gid, scores) / n
    sq = torch.zeros_like(n).index_add_(0, gid, (scores - mean[gid]) ** 2)
    std = torch.sqrt(sq / (n - 1).clamp(min=1))
    return mean[gid], std[gid], n[gid]


@register_adv_estimator("grpo")
def grpo(scores, group_ids, mask, *, norm_adv_by_std_in_grpo: bool = True, eps: float = 1e-6):
    """GRPO (Shao et al. 2024, arXiv:2402.03300), outcome supervision.

        A_i = (r_i - mean_g(r)) / (std_g(r) + eps)      broadcast over the tokens of sequence i

    std is the unbiased group standard deviation. `norm_adv_by_std_in_grpo=False` drops the division
    (Dr.GRPO, arXiv:2503.20783). A group of identical rewards gets A = 0 (no signal). A group of size 1 has no
    baseline: mean := 0, std := 1, so A_i = r_i (verl/RLLaVA's rule).
    """
    mean, std, n = group_stats(scores, group_ids)
    single = n == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    adv = scores - mean
    if norm_adv_by_std_in_grpo:
        adv = adv / (std + eps)
    return adv[:, None] * mask


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked entries of the whole batch (unbiased std); 0 where mask is 0."""
    m = mask.to(x.dtype)
    n = m.sum().clamp(min=1)
    mean = (x * m).sum() / n
    var = ((x - mean) ** 2 * m).sum() / (n - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(var + eps) * m


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = sum_{k >= t} gamma^(k-t) r_k over each row's masked tokens (masked-out tokens pass nothing on)."""
    m = mask.to(token_rewards.dtype)
    out, running = torch.zeros_like(token_rewards), torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t] * m[:, t] + gamma * running * m[:, t]
        out[:, t] = running
    return out * m


def gae_returns(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float,
                lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over each row's masked tokens (padding is skipped: V after the last token is 0):

        delta_t = r_t + gamma V_{t+1} - V_t;   A_t = delta_t + gamma lam A_{t+1};   R_t = A_t + V_t

    Returns (advantages, returns) [B, T], unwhitened; the critic regresses V onto R."""
    m = mask.to(values.dtype)
    adv = torch.zeros_like(values)
    next_value, next_adv = torch.zeros_like(values[:, 0]), torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * next_adv
        adv[:, t] = a * m[:, t]
        next_value = torch.where(m[:, t] > 0, values[:, t], next_value)  # skip masked positions
        next_adv = torch.where(m[:, t] > 0, a, next_adv)
    return adv, (adv + values) * m


@register_adv_estimator("gae")
def gae(scores, group_ids, mask, *, token_rewards, values, gamma: float = 1.0, lam: float = 1.0):
    """PPO's generalized advantage estimation (Schulman et al. 2015, arXiv:1506.02438), whitened over the batch:

        A_t = sum_l (gamma lam)^l delta_{t+l},   delta_t = r_t + gamma V(s_{t+1}) - V(s_t)
        A   <- (A - mean A) / std A              (over all response tokens of the batch, as PPO does)

    Needs the critic's `values` and the token rewards (score at the last token, minus KL when in the reward).
    """
    adv, _ = gae_returns(token_rewards, values, mask, gamma=gamma, lam=lam)
    return masked_whiten(adv, mask)


@register_adv_estimator("dr_grpo")
def dr_grpo(scores, group_ids, mask):
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783): GRPO without the
    std division, which biases towards questions that are too easy or too hard:

        A_i = r_i - mean_g(r)

    The paper's other half, a constant length normaliser, is `actor.loss_agg_mode=seq-mean-token-sum-norm`.
    A group of size 1 has no baseline: A_i = r_i.
    """
    return grpo(scores, group_ids, mask, norm_adv_by_std_in_grpo=False)


@register_adv_estimator("rloo")
def rloo(scores, group_ids, mask):
    """RLOO, REINFORCE leave-one-out (Ahmadian et al. 2024, arXiv:2402.14740): each sample's baseline is the
    mean of the other samples of its group:

        A_i = r_i - (sum_g r - r_i) / (n_g - 1)  =  n_g / (n_g - 1) * (r_i - mean_g(r))

    A group of size 1 has no other sample: A_i = r_i.
    """
    mean, _, n = group_stats(scores, group_ids)
    adv = torch.where(n > 1, (scores - mean) * n / (n - 1).clamp(min=1), scores)
    return adv[:, None] * mask


@register_adv_estimator("grpo_passk")
def grpo_passk(scores, group_ids, mask, *, norm_adv_by_std_in_grpo: bool = True, eps: float = 1e-6):
    """GRPO for pass@k (verl's `grpo_passk`; Chen et al. 2025, "Pass@k Training", arXiv:2508.10751): only the
    best response of each group is credited, by its margin over the runner-up:

        A_best = (r_(1) - r_(2)) / (std_g(r) + eps)   (no division if not norm_adv_by_std_in_grpo);  others 0

    Ties for best go to the first in batch order. A group of size 1 gets 0 (no runner-up).
    """
    _, std, n = group_stats(scores, group_ids)
    adv = torch.zeros_like(scores)
    for g in torch.unique(group_ids):
        idx = (group_ids == g).nonzero().squeeze(-1)
        if len(idx) < 2:
            continue
        top2 = torch.topk(scores[idx], 2)
        best = idx[top2.indices[0]]
        margin = top2.values[0] - top2.values[1]
        adv[best] = margin / (std[best] + eps) if norm_adv_by_std_in_grpo else margin
    return adv[:, None] * mask


@register_adv_estimator("reinforce_plus_plus")
def reinforce_plus_plus(scores, group_ids, mask, *, token_rewards, gamma: float = 1.0):
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted return-to-go of the token rewards, whitened over the
    batch (a global baseline and scale; no critic, no group):

        G_t = sum_{k >= t} gamma^(k-t) r_k,     A = (G - mean G) / std G   over all response tokens
    """
    return masked_whiten(discounted_returns(token_rewards, mask, gamma), mask)


@register_adv_estimator("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(scores, group_ids, mask):
    """REINFORCE++-baseline (Hu 2025, arXiv:2501.03262): the group mean as baseline, then batch whitening:

        A_i = r_i - mean_g(r)  (broadcast over tokens),   A = (A - mean A) / std A   over all response tokens
    """
    mean, _, _ = group_stats(scores, group_ids)
    return masked_whiten((scores - mean)[:, None] * mask, mask)


@register_adv_estimator("remax")
def remax(scores, group_ids, mask, *, baseline_scores):
    """ReMax (Li et al. 2023, arXiv:2310.10505): the reward of the greedy response to the same prompt is the
    baseline (the rollout stage generates it when this estimator is selected):

        A_i = r_i - r(greedy answer to prompt of i)      broadcast over the tokens of i
    """
    return (scores - baseline_scores)[:, None] * mask


@register_adv_estimator("opo")
def opo(scores, group_ids, mask):
    """OPO, on-policy RL with the optimal baseline (Hao et al. 2025, arXiv:2505.23585): the group baseline is
    weighted by response length, the variance-minimising baseline under the paper's assumptions:

        b_g = sum_{j in g} |o_j| r_j / sum_{j in g} |o_j|,     A_i = r_i - b_g
    """
    lengths = mask.sum(-1).to(scores.dtype)
    _, gid = torch.unique(group_ids, return_inverse=True)
    weighted = torch.zeros(int(gid.max()) + 1, dtype=scores.dtype).index_add_(0, gid, lengths * scores)
    total = torch.zeros_like(weighted).index_add_(0, gid, lengths)
    baseline = weighted[gid] / total[gid].clamp(min=1)
    return (scores - baseline)[:, None] * mask


@register_adv_estimator("gpg")
def gpg(scores, group_ids, mask):
    """GPG, group policy gradient (Chu et al. 2025, arXiv:2504.02546): group-mean baseline without std, scaled
    up by the inverse fraction of samples in groups that carry signal (the paper's gradient correction):

        A_i = alpha (r_i - mean_g(r)),   alpha = B / #{samples in groups whose rewards are not all equal}
    """
    mean, std, _ = group_stats(scores, group_ids)
    valid = (std > 0).sum().clamp(min=1).to(scores.dtype)
    return (len(scores) / valid * (scores - mean))[:, None] * mask
