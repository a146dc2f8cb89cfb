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
