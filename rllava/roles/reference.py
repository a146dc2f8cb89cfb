"""The Reference: the policy the KL terms anchor to (`algorithm.use_kl_loss`, `algorithm.use_kl_in_reward`). Frozen,
except that `algorithm.ref_reset_freq = k` copies the policy into it after every k-th step's update (RLLaVA paper,
Algorithm 1 line 3, "pi_ref <- pi_theta"): the KL then holds the policy near where it was k steps ago, not at the
start. Under LoRA it is the policy with its adapters off (`lora_base`): the base never trains, so no copy (or reset).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from rllava.data.protocol import Batch
from rllava.errors import RllavaError
from rllava.model.forward import LOGPROB_CHUNK, _backbone_and_head, token_logprobs, trained_hidden
from rllava.model.lora import adapters_disabled
from rllava.roles.batching import MicroBatching, compute_logprobs, forward_in_chunks


def _zero3(params: list) -> bool:
    return any(hasattr(p, "ds_id") for p in params)  # DeepSpeed ZeRO-3 partitions parameters in place


def gathered(params: list):
    """DeepSpeed ZeRO-3's parameters whole inside the block (rank 0's changes kept); a no-op for any other."""
    if not _zero3(params):
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=0)


def weight_shapes(model: torch.nn.Module) -> dict[str, tuple]:
    """Parameter name -> full shape (a DTensor's is the whole weight's; ZeRO-3 keeps it as `ds_shape`)."""
    return {n: tuple(getattr(p, "ds_shape", p.shape)) for n, p in model.named_parameters()}


@dataclass
class Reference:
    model: torch.nn.Module
    batching: MicroBatching  # the actor's padding_free / shared_prefix / dynamic_batching, with ref.* sizes
    temperature: float
    lora_base: bool = False
    chunk_size: int = LOGPROB_CHUNK  # actor.logprob_chunk_size
    reset_freq: int = 0  # algorithm.ref_reset_freq: 0 = frozen for the whole run

    def _base(self):
        return adapters_disabled(self.model) if self.lora_base else nullcontext()

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        """log pi_ref(x_t | x_<t) [B, T] at every trained position."""
        with self._base():
            return compute_logprobs(self.model, batch, self.batching, self.temperature, chunk_size=self.chunk_size)

    @torch.no_grad()
    def hidden(self, micro: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(last hidden states [N, H] at the trained positions, LM head weight [V, H]): the reference's part of the
        exact KL (`rllava.model.forward.full_kl_from_hidden`)."""
        was_training = self.model.training
        self.model.eval()
        try:
            with self._base():
                h, _ = trained_hidden(self.model, micro, **self.batching.layout)
        finally:
            self.model.train(was_training)
        head = _backbone_and_head(self.model)[1]
        head = getattr(head, "base_layer", head)  # a LoRA-wrapped head: its base is the reference's
        if type(head) is not torch.nn.Linear or head.bias is not None:
            raise RllavaError(f"the full-vocabulary KL needs a bias-free linear LM head; this model's is "
                              f"{type(head).__name__}: use a sampled KL estimator (e.g. low_var_kl)")
        return h, head.weight

    def full_kl(self, batch: Batch, policy: torch.nn.Module) -> torch.Tensor:
        """KL(pi || pi_ref) over the vocabulary [B, T] at every trained position, no grad (`algorithm.kl_penalty=full`):
        per micro-batch the reference's hidden states, then the policy's forward."""
        return forward_in_chunks(policy, batch, self.batching, lambda micro: token_logprobs(
            policy, micro, temperature=self.temperature, chunk_size=self.chunk_size, ref_hidden=[self.hidden(micro)],
            **self.batching.layout)[2])

    def after_update(self, policy: torch.nn.Module, step: int) -> dict[str, float]:
        """After step `step`'s update: with reset_freq = k, the policy becomes the reference when k divides the step
        (steps k j + 1 .. k (j + 1) use the policy of step k j). Returns `ref/last_reset_step` (0: the start)."""
        if not self.reset_freq:
            return {}
        if step % self.reset_freq == 0:
            self.reset(policy)
        return {"ref/last_reset_step": float(step - step % self.reset_freq)}

    @torch.no_grad()
    def reset(self, policy: torch.nn.Module) -> None:
        """reference <- the policy's current weights, parameter by parameter: plain tensors on one device, each
        rank's own shard under FSDP2 (both models are sharded alike), gathered ones under DeepSpeed ZeRO-3."""
        source = dict(policy.named_parameters())
        for name, q in self.model.named_parameters():
            p = source[name]
            with gathered([p, q]):
                q.copy_(p)

    def state_dict(self) -> dict:
        """The weights resets move, for a checkpoint (engine `ref`): torch's model state dict (sharded under FSDP2),
        full tensors under ZeRO-3."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        params = list(self.model.parameters())
        if not _zero3(params):
            return {"model": get_model_state_dict(self.model)}
        with gathered(params):
            return {"model": {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}}

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        params = list(self.model.parameters())
        if not _zero3(params):
            set_model_state_dict(self.model, state["model"])
            return
        with gathered(params):
            self.model.load_state_dict(state["model"])
