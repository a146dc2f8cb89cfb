"""Policy losses, KL penalties and loss aggregation: small pure functions over [B, T] tensors. A policy loss takes a
`LossInputs` and its keyword-only hyperparameters and returns the per-token loss [B, T] and scalar metrics (detached
0-d tensors, read once per update: no micro-batch waits on the device); `aggregate` reduces it separately
(`actor.loss_agg_mode`), so any loss works with any aggregation. Names follow RLLaVA.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    off_policy: torch.Tensor | None = None  # [B, T] 1 on expert-written tokens (SFT+RL hybrids), else None
    scores: torch.Tensor | None = None  # [B] each row's reward (SRFT: a rollout is correct when it reaches a threshold)
    trained_mask: torch.Tensor | None = None  # [B, T] every trained token, of the RL and of the SFT term
    sft_mask: torch.Tensor | None = None  # [B, T] a hybrid's SFT-term tokens (expert tokens), else None
    teacher_logprobs: torch.Tensor | None = None  # [B, T] on-policy distillation's teacher, at the sampled tokens
    full_kl: dict[str, torch.Tensor] = field(default_factory=dict)  # [B, T] exact KL(pi || "reference" / "teacher")
    rl_weights: torch.Tensor | None = None  # rollout correction's IS weights of the RL term (algorithm.rollout_is)
    distill_weights: torch.Tensor | None = None  # ... and of the distillation term (rllava.algorithms.distill)

    def need(self, name: str, loss: str) -> torch.Tensor:
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"loss {loss!r} needs LossInputs.{name}, which this batch does not carry")
        return value


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def _seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence mean over masked tokens, [B, T] -> [B]; 0 for a row with no tokens."""
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def _log_ratio(inp: LossInputs, loss: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, log rho) with log rho = logp - logp_old clamped to [-20, 20] so exp stays finite."""
    adv, old = inp.need("advantages", loss), inp.need("old_logprobs", loss)
    return adv, (inp.logprobs - old).clamp(-20.0, 20.0)


def _clipped_surrogate(adv: torch.Tensor, ratio: torch.Tensor, low: float, high: float):
    """PPO's pessimistic surrogate max(-A rho, -A clip(rho, 1 - low, 1 + high)) and the mask of tokens where the
    clipped branch is active (there the loss is constant in rho, so its gradient is zero)."""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - low, 1.0 + high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def _ppo_metrics(clipped: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor, **extra) -> dict:
    """`pg_clipfrac` (fraction of tokens clipped), `ppo_kl` = mean(logp_old - logp), k1 of KL(old || new); `extra`."""
    return {"pg_clipfrac": masked_mean(clipped.float(), mask), "ppo_kl": masked_mean(-log_ratio.detach(), mask),
            **extra}


def _centered_cov(adv: torch.Tensor, logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token centred covariance (A_t - mean A)(logp_t - mean logp) that Clip-Cov / KL-Cov rank tokens by
    (Cui et al. 2025, arXiv:2505.22617); means over this batch's masked tokens, -inf on masked-out ones. No grad."""
    logprobs = logprobs.detach()
    cov = (adv - masked_mean(adv, mask)) * (logprobs - masked_mean(logprobs, mask))
    return torch.where(mask > 0, cov, torch.full_like(cov, -torch.inf))


@register_policy_loss("vanilla")
def vanilla(inp: LossInputs, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2, clip_ratio_c: float = 3.0):
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347), dual clip (Ye et al. 2020, arXiv:1912.09729).

        rho = exp(logp - logp_old)
        L   = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))
        for A < 0 the loss is also capped at -A c  (dual clip, c = clip_ratio_c > 1)

    Metrics: `pg_clipfrac` (tokens where the clipped branch is active: zero gradient), `pg_clipfrac_lower` (capped
    by the dual clip), `ppo_kl` = mean(logp_old - logp) (k1 of KL(old || new)).

    Reference: volcengine/verl verl/trainer/ppo/core_algos.py@b178a3c `compute_policy_loss_vanilla` L1159-1250.
    Differs: nothing in the formula (log rho clamped to [-20, 20], the dual clip only for A < 0, c = clip_ratio_c)."""
    adv, log_ratio = _log_ratio(inp, "vanilla")
    loss_clip, clipped = _clipped_surrogate(adv, torch.exp(log_ratio), clip_ratio_low, clip_ratio_high)
    loss_cap = -adv * clip_ratio_c
    capped = (loss_clip > loss_cap) & (adv < 0)
    return torch.where(capped, loss_cap, loss_clip), _ppo_metrics(
        clipped, log_ratio, inp.mask, pg_clipfrac_lower=masked_mean(capped.float(), inp.mask))


@register_policy_loss("dapo")
def dapo(inp: LossInputs, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.28):
    """DAPO's clip-higher (Yu et al. 2025, arXiv:2503.14476): PPO clip with decoupled bounds, no dual clip,

        L_t = max(-A_t rho_t, -A_t clip(rho_t, 1 - eps_low, 1 + eps_high)),   rho_t = exp(logp_t - logp_old_t)

    A larger eps_high (actor.clip_ratio_high; the paper's 0.2 / 0.28 are the defaults) lets low-probability tokens grow,
    slowing entropy collapse. DAPO's token-level loss is `actor.loss_agg_mode=token-mean`; its dynamic sampling and
    overlong shaping live outside the loss. Metrics: `pg_clipfrac`, `ppo_kl` as in `vanilla`.

    Reference: volcengine/verl verl/trainer/ppo/core_algos.py@b178a3c `compute_policy_loss_vanilla` L1159-1250 with
    DAPO's clip_ratio_low 0.2 / clip_ratio_high 0.28 (docs/algo/dapo.md L55-56). Differs: no dual clip (as the
    paper); verl's DAPO scripts cap the loss at -10 A for A < 0 and rho > 10 (clip_ratio_c=10, e.g.
    verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_8_8.sh L99), where rllava's grows as -A rho."""
    adv, log_ratio = _log_ratio(inp, "dapo")
    loss, clipped = _clipped_surrogate(adv, torch.exp(log_ratio), clip_ratio_low, clip_ratio_high)
    return loss, _ppo_metrics(clipped, log_ratio, inp.mask)


@register_policy_loss("gspo")
def gspo(inp: LossInputs, *, clip_ratio_low: float = 3e-4, clip_ratio_high: float = 4e-4):
    """GSPO (Zheng et al. 2025, arXiv:2507.18071): a sequence-level, length-normalised importance ratio

        s_i    = (pi(y_i|x) / pi_old(y_i|x))^(1/|y_i|) = exp(mean_t (logp_it - logp_old_it))   (masked tokens)
        s_it   = sg[s_i] * pi(y_it) / sg[pi(y_it)]          (GSPO-token form: value s_i, grad s_i * grad logp_it)
        L_it   = max(-A_it s_it, -A_it clip(s_it, 1 - eps_low, 1 + eps_high))

    so the whole sequence is weighted by s_i and clipped or not. With a sequence-level advantage this is the
    paper's objective; its (1/|y_i|) sum_t is `actor.loss_agg_mode=seq-mean-token-mean`. eps: actor.clip_ratio_low
    / clip_ratio_high, the paper's 3e-4 / 4e-4 by default (PPO's 0.2 would almost never clip this ratio).
    Metrics: `pg_clipfrac` (fraction of tokens in clipped sequences), `ppo_kl` (token-level k1).

    Reference: volcengine/verl verl/trainer/ppo/core_algos.py@b178a3c `compute_policy_loss_gspo` L1253-1326.
    Differs: token log rho clamped to [-20, 20] before the sequence mean, log s_it not capped (verl: the reverse, at
    10); the aggregation is actor.loss_agg_mode's (verl forces seq-mean-token-mean)."""
    adv, log_ratio = _log_ratio(inp, "gspo")
    log_seq = _seq_mean(log_ratio, inp.mask).detach().unsqueeze(-1)
    seq_ratio = torch.exp(log_seq + inp.logprobs - inp.logprobs.detach())
    loss, clipped = _clipped_surrogate(adv, seq_ratio, clip_ratio_low, clip_ratio_high)
    return loss, _ppo_metrics(clipped, log_ratio, inp.mask)


@register_policy_loss("geo_mean")
@register_policy_loss("gmpo")
def geo_mean(inp: LossInputs, *, clip_ratio_low: float = 0.4, clip_ratio_high: float = 0.4):
    """GMPO, geometric-mean policy optimisation (Zhao et al. 2025, arXiv:2507.20673): the geometric mean of the
    token ratios, each clipped in log space to [-eps_low, eps_high] on the pessimistic side (sign of A):

        l_t  = sgn(A) * min(sgn(A) log rho_t, sgn(A) clip(log rho_t, -eps_low, eps_high))
             = min(log rho_t, eps_high) if A >= 0,  max(log rho_t, -eps_low) if A < 0
        L_i  = -A_i exp(mean_t l_t)                 (A_i = mean advantage of sequence i over its tokens)
        per-token loss l_it = L_i / |o_i| on each of its |o_i| tokens

    Paper defaults eps_low = eps_high = 0.4. L_i being split evenly, `actor.loss_agg_mode` weighs the sequences:
        seq-mean-token-sum       -> mean_i L_i                 (the paper's objective)
        token-mean               -> sum_i L_i / N_tokens       (the paper's, scaled by N_seqs / N_tokens)
        seq-mean-token-sum-norm  -> mean_i L_i / L_max         (the paper's, constant scale)
        seq-mean-token-mean      -> mean_i L_i / |o_i|         (down-weights long sequences; not the paper's)
    Use seq-mean-token-sum (examples/algorithms/gmpo.sh): what the authors' code (one sequence per micro-batch)
    and verl's geo_mean optimise; token-mean's N_seqs / N_tokens varies per batch (KL and entropy scale alike).
    Metrics: `pg_clipfrac` (tokens whose log-ratio clip is active, zero gradient), `ppo_kl`.

    Reference: the GMPO authors' callsys/GMPO@205b2bf train_zero_math_gmpo.py L675-701 (the loss; one sequence per
    micro-batch, L620-623; their script runs --beta 0: no KL, where gmpo.sh keeps grpo.sh's). Differs: nothing; verl's
    geo_mean takes sign(A_t) per token, not A_i's (the same unless advantages vary within a sequence, unlike GRPO's)."""
    adv, log_ratio = _log_ratio(inp, "geo_mean")
    seq_adv = _seq_mean(adv, inp.mask)
    pos = (seq_adv >= 0).unsqueeze(-1)  # pessimistic side: for A > 0 cap log rho at eps_high, for A < 0 at -eps_low
    log_r = torch.where(pos, log_ratio.clamp(max=clip_ratio_high), log_ratio.clamp(min=-clip_ratio_low))
    seq_loss = -seq_adv * torch.exp(_seq_mean(log_r, inp.mask))
    loss = (seq_loss / inp.mask.sum(-1).clamp(min=1)).unsqueeze(-1).expand_as(inp.logprobs)
    clipped = (log_r != log_ratio) & (seq_adv != 0).unsqueeze(-1)
    return loss, _ppo_metrics(clipped, log_ratio, inp.mask)


@register_policy_loss("gpg")
def gpg(inp: LossInputs):
    """GPG, group policy gradient (Chu et al. 2025, arXiv:2504.02546): plain policy gradient, no ratio, clip or KL:

        L_t = -A_t logp_t

    Needs no old log-probs. GPG's group-mean advantage and valid-sample correction are the `gpg` estimator's.

    Reference: AMAP-ML/GPG open-r1/src/open_r1/gpg_trainer.py@e096da8 `compute_loss` L299-303 (as volcengine/verl
    verl/trainer/ppo/core_algos.py@b178a3c `compute_policy_loss_gpg` L1414-1447). Differs: nothing in the formula;
    the reference's division of the loss by 1/alpha (L315-316) is the `gpg` estimator's alpha here."""
    return -inp.need("advantages", "gpg") * inp.logprobs, {}


@register_policy_loss("clip_cov")
def clip_cov(inp: LossInputs, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
             clip_cov_ratio: float = 0.0002, clip_cov_lb: float = 1.0, clip_cov_ub: float = 5.0):
    """Clip-Cov (Cui et al. 2025, arXiv:2505.22617): entropy falls with cov(logp, A): stop a few high-cov tokens' grad.

        cov_t = (A_t - mean A)(logp_t - mean logp)          (means over the masked tokens of this micro-batch)
        I     = clip_cov_ratio * N_tokens (at least 1) tokens drawn uniformly at random among the masked tokens
                with clip_cov_lb < cov_t < clip_cov_ub that PPO's clip has not already clipped
        L_t   = PPO clip (no dual clip) for t not in I;  sg[L_t] for t in I (same value, zero gradient)

    The draw uses torch's global CPU RNG (torch.manual_seed seeds it). Metrics: `pg_clipfrac` (PPO clip),
    `clip_cov_frac` (fraction of tokens in I), `ppo_kl`.

    Reference: the authors' PRIME-RL/Entropy-Mechanism-of-RL verl/trainer/ppo/core_algos.py@8850579
    `compute_policy_loss_clip_cov` L469-518 (volcengine/verl@b178a3c L1450-1552 is the same). Differs: a token in I
    keeps its loss value, gradient stopped (the reference zeroes it: same gradient and, for one RNG state, same I);
    log rho is clamped to [-20, 20]; `pg_clipfrac` is PPO's (the reference's is the fraction in I: `clip_cov_frac`)."""
    adv, log_ratio = _log_ratio(inp, "clip_cov")
    loss, clipped = _clipped_surrogate(adv, torch.exp(log_ratio), clip_ratio_low, clip_ratio_high)
    cov = _centered_cov(adv, inp.logprobs, inp.mask)
    band = ((cov > clip_cov_lb) & (cov < clip_cov_ub) & ~clipped).flatten().nonzero().squeeze(-1)
    n_pick = min(max(int(clip_cov_ratio * int((inp.mask > 0).sum())), 1), band.numel())
    pick = band[torch.randperm(band.numel())[:n_pick].to(band.device)]
    selected = torch.zeros(cov.shape, dtype=torch.bool, device=cov.device)
    selected.view(-1)[pick] = True
    return torch.where(selected, loss.detach(), loss), _ppo_metrics(
        clipped, log_ratio, inp.mask, clip_cov_frac=masked_mean(selected.float(), inp.mask))


@register_policy_loss("kl_cov")
def kl_cov(inp: LossInputs, *, kl_cov_ratio: float = 0.0002, ppo_kl_coef: float = 0.1):
    """KL-Cov (Cui et al. 2025, arXiv:2505.22617): a KL penalty on the highest-covariance tokens only.

        cov_t = (A_t - mean A)(logp_t - mean logp)          (means over the masked tokens of this micro-batch)
        I     = the top kl_cov_ratio * N_tokens (at least 1) masked tokens by cov_t
        L_t   = -A_t rho_t + ppo_kl_coef |logp_t - logp_old_t| * [t in I]     (no clipping anywhere)

    Metrics: `kl_cov_frac` (fraction of tokens in I), `ppo_kl` (k1), `ppo_kl_abs` = mean |logp - logp_old|.

    Reference: the authors' PRIME-RL/Entropy-Mechanism-of-RL verl/trainer/ppo/core_algos.py@8850579
    `compute_policy_loss_kl_cov` L426-467 (volcengine/verl@b178a3c L1555-1632: the same, k as a fraction). Differs:
    ppo_kl_coef defaults to 0.1 (kl_cov.sh too; the authors and verl: 1); kl_cov_ratio is a fraction, as verl's (the
    authors' k_percent 0.2 for 7B / 0.02 for 32B is 0.002 / 0.0002); log rho is clamped to [-20, 20]."""
    adv, log_ratio = _log_ratio(inp, "kl_cov")
    cov = _centered_cov(adv, inp.logprobs, inp.mask).flatten()
    n_valid = int((inp.mask > 0).sum())
    k = max(int(kl_cov_ratio * n_valid), 1) if n_valid else 0
    selected = torch.zeros(inp.logprobs.shape, dtype=torch.bool, device=cov.device)
    selected.view(-1)[torch.topk(cov, k).indices] = True
    loss = -adv * torch.exp(log_ratio) + ppo_kl_coef * log_ratio.abs() * selected
    return loss, {"kl_cov_frac": masked_mean(selected.float(), inp.mask),
                  "ppo_kl": masked_mean(-log_ratio.detach(), inp.mask),
                  "ppo_kl_abs": masked_mean(log_ratio.detach().abs(), inp.mask)}


@register_policy_loss("cispo")
def cispo(inp: LossInputs, *, cispo_clip_ratio_low: float = 1.0, cispo_clip_ratio_high: float = 0.28):
    """CISPO (MiniMax-M1, arXiv:2506.13585, eq. 4-5): clip the importance-sampling weight, not the update, and stop
    its gradient, so every token keeps a gradient (PPO drops clipped ones):

        w_t = sg[clip(rho_t, 1 - eps_low_IS, 1 + eps_high_IS)],   L_t = -w_t A_t logp_t,   grad = -w_t A_t grad logp_t

    The paper sets no lower bound and tunes only eps_high_IS: defaults cispo_clip_ratio_low = 1.0 (bound 0: none),
    cispo_clip_ratio_high = 0.28 (DAPO's eps_high; the paper gives none: tune it). Only the gradient is meaningful.
    Metrics: `pg_clipfrac` (tokens whose weight is truncated; they still have gradient), `ppo_kl`.

    Reference: volcengine/verl verl/trainer/ppo/core_algos.py@b178a3c `compute_policy_loss_cispo` L1721-1779.
    Differs: nothing in the formula; its bounds are keys of their own (above), where verl reuses PPO's."""
    adv, log_ratio = _log_ratio(inp, "cispo")
    ratio = torch.exp(log_ratio)
    low, high = 1.0 - cispo_clip_ratio_low, 1.0 + cispo_clip_ratio_high
    weight = ratio.clamp(low, high).detach()
    return -weight * adv * inp.logprobs, _ppo_metrics((ratio < low) | (ratio > high), log_ratio, inp.mask)


@register_policy_loss("sapo")
def sapo(inp: LossInputs, *, tau_pos: float = 1.0, tau_neg: float = 1.05):
    """SAPO, soft adaptive policy optimisation (Gao et al. 2025, arXiv:2511.20347): a smooth, temperature-controlled
    gate on the ratio instead of PPO's hard clip, so off-policy tokens are damped, never cut off:

        rho_t = exp(logp_t - logp_old_t),   tau_t = tau_pos if A_t > 0 else tau_neg
        f(rho) = (4 / tau) sigmoid(tau (rho - 1)),   L_t = -f(rho_t) A_t
        grad   = -w_t A_t rho_t grad logp_t,   w_t = 4 sigma_t (1 - sigma_t),   sigma_t = sigmoid(tau_t (rho_t - 1))

    w = 1 at rho = 1 (the plain policy gradient) and decays smoothly as rho leaves 1, faster for a larger tau;
    tau_neg > tau_pos damps negative-advantage tokens more (their gradients spread over many unsampled tokens and
    destabilise training). Defaults: the paper's / verl's. The paper's (1/G) sum_i (1/|y_i|) sum_t f(rho_it) A_it is
    `actor.loss_agg_mode=seq-mean-token-mean` (set by examples/algorithms/sapo.sh; token-mean weighs long sequences
    more). Metrics: `sapo_weight` = mean gradient weight w (1 = on-policy), `ppo_kl`.

    Reference: verl's verl/trainer/ppo/core_algos.py@b178a3c `compute_policy_loss_sapo` L1364-1397. Differs: the
    aggregation is actor.loss_agg_mode's, the KL term's too (verl: seq-mean-token-mean, the KL by its own mode)."""
    adv, log_ratio = _log_ratio(inp, "sapo")
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    gate = torch.sigmoid(tau * (torch.exp(log_ratio) - 1.0))
    weight = (4 * gate * (1 - gate)).detach()
    return -(4 / tau) * gate * adv, {"sapo_weight": masked_mean(weight, inp.mask),
                                       "ppo_kl": masked_mean(-log_ratio.detach(), inp.mask)}


@register_policy_loss("decoupled_ppo", reads=("rollout_logprobs",))
def decoupled_ppo(inp: LossInputs, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                  clip_ratio_c: float | None = None, behav_imp_weight_cap: float | None = None):
    """Decoupled PPO (Fu et al. 2025, "AReaL", arXiv:2505.24298, eq. 5): the behaviour policy that sampled
    (`rollout_logprobs`), the proximal one the update is held near (the trainer's, `old_logprobs`) and pi_theta:

        r_t = exp(logp_t - logp_prox_t),   w_t = exp(logp_prox_t - logp_behav_t)   (no grad)
        L_t = w_t * max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))   (dual clip -A c for A < 0 when
              clip_ratio_c is given, as `vanilla`)
        w_t > behav_imp_weight_cap  ->  w_t = 0   (the token is filtered out; it still counts in the normaliser)

    PPO's clip acts on the step from pi_prox, w corrects the sample's off-policyness; with w = 1 it is `vanilla`.
    Not with algorithm.rollout_is (the same ratio twice); algorithm.rollout_rs composes. behav_imp_weight_cap
    (actor.policy_loss.*) None: no filter (AReaL's default; it requires > 1). In a run clip_ratio_c is
    actor.clip_ratio_c (3.0, AReaL's c_clip); called bare, there is no dual clip.
    Metrics: `pg_clipfrac`, `ppo_kl` (k1 of KL(prox || theta)), `behav_imp_weight` (mean w over kept tokens),
    `behav_approx_kl` = mean (logp_prox - logp_behav) over kept tokens, `behav_filtered_frac` (tokens over the cap).

    Reference: inclusionAI/AReaL areal/utils/functional/functional.py@61d1bbb `ppo_actor_loss_fn` L144-233 (the
    last version with behav_imp_weight_cap; since 03d7115 it is RejectionSamplingConfig). Differs: the aggregation
    is actor.loss_agg_mode's (AReaL's: token-mean); its importance_sampling_level=sequence is `gspo` here."""
    adv, log_ratio = _log_ratio(inp, "decoupled_ppo")
    behav = inp.need("rollout_logprobs", "decoupled_ppo")
    loss, clipped = _clipped_surrogate(adv, torch.exp(log_ratio), clip_ratio_low, clip_ratio_high)
    if clip_ratio_c is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * clip_ratio_c), loss)
    with torch.no_grad():
        behav_kl = inp.old_logprobs - behav
        weight = torch.exp(behav_kl.clamp(max=20.0))
        kept = (weight <= behav_imp_weight_cap) if behav_imp_weight_cap is not None else torch.ones_like(
            weight, dtype=torch.bool)
        weight = torch.where(kept, weight, torch.zeros_like(weight))
    kept_mask = inp.mask * kept
    return loss * weight, _ppo_metrics(
        clipped, log_ratio, inp.mask, behav_imp_weight=masked_mean(weight, kept_mask),
        behav_approx_kl=masked_mean(behav_kl, kept_mask), behav_filtered_frac=masked_mean((~kept).float(), inp.mask))


@register_policy_loss("sft")
def sft(inp: LossInputs):
    """Supervised fine-tuning: negative log-likelihood of the target tokens (what the SFT pipeline trains).

        L_t = -log pi(y_t | y_<t, x)

    Reference: volcengine/verl verl/trainer/fsdp_sft_trainer.py@b178a3c `_compute_loss_and_backward` L372-467.
    Differs: nothing per token; verl averages the micro-batches' token means (L465-467), rllava aggregates by
    actor.loss_agg_mode over the mini-batch's counts."""
    return -inp.logprobs, {}


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL divergence",
    http://joschu.net/blog/kl-approx.html). With d = logp - logp_ref:

        k1 / kl      : d                        (unbiased, high variance, can be negative)
        abs          : |d|
        k2 / mse     : d^2 / 2
        k3 / low_var_kl : exp(-d) - 1 + d       (unbiased, >= 0, low variance; clamped to [-10, 10] as in verl)"""
    d = logprobs - ref_logprobs
    estimates = {("kl", "k1"): lambda: d, ("abs",): d.abs, ("mse", "k2"): lambda: 0.5 * d.square(),
                 ("low_var_kl", "k3"): lambda: (torch.exp(-d) - 1 + d).clamp(-10.0, 10.0)}
    for names, estimate in estimates.items():
        if kind in names:
            return estimate()
    raise ValueError(f"unknown KL estimator {kind!r} (choose kl|k1|abs|mse|k2|low_var_kl|k3)")


def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: str, *, max_len: int, num_tokens: float | None = None,
              num_seqs: float | None = None) -> torch.Tensor:
    """Reduce a per-token loss [B, T] to a scalar (`actor.loss_agg_mode`).

        token-mean              : sum_{i,t} l_it / N_tokens
        seq-mean-token-sum      : sum_i (sum_t l_it) / N_seqs
        seq-mean-token-mean     : sum_i (sum_t l_it / |o_i|) / N_seqs
        seq-mean-token-sum-norm : sum_{i,t} l_it / (N_seqs * L_max)   (Dr.GRPO's; L_max: data.max_response_length)

    The normalisers default to this micro-batch's counts; pass the mini-batch's (`num_tokens`, `num_seqs`) when
    accumulating gradients over micro-batches, so the result equals the unsplit loss."""
    mask = mask.to(loss.dtype)
    seq_has_tokens = (mask.sum(-1) > 0).to(loss.dtype)
    num_tokens = mask.sum().clamp(min=1) if num_tokens is None else num_tokens
    num_seqs = seq_has_tokens.sum().clamp(min=1) if num_seqs is None else num_seqs
    if mode == "seq-mean-token-mean":
        return _seq_mean(loss, mask).sum() / num_seqs
    norm = {"token-mean": num_tokens, "seq-mean-token-sum": num_seqs, "seq-mean-token-sum-norm": num_seqs * max_len}
    if mode not in norm:
        raise ValueError(f"unknown actor.loss_agg_mode {mode!r}")
    return (loss * mask).sum() / norm[mode]


def value_loss(vpreds: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, *,
               cliprange: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss (Schulman et al. 2017, arXiv:1707.06347; as in OpenAI baselines):

        V_clip = V_old + clip(V - V_old, -c, c)
        L_t    = 0.5 * max((V - R)^2, (V_clip - R)^2)

    Returns the per-token loss [B, T] (aggregated like a policy loss) and the fraction of masked tokens where the
    clipped branch is the larger one (zero gradient)."""
    clipped = old_values + (vpreds - old_values).clamp(-cliprange, cliprange)
    unclipped_sq, clipped_sq = (vpreds - returns).square(), (clipped - returns).square()
    return 0.5 * torch.maximum(unclipped_sq, clipped_sq), masked_mean((clipped_sq > unclipped_sq).float(), mask)
