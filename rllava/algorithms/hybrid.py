"""SFT+RL hybrids: their schedules, weights and policy losses, as small pure functions over tensors.

A hybrid trains on two kinds of tokens in one batch: the policy's own (on-policy, RL as usual) and an expert's
(`Segment.off_policy`: a demonstration, a hint, an expert sample in a group). Each is one config (the scripts
`examples/algorithms/{chord,chord_phi,luffy,uft,hpt,srft}.sh`); what it does with the expert tokens:

    method  expert tokens                                  from (rllava.train.hybrid_step)              select with
    LUFFY   RL in the group, shaped f(p) = p/(p+gamma),    n_prefix of the K responses are the     loss_mode=luffy
            no clip (arXiv:2504.14945)                     expert's (prefix_strategy=random)
    SRFT    LUFFY's shaped RL + SFT x 0.5 exp(-H_i); own   as LUFFY                                loss_mode=srft
            correct rollouts x 0.1 exp(H_i) (arXiv:2506.19767)
    CHORD   SFT x mu(t) (CHORD-phi: x phi(p)), RL x        expert_data_ratio of the rows are       loss_mode=chord
            (1 - mu(t)) (arXiv:2508.11408)                 demonstrations
    HPT     SFT x sft_loss_coef where a prompt was solved  a demonstration replaces the group      loss_mode=hpt
            <= switch_gate times, else RL (arXiv:2509.04419)  (unify_strategy=switch | soft)
    UFT     SFT x sft_loss_coef on the hint, RL on the     the first k of hint_chunks chunks,      loss_mode=uft
            continuation (arXiv:2505.16984)                k ~ Binomial(chunks, p(t)) (prefix_strategy=hint)

The step loss is rl_coef L_RL + sft_coef L_SFT, each term normalised over its own tokens (`rllava.roles.actor`).
Keys follow RLLaVA (`actor.off_policy_reshape=p_div_p_0.1`, `algorithm.strategy=mix_chord`, ...); every schedule
and weight is logged per step (`hybrid/*`, `actor/sft_nll`, `actor/sft_weight`, `actor/srft_*`).
"""

from __future__ import annotations

import math

import torch

from rllava.algorithms.losses import LossInputs, _clipped_surrogate, _seq_mean, masked_mean
from rllava.algorithms.registry import register_policy_loss
from rllava.config.schema import HYBRIDS

EXPERT_IN_RL = {"luffy", "srft"}  # the hybrid losses that train the expert tokens with (shaped) RL,
EXPERT_IN_SFT = {"srft", "chord", "hpt", "uft"}  # ... and with the SFT term
HYBRID_LOSSES = HYBRIDS  # the one list of their names, the config's: it checks them before torch loads
# The actor.* keys the hybrid losses declare (keyword-only parameters of the same names)
HYBRID_LOSS_KEYS = ("loss_remove_clip", "off_policy_reshape", "off_policy_reshape_weight", "off_policy_reshape_pow_exp",
                    "off_policy_max_clip", "off_policy_min_clip", "all_max_clip", "on_policy_reshape",
                    "on_policy_reshape_weight", "on_policy_reshape_pow_exp", "srft_type", "clip_upper_bound")


def mu_schedule(step: int, *, warmup: int, decay: int, peak: float, valley: float) -> float:
    """CHORD's SFT weight mu(t) (Zhang et al. 2025, arXiv:2508.11408): linear warm-up from 0 to `peak` over
    `warmup` steps, cosine decay from `peak` to `valley` over the next `decay` steps, then `valley`:

        mu(t) = peak * t / warmup                                          t <  warmup
              = valley + (peak - valley) (1 + cos(pi (t - warmup) / decay)) / 2   warmup <= t < warmup + decay
              = valley                                                     afterwards
    warmup = decay = 0 with peak = valley gives a constant mu (CHORD-phi's 0.1)."""
    if step < warmup:
        return peak * step / warmup
    if step < warmup + decay:
        return valley + (peak - valley) * 0.5 * (1 + math.cos(math.pi * (step - warmup) / decay))
    return valley


def phi(p: torch.Tensor) -> torch.Tensor:
    """CHORD-phi's token weight (Zhang et al. 2025, arXiv:2508.11408), on the SFT term -sg(phi(p_t)) log p_t:

        phi(p) = p (1 - p)

    largest for uncertain tokens (p = 0.5), ~0 for tokens the policy already predicts (p -> 1) and for ones far
    from it (p -> 0), so SFT does not overwrite what RL found nor force the improbable."""
    return p * (1 - p)


def reshape(ratio: torch.Tensor, logprobs: torch.Tensor, kind: str, *, weight: float = 0.1,
            pow_exp: float = 0.5) -> torch.Tensor:
    """LUFFY's (and RLLaVA's) shaping of the expert's probability r = p = pi(y_t), pi_old of the expert taken as 1
    (`actor.off_policy_reshape`; LUFFY's mix_core_alg.py L106-121; the policy's own ratio: `on_policy_ratio`):

        no_reshape     r                    logp     weight * log p          p_logp  weight * log p + r
        square_root    sqrt(r)              pow      r ** pow_exp            p_div_p_<gamma>  r / (r + gamma)

    LUFFY's f(p) = p / (p + gamma), gamma = 0.1 (`p_div_p_0.1`), keeps low-probability expert tokens' gradient
    large (grad f = gamma / (p + gamma)^2 grad p), where plain p's would vanish."""
    if kind.startswith("p_div_p_"):
        return ratio / (ratio + float(kind[len("p_div_p_"):]))
    shaped = {"no_reshape": lambda: ratio, "logp": lambda: logprobs * weight,
              "p_logp": lambda: logprobs * weight + ratio, "square_root": lambda: torch.sqrt(ratio),
              "pow": lambda: torch.pow(ratio, pow_exp)}.get(kind)
    if shaped is None:
        raise ValueError(f"unknown reshape {kind!r} (choose no_reshape|logp|p_logp|square_root|pow|p_div_p_<gamma>)")
    return shaped()


def on_policy_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, kind: str, *, weight: float = 0.1,
                    pow_exp: float = 0.5) -> torch.Tensor:
    """LUFFY's shaping of the policy's own ratio r = p / p_old (`actor.on_policy_reshape`; LUFFY's
    luffy/verl/verl/mix_src/mix_core_alg.py L62-87, `compute_token_on_off_policy_loss`):

        no_reshape  r        logp  log r        p_logp  r + weight log r        square_root  sqrt(r)
        pow         r ** pow_exp                p_div_p_<gamma>  f(p) / f(p_old),  f(p) = p / (p + gamma)

    RLLaVA shapes r as the expert's p (`reshape` on r, its `_reshape_ratio`) under `rllava_<kind>`: e.g.
    `rllava_p_div_p_<gamma>` = r / (r + gamma). At r = 1, p_div_p_0.1's gradient is LUFFY's gamma / (p + gamma)
    d log p, RLLaVA's 1 / 1.1^2 x 0.1 whatever p."""
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    if kind.startswith("rllava_"):
        return reshape(ratio, logprobs, kind[len("rllava_"):], weight=weight, pow_exp=pow_exp)
    if kind == "logp":
        return log_ratio
    if kind == "p_logp":
        return ratio + weight * log_ratio
    if kind.startswith("p_div_p_"):
        gamma = float(kind[len("p_div_p_"):])
        p, p_old = torch.exp(logprobs), torch.exp(old_logprobs)
        return (p / (p + gamma)) / (p_old / (p_old + gamma))
    return reshape(ratio, logprobs, kind, weight=weight, pow_exp=pow_exp)  # no_reshape, square_root, pow: the same


def hint_probability(step: int, *, steps: int, start: float, end: float) -> float:
    """UFT's hint schedule (Liu et al. 2025, arXiv:2505.16984): the probability p(t) that each chunk of the
    expert solution is shown, cosine from `start` to `end` over the first `steps` steps, 0 (no hint) after:

        p(t) = end + (start - end) (1 + cos(pi t / steps)) / 2      t < steps;   0 afterwards"""
    if step >= steps:
        return 0.0
    return end + (start - end) * 0.5 * (1 + math.cos(math.pi * step / steps))


def chunk_bounds(n_tokens: int, chunks: int) -> list[int]:
    """Token counts at the end of each of (at most) `chunks` near-equal chunks of an `n_tokens` solution:
    a hint of k chunks is its first chunk_bounds(...)[k - 1] tokens. chunk_bounds(10, 4) = [3, 6, 8, 10]."""
    chunks = max(1, min(chunks, n_tokens))
    base, extra = divmod(n_tokens, chunks)  # the first `extra` chunks are one token longer
    return [k * base + min(k, extra) for k in range(1, chunks + 1)]


def srft_weights(entropy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SRFT's entropy-aware weights (Fu et al. 2025, arXiv:2506.19767), one per sequence from its mean token
    entropy H (detached; RLLaVA's rllava/ppo/plugins/policy_loss.py `compute_policy_loss_srft`, `H_coef`):

        w_SFT = 0.5 exp(-H)   on a demonstration's NLL: an uncertain policy learns less from it
        w_RL  = 0.1 exp(+H)   on a correct rollout of the policy's own: an uncertain policy reinforces it more"""
    return 0.5 * torch.exp(-entropy), 0.1 * torch.exp(entropy)


def _on_policy_loss(inp: LossInputs, on: torch.Tensor, loss_remove_clip: bool, reshape_kind: str,
                    reshape_weight: float, reshape_pow_exp: float, clip_ratio_low: float, clip_ratio_high: float):
    """(-A r on the policy's tokens, r from `on_policy_ratio`, PPO-clipped unless loss_remove_clip; the clip mask)."""
    adv = inp.need("advantages", "hybrid")
    ratio = on_policy_ratio(inp.logprobs, inp.need("old_logprobs", "hybrid"), reshape_kind, weight=reshape_weight,
                            pow_exp=reshape_pow_exp)
    if loss_remove_clip:
        return -adv * ratio, torch.zeros_like(on, dtype=torch.bool)
    loss, clipped = _clipped_surrogate(adv, ratio, clip_ratio_low, clip_ratio_high)
    return loss, clipped & (on > 0)


def _with_expert_tokens(inp: LossInputs, on: torch.Tensor, off: torch.Tensor, on_loss: torch.Tensor, clipped, kind: str,
                        weight: float, pow_exp: float, max_clip: float, min_clip: float, all_max_clip: float):
    """(per-token loss, metrics): `on_loss` on the policy's tokens, -A f(p) on the expert's, f the shaped off-policy
    ratio of p = pi(y_t) (pi_old of the expert = 1) clamped to [min_clip, max_clip]; RLLaVA's `actor.all_max_clip`:
    no loss on tokens the policy already gives p > all_max_clip (-1: that bound off)."""
    off_ratio = reshape(torch.exp(inp.logprobs), inp.logprobs, kind, weight=weight, pow_exp=pow_exp)
    if max_clip != -1:
        off_ratio = off_ratio.clamp(max=max_clip)
    if min_clip != -1:
        off_ratio = off_ratio.clamp(min=min_clip)
    off_loss = -inp.advantages * off_ratio
    loss, p = torch.where(off > 0, off_loss, on_loss), torch.exp(inp.logprobs.detach())
    if all_max_clip != -1:
        loss = loss * (p <= all_max_clip)
    return loss, {"on_pg_loss": masked_mean(on_loss.detach(), on), "off_pg_loss": masked_mean(off_loss.detach(), off),
                  "pg_clipfrac": masked_mean(clipped.float(), on), "on_policy_prob": masked_mean(p, on),
                  "off_policy_prob": masked_mean(p, off),
                  "ppo_kl": masked_mean((inp.old_logprobs - inp.logprobs).detach(), on)
                  if inp.old_logprobs is not None else 0.0}


@register_policy_loss("luffy")
def luffy(inp: LossInputs, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
          loss_remove_clip: bool = False, off_policy_reshape: str = "p_div_p_0.1",
          off_policy_reshape_weight: float = 0.1, off_policy_reshape_pow_exp: float = 0.5,
          on_policy_reshape: str = "no_reshape", on_policy_reshape_weight: float = 0.1,
          on_policy_reshape_pow_exp: float = 0.5, off_policy_max_clip: float = -1, off_policy_min_clip: float = -1,
          all_max_clip: float = -1):
    """LUFFY, mixed-policy GRPO (Yan et al. 2025, arXiv:2504.14945): a group's advantages span its expert samples, and

        expert tokens (inp.off_policy = 1):  L_t = -A_t f(p_t),   p_t = pi(y_t | ...),  f(p) = p / (p + gamma)
        own tokens:                          L_t = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))

    pi_old of the expert is taken as 1 (unknown), so r = p, unclipped. `actor.off_policy_reshape` picks f (`reshape`;
    LUFFY's `p_div_p_0.1`: gamma = 0.1); `actor.loss_remove_clip=true` unclips the own tokens too (LUFFY's script,
    with `actor.loss_agg_mode=seq-mean-token-sum-norm`). `actor.off_policy_max_clip` / `off_policy_min_clip` clamp
    f (-1: off); `actor.all_max_clip` drops tokens with p > it from the loss (not from the normaliser's count).
    Metrics: `on_pg_loss`, `off_pg_loss`, `on_policy_prob` / `off_policy_prob` (mean p), `pg_clipfrac`, `ppo_kl`.

    Reference: LUFFY's luffy/verl/verl/mix_src/mix_core_alg.py `compute_token_on_off_policy_loss` L59-155 (read at
    TheRoadQaQ/LUFFY@c4eab08, a copy of ElliottYan/LUFFY); `actor.on_policy_reshape` has LUFFY's meaning
    (`on_policy_ratio`; RLLaVA's under `rllava_<kind>`). Differs: `actor.all_max_clip` keeps the dropped tokens in
    the normaliser's count (LUFFY and RLLaVA drop them from it too)."""
    off = inp.off_policy if inp.off_policy is not None else torch.zeros_like(inp.mask)
    off, on = inp.mask * off, inp.mask * (1 - off)
    on_loss, clipped = _on_policy_loss(inp, on, loss_remove_clip, on_policy_reshape, on_policy_reshape_weight,
                                       on_policy_reshape_pow_exp, clip_ratio_low, clip_ratio_high)
    return _with_expert_tokens(inp, on, off, on_loss, clipped, off_policy_reshape, off_policy_reshape_weight,
                               off_policy_reshape_pow_exp, off_policy_max_clip, off_policy_min_clip, all_max_clip)


@register_policy_loss("srft")
def srft(inp: LossInputs, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
         loss_remove_clip: bool = False, off_policy_reshape: str = "p_div_p_0.1",
         off_policy_reshape_weight: float = 0.1, off_policy_reshape_pow_exp: float = 0.5,
         off_policy_max_clip: float = -1, off_policy_min_clip: float = -1, srft_type: str = "paper",
         clip_upper_bound: float = 1.0, all_max_clip: float = -1, success_reward_threshold: float = 1.0):
    """SRFT's RL terms (Fu et al. 2025, arXiv:2506.19767); the Actor adds its SFT term 0.5 exp(-H_i) NLL on
    demonstration i (`sft_token_weights`). H_i: row i's mean token entropy (detached), w_RL,i = 0.1 exp(H_i):

        expert tokens:                    L_t = -A_t f(p_t)                 (LUFFY's shaped off-policy term)
        own tokens of a correct rollout:  L_t = -w_RL,i g_t                 (reinforce, weighted by its entropy)
        own tokens of a wrong rollout:    L_t = +g_t                        (push down)

    A rollout is correct when its reward reaches `algorithm.success_reward_threshold` (the reference's: reward == 1),
    whatever its advantage: where a whole group is right GRPO's advantages are 0, and SRFT still reinforces it.
    g_t = log p_t (`actor.srft_type=paper`), p_t (`exp`), r_t (`classic_rl`; clamped to [1 - eps_low,
    max(clip_upper_bound, 1 + eps_high)] on the pessimistic side unless `actor.loss_remove_clip`) or
    log p_t - log p_old (`minus_old`). `actor.off_policy_max_clip` / `off_policy_min_clip` / `all_max_clip`: `luffy`.
    Metrics: as `luffy`, plus `srft_on_coef` (mean w_RL of the own rollouts) and `srft_entropy` (their mean H).

    Reference: RLLaVA's rllava/ppo/plugins/policy_loss.py `compute_policy_loss_srft` L356-485 (TinyLoopX/RLLaVA@4753d4a;
    SRFT's own mix actor computes the same H_i, weights and reward-based correctness). Differs: the clamp above
    (RLLaVA's clamps log p: no gradient for a wrong rollout under `srft_type=paper` unless `actor.loss_remove_clip`);
    the SFT coefficient `actor.sft_loss_coef` (default 1, the reference's implicit 1)."""
    off = inp.off_policy if inp.off_policy is not None else torch.zeros_like(inp.mask)
    off, on = inp.mask * off, inp.mask * (1 - off)
    adv = inp.need("advantages", "srft")
    entropy = _seq_mean(inp.need("entropy", "srft").detach(), inp.mask).unsqueeze(-1)  # H_i, [B, 1]
    _, on_coef = srft_weights(entropy)
    correct = (inp.need("scores", "srft") >= success_reward_threshold).unsqueeze(-1)
    on_adv = torch.where(correct, on_coef.to(adv.dtype).expand_as(adv), torch.full_like(adv, -1.0))
    old = inp.old_logprobs if inp.old_logprobs is not None else inp.logprobs.detach()
    g = {"exp": torch.exp(inp.logprobs), "classic_rl": torch.exp((inp.logprobs - old).clamp(-20.0, 20.0)),
         "minus_old": inp.logprobs - old}.get(srft_type, inp.logprobs)
    on_loss = -on_adv * g
    clipped = torch.zeros_like(on, dtype=torch.bool)
    if srft_type == "classic_rl" and not loss_remove_clip:  # a ratio: clipped like PPO's
        bounded = -on_adv * g.clamp(1.0 - clip_ratio_low, max(clip_upper_bound, 1.0 + clip_ratio_high))
        clipped = (bounded > on_loss) & (on > 0)
        on_loss = torch.maximum(on_loss, bounded)
    loss, metrics = _with_expert_tokens(inp, on, off, on_loss, clipped, off_policy_reshape, off_policy_reshape_weight,
                                        off_policy_reshape_pow_exp, off_policy_max_clip, off_policy_min_clip,
                                        all_max_clip)
    own = on.sum(-1, keepdim=True) > 0  # the rows holding own tokens
    metrics.update(srft_on_coef=masked_mean(on_coef, own), srft_entropy=masked_mean(entropy, own))
    return loss, metrics


PAPERS = {"chord": "arXiv:2508.11408", "hpt": "arXiv:2509.04419", "uft": "arXiv:2505.16984"}
# The reference implementation each follows and where rllava differs (tests/algorithms/test_parity_hybrids.py)
REFERENCES = {
    "chord": "Trinity-RFT's trinity/algorithm/policy_loss_fn/chord_policy_loss.py `MIXCHORDPolicyLossFn` L202-228 "
             "(mu schedule L14-31, phi L62-67, the dual clip of its GRPO term ppo_policy_loss.py L71-76; read at "
             "yanxi-chen/Trinity-RFT@9051d63). Differs: update t runs mu(t - 1) (Trinity: mu(t)); normalised over "
             "the mini-batch (Trinity: per micro-batch, then averaged).",
    "hpt": "TsinghuaC3I/Unify-Post-Training hpt/verl/verl/mix_src/mix_trainer.py L394-407 (the switch), mix_actor.py "
           "L135-165 (SFT token-mean + PG). Differs: solved = reward >= algorithm.success_reward_threshold (HPT: "
           "== 1); the authors' train.sh runs no clip and the token sum / the max length (not / sequences), while "
           "examples/algorithms/hpt.sh runs the reference's yaml defaults (clip, token-mean).",
    "uft": "liumy2010/UFT verl/workers/actor/dp_actor.py L249-284 (PPO on the continuation + sft_loss_coef x "
           "token-mean NLL of the hint). Differs: update t draws hints with p(t - 1) (UFT: p(t), t from 1).",
}


def _own_ppo(inp: LossInputs, low: float, high: float, remove_clip: bool, dual_clip_c: float | None = None):
    """PPO's clipped surrogate on the policy's own tokens (no clip with actor.loss_remove_clip), for A < 0 capped
    at -A c when `dual_clip_c` is given; (per-token loss, metrics)."""
    per_token, clipped = _on_policy_loss(inp, inp.mask, remove_clip, "no_reshape", 0.1, 0.5, low, high)
    if dual_clip_c is not None:
        per_token = torch.where(inp.advantages < 0, torch.minimum(per_token, -inp.advantages * dual_clip_c), per_token)
    return per_token, {"pg_clipfrac": masked_mean(clipped.float(), inp.mask),
                       "ppo_kl": masked_mean((inp.old_logprobs - inp.logprobs).detach(), inp.mask)}


def _doc(name: str, formula: str) -> str:
    return (f"{name.upper()}'s RL term ({PAPERS[name]}), on the policy's own tokens; its expert tokens get the SFT "
            f"term instead (see the module docstring):\n\n        {formula}\n\n    Reference: {REFERENCES[name]}\n")


def _ppo_on_own_tokens(name: str):
    """The RL half of HPT and UFT (`_own_ppo`); their expert tokens get the SFT term only (`rllava.roles.actor`)."""

    def loss(inp: LossInputs, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
             loss_remove_clip: bool = False):
        return _own_ppo(inp, clip_ratio_low, clip_ratio_high, loss_remove_clip)

    loss.__name__ = name
    loss.__doc__ = _doc(name, "L_t = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))   (-A_t r_t with "
                              "actor.loss_remove_clip)")
    return register_policy_loss(name)(loss)


@register_policy_loss("chord")
def chord(inp: LossInputs, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
          loss_remove_clip: bool = False, clip_ratio_c: float = 3.0):
    return _own_ppo(inp, clip_ratio_low, clip_ratio_high, loss_remove_clip, None if loss_remove_clip else clip_ratio_c)


chord.__doc__ = _doc("chord", "L_t = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high)), capped at -A_t c "
                              "for A_t < 0 (dual clip, c = actor.clip_ratio_c; -A_t r_t with actor.loss_remove_clip)")
hpt = _ppo_on_own_tokens("hpt")
uft = _ppo_on_own_tokens("uft")


def sft_token_weights(loss_mode: str, logprobs: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor, *,
                      enable_phi_function: bool = False) -> torch.Tensor:
    """The per-token weight (detached) of the SFT term's -log p on expert tokens, before its coefficient: CHORD-phi:
    phi(p); SRFT: 0.5 exp(-H_i), H_i the row's mean token entropy (detached) over `mask`; others: 1."""
    if loss_mode == "srft":
        return srft_weights(_seq_mean(entropy.detach(), mask).unsqueeze(-1))[0].to(logprobs.dtype).expand_as(logprobs)
    if loss_mode == "chord" and enable_phi_function:
        return phi(torch.exp(logprobs.detach()))
    return torch.ones_like(logprobs)
