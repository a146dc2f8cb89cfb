"""The Critic role (PPO with `algorithm.adv_estimator=gae`): values for GAE, and its own update.

Stage 3 reads `batch.values = critic.compute_values(batch)`; stage 4 also runs `critic.update(batch)`, which
regresses V onto the GAE returns (advantages before whitening + old values) with PPO's clipped value loss.
For `trainer.critic_warmup` steps only the critic learns, so the actor starts from a useful baseline.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from rllava.algorithms.advantage import gae_returns
from rllava.algorithms.kl import outcome_token_rewards
from rllava.algorithms.losses import aggregate, masked_mean, value_loss
from rllava.data.protocol import Batch
from rllava.roles.actor import chunks


class Critic:
    def __init__(self, model, engine, *, ppo_epochs: int, mini_batch_size: int, micro_batch_size: int,
                 values_micro_batch_size: int, cliprange_value: float, loss_avg_mode: str, gamma: float, lam: float):
        self.model, self.engine = model, engine
        self.ppo_epochs, self.mini_batch_size, self.micro_batch_size = ppo_epochs, mini_batch_size, micro_batch_size
        self.values_micro_batch_size = values_micro_batch_size
        self.cliprange_value, self.gamma, self.lam = cliprange_value, gamma, lam
        self.agg_mode = {"token": "token-mean", "seq": "seq-mean-token-mean"}[loss_avg_mode]

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> torch.Tensor:
        """V(s_t) [B, T] under the current critic (the "old" values of this step)."""
        self.model.eval()
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        for idx in chunks(len(batch), self.values_micro_batch_size):
            v = self.model(batch.select(idx).to(self.engine.device)).cpu()
            out[idx, :v.shape[1]] = v
        return out

    def update(self, batch: Batch) -> dict[str, float]:
        """Fit V to the returns of this batch; returns averaged `critic/*` metrics."""
        old_values = batch.need("values")
        token_rewards = batch.token_rewards
        if token_rewards is None:
            token_rewards = outcome_token_rewards(batch.need("scores"), batch.loss_mask)
        _, returns = gae_returns(token_rewards, old_values, batch.loss_mask, gamma=self.gamma, lam=self.lam)
        self.model.train()
        sums, counts = defaultdict(float), defaultdict(int)
        for _ in range(self.ppo_epochs):
            for mini in chunks(len(batch), self.mini_batch_size):
                mask = batch.loss_mask[mini]
                norm = {"num_tokens": mask.sum().clamp(min=1), "num_seqs": (mask.sum(-1) > 0).sum().clamp(min=1)}
                for idx in chunks(len(mini), self.micro_batch_size):
                    rows = [mini[i] for i in idx]
                    micro = batch.select(rows).to(self.engine.device)
                    T = micro.input_ids.shape[1]
                    vpred = self.model(micro)
                    per_token, clipfrac = value_loss(vpred, old_values[rows, :T].to(vpred.device),
                                                     returns[rows, :T].to(vpred.device), micro.loss_mask,
                                                     cliprange=self.cliprange_value)
                    loss = aggregate(per_token, micro.loss_mask, self.agg_mode, max_len=T, **norm)
                    self.engine.backward(loss)
                    for k, v in {"critic/vf_loss": loss.item(), "critic/vf_clipfrac": clipfrac,
                                 "critic/vpred_mean": masked_mean(vpred.detach(), micro.loss_mask).item()}.items():
                        sums[k] += v
                        counts[k] += 1
                sums["critic/grad_norm"] += self.engine.optimizer_step()
                counts["critic/grad_norm"] += 1
        metrics = {k: sums[k] / counts[k] for k in sums}
        metrics["critic/returns_mean"] = masked_mean(returns, batch.loss_mask).item()
        return metrics
