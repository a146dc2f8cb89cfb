"""The one place that runs a (VL)M forward for training: per-token log-probs and entropy of a Batch.

Only positions whose next token is trained (the loss mask) go through the LM head, so prompt and image tokens
never materialise [T x vocab] logits.
"""

from __future__ import annotations

import torch

from rllava.data.protocol import Batch


def model_inputs(model, batch: Batch) -> dict[str, torch.Tensor]:
    """Forward kwargs for `batch`: ids, mask, pixel tensors, and for Qwen-VL the per-token modality types
    (`mm_token_type_ids`: 0 text, 1 image, 2 video) its M-RoPE position ids are computed from."""
    inputs = batch.model_inputs()
    image_id = getattr(model.config, "image_token_id", None)
    if image_id is not None:
        ids = inputs["input_ids"]
        types = (ids == image_id).int()
        video_id = getattr(model.config, "video_token_id", None)
        if video_id is not None:
            types = types + 2 * (ids == video_id).int()
        inputs["mm_token_type_ids"] = types
    return inputs


def _backbone_and_head(model):
    """(decoder returning hidden states, LM head) of a HF causal LM or VLM."""
    return getattr(model, model.base_model_prefix), model.get_output_embeddings()


def token_logprobs(model, batch: Batch, *, temperature: float = 1.0, with_entropy: bool = False,
                   entropy_grad: bool = False, chunk_size: int = 4096) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(x_t | x_<t) and the policy's entropy at t, for every t with loss_mask[t] = 1.

    Returns logprobs [B, T] (and entropy [B, T] or None), zero at untrained positions. Logits are divided by
    the sampling `temperature`, so the log-probs are those of the distribution the rollout sampled from.
    Without grad, the LM head runs over `chunk_size` tokens at a time. The entropy carries grad only if
    `entropy_grad` (an entropy bonus); otherwise it is a detached metric.
    """
    backbone, head = _backbone_and_head(model)
    hidden = backbone(**model_inputs(model, batch), use_cache=False).last_hidden_state  # [B, T, H]
    target = batch.loss_mask[:, 1:] > 0  # [B, T-1]: token t+1 is trained, predicted from position t
    h = hidden[:, :-1][target]  # [N, H]
    labels = batch.input_ids[:, 1:][target]  # [N]
    step = h.shape[0] if torch.is_grad_enabled() else chunk_size
    lps, ents = [], []
    for s in range(0, h.shape[0], max(step, 1)):
        logits = head(h[s:s + step]).float() / temperature  # [n, V]
        logp = torch.log_softmax(logits, dim=-1)
        lps.append(logp.gather(-1, labels[s:s + step, None]).squeeze(-1))
        if with_entropy:
            p_logp = logp if entropy_grad else logp.detach()
            ents.append(-(p_logp.exp() * p_logp).sum(-1))
    B, T = batch.input_ids.shape
    out = hidden.new_zeros(B, T, dtype=torch.float32)
    out[:, 1:][target] = torch.cat(lps) if lps else out.new_zeros(0)
    entropy = None
    if with_entropy:
        entropy = hidden.new_zeros(B, T, dtype=torch.float32)
        entropy[:, 1:][target] = torch.cat(ents) if ents else entropy.new_zeros(0)
    return out, entropy
