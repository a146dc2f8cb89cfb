"""The Critic role (PPO with `algorithm.adv_estimator=gae`): values for GAE (stage 3, `compute_values`), and its own
update (stage 4), regressing V onto the GAE returns (advantages before whitening + old values) with PPO's clipped
value loss. For `trainer.critic_warmup` steps only the critic learns, so the actor starts from a useful baseline.
"""

from __future__ import annotations

import torch

from rllava.algorithms.advantage import gae_returns
from rllava.algorithms.kl import token_rewards_of
from rllava.algorithms.losses import aggregate, masked_mean, value_loss
from rllava.data.protocol import Batch
from rllava.model import ulysses
from rllava.roles.batching import MeanMetrics, MicroBatching, forward_in_chunks, logged_scale, mini_batches


class Critic:
    def __init__(self, model, engine, *, ppo_epochs: int, mini_batch_size: int, micro_batch_size: int,
                 values_micro_batch_size: int, group_size: int = 1, cliprange_value: float, loss_avg_mode: str,
                 gamma: float, lam: float,
                 padding_free: bool = False, shared_prefix: bool = False, max_token_len: int | None = None,
                 values_max_token_len: int | None = None):
        """Mini- and micro-batching as the Actor's: a token budget set means dynamic batching by it."""
        self.model, self.engine = model, engine
        self.ppo_epochs, self.mini_batch_size, self.group_size = ppo_epochs, mini_batch_size, group_size
        self.micro_batching = MicroBatching(micro_batch_size, max_token_len, padding_free, shared_prefix)
        self.values_batching = MicroBatching(values_micro_batch_size, values_max_token_len, padding_free, shared_prefix)
        self.cliprange_value, self.gamma, self.lam = cliprange_value, gamma, lam
        self.agg_mode = {"token": "token-mean", "seq": "seq-mean-token-mean"}[loss_avg_mode]

    def compute_values(self, batch: Batch) -> torch.Tensor:
        """V(s_t) [B, T] under the current critic (the "old" values of this step)."""
        return forward_in_chunks(self.model, batch, self.values_batching,
                                 lambda micro: self.model(micro, **self.values_batching.layout))

    def update(self, batch: Batch) -> dict[str, float]:
        """Fit V to the returns of this batch; returns averaged `critic/*` metrics."""
        batch, own, parts = ulysses.union(batch)  # sequence parallelism: the group's rows (Actor.update)
        old_values = batch.need("values")
        _, returns = gae_returns(token_rewards_of(batch), old_values, batch.loss_mask, gamma=self.gamma, lam=self.lam)
        self.model.train()
        metrics = MeanMetrics()
        with self.engine.update_phase():  # Adam's state on the device only in here (offload_optimizer)
            for mini, norm in mini_batches(batch, self.ppo_epochs, self.mini_batch_size, parts=parts,
                                           group_size=self.group_size):
                micros = self.micro_batching.split(batch, mini)
                scale = logged_scale(len(micros), lambda rows: self.micro_batching.split(batch, rows), mini,
                                     range(len(batch))[own])
                for rows in micros:
                    micro = batch.select(rows).to(self.engine.device)
                    T = micro.input_ids.shape[1]
                    vpred = self.model(micro, **self.micro_batching.layout)
                    per_token, clipfrac = value_loss(vpred, old_values[rows, :T].to(vpred.device),
                                                     returns[rows, :T].to(vpred.device), micro.loss_mask,
                                                     cliprange=self.cliprange_value)
                    loss = aggregate(per_token, micro.loss_mask, self.agg_mode, max_len=T, **norm)
                    self.engine.backward(loss)
                    metrics.add({"critic/vf_loss": loss.detach() * scale, "critic/vf_clipfrac": clipfrac,
                                 "critic/vpred_mean": masked_mean(vpred.detach(), micro.loss_mask)})
                metrics.add({"critic/grad_norm": self.engine.optimizer_step()})
        return {**metrics.means(), "critic/returns_mean": masked_mean(returns, batch.loss_mask).item()}
