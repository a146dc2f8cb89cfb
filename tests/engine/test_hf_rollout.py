"""The HF rollout engine's sampling log-probs: taken as each token is drawn (no [steps, rows, vocabulary] score
tensor kept: 80 GB for 256 rows x 512 tokens x 152k), under the rollout keys' sampling alone."""

import torch

from rllava.engine.inference.base import SamplingParams
from rllava.engine.inference.hf import HFRolloutEngine
from rllava.model.forward import token_logprobs
from rllava.model.loader import load_model
from rllava.model.processor import get_tokenizer, load_processor
from rllava.roles.rollout import Rollout
from rllava.data.protocol import Sample, collate
from PIL import Image


def _roll_out(model, processor, sampling):
    tok = get_tokenizer(processor)
    engine = HFRolloutEngine(pad_token_id=tok.pad_token_id, stop_token_ids=[tok.eos_token_id], banned_token_ids=[],
                             micro_batch_size=8, device=torch.device("cpu"))
    samples = [Sample(index=i, messages=[{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "How many" + " red" * i + "?"}]}],
        images=[Image.new("RGB", (112, 112), (40 * i, 90, 200))], ground_truth=None) for i in range(3)]
    engine.load(model)
    trajectories = Rollout(engine, processor).generate(samples, sampling)
    engine.offload()
    return collate(trajectories, tok.pad_token_id)


def test_log_probs_are_the_temperature_scaled_forwards_whatever_the_checkpoints_generation_config(tiny_model_dir):
    """A checkpoint's generation_config.json (Qwen-VL's ship repetition_penalty, top_k) must not reach the
    rollout: the sampled tokens' log-probs are log softmax(logits / T) of the training forward at the rollout's
    temperature (before: top_k=1 leaked in, every log-prob 0, and the penalty changed the draws)."""
    model, processor = load_model(tiny_model_dir, dtype=torch.float32), load_processor(tiny_model_dir)
    model.generation_config.top_k, model.generation_config.repetition_penalty = 1, 50.0
    torch.manual_seed(0)
    batch = _roll_out(model, processor, SamplingParams(n=2, temperature=0.7, max_new_tokens=6))
    model.eval()
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch, temperature=0.7)
    mask = batch.loss_mask
    assert (batch.rollout_logprobs * mask).abs().sum() > 0.1  # a real distribution, not top-1
    torch.testing.assert_close(lp * mask, batch.rollout_logprobs * mask, atol=2e-4, rtol=1e-4)


def test_top_k_and_top_p_are_applied_before_the_log_prob(tiny_model_dir):
    """top_k=1 leaves one token (log-prob 0, the greedy token); top_p keeps log-probs >= the untruncated ones
    (the nucleus renormalised: log p / Z with Z <= 1), HF's own warpers in generate's order."""
    model, processor = load_model(tiny_model_dir, dtype=torch.float32), load_processor(tiny_model_dir)
    greedy = _roll_out(model, processor, SamplingParams(n=1, temperature=0.0, max_new_tokens=5))
    top1 = _roll_out(model, processor, SamplingParams(n=1, temperature=1.0, top_k=1, max_new_tokens=5))
    assert torch.equal(top1.input_ids, greedy.input_ids)
    assert torch.equal(top1.rollout_logprobs * top1.loss_mask, torch.zeros_like(top1.rollout_logprobs))
    torch.manual_seed(1)
    nucleus = _roll_out(model, processor, SamplingParams(n=2, temperature=1.0, top_p=0.5, max_new_tokens=5))
    model.eval()
    with torch.no_grad():
        full, _ = token_logprobs(model, nucleus)
    mask = nucleus.loss_mask.bool()
    assert (nucleus.rollout_logprobs[mask] >= full[mask] - 1e-4).all()
    assert (nucleus.rollout_logprobs[mask] > full[mask] + 1e-3).any()
