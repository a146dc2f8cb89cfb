"""Rollout correction: the rollout engine (vLLM, SGLang, a stale or bf16 copy) samples from pi_rollout, not the
trainer's pi_old, so even a synchronous run is slightly off-policy. Pure functions over [B, T] tensors, applied by
`rllava.roles.actor.Actor` to the RL term of any policy loss (and to `rllava.algorithms.distill`'s):

    rollout_importance_weights : truncated IS weights (TIS), token or sequence level -> per-token loss x weights
    rollout_rejection_mask     : rejection sampling (RS) by divergence thresholds  -> tokens/rows out of the mask
    mismatch_metrics           : KL / chi^2 / perplexity gap between pi_rollout and pi_old (diagnostics)

Config: `algorithm.rollout_is` / `rollout_is_cap` (or RLLaVA's `actor.tis_imp_ratio_cap`), `algorithm.rollout_rs` /
`rollout_rs_threshold`. IS + RS together are verl's "MIS" (e.g. rollout_is=sequence, rollout_rs=seq_sum_k1,
rollout_rs_threshold=0.5_2.0), RS alone on seq_mean_k1 its "Geo-RS" (geometric-mean ratio, 0.999_1.001). The
decoupled PPO loss (AReaL) is a policy loss: `rllava.algorithms.losses.decoupled_ppo`.
"""

from __future__ import annotations

import math

import torch

from rllava.algorithms.losses import masked_mean

SAFETY_BOUND = 20.0  # log-ratios are clamped to [-20, 20] before exp, as verl's rollout_corr_helper.py L75

RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
              "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


def rollout_importance_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, *,
                               cap: float, level: str = "token") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated importance sampling (TIS) for the rollout/trainer mismatch (Yao et al. 2025, "Your Efficient RL
    Framework Secretly Brings You Off-Policy RL Training", https://fengyao.notion.site/off-policy-rl):

        token    : w_t = min(exp(logp_old_t - logp_rollout_t), cap)
        sequence : w_i = min(exp(sum_t (logp_old_t - logp_rollout_t)), cap)   (product over masked tokens, in
                   log space), broadcast to the sequence's tokens

    Returns detached weights [B, T] (1 on masked-out tokens) for any per-token loss, and metrics over masked
    tokens: `rollout_is_mean` (truncated weights), `rollout_is_max` (before truncation, log clamped at 20),
    `rollout_is_truncated_frac`, `rollout_log_ratio_abs` = mean |log ratio|.

    Reference: volcengine/verl verl/trainer/ppo/rollout_corr_helper.py@b178a3c `compute_rollout_correction_weights`
    L481-598 (metrics `compute_is_metrics` L601-713). Differs: no batch normalisation (verl's
    rollout_is_batch_normalize, default off); weights 1, not 0, on masked-out tokens; the token log-ratio is not
    clamped below (exp underflows to 0 harmlessly); `rollout_is_mean` is after truncation (verl's: before); no std /
    ESS / per-sequence metrics. As verl (L782-808), a sequence weight counts the tokens rejection then drops."""
    with torch.no_grad():
        valid = mask > 0
        log_ratio = torch.where(valid, old_logprobs - rollout_logprobs, torch.zeros_like(old_logprobs))
        if level not in ("token", "sequence"):
            raise ValueError(f"unknown importance-sampling level {level!r} (choose token|sequence)")
        log_w = log_ratio if level == "token" else log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
        truncated = log_w > math.log(cap)
        weights = torch.where(valid, torch.exp(log_w.clamp(max=math.log(cap))), torch.ones_like(log_w))
        top = torch.where(valid, log_w, torch.full_like(log_w, -torch.inf)).max().clamp(max=SAFETY_BOUND)
    return weights, {"rollout_is_mean": masked_mean(weights, mask),
                     "rollout_is_max": torch.exp(top) if bool(valid.any()) else torch.ones(()),
                     "rollout_is_truncated_frac": masked_mean(truncated.float(), mask),
                     "rollout_log_ratio_abs": masked_mean(log_ratio.abs(), mask)}


def parse_rs_thresholds(options: str, thresholds: str | float | None) -> dict[str, tuple[float | None, float]]:
    """`algorithm.rollout_rs` / `rollout_rs_threshold` -> {option: (lower, upper)}; ValueError (one line) if bad.

    `options`: comma-separated RS_OPTIONS (duplicates dropped); `thresholds`: one for all or one per option, alike.
    k1 takes ratio bounds "lower_upper" (one value: the upper, lower = 1 / upper); k2 / k3 one positive upper bound
    (lower None). Reference: verl rollout_corr_helper.py@b178a3c `_parse_rollout_rs_thresholds` L93-153."""
    opts = list(dict.fromkeys(o.strip() for o in str(options).split(",") if o.strip()))
    if not opts:
        raise ValueError("must name at least one option")
    for o in opts:
        if o not in RS_OPTIONS:
            raise ValueError(f"option {o!r} is not one of: {', '.join(RS_OPTIONS)}")
    if thresholds is None or str(thresholds).strip() == "":
        raise ValueError("set algorithm.rollout_rs_threshold (no default, as in verl; e.g. 0.5_2.0 for a k1 option, "
                         "0.01 for k3)")
    specs = [s.strip() for s in str(thresholds).split(",") if s.strip()]
    if len(specs) not in (1, len(opts)):
        raise ValueError(f"give one threshold for all options or one per option ({len(opts)}), not {len(specs)}")
    out = {}
    for o, s in zip(opts, specs * len(opts) if len(specs) == 1 else specs):
        try:
            if o.endswith("k1"):
                lower, upper = (float(v) for v in s.split("_", 1)) if "_" in s else (1.0 / float(s), float(s))
            elif "_" in s:
                raise ValueError(f"{o} takes a single upper bound, not {s!r}")
            else:
                lower, upper = None, float(s)
        except (ValueError, ZeroDivisionError) as e:
            raise ValueError(f"bad threshold {s!r} for {o}: {e}") from None
        if upper <= 0 or (lower is not None and lower <= 0):
            raise ValueError(f"thresholds for {o} must be positive, got {s!r}")
        out[o] = (lower, upper)
    return out


def rollout_rejection_mask(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, *,
                           options: str, thresholds: str | float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Rejection sampling (a hard trust region between the trainer and the sampler): tokens or whole sequences whose
    divergence estimate is out of bounds leave the loss. With log rho_t = clamp(logp_old_t - logp_rollout_t, -20, 20):

        k1_t = -log rho_t      k2_t = (log rho_t)^2 / 2      k3_t = exp(log rho_t) - 1 - log rho_t
        token_kN    : keep token t      if its k_t passes
        seq_sum_kN  : keep sequence i   if sum_t k_t passes        (seq_sum_k1: the sequence IS ratio)
        seq_mean_kN : keep sequence i   if mean_t k_t passes       (seq_mean_k1: the geometric-mean ratio, Geo-RS)
        seq_max_kN  : keep sequence i   if max_t k_t passes        (one catastrophic token vetoes its sequence)
        passes: k1 in [log lower, log upper] (ratio bounds, from "lower_upper"); k2 / k3 <= upper

    Comma-separated options must all pass. Returns the keep mask [B, T] (1 = kept, and outside `mask`) and metrics:
    `rollout_rs_masked_fraction` (rejected share of masked tokens), `rollout_rs_seq_masked_fraction` (of sequences
    with a rejected token), per option `rollout_rs_<option>_masked_fraction`.

    Reference: volcengine/verl verl/trainer/ppo/rollout_corr_helper.py@b178a3c `compute_rollout_rejection_mask`
    L156-372 (thresholds L93-153; presets verl/trainer/config/algorithm.py L210-255, L301-320: seq_sum_k1
    0.5_2.0, seq_mean_k1 0.999_1.001, seq_mean_k3 0.01). Differs: rejected tokens still count in the aggregation's
    normalisers (counted per mini-batch before its micro-batches run, as AReaL; verl's response_mask drops them);
    the sequence fraction is over sequences with masked tokens (verl: all rows); no per-option statistics."""
    specs = parse_rs_thresholds(options, thresholds)
    with torch.no_grad():
        valid = mask > 0
        lr = (old_logprobs - rollout_logprobs).clamp(-SAFETY_BOUND, SAFETY_BOUND)
        stats = {"k1": -lr, "k2": 0.5 * lr.square(), "k3": torch.exp(lr) - 1.0 - lr}
        keep = torch.ones_like(lr, dtype=torch.bool)
        metrics = {}
        for option, (lower, upper) in specs.items():
            level, k = option.rsplit("_", 1)
            s = torch.where(valid, stats[k], torch.zeros_like(lr))
            if level == "seq_sum":
                s = s.sum(-1, keepdim=True)
            elif level == "seq_mean":
                s = s.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
            elif level == "seq_max":
                s = torch.where(valid, s, torch.full_like(s, -torch.inf)).amax(-1, keepdim=True)
            ok = (s >= math.log(lower)) & (s <= math.log(upper)) if k == "k1" else s <= upper
            ok = ok.expand_as(lr) | ~valid
            metrics[f"rollout_rs_{option}_masked_fraction"] = masked_mean((~ok).float(), mask)
            keep &= ok
        rows = valid.any(-1)
        rejected_rows = (~keep & valid).any(-1)
        metrics["rollout_rs_masked_fraction"] = masked_mean((~keep).float(), mask)
        metrics["rollout_rs_seq_masked_fraction"] = rejected_rows.float().sum() / rows.float().sum().clamp(min=1)
    return keep.to(mask.dtype), metrics


def mismatch_metrics(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """How far the sampler is from the trainer, over masked tokens (log rho_t = logp_old_t - logp_rollout_t):

        mismatch_kl         = mean_t (logp_rollout_t - logp_old_t)           k1 of KL(pi_rollout || pi_old)
        mismatch_k3_kl      = mean_t (exp(log rho_t) - log rho_t - 1)         k3 of the same KL
        mismatch_log_ppl_diff = mean_i (mean_t logp_rollout_it - mean_t logp_old_it)   (log of the PPL ratio)
        mismatch_chi2_token = mean_t rho_t^2 - 1,  mismatch_chi2_seq = mean_i (prod_t rho_it)^2 - 1   (clamped)
        mismatch_training_ppl / mismatch_rollout_ppl = mean_i exp(-mean_t logp_it)

    Reference: volcengine/verl verl/trainer/ppo/rollout_corr_helper.py@b178a3c `compute_offpolicy_metrics` L834-940.
    Differs: its names (`kl`, `k3_kl`, `log_ppl_diff`, ...) prefixed `mismatch_`; sequence means are over sequences with
    masked tokens (verl: all rows); verl's log-PPL min / max / abs and ppl_ratio are not logged."""
    with torch.no_grad():
        valid = mask > 0
        zero = torch.zeros_like(old_logprobs)
        lr = torch.where(valid, old_logprobs - rollout_logprobs, zero)
        rows = valid.any(-1)
        n_rows = rows.float().sum().clamp(min=1)
        count = mask.sum(-1).clamp(min=1)
        seq_old = torch.where(valid, old_logprobs, zero).sum(-1) / count
        seq_rollout = torch.where(valid, rollout_logprobs, zero).sum(-1) / count
        lr_safe = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)

        def over_rows(x: torch.Tensor) -> torch.Tensor:
            return (x * rows).sum() / n_rows

        return {"mismatch_kl": masked_mean(-lr, mask),
                "mismatch_k3_kl": masked_mean(torch.exp(lr) - lr - 1, mask),
                "mismatch_log_ppl_diff": over_rows(seq_rollout - seq_old),
                "mismatch_chi2_token": masked_mean(torch.exp(lr_safe).square(), mask) - 1.0,
                "mismatch_chi2_seq": over_rows(torch.exp(2.0 * lr.sum(-1).clamp(-SAFETY_BOUND, SAFETY_BOUND))) - 1.0,
                "mismatch_training_ppl": over_rows(torch.exp(-seq_old)),
                "mismatch_rollout_ppl": over_rows(torch.exp(-seq_rollout))}
