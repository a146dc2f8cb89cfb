"""The Actor (the policy being trained; the Reference it is held near: `rllava.roles.reference`). `Actor.update` is
stage 4: ppo_epochs x mini-batches (one optimizer step each) x micro-batches (gradient accumulation). Aggregation
normalisers are the mini-batch's token/sequence counts, so splitting it into micro-batches, by a fixed row count or
by a token budget (`MicroBatching`), never changes the gradient.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from rllava.algorithms.hybrid import EXPERT_IN_RL, EXPERT_IN_SFT, sft_token_weights
from rllava.algorithms.correction import mismatch_metrics, rollout_importance_weights, rollout_rejection_mask
from rllava.algorithms.losses import LossInputs, aggregate, kl_penalty, masked_mean
from rllava.data.protocol import Batch
from rllava.model import ulysses
from rllava.model.forward import LOGPROB_CHUNK, token_logprobs
from rllava.roles.batching import (MeanMetrics, MicroBatching, compute_logprobs, logged_scale, mini_batch_count,
                                   mini_batches)
from rllava.roles.teacher import Teachers


@dataclass(frozen=True)
class ExpertLoss:
    """How a hybrid trains the expert tokens (`rllava.algorithms.hybrid`): `loss_mode` decides RL (shaped, in the
    policy loss) and/or an SFT term; `enable_phi_function` weights CHORD's SFT tokens by phi(p); `token_level_sft`
    normalises the SFT term over its tokens (else per sequence, then over sequences)."""

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

    def needs(self, name: str) -> bool:
        """Does the loss read `name` (teacher_logprobs: a teacher pass first; full_kl: the teacher in the update)?"""
        return name in self.fn.reads

    @property
    def full(self) -> bool:
        return self.needs("full_kl")


@dataclass(frozen=True)
class Term:
    """One term of the update's loss: `fn(inputs, norm)` -> (its aggregated loss, its metrics), or None where a
    micro-batch has none of its tokens; the loss adds coef x value x the hybrid schedule's coefficient `scale`
    ("rl" / "sft"). Its metrics average over the micro-batches holding tokens of kind `on` ("rl" / "sft")."""

    name: str
    fn: Callable[[LossInputs, dict], tuple[torch.Tensor, dict] | None]
    coef: float = 1.0
    scale: str | None = None
    on: str = "rl"


class Actor:
    def __init__(self, model, engine, algorithm, *, ppo_epochs: int, mini_batch_size: int, micro_batch_size: int,
                 log_prob_micro_batch_size: int, loss_agg_mode: str, max_response_length: int, group_size: int = 1,
                 temperature: float, use_kl_loss: bool, kl_loss_coef: float, kl_loss_type: str,
                 entropy_coeff: float, rollout_is: str = "none", rollout_is_cap: float = 2.0,
                 rollout_rs: str | None = None, rollout_rs_threshold: str | None = None, off_policy: bool = False,
                 padding_free: bool = False, shared_prefix: bool = False, max_token_len: int | None = None,
                 log_prob_max_token_len: int | None = None, logprob_chunk_size: int = LOGPROB_CHUNK,
                 expert: ExpertLoss | None = None, loss_terms: dict[str, tuple[Callable, float]] | None = None,
                 scorers: list | None = None):
        """`max_token_len` / `log_prob_max_token_len`: the update's / the no-grad pass's micro-batches by that token
        budget, not rows. `scorers`: the run's passes before the update (rllava.train.scorers); the Actor reads two.
        `mini_batch_size` rows of `group_size` rows per prompt (rollout.n): each mini-batch holds that many prompts'
        whole groups (`rllava.roles.batching.group_minis`)."""
        self.model, self.engine, self.algorithm = model, engine, algorithm
        self.ppo_epochs, self.mini_batch_size, self.group_size = ppo_epochs, mini_batch_size, group_size
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
        self.loss_terms = loss_terms or {}  # actor.loss_terms: name -> (registered fn, coef)
        self.scorers = list(scorers or [])
        roles = {s.fills: s.role for s in self.scorers}
        # kl_loss_type=full runs the Reference on every micro-batch (no grad): it needs its whole distribution
        self.reference = roles.get("ref_logprobs")
        self.distill: Distillation | None = roles.get("teacher_logprobs")  # on-policy distillation's term
        self._terms: list[Term] | None = None

    @property
    def terms(self) -> list[Term]:
        """The loss's terms in summation order, each when configured: the policy loss, a hybrid's SFT term, the KL to
        the reference, on-policy distillation, the registered terms of actor.loss_terms, the entropy bonus."""
        if self._terms is None:
            agg = dict(mode=self.loss_agg_mode, max_len=self.max_response_length)
            terms = [Term("policy", partial(policy_term, self.algorithm, agg=agg), scale="rl")]
            if self.expert is not None:
                terms.append(Term("sft", partial(sft_term, self.expert, agg=agg), scale="sft", on="sft"))
            if self.use_kl_loss:
                terms.append(Term("kl", partial(kl_term, self.kl_loss_type, agg=agg), coef=self.kl_loss_coef))
            if self.distill is not None:
                terms.append(Term("distill", partial(distill_term, self.distill, agg=agg), coef=self.distill.coef))
            for name, (fn, coef) in self.loss_terms.items():
                terms.append(Term(name, partial(registered_term, name, fn, agg=agg), coef=coef))
            if self.entropy_coeff != 0:
                terms.append(Term("entropy", partial(entropy_term, agg=agg), coef=-self.entropy_coeff))
            self._terms = terms
        return self._terms

    def needs_old_logprobs(self, batch: Batch) -> bool:
        """With one epoch over one mini-batch, the policy that sampled is the one being updated, so pi_old is
        the current forward's detached log-probs and the separate old-log-prob pass can be skipped."""
        return self.ppo_epochs > 1 or mini_batch_count(batch, self.mini_batch_size, self.group_size) > 1

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        return compute_logprobs(self.model, batch, self.log_prob_batching, self.temperature,
                                chunk_size=self.logprob_chunk_size)

    def update(self, batch: Batch, *, rl_coef: float = 1.0, sft_coef: float = 1.0) -> dict[str, float]:
        """Stage 4: optimise the loss's terms over the batch; returns averaged metrics. A hybrid's batch (expert
        tokens in `off_policy_mask`) optimises rl_coef L_RL + sft_coef L_SFT, each normalised over its own tokens."""
        self.model.train()
        batch, own, shares = ulysses.union(batch)  # sequence parallelism: the group's rows, each rank a part of each
        metrics, masks = MeanMetrics(), self._masks(batch)
        full = self.distill is not None and self.distill.full  # the teachers run inside the update
        with self.engine.update_phase(), self.distill.teachers.resident() if full else nullcontext():
            for mini, norm in mini_batches(batch, self.ppo_epochs, self.mini_batch_size, *masks, parts=shares,
                                           group_size=self.group_size):
                micros, split = self._micro_batches(batch, mini), partial(self._micro_batches, batch)
                norm = {**norm, "logged": logged_scale(len(micros), split, mini, range(len(batch))[own])}
                for rows in micros:
                    micro = batch.select(rows)
                    rl, sft = self._masks(micro)  # which terms have tokens, read on the host: no wait on the device
                    has = (bool(rl.any()), sft is not None and bool(sft.any()))
                    metrics.add(self._backward(micro.to(self.engine.device), norm, rl_coef, sft_coef, has))
                metrics.add({"actor/grad_norm": self.engine.optimizer_step()})
        return metrics.means()

    def _micro_batches(self, batch: Batch, rows: list[int]) -> list[list[int]]:
        """`rows` in micro-batches (the exact KL to the teachers runs one teacher's forward in each: by teacher)."""
        full = self.distill is not None and self.distill.full
        parts = list(self.distill.teachers.route(batch, rows).values()) if full else [rows]
        return [r for part in parts for r in self.micro_batching.split(batch, part)]

    def _masks(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(tokens of the RL term, tokens of a hybrid's SFT term or None), each [B, T]. A hybrid's rows without
        expert tokens have an empty SFT mask, not None: every rank counts the same normalisers (`mini_batches`)."""
        if self.expert is None:
            return batch.loss_mask, None
        off = batch.off_policy_mask if batch.off_policy_mask is not None else torch.zeros_like(batch.loss_mask)
        return self.expert.masks(batch.loss_mask, off)

    def _rollout_correction(self, micro: Batch, mask: torch.Tensor, old: torch.Tensor):
        """(RL-term mask less the rejected tokens, the RL term's IS weights or None, the distillation term's or None,
        metrics): rollout correction (`rllava.algorithms.correction`) of the sampled (not expert) tokens. As verl's
        rollout_corr_helper.py@b178a3c `compute_rollout_correction_and_rejection_mask` L782-808, IS weights are over
        the whole response, then rejection drops tokens / rows from every term's mask (the normalisers still count
        them). Distillation's weights: when the RL term is corrected or samples are stale (token level if
        rollout_is=none; full_kl: sequence level only, see `rllava.algorithms.distill`); `mismatch_*` metrics then."""
        reads = getattr(getattr(self.algorithm, "loss_fn", None), "reads", ())
        decoupled = "rollout_logprobs" in reads  # a loss with its own IS weight (decoupled_ppo: AReaL)
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
        """One micro-batch's loss (the terms' sum), backward; its metrics (`has`: it holds RL-term, SFT-term tokens)."""
        inputs, correction = self._loss_inputs(micro)
        loss, scales, holds = None, {"rl": rl_coef, "sft": sft_coef}, {"rl": has[0], "sft": has[1]}
        out = {f"actor/{k}": v for k, v in correction.items()} if has[0] else {}
        for term in self.terms:
            got = term.fn(inputs, norm)
            if got is None:
                continue
            value, metrics = got
            part = term.coef * scales.get(term.scale, 1.0) * value
            loss = part if loss is None else loss + part
            if holds[term.on]:
                out.update(metrics)
        self.engine.backward(loss)
        return out

    def _loss_inputs(self, micro: Batch) -> tuple[LossInputs, dict]:
        """A micro-batch as the terms read it (the forward, with their exact KLs); the rollout correction's metrics."""
        exact = [name for name, on in (("reference", self.use_kl_loss and self.kl_loss_type == "full"),
                                       ("teacher", self.distill is not None and self.distill.full)) if on]
        hidden = {"reference": lambda: self.reference.hidden(micro),
                  "teacher": lambda: self.distill.teachers.hidden(micro)}
        logprobs, entropy, *full_kl = token_logprobs(
            self.model, micro, temperature=self.temperature, with_entropy=True, entropy_grad=self.entropy_coeff != 0,
            chunk_size=self.logprob_chunk_size, ref_hidden=[hidden[name]() for name in exact],
            **self.micro_batching.layout)
        mask, sft_mask = self._masks(micro)
        old = micro.old_logprobs if micro.old_logprobs is not None else logprobs.detach()
        mask, weights, distill_weights, corr_metrics = self._rollout_correction(micro, mask, old)
        inputs = LossInputs(
            logprobs=logprobs, mask=mask, advantages=micro.advantages, old_logprobs=old,
            ref_logprobs=micro.ref_logprobs, rollout_logprobs=micro.rollout_logprobs, entropy=entropy,
            off_policy=micro.off_policy_mask, scores=micro.scores, trained_mask=micro.loss_mask, sft_mask=sft_mask,
            teacher_logprobs=micro.teacher_logprobs, full_kl=dict(zip(exact, full_kl)), rl_weights=weights,
            distill_weights=distill_weights)
        return inputs, corr_metrics


# ---- the terms (Actor.terms): each (its aggregated loss, its metrics) from LossInputs --------------------------
def _agg(agg: dict, norm: dict) -> dict:
    return dict(agg, num_tokens=norm["num_tokens"], num_seqs=norm["num_seqs"])


def _logged(loss: torch.Tensor, norm: dict) -> torch.Tensor:
    """A term's loss as logged: x the update's `logged_scale` (rllava.roles.batching)."""
    return loss.detach() * norm.get("logged", 1.0)


def policy_term(algorithm, inp: LossInputs, norm: dict, agg: dict):
    """The configured policy loss (`actor.policy_loss.loss_mode`) on the RL term's tokens, times the rollout
    correction's IS weights; its metrics, the correction's, pg_loss and the entropy."""
    per_token, metrics = algorithm.policy_loss(inp)
    if inp.rl_weights is not None:
        per_token = per_token * inp.rl_weights
    pg_loss = aggregate(per_token, inp.mask, **_agg(agg, norm))
    return pg_loss, {**{f"actor/{k}": v for k, v in metrics.items()}, "actor/pg_loss": _logged(pg_loss, norm),
                     "actor/entropy": masked_mean(inp.entropy.detach(), inp.mask)}


def sft_term(expert: ExpertLoss, inp: LossInputs, norm: dict, agg: dict):
    """A hybrid's SFT term on the expert tokens: -w_t log p_t over its own tokens (`rllava.algorithms.hybrid`)."""
    if inp.sft_mask is None:
        return None
    w = sft_token_weights(expert.loss_mode, inp.logprobs, inp.entropy, inp.trained_mask,
                          enable_phi_function=expert.enable_phi_function)
    loss = aggregate(-w * inp.logprobs, inp.sft_mask, "token-mean" if expert.token_level_sft else "seq-mean-token-mean",
                     max_len=agg["max_len"], num_tokens=norm["sft_tokens"], num_seqs=norm["sft_seqs"])
    return loss, {"actor/sft_nll": masked_mean(-inp.logprobs.detach(), inp.sft_mask),
                  "actor/sft_weight": masked_mean(w, inp.sft_mask)}


def kl_term(kl_type: str, inp: LossInputs, norm: dict, agg: dict):
    """KL(pi || pi_ref) on the RL term's tokens (`actor.kl_loss_type`; full: over the vocabulary)."""
    kl = inp.full_kl["reference"] if kl_type == "full" else kl_penalty(
        inp.logprobs, inp.need("ref_logprobs", f"kl_loss_type={kl_type}"), kl_type)
    return aggregate(kl, inp.mask, **_agg(agg, norm)), {"actor/kl_loss": masked_mean(kl.detach(), inp.mask)}


def distill_term(distill: Distillation, inp: LossInputs, norm: dict, agg: dict):
    """On-policy distillation's per-token loss (`algorithm.distill.loss`) on the RL term's tokens, times its
    rollout-correction weights; the reverse KL to the teacher (exact, or k1's estimate) logged beside it."""
    w = 1.0 if inp.distill_weights is None else inp.distill_weights
    loss = aggregate(distill.fn(inp) * w, inp.mask, **_agg(agg, norm))
    kl = inp.full_kl["teacher"] if distill.full else inp.old_logprobs - inp.need("teacher_logprobs", "distill")
    return loss, {"actor/distill_loss": _logged(loss, norm), "distill/reverse_kl": masked_mean(kl.detach(), inp.mask)}


def entropy_term(inp: LossInputs, norm: dict, agg: dict):
    """The entropy on the RL term's tokens (`actor.entropy_coeff` its bonus: the term's coefficient is minus it)."""
    return aggregate(inp.entropy, inp.mask, **_agg(agg, norm)), {}


def registered_term(name: str, fn: Callable, inp: LossInputs, norm: dict, agg: dict):
    """A term of `actor.loss_terms` (`rllava.algorithms.registry.register_loss_term`) on the RL term's tokens."""
    per_token, metrics = fn(inp)
    loss = aggregate(per_token, inp.mask, **_agg(agg, norm))
    return loss, {f"actor/{name}": _logged(loss, norm), **{f"actor/{name}/{k}": v for k, v in metrics.items()}}
