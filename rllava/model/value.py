"""The critic's model: a policy-shaped (VL)M backbone with a scalar value head instead of the LM head.

    V(s_t) = w^T h_{t-1} + b        h_{t-1}: the backbone's last hidden state after reading tokens < t

so `values[:, t]` is the value of the state in which response token t is generated, aligned with the
log-probs of `rllava.model.forward.token_logprobs` (both are read at the loss-mask positions).
"""

from __future__ import annotations

import torch
from torch import nn

from rllava.data.protocol import Batch
from rllava.model.forward import _scatter, trained_hidden


class ValueModel(nn.Module):
    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm  # a HF causal LM / VLM; only its backbone runs
        self.value_head = nn.Linear(lm.config.get_text_config().hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)  # start from V = 0 everywhere: no spurious advantages on step 1
        nn.init.zeros_(self.value_head.bias)

    def forward(self, batch: Batch, padding_free: bool = False, shared_prefix: bool = False) -> torch.Tensor:
        """Values [B, T], zero where loss_mask is 0; `padding_free` / `shared_prefix` lay the rows out as the
        policy's forward does."""
        h, target = trained_hidden(self.lm, batch, padding_free=padding_free,  # [N, H] at t-1 for trained t
                                   shared_prefix=shared_prefix)
        return _scatter(self.value_head(h).squeeze(-1).float(), target)
