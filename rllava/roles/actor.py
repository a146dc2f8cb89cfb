"""The Actor (the policy being trained) and the frozen Reference.

`Actor.update` is stage 4: ppo_epochs x mini-batches (one optimizer step each) x micro-batches (gradient
accumulation). Aggregation normalisers are the mini-batch's token/sequence counts, so splitting a mini-batch
into micro-batches never changes the gradient.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from rllava.algorithms.losses import LossInputs, aggregate, kl_penalty, masked_mean, rollout_importance_weights
from rllava.data.protocol import Batch
from rllava.model.forward import token_logprobs


def chunks(n: int, size: int) -> list[list[int]]:
    return [list(range(s, min(s + size, n))) for s in range(0, n, size)]


@torch.no_grad()
def forward_in_chunks(model, batch: Batch, micro_batch_size: int, fn) -> torch.Tensor:
    """`fn(micro)` -> [b, t] for each micro-batch, in eval mode and without grad, gathered into [B, T] (zeros past
    each micro-batch's trimmed length). The old-log-prob, reference and critic-value passes all run this way."""
    was_training = model.training
    model.eval()
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    for idx in chunks(len(batch), micro_batch_size):
        v = fn(batch.select(idx).to(_device(model))).cpu()
        out[idx, :v.shape[1]] = v
    model.train(was_training)
    return out


def compute_logprobs(model, batch: Batch, micro_batch_size: int, temperature: float) -> torch.Tensor:
    """log pi(x_t | x_<t) [B, T] at every trained position, without grad (old-policy / reference pass)."""
    return forward_in_chunks(model, batch, micro_batch_size,
                             lambda micro: token_logprobs(model, micro, temperature=temperature)[0])


def mini_batches(batch: Batch, epochs: int, size: int):
    """(row indices, aggregation normalisers) of each mini-batch of each epoch: one optimizer step each. The
    normalisers are the mini-batch's token / sequence counts, so its micro-batches sum to the unsplit loss."""
    for _ in range(epochs):
        for mini in chunks(len(batch), size):
            mask = batch.loss_mask[mini]
            yield mini, {"num_tokens": mask.sum().clamp(min=1), "num_seqs": (mask.sum(-1) > 0).sum().clamp(min=1)}


class MeanMetrics:
    """Averages named scalars over the micro-/mini-batches of one update."""

    def __init__(self):
        self.sums, self.counts = defaultdict(float), defaultdict(int)

    def add(self, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.sums[name] += float(value)
            self.counts[name] += 1

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / self.counts[k] for k in self.sums}


def _device(model) -> torch.device:
    return next(model.parameters()).device


class Actor:
    def __init__(self, model, engine, algorithm, *, ppo_epochs: int, mini_batch_size: int, micro_batch_size: int,
                 log_prob_micro_batch_size: int, loss_agg_mode: str, max_response_length: int,
                 temperature: float, use_kl_loss: bool, kl_loss_coef: float, kl_loss_type: str,
                 entropy_coeff: float, rollout_is: str = "none", rollout_is_cap: float = 2.0):
        self.model, self.engine, self.algorithm = model, engine, algorithm
        self.ppo_epochs, self.mini_batch_size, self.micro_batch_size = ppo_epochs, mini_batch_size, micro_batch_size
        self.log_prob_micro_batch_size = log_prob_micro_batch_size
        self.loss_agg_mode, self.max_response_length = loss_agg_mode, max_response_length
        self.temperature = temperature
        self.use_kl_loss, self.kl_loss_coef, self.kl_loss_type = use_kl_loss, kl_loss_coef, kl_loss_type
        self.entropy_coeff = entropy_coeff
        self.rollout_is, self.rollout_is_cap = rollout_is, rollout_is_cap  # truncated IS: none | token | sequence

    def needs_old_logprobs(self, batch_size: int) -> bool:
        """With one epoch over one mini-batch, the policy that sampled is the one being updated, so pi_old is
        the current forward's detached log-probs and the separate old-log-prob pass can be skipped."""
        return self.ppo_epochs > 1 or batch_size > self.mini_batch_size

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        return compute_logprobs(self.model, batch, self.log_prob_micro_batch_size, self.temperature)

    def update(self, batch: Batch) -> dict[str, float]:
        """Stage 4: optimise the policy loss (+ KL, - entropy) over the batch; returns averaged metrics."""
        self.model.train()
        metrics = MeanMetrics()
        for mini, norm in mini_batches(batch, self.ppo_epochs, self.mini_batch_size):
            for idx in chunks(len(mini), self.micro_batch_size):
                metrics.add(self._backward(batch.select([mini[i] for i in idx]).to(self.engine.device), norm))
            metrics.add({"actor/grad_norm": self.engine.optimizer_step()})
        return metrics.means()

    def _backward(self, micro: Batch, norm: dict) -> dict[str, float]:
        logprobs, entropy = token_logprobs(self.model, micro, temperature=self.temperature, with_entropy=True,
                                           entropy_grad=self.entropy_coeff != 0)
        mask = micro.loss_mask
        inputs = LossInputs(
            logprobs=logprobs, mask=mask, advantages=micro.advantages,
            old_logprobs=micro.old_logprobs if micro.old_logprobs is not None else logprobs.detach(),
            ref_logprobs=micro.ref_logprobs, rollout_logprobs=micro.rollout_logprobs, entropy=entropy)
        per_token, metrics = self.algorithm.policy_loss(inputs)
        if self.rollout_is != "none":  # reweight by pi_old / pi_rollout: the engine sampled, the trainer scores
            weights, is_metrics = rollout_importance_weights(inputs.old_logprobs, micro.need("rollout_logprobs"),
                                                             mask, cap=self.rollout_is_cap, level=self.rollout_is)
            per_token = per_token * weights
            metrics.update(is_metrics)
        agg = dict(mode=self.loss_agg_mode, max_len=self.max_response_length, **norm)
        pg_loss = aggregate(per_token, mask, **agg)
        loss = pg_loss
        out = {f"actor/{k}": v for k, v in metrics.items()}
        if self.use_kl_loss:
            kl = kl_penalty(logprobs, micro.need("ref_logprobs"), self.kl_loss_type)
            kl_loss = aggregate(kl, mask, **agg)
            loss = loss + self.kl_loss_coef * kl_loss
            out["actor/kl_loss"] = masked_mean(kl.detach(), mask).item()
        if self.entropy_coeff != 0:
            loss = loss - self.entropy_coeff * aggregate(entropy, mask, **agg)
        self.engine.backward(loss)
        out["actor/pg_loss"] = pg_loss.item()
        out["actor/entropy"] = masked_mean(entropy.detach(), mask).item()
        return out
