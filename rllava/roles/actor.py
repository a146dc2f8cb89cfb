"""The Actor (the policy being trained); the Reference it is held near is `rllava.roles.reference`.

`Actor.update` is stage 4: ppo_epochs x mini-batches (one optimizer step each) x micro-batches (gradient
accumulation). Aggregation normalisers are the mini-batch's token/sequence counts, so splitting a mini-batch
into micro-batches, by a fixed row count or by a token budget (`MicroBatching`), never changes the gradient.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch

from rllava.algorithms.hybrid import EXPERT_IN_RL, EXPERT_IN_SFT, sft_token_weights
from rllava.algorithms.correction import mismatch_metrics, rollout_importance_weights, rollout_rejection_mask
from rllava.algorithms.losses import LossInputs, aggregate, kl_penalty, masked_mean
from rllava.algorithms.registry import call_with_params
from rllava.data.protocol import Batch
from rllava.model.forward import LOGPROB_CHUNK, token_logprobs
from rllava.roles.batching import MeanMetrics, MicroBatching, compute_logprobs, mini_batches
from rllava.roles.teacher import Teachers


@dataclass(frozen=True)
class ExpertLoss:
    """How a hybrid's loss trains the expert (off-policy) tokens (`rllava.algorithms.hybrid`): `loss_mode` decides
    RL (shaped, inside the policy loss) and/or an SFT term; `enable_phi_function` weights CHORD's SFT tokens by
    phi(p); `token_level_sft` normalises the SFT term over its tokens (else per sequence, then over sequences)."""

    loss_mode: str
    enable_phi_function: bool = False
    token_level_sft: bool = True

    def masks(self, loss_mask: torch.Tensor, off_policy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens of the RL term, tokens of the SFT term), each [B, T]."""
        off = loss_mask * off_policy
        rl = loss_mask if self.loss_mode in EXPERT_IN_RL else loss_mask - off
        return rl, off if self.loss_mode in EXPERT_IN_SFT else torch.zeros_like(off)


@dataclass(frozen=True)
class Distillation:
    """On-policy distillation as the Actor adds it (`algorithm.distill`): the registered per-token loss `fn`
    (`rllava.algorithms.distill`), its weight and the teachers (`rllava.roles.teacher.Teachers`)."""

    fn: Callable
    coef: float
    teachers: Teachers
    key: str = "algorithm.distill.loss"

    def needs(self, name: str) -> bool:
        """The loss declares `name`: teacher_logprobs (a teacher pass before the update), full_kl (the teacher
        runs on every micro-batch of the update)."""
        return name in inspect.signature(self.fn).parameters

    @property
    def full(self) -> bool:
        return self.needs("full_kl")


class Actor:
    def __init__(self, model, engine, algorithm, *, ppo_epochs: int, mini_batch_size: int, micro_batch_size: int,
                 log_prob_micro_batch_size: int, loss_agg_mode: str, max_response_length: int,
                 temperature: float, use_kl_loss: bool, kl_loss_coef: float, kl_loss_type: str,
                 entropy_coeff: float, rollout_is: str = "none", rollout_is_cap: float = 2.0,
                 rollout_rs: str | None = None, rollout_rs_threshold: str | None = None, off_policy: bool = False,
                 padding_free: bool = False, shared_prefix: bool = False, max_token_len: int | None = None,
                 log_prob_max_token_len: int | None = None, logprob_chunk_size: int = LOGPROB_CHUNK,
                 expert: ExpertLoss | None = None):
        """`max_token_len` / `log_prob_max_token_len` set: dynamic batching of the update / the no-grad pass
        by that token budget instead of `micro_batch_size` / `log_prob_micro_batch_size` rows."""
        self.model, self.engine, self.algorithm = model, engine, algorithm
        self.ppo_epochs, self.mini_batch_size = ppo_epochs, mini_batch_size
        self.micro_batching = MicroBatching(micro_batch_size, max_token_len, padding_free, shared_prefix)
        self.log_prob_batching = MicroBatching(log_prob_micro_batch_size, log_prob_max_token_len, padding_free,
                                               shared_prefix)
        self.logprob_chunk_size = logprob_chunk_size  # trained tokens per LM-head chunk (<= 0: all at once)
        self.loss_agg_mode, self.max_response_length = loss_agg_mode, max_response_length
        self.temperature = temperature
        self.use_kl_loss, self.kl_loss_coef, self.kl_loss_type = use_kl_loss, kl_loss_coef, kl_loss_type
        self.entropy_coeff = entropy_coeff
        self.rollout_is, self.rollout_is_cap = rollout_is, rollout_is_cap  # truncated IS: none | token | sequence
        self.rollout_rs, self.rollout_rs_threshold = rollout_rs, rollout_rs_threshold  # rejection sampling; None: off
        self.off_policy = off_policy  # asynchronous or partial rollouts: the mismatch metrics even uncorrected
        self.expert = expert  # a hybrid's treatment of expert tokens; None: every trained token is RL-trained
        # the Reference, for a full-vocabulary KL loss (kl_loss_type=full): its forward runs on every micro-batch of
        # the update (no grad), since the loss needs its whole distribution at each position, not one log-prob
        self.reference = None
        self.distill: Distillation | None = None  # on-policy distillation's term, beside the policy loss

    def needs_old_logprobs(self, batch: Batch) -> bool:
        """With one epoch over one mini-batch, the policy that sampled is the one being updated, so pi_old is
        the current forward's detached log-probs and the separate old-log-prob pass can be skipped."""
        rows = len(batch) - (int(batch.sft_only.sum()) if batch.sft_only is not None else 0)  # demonstrations:
        return self.ppo_epochs > 1 or rows > self.mini_batch_size  # spread over the mini-batches, not one more

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        return compute_logprobs(self.model, batch, self.log_prob_batching, self.temperature,
                                chunk_size=self.logprob_chunk_size)

    def update(self, batch: Batch, *, rl_coef: float = 1.0, sft_coef: float = 1.0) -> dict[str, float]:
        """Stage 4: optimise the policy loss (+ KL, - entropy) over the batch; returns averaged metrics.
        A hybrid's batch (expert tokens in `off_policy_mask`, `self.expert` set) optimises
        rl_coef * L_RL + sft_coef * L_SFT, each term normalised over its own tokens."""
        self.model.train()
        metrics = MeanMetrics()
        masks = (None, None)
        if self.expert is not None and batch.off_policy_mask is not None:
            masks = self.expert.masks(batch.loss_mask, batch.off_policy_mask)
        full = self.distill is not None and self.distill.full  # the teachers run inside the update
        with self.distill.teachers.resident() if full else nullcontext():
            for mini, norm in mini_batches(batch, self.ppo_epochs, self.mini_batch_size, *masks):
                parts = self.distill.teachers.split(batch, mini) if full else [mini]  # one teacher per micro-batch
                for rows in [r for part in parts for r in self.micro_batching.split(batch, part)]:
                    micro = batch.select(rows)
                    rl, sft = self._masks(micro)  # which terms have tokens, read on the host: no wait on the device
                    has = (bool(rl.any()), sft is not None and bool(sft.any()))
                    metrics.add(self._backward(micro.to(self.engine.device), norm, rl_coef, sft_coef, has))
                metrics.add({"actor/grad_norm": self.engine.optimizer_step()})
        return metrics.means()

    def _masks(self, micro: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(tokens of the RL term, tokens of a hybrid's SFT term or None), each [b, t]."""
        if self.expert is not None and micro.off_policy_mask is not None:
            return self.expert.masks(micro.loss_mask, micro.off_policy_mask)
        return micro.loss_mask, None

    def _rollout_correction(self, micro: Batch, mask: torch.Tensor, old: torch.Tensor):
        """(RL-term mask less the rejected tokens, the RL term's IS weights or None, the distillation term's or None,
        metrics): rollout correction (`rllava.algorithms.correction`) of the tokens the rollout engine sampled (not a
        hybrid's expert tokens) between pi_rollout, which sampled, and pi_old, the trainer's. As verl's
        `compute_rollout_correction_and_rejection_mask` (rollout_corr_helper.py@b178a3c L782-808), the IS weights are
        taken over the whole response, then rejection (algorithm.rollout_rs) drops tokens / rows from the mask of
        every term of the loss (policy, KL, entropy, distillation), as verl drops them from response_mask; the
        aggregation's normalisers still count them. Distillation's weights: when the RL term is corrected or the
        samples are stale (token level if rollout_is=none; a full_kl loss: sequence level only, as
        `rllava.algorithms.distill` says why). Also logs the sampler/trainer mismatch (`mismatch_*`) then."""
        decoupled = getattr(self.algorithm, "loss_name", None) == "decoupled_ppo"
        if self.rollout_is == "none" and self.rollout_rs is None and not decoupled and not self.off_policy:
            return mask, None, None, {}
        rollout = micro.need("rollout_logprobs")
        sampled = mask if micro.off_policy_mask is None else mask * (1 - micro.off_policy_mask)  # not expert
        metrics, weights = mismatch_metrics(old, rollout, sampled), None
        if self.rollout_is != "none" or decoupled or self.off_policy:  # pi_old / pi_rollout: the engine sampled
            weights, is_metrics = rollout_importance_weights(old, rollout, sampled, cap=self.rollout_is_cap,
                                                             level=self.rollout_is.replace("none", "token"))
            metrics.update(is_metrics if self.rollout_is != "none" else {})
        if self.rollout_rs is not None:
            keep, rs_metrics = rollout_rejection_mask(old, rollout, sampled, options=self.rollout_rs,
                                                      thresholds=self.rollout_rs_threshold)
            mask = mask * keep
            metrics.update(rs_metrics)
        exact = self.distill is not None and self.distill.full and self.rollout_is != "sequence"
        return mask, None if self.rollout_is == "none" else weights, None if exact else weights, metrics

    def _backward(self, micro: Batch, norm: dict, rl_coef: float = 1.0, sft_coef: float = 1.0,
                  has: tuple[bool, bool] = (True, True)) -> dict[str, float | torch.Tensor]:
        """One micro-batch's loss, backward; its metrics (`has`: whether it holds any token of the RL term, of
        the SFT term)."""
        full = self.use_kl_loss and self.kl_loss_type == "full"
        distill_full = self.distill is not None and self.distill.full
        others = ([self.reference.hidden(micro)] if full else []) + ([self.distill.teachers.hidden(micro)]
                                                                     if distill_full else [])
        logprobs, entropy, *full_kl = token_logprobs(
            self.model, micro, temperature=self.temperature, with_entropy=True, entropy_grad=self.entropy_coeff != 0,
            chunk_size=self.logprob_chunk_size, ref_hidden=others, **self.micro_batching.layout)
        mask, sft_mask = self._masks(micro)
        old = micro.old_logprobs if micro.old_logprobs is not None else logprobs.detach()
        mask, weights, distill_weights, corr_metrics = self._rollout_correction(micro, mask, old)
        inputs = LossInputs(
            logprobs=logprobs, mask=mask, advantages=micro.advantages, old_logprobs=old,
            ref_logprobs=micro.ref_logprobs, rollout_logprobs=micro.rollout_logprobs, entropy=entropy,
            off_policy=micro.off_policy_mask, scores=micro.scores)
        per_token, metrics = self.algorithm.policy_loss(inputs)
        if weights is not None:
            per_token = per_token * weights
        metrics.update(corr_metrics)
        agg = dict(mode=self.loss_agg_mode, max_len=self.max_response_length, num_tokens=norm["num_tokens"],
                   num_seqs=norm["num_seqs"])
        pg_loss = aggregate(per_token, mask, **agg)
        loss = rl_coef * pg_loss
        out = {f"actor/{k}": v for k, v in metrics.items()}
        if sft_mask is not None:  # the hybrid's SFT term on expert tokens: -w_t log p_t over its own tokens
            weights = sft_token_weights(self.expert.loss_mode, logprobs, entropy, micro.loss_mask,
                                        enable_phi_function=self.expert.enable_phi_function)
            sft_loss = aggregate(-weights * logprobs, sft_mask, "token-mean" if self.expert.token_level_sft
                                 else "seq-mean-token-mean", max_len=self.max_response_length,
                                 num_tokens=norm["sft_tokens"], num_seqs=norm["sft_seqs"])
            loss = loss + sft_coef * sft_loss
            if has[1]:  # averaged over the micro-batches that hold expert tokens
                out["actor/sft_nll"] = masked_mean(-logprobs.detach(), sft_mask)
                out["actor/sft_weight"] = masked_mean(weights, sft_mask)
        if self.use_kl_loss:
            kl = full_kl[0] if full else kl_penalty(logprobs, micro.need("ref_logprobs"), self.kl_loss_type)
            kl_loss = aggregate(kl, mask, **agg)
            loss = loss + self.kl_loss_coef * kl_loss
            out["actor/kl_loss"] = masked_mean(kl.detach(), mask)
        if self.distill is not None:  # on-policy distillation: the teacher's per-token term
            pool = {"logprobs": logprobs, "old_logprobs": old, "teacher_logprobs": micro.teacher_logprobs,
                    "full_kl": full_kl[-1] if distill_full else None}
            w = 1.0 if distill_weights is None else distill_weights  # rollout correction, as the RL term's
            distill_loss = aggregate(call_with_params(self.distill.fn, (), pool, self.distill.key) * w, mask, **agg)
            loss = loss + self.distill.coef * distill_loss
            kl = full_kl[-1] if distill_full else old - micro.need("teacher_logprobs")  # exact, or k1's estimate
            out.update({"actor/distill_loss": distill_loss.detach(),
                        "distill/reverse_kl": masked_mean(kl.detach(), mask)})
        if self.entropy_coeff != 0:
            loss = loss - self.entropy_coeff * aggregate(entropy, mask, **agg)
        self.engine.backward(loss)
        if not has[0]:  # a micro-batch of demonstrations only (HPT): no RL token to average over
            return {k: v for k, v in out.items() if k in ("actor/sft_nll", "actor/sft_weight")}
        out["actor/pg_loss"] = pg_loss.detach()
        out["actor/entropy"] = masked_mean(entropy.detach(), mask)
        return out
