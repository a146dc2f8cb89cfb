"""rollout.hf_decode=static: the HF engine decodes from a StaticCache filled by copying each prompt's one
prefill n times. Same tokens and log-probs as the eager (DynamicCache) path, and the training forward's
log-probs, on left-padded prompts of different lengths, with and without images, greedy and sampled (n > 1).
No torch.compile here (decode=compiled is CUDA only): the compiled graph is the GPU's check."""

import pytest
import torch
from PIL import Image
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM, StaticCache

from rllava.config import ConfigError, load_config
from rllava.data.protocol import Sample, collate
from rllava.engine.inference.base import GenerationRequest, SamplingParams, build_rollout_engine
from rllava.engine.inference.hf import HFRolloutEngine, static_cache_ok
from rllava.model.forward import token_logprobs
from rllava.model.loader import load_model
from rllava.model.modular import CACHE_KWARG
from rllava.model.processor import get_tokenizer, load_processor
from rllava.model.tiny import build_tiny
from rllava.roles.rollout import Rollout

ARCHS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen2", "tinyllava"]


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_model_dir):
    out = tmp_path_factory.mktemp("static_archs")
    return {arch: tiny_model_dir if arch == "qwen2_vl" else build_tiny(arch, str(out / arch), size="small")
            for arch in ARCHS}


def _samples(vision: bool) -> list[Sample]:
    """Three prompts of different lengths (left padding), the middle one without an image."""
    out = []
    for i in range(3):
        text = {"type": "text", "text": "How many" + " red" * (3 * i) + "?"}
        images = [Image.new("RGB", (56 + 28 * i, 56), (40 * i, 90, 200))] if vision and i != 1 else []
        content = [{"type": "image"}] * len(images) + [text] if vision else text["text"]
        out.append(Sample(index=i, messages=[{"role": "user", "content": content}], images=images, ground_truth=None))
    return out


def _roll_out(model, processor, decode, sampling, micro_batch_size=8):
    """The collated batch of a rollout, and the caches `generate` was handed."""
    tok = get_tokenizer(processor)
    engine = HFRolloutEngine(pad_token_id=tok.pad_token_id, stop_token_ids=[tok.eos_token_id], banned_token_ids=[],
                             micro_batch_size=micro_batch_size, device=torch.device("cpu"), decode=decode)
    caches, generate = [], model.generate
    model.generate = lambda **kw: caches.append(kw.get(CACHE_KWARG)) or generate(**kw)
    engine.load(model)
    torch.manual_seed(0)
    try:
        batch = collate(Rollout(engine, processor).generate(_samples(hasattr(processor, "image_processor")),
                                                            sampling), tok.pad_token_id)
    finally:
        engine.offload()
        del model.generate
    return batch, caches


def _assert_forward_logprobs(model, batch):
    """The rollout's log-probs are the training forward's on every response token: a wrong copy of the cache
    (rows in the wrong order, a shifted column) moves them."""
    model.eval()
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch)
    assert batch.loss_mask.sum() > 0
    torch.testing.assert_close(lp * batch.loss_mask, batch.rollout_logprobs * batch.loss_mask, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_static_decode_is_the_eager_decode(models, arch):
    """Greedy and sampled (n=3, one seed: the sampler draws the same numbers from the same scores) rollouts
    through the static cache give the eager path's tokens and log-probs, which are the training forward's."""
    model, processor = load_model(models[arch], dtype=torch.float32), load_processor(models[arch])
    assert static_cache_ok(model)
    for sampling in (SamplingParams(n=1, temperature=0.0, max_new_tokens=6),
                     SamplingParams(n=3, temperature=1.0, max_new_tokens=6)):
        eager, eager_caches = _roll_out(model, processor, "eager", sampling)
        static, static_caches = _roll_out(model, processor, "static", sampling)
        assert [type(c) for c in static_caches] == [StaticCache]
        assert [type(c) for c in eager_caches] == [DynamicCache if sampling.n > 1 else type(None)]
        assert torch.equal(static.input_ids, eager.input_ids)
        torch.testing.assert_close(static.rollout_logprobs, eager.rollout_logprobs, atol=1e-5, rtol=1e-5)
        _assert_forward_logprobs(model, static)


def test_one_prompt_per_generate_without_padding_reuses_the_cache(models):
    """micro_batch_size=1: no left padding, so `generate` drops the all-ones mask and the static cache's unused
    columns are hidden by the causal mask alone; the three micro-batches (same rows, same rounded length) refill
    one StaticCache, reset in between (a stale length counter would shift every later prompt)."""
    model, processor = load_model(models["qwen2_5_vl"], dtype=torch.float32), load_processor(models["qwen2_5_vl"])
    batch, caches = _roll_out(model, processor, "static", SamplingParams(n=2, temperature=1.0, max_new_tokens=5),
                              micro_batch_size=1)
    assert len(caches) == 3 and isinstance(caches[0], StaticCache) and caches[0] is caches[1] is caches[2]
    _assert_forward_logprobs(model, batch)


def test_a_model_with_sliding_window_layers_keeps_the_eager_path():
    """The rule: the static cache serves models whose layers are all full attention; a Qwen2 with a sliding-window
    layer decodes with the DynamicCache under decode=static, and samples the same tokens as decode=eager."""
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True, sliding_window=8,
                         max_window_layers=1)
    model = Qwen2ForCausalLM(config).eval()
    assert config.layer_types == ["full_attention", "sliding_attention"] and not static_cache_ok(model)
    requests = [GenerationRequest(prompt_ids=[5, 6, 7, 8]), GenerationRequest(prompt_ids=[9, 10])]
    out, caches, generate = {}, [], model.generate
    model.generate = lambda **kw: caches.append(type(kw.get(CACHE_KWARG))) or generate(**kw)
    for decode in ("eager", "static"):
        engine = HFRolloutEngine(pad_token_id=0, stop_token_ids=[1], banned_token_ids=[], micro_batch_size=2,
                                 device=torch.device("cpu"), decode=decode)
        engine.load(model)
        torch.manual_seed(0)
        out[decode] = [c.token_ids for g in engine.generate(requests, SamplingParams(n=2, max_new_tokens=4))
                       for c in g]
    assert out["static"] == out["eager"] and caches == [DynamicCache, DynamicCache]


def test_the_key_reaches_the_engine_and_compiled_needs_cuda():
    """rollout.hf_decode builds the engine's decode mode; compiled on a CPU run is a start-up error (the config
    check for trainer.device=cpu, the builder for a device that resolved to the CPU), and with a sharded train
    engine (not built for it yet); unknown names are refused."""
    cpu = torch.device("cpu")
    engine = build_rollout_engine(load_config(["rollout.hf_decode=static"]), 0, [1], [], cpu)
    assert engine.decode == "static"
    assert build_rollout_engine(load_config([]), 0, [1], [], cpu).decode == "eager"
    with pytest.raises(ConfigError, match="rollout.hf_decode=compiled"):
        load_config(["rollout.hf_decode=compiled", "trainer.device=cpu"])
    with pytest.raises(ConfigError, match="rollout.hf_decode=compiled"):
        build_rollout_engine(load_config(["rollout.hf_decode=compiled"]), 0, [1], [], cpu)
    with pytest.raises(ConfigError, match="rollout.hf_decode=compiled with the fsdp2 engine"):
        load_config(["rollout.hf_decode=compiled", "trainer.device=cuda", "actor.strategy=fsdp2"])
    assert load_config(["rollout.hf_decode=compiled", "trainer.device=cuda"]).rollout.hf_decode == "compiled"
    with pytest.raises(ConfigError, match="rollout.hf_decode=statc is not one of.*did you mean"):
        load_config(["rollout.hf_decode=statc"])
    with pytest.raises(ValueError, match="CUDA"):
        HFRolloutEngine(pad_token_id=0, stop_token_ids=[1], banned_token_ids=[], micro_batch_size=1, device=cpu,
                        decode="compiled")


def test_the_published_qwen_vl_configs_are_served():
    """Every seed model's published config (rllava.train.memory, offline) has only full-attention layers: the static
    path serves the real Qwen2-VL, Qwen2.5-VL and Qwen3-VL checkpoints, not only the tiny ones."""
    from types import SimpleNamespace

    from rllava.train.memory.planner import SEED_MODELS, model_config

    assert all(static_cache_ok(SimpleNamespace(config=model_config(name))) for name in SEED_MODELS)
