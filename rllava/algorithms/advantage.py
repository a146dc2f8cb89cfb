"""Advantage estimators: pure functions over tensors, registered by name (`algorithm.adv_estimator`). `scores` [B]:
one reward per sequence; `group_ids` [B]: the prompt each answers (its K samples share an id); `mask` [B, T]: 1 on
the tokens the policy wrote. Every estimator returns advantages [B, T], zero where `mask` is 0.
"""

from __future__ import annotations

import torch

from rllava import distributed as D
from rllava.algorithms.registry import register_adv_estimator


def group_mean(x: torch.Tensor, group_ids: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Each sequence's (weighted) group mean, [B]. Summed as offsets from the group minimum, so equal values have
    exactly that mean (sum / n is an ulp off for seven rewards of 0.7, which GRPO's std division blows up to
    advantages of +-0.06). A group of zero total weight gets its min."""
    _, gid = torch.unique(group_ids, return_inverse=True)  # ids -> 0..G-1
    w = torch.ones_like(x) if weights is None else weights.to(x.dtype)
    zeros = x.new_zeros(int(gid.max()) + 1 if gid.numel() else 0)
    lo = zeros.scatter_reduce(0, gid, x, "amin", include_self=False)
    num = zeros.index_add(0, gid, w * (x - lo[gid]))
    den = zeros.index_add(0, gid, w)
    return (lo + num / torch.where(den > 0, den, torch.ones_like(den)))[gid]


def group_stats(scores: torch.Tensor, group_ids: torch.Tensor, weights: torch.Tensor | None = None):
    """Per-sequence (group mean, group unbiased std, group size), each [B], vectorised over groups; `weights`: each
    sequence counts that many times (GiGPO's statistics over turn rows)."""
    _, gid, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    n = (counts.to(scores.dtype) if weights is None else
         scores.new_zeros(len(counts)).index_add(0, gid, weights.to(scores.dtype)))[gid]
    mean = group_mean(scores, group_ids, weights)
    var = group_mean((scores - mean) ** 2, group_ids, weights) * n / (n - 1).clamp(min=1)
    return mean, var.sqrt(), n


def group_baseline(scores: torch.Tensor, group_ids: torch.Tensor, weights: torch.Tensor | None = None):
    """The group-mean baseline b_i, [B]; a group of size 1 has no baseline (b = 0, so A_i = r_i: verl's rule)."""
    _, gid, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return torch.where(counts[gid] > 1, group_mean(scores, group_ids, weights), torch.zeros_like(scores))


@register_adv_estimator("grpo")
def grpo(scores, group_ids, mask, *, norm_adv_by_std_in_grpo: bool = True, eps: float = 1e-6):
    """GRPO (Shao et al. 2024, arXiv:2402.03300), outcome supervision.

        A_i = (r_i - mean_g(r)) / (std_g(r) + eps)      broadcast over the tokens of sequence i

    std: the unbiased group std. `norm_adv_by_std_in_grpo=False` drops the division (Dr.GRPO, arXiv:2503.20783).
    Identical rewards give A = 0. A group of size 1 has no baseline: mean 0, std 1, A_i = r_i (verl/RLLaVA's rule).

    Reference: volcengine/verl verl/trainer/ppo/core_algos.py@b178a3c `compute_grpo_outcome_advantage` L266-330.
    Differs: nothing in the formula; equal rewards give exactly A = 0 (`group_mean`), verl's 0.056 for seven 0.7s."""
    mean, std, n = group_stats(scores, group_ids)
    single = n == 1
    mean, std = torch.where(single, 0.0, mean), torch.where(single, 1.0, std)
    adv = (scores - mean) / (std + eps) if norm_adv_by_std_in_grpo else scores - mean
    return adv[:, None] * mask


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked entries of the whole batch, every rank's share (unbiased); 0 off the mask."""
    m = mask.to(x.dtype)
    n, total = _sum_over_ranks(m.sum(), (x * m).sum())  # one collective for both
    n = n.clamp(min=1)
    mean = total / n
    (sq,) = _sum_over_ranks(((x - mean) ** 2 * m).sum())
    var = sq / (n - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(var + eps) * m


def _sum_over_ranks(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each scalar tensor summed over the ranks, in one all-reduce (as given on one process)."""
    if D.world_size() == 1:
        return ts
    return tuple(torch.tensor(v, dtype=t.dtype, device=t.device) for t, v in zip(ts, D.all_sum([float(t) for t in ts])))


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

    Reference: volcengine/verl verl/trainer/ppo/core_algos.py@b178a3c `compute_gae_advantage_return` L214-262, whitened
    by verl/utils/torch_functional.py `masked_whiten` L322-339. Differs: nothing in the formula (masked positions
    skipped, unbiased variance, rsqrt(var + 1e-8)); masked positions get 0 (verl's hold values its loss masks out)."""
    adv, _ = gae_returns(token_rewards, values, mask, gamma=gamma, lam=lam)
    return masked_whiten(adv, mask)


@register_adv_estimator("dr_grpo")
def dr_grpo(scores, group_ids, mask):
    """Dr.GRPO (Liu et al. 2025, arXiv:2503.20783): GRPO without the std division, which favours questions that
    are too easy or too hard:

        A_i = r_i - mean_g(r)

    Its constant length normaliser is `actor.loss_agg_mode=seq-mean-token-sum-norm`. A group of one: A_i = r_i.

    Reference: sail-sg/understand-r1-zero train_zero_math.py@dfca49d `compute_monte_carlo_advantages` L293-308
    (critic_type=drgrpo; its normaliser, masked_sum / generate_max_length, L286-291). Differs: groups by id, of any
    size (the reference: equal groups of num_samples); a group of one gets A = r (reference: 0)."""
    return (scores - group_baseline(scores, group_ids))[:, None] * mask


@register_adv_estimator("rloo")
def rloo(scores, group_ids, mask):
    """RLOO, REINFORCE leave-one-out (Ahmadian et al. 2024, arXiv:2402.14740): the baseline is the others' mean:

        A_i = r_i - (sum_g r - r_i) / (n_g - 1)  =  n_g / (n_g - 1) * (r_i - mean_g(r))

    Reference: volcengine/verl verl/trainer/ppo/core_algos.py@b178a3c `compute_rloo_outcome_advantage` L476-525.
    Differs: nothing in the formula (a group of one: A = r in both)."""
    mean, _, n = group_stats(scores, group_ids)
    adv = torch.where(n > 1, (scores - mean) * n / (n - 1).clamp(min=1), scores)
    return adv[:, None] * mask


@register_adv_estimator("grpo_passk")
def grpo_passk(scores, group_ids, mask, *, norm_adv_by_std_in_grpo: bool = True, eps: float = 1e-6):
    """GRPO for pass@k, as verl's `grpo_passk` (citing Tang et al. 2025, arXiv:2503.19595; the setting of Chen et
    al. 2025, arXiv:2508.10751). The group's reward is its best, and each response is credited by how much the best
    would drop without it (leave-one-out), so only the best response gets a nonzero advantage:

        A_best = (r_(1) - r_(2)) / (std_g(r) + eps)     r_(1) >= r_(2): the two largest rewards of the group
        A_j    = 0                                      every other response of the group

    std_g: the unbiased group std (no division if not `norm_adv_by_std_in_grpo`). A tie for the best, or a group of
    one, gives 0 (also with eps = 0). Not Chen et al.'s analytical pass@k advantage, which credits every response.

    Reference: volcengine/verl verl/trainer/ppo/core_algos.py@b178a3c `compute_grpo_passk_outcome_advantage`
    L360-419. Differs: a group of one gets A = 0 (verl raises ValueError); otherwise nothing in the formula."""
    _, std, _ = group_stats(scores, group_ids)
    adv = torch.zeros_like(scores)
    for g in torch.unique(group_ids):
        idx = (group_ids == g).nonzero().squeeze(-1)
        if len(idx) < 2:
            continue
        top2 = torch.topk(scores[idx], 2)
        best, margin = idx[top2.indices[0]], top2.values[0] - top2.values[1]
        if margin > 0:
            adv[best] = margin / (std[best] + eps) if norm_adv_by_std_in_grpo else margin
    return adv[:, None] * mask


@register_adv_estimator("reinforce_plus_plus")
def reinforce_plus_plus(scores, group_ids, mask, *, token_rewards, gamma: float = 1.0):
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted return-to-go of the token rewards, whitened over the
    batch (a global baseline and scale; no critic, no group); the return restarts after a masked position:

        G_t = sum_{k >= t} gamma^(k-t) r_k,     A = (G - mean G) / std G   over all response tokens

    Reference: volcengine/verl verl/trainer/ppo/core_algos.py@b178a3c
    `compute_reinforce_plus_plus_outcome_advantage` L582-618 (whitened by `masked_whiten`). Differs: nothing."""
    m = mask.to(token_rewards.dtype)
    returns, running = torch.zeros_like(token_rewards), torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):  # a masked-out token passes nothing on
        running = token_rewards[:, t] * m[:, t] + gamma * running * m[:, t]
        returns[:, t] = running
    return masked_whiten(returns * m, mask)


@register_adv_estimator("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(scores, group_ids, mask):
    """REINFORCE++-baseline (Hu 2025, arXiv:2501.03262): group-mean baseline (none in a group of one), then whitening:

        A_i = r_i - mean_g(r)  (broadcast over tokens),   A = (A - mean A) / std A   over all response tokens

    Reference: volcengine/verl verl/trainer/ppo/core_algos.py@b178a3c
    `compute_reinforce_plus_plus_baseline_outcome_advantage` L422-473. Differs: nothing in the formula."""
    return masked_whiten((scores - group_baseline(scores, group_ids))[:, None] * mask, mask)


@register_adv_estimator("remax")
def remax(scores, group_ids, mask, *, baseline_scores):
    """ReMax (Li et al. 2023, arXiv:2310.10505): the baseline is the reward of a greedy response, rolled out for it:

        A_i = r_i - r(greedy answer to prompt of i)      broadcast over the tokens of i

    Reference: volcengine/verl verl/trainer/ppo/core_algos.py@b178a3c `compute_remax_outcome_advantage` L621-654.
    Differs: every token gets the total reward minus b, verl's token t its return-to-go from t minus b: equal for an
    outcome reward; with algorithm.use_kl_in_reward rllava's token t also carries the earlier tokens' KL penalties
    (shaped rewards [-0.1, -0.2, 0.7], b = 0.5: verl [-0.1, 0.0, 0.2], rllava -0.1 each)."""
    return (scores - baseline_scores)[:, None] * mask


@register_adv_estimator("opo")
def opo(scores, group_ids, mask):
    """OPO, on-policy RL with the optimal baseline (Hao et al. 2025, arXiv:2505.23585): the group baseline weighted by
    response length |o_j| (masked tokens; least variance, by the paper), none in a group of one (A_i = r_i, as verl):

        b_g = sum_{j in g} |o_j| r_j / sum_{j in g} |o_j|,     A_i = r_i - b_g

    Reference: volcengine/verl verl/trainer/ppo/core_algos.py@b178a3c `compute_opo_outcome_advantage` L528-579.
    Differs: nothing in the formula; a group of empty responses gets its minimum reward as baseline (verl: NaN)."""
    lengths = mask.sum(-1).to(scores.dtype)
    return (scores - group_baseline(scores, group_ids, weights=lengths))[:, None] * mask


@register_adv_estimator("gpg")
def gpg(scores, group_ids, mask):
    """GPG, group policy gradient (Chu et al. 2025, arXiv:2504.02546): group-mean baseline without std (F_norm = 1),
    scaled by the gradient correction alpha = B / (B - M), M the samples of groups of equal rewards (no gradient):

        A_i = alpha (r_i - mean_g(r)),   alpha = B / #{samples in groups with a nonzero advantage}

    A group of one: A_i = alpha r_i (as verl), carrying signal iff r_i != 0. verl's alpha = B / #{nonzero rewards}.

    Reference: AMAP-ML/GPG open-r1/src/open_r1/gpg_trainer.py@e096da8 `_generate_and_score_completions` L614-626
    (A = r - mean_g; 1/alpha = groups of unequal rewards / groups) and `compute_loss` L315-316, as its train.sh runs
    them (--scale_rewards False --adjust_gd). Differs: alpha scales the advantage (the reference divides the loss, a
    KL term too; its recipes run beta = 0) and counts samples (the same ratio for equal-size groups); no resampling
    until 1/alpha >= min_inverse_alpha; a group of one (the reference has none) is valid iff r != 0."""
    _, gid = torch.unique(group_ids, return_inverse=True)
    adv = scores - group_baseline(scores, group_ids)
    signal = scores.new_zeros(int(gid.max()) + 1 if gid.numel() else 0).index_add(0, gid, (adv != 0).to(adv.dtype))
    alpha = len(scores) / (signal[gid] > 0).sum().clamp(min=1)
    return (alpha * adv)[:, None] * mask


@register_adv_estimator("gigpo")
def gigpo(scores, group_ids, mask, *, turn_index, turn_anchors, turn_rewards, discount: float = 0.95,
          step_advantage_w: float = 1.0, norm_adv_by_std_in_grpo: bool = True,
          gigpo_mean_std_cross_steps: bool = False, eps: float = 1e-6):
    """GiGPO, group-in-group policy optimisation for multi-turn agents (Feng et al. 2025, arXiv:2505.10978): an
    episode-level group advantage plus a step-level one among the group's turns written after the same observation
    (the "anchor state": the prompt for every first turn).

        A(i, k)    = A_ep(i) + w * A_step(i, k)                        on the tokens of turn k of episode i
        A_ep(i)    = GRPO's advantage of the episode score R_i (outcome + every turn's tool reward)
        G(i, k)    = sum_{j >= k} gamma^(j - k) r(i, j)                 r(i, j): turn j's tool reward, the
                                                                        outcome added at the episode's last turn
        A_step(i, k) = (G(i, k) - mean_s G) / (std_s G + eps)           s: the turns of i's group with i's anchor

    gamma = rollout.discount, w = algorithm.step_advantage_w; `norm_adv_by_std_in_grpo=False` drops both divisions (the
    paper's mean_norm). A turn alone with its anchor has A_step = 0. A_ep's mean and std are over the group's episodes,
    one value each (the paper's Eq. 3). verl-agent's default (episode_norm_reward, compute_mean_std_cross_steps=True,
    more stable by its authors) takes them over its rows, one per turn, so longer episodes weigh more (a lone episode of
    several turns gets A_ep = 0): `algorithm.gigpo_mean_std_cross_steps=true` (the std then unbiased over turn rows).

    Reference: verl-agent's gigpo/core_gigpo.py@29e3e8b (langfengQ/verl-agent) L174-383: episode_norm_reward,
    the anchor-state step groups and the discounted step returns. Differs: the default episode statistics (the
    paper's, above; verl-agent's under the option)."""
    B, K = len(scores), int(turn_index.max()) + 1 if turn_index.numel() else 0
    on = turn_index >= 0
    rows = torch.arange(B)[:, None].expand_as(turn_index)[on]
    turns = turn_index[on]
    valid = torch.zeros(B, K, dtype=torch.bool)
    valid[rows, turns] = True
    r = torch.zeros(B, K, dtype=scores.dtype).index_put_((rows, turns), turn_rewards[on].to(scores.dtype),
                                                         accumulate=True)
    anchor = torch.full((B, K), -1, dtype=torch.long)
    anchor[rows, turns] = turn_anchors[on]
    last = (valid.long() * torch.arange(1, K + 1)).max(-1).values - 1  # [B], -1 for a row without turns
    has = last >= 0
    r[has, last[has]] += scores[has] - r[has].sum(-1)  # the outcome, paid at the last turn
    G, running = torch.zeros_like(r), torch.zeros(B, dtype=r.dtype)
    for k in reversed(range(K)):
        running = r[:, k] + discount * running
        G[:, k] = running
    _, step_group = torch.unique(torch.stack([group_ids[:, None].expand(B, K)[valid], anchor[valid]], -1), dim=0,
                                 return_inverse=True)
    g = G[valid]
    mean, std, _ = group_stats(g, step_group)
    a_step = torch.zeros_like(G)
    a_step[valid] = (g - mean) / (std + eps) if norm_adv_by_std_in_grpo else g - mean
    # A_ep: GRPO's, or verl-agent's (the option): each episode's R once per turn row (n_i = its number of turns)
    mean, std, n_rows = group_stats(scores, group_ids, weights=valid.sum(-1) if gigpo_mean_std_cross_steps else None)
    single = n_rows <= 1  # one episode (row): no baseline (mean 0, std 1), as GRPO and verl-agent
    mean, std = torch.where(single, 0.0, mean), torch.where(single, 1.0, std)
    a_ep = (scores - mean) / (std + eps) if norm_adv_by_std_in_grpo else scores - mean
    return (a_ep[:, None] + step_advantage_w * a_step.gather(1, turn_index.clamp(min=0))) * mask * on
