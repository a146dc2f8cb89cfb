"""The Actor (the policy being trained) and the frozen Reference.

`Actor.update` is stage 4: ppo_epochs x mini-batches (one optimizer step each) x micro-batches (gradient
accumulation). Aggregation normalisers are the mini-batch's token/sequence counts, so splitting a mini-batch
into micro-batches, by a fixed row count or by a token budget (`MicroBatching`), never changes the gradient.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from rllava import distributed as D
from rllava.algorithms.losses import LossInputs, aggregate, kl_penalty, masked_mean, rollout_importance_weights
from rllava.data.protocol import Batch
from rllava.model.forward import LOGPROB_CHUNK, token_logprobs


def chunks(n: int, size: int) -> list[list[int]]:
    return [list(range(s, min(s + size, n))) for s in range(0, n, size)]


def token_budget_groups(lengths: list[int], max_tokens: int, *, packed: bool) -> list[list[int]]:
    """Indices of `lengths` grouped so that each group's token count stays within `max_tokens`.

    A group's count is what its forward computes over: the sum of its lengths when `packed` (padding-free),
    else rows x its longest row (`Batch.select` pads to that). Rows are taken longest first and added to
    the current group until the next one would overflow it: sorting puts rows of similar length together,
    which wastes less padding and, packed or not, leaves fewer partly empty groups than row order. A row
    longer than the budget alone gets a group of its own. Each group lists its indices in ascending order.
    """
    groups: list[list[int]] = []
    group: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):  # stable: equal lengths keep row order
        rows = group + [i]
        tokens = sum(lengths[j] for j in rows) if packed else len(rows) * max(lengths[j] for j in rows)
        if group and tokens > max_tokens:
            groups.append(sorted(group))
            rows = [i]
        group = rows
    return groups + [sorted(group)] if group else groups


@dataclass(frozen=True)
class MicroBatching:
    """How a batch's rows are split into micro-batches (one forward each, and in an update one backward).

    Fixed: `size` rows each, in row order. Dynamic (`max_tokens` set; RLLaVA's `dynamic_batching`): as many
    rows as fit the token budget (`token_budget_groups`), so short responses make few large micro-batches
    and long ones many small ones; `size` is then not read. `padding_free` micro-batches run packed
    (`rllava.model.forward.packed_inputs`), which also changes what a micro-batch's tokens count.
    """

    size: int
    max_tokens: int | None = None
    padding_free: bool = False

    def split(self, batch: Batch, rows: list[int]) -> list[list[int]]:
        """`rows` (indices into `batch`) as a list of micro-batches of row indices."""
        if self.max_tokens is None:
            return [[rows[i] for i in idx] for idx in chunks(len(rows), self.size)]
        lengths = batch.attention_mask[rows].sum(-1).tolist()
        groups = [[rows[i] for i in idx] for idx in token_budget_groups(lengths, self.max_tokens,
                                                                        packed=self.padding_free)]
        return equal_count(groups, D.all_max(len(groups)))


def equal_count(groups: list[list[int]], n: int) -> list[list[int]]:
    """`groups` split until there are `n` (the largest count over ranks): under FSDP every rank must run the
    same number of forwards, each one a collective. The biggest group is halved first (every rank holds the
    same number of rows, so `n` never exceeds this rank's rows)."""
    groups = [list(g) for g in groups]
    while len(groups) < n:
        big = max(range(len(groups)), key=lambda i: len(groups[i]))
        g = groups.pop(big)
        groups[big:big] = [g[:len(g) // 2], g[len(g) // 2:]]
    return groups


@torch.no_grad()
def forward_in_chunks(model, batch: Batch, batching: MicroBatching, fn) -> torch.Tensor:
    """`fn(micro)` -> [b, t] for each micro-batch, in eval mode and without grad, gathered into [B, T] (zeros past
    each micro-batch's trimmed length). The old-log-prob, reference and critic-value passes all run this way."""
    was_training = model.training
    model.eval()
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    for idx in batching.split(batch, list(range(len(batch)))):
        v = fn(batch.select(idx).to(_device(model))).cpu()
        out[idx, :v.shape[1]] = v
    model.train(was_training)
    return out


def compute_logprobs(model, batch: Batch, batching: MicroBatching, temperature: float, *,
                     chunk_size: int = LOGPROB_CHUNK) -> torch.Tensor:
    """log pi(x_t | x_<t) [B, T] at every trained position, without grad (old-policy / reference pass)."""
    return forward_in_chunks(model, batch, batching, lambda micro: token_logprobs(
        model, micro, temperature=temperature, chunk_size=chunk_size, padding_free=batching.padding_free)[0])


def mini_batches(batch: Batch, epochs: int, size: int):
    """(row indices, aggregation normalisers) of each mini-batch of each epoch: one optimizer step each. The
    normalisers are the mini-batch's token / sequence counts, so its micro-batches sum to the unsplit loss.

    With N ranks (`size` and `batch` are then this rank's share) the gradients are averaged over ranks, so
    each rank divides by 1/N of the *global* counts: the average of the ranks' losses is then the loss of
    the global mini-batch, however its tokens are spread over the ranks."""
    for _ in range(epochs):
        for mini in chunks(len(batch), size):
            mask = batch.loss_mask[mini]
            tokens, seqs = D.all_sum([float(mask.sum()), float((mask.sum(-1) > 0).sum())])
            yield mini, {"num_tokens": torch.tensor(max(tokens, 1.0) / D.world_size()),
                         "num_seqs": torch.tensor(max(seqs, 1.0) / D.world_size())}


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
                 entropy_coeff: float, rollout_is: str = "none", rollout_is_cap: float = 2.0,
                 padding_free: bool = False, max_token_len: int | None = None,
                 log_prob_max_token_len: int | None = None, logprob_chunk_size: int = LOGPROB_CHUNK):
        """`max_token_len` / `log_prob_max_token_len` set: dynamic batching of the update / the no-grad pass
        by that token budget instead of `micro_batch_size` / `log_prob_micro_batch_size` rows."""
        self.model, self.engine, self.algorithm = model, engine, algorithm
        self.ppo_epochs, self.mini_batch_size = ppo_epochs, mini_batch_size
        self.micro_batching = MicroBatching(micro_batch_size, max_token_len, padding_free)
        self.log_prob_batching = MicroBatching(log_prob_micro_batch_size, log_prob_max_token_len, padding_free)
        self.logprob_chunk_size = logprob_chunk_size  # trained tokens per LM-head chunk (<= 0: all at once)
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
        return compute_logprobs(self.model, batch, self.log_prob_batching, self.temperature,
                                chunk_size=self.logprob_chunk_size)

    def update(self, batch: Batch) -> dict[str, float]:
        """Stage 4: optimise the policy loss (+ KL, - entropy) over the batch; returns averaged metrics."""
        self.model.train()
        metrics = MeanMetrics()
        for mini, norm in mini_batches(batch, self.ppo_epochs, self.mini_batch_size):
            for rows in self.micro_batching.split(batch, mini):
                metrics.add(self._backward(batch.select(rows).to(self.engine.device), norm))
            metrics.add({"actor/grad_norm": self.engine.optimizer_step()})
        return metrics.means()

    def _backward(self, micro: Batch, norm: dict) -> dict[str, float]:
        logprobs, entropy = token_logprobs(self.model, micro, temperature=self.temperature, with_entropy=True,
                                           entropy_grad=self.entropy_coeff != 0, chunk_size=self.logprob_chunk_size,
                                           padding_free=self.micro_batching.padding_free)
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
