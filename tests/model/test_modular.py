"""The TinyLLaVA-style modular VLM (rllava.model.modular): composed from independently loaded parts, saved and
loaded as one HF model, generating with images, frozen part by part, packed, and trained by the RLVR loop."""

import json
import os

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import (CLIPConfig, CLIPModel, Dinov2Config, Dinov2Model, Qwen2Config, Qwen2ForCausalLM,
                          SiglipVisionConfig, SiglipVisionModel)
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

from rllava.config.schema import ModelConfig
from rllava.data.dataset import encode_prompt
from rllava.data.protocol import Sample, Segment, Trajectory, collate
from rllava.engine.inference.base import GenerationRequest, SamplingParams
from rllava.engine.inference.hf import HFRolloutEngine
from rllava.model.forward import token_logprobs
from rllava.model.loader import ModelLoadError, build_policy, freeze, load_model, save_model
from rllava.model.modular import compose
from rllava.model.processor import get_tokenizer, load_processor
from rllava.model.tiny import CHAT_TEMPLATE, build_tiny, build_tokenizer
from rllava.train.outputs import keys_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tinyllava_dir(tmp_path_factory):
    return build_tiny("tinyllava", str(tmp_path_factory.mktemp("models") / "tinyllava"), size="small")


def _load(path):
    return load_model(path, dtype=torch.float32), load_processor(path)


def _sample(i, size=(112, 112), words=1):
    """A counting-style prompt: an image (None: text only) and "How many red ...?"."""
    content = ([{"type": "image"}] if size else []) + [{"type": "text", "text": "How many" + " red" * words + "?"}]
    images = [Image.new("RGB", size, (40 * i, 90, 200))] if size else []
    return Sample(index=i, messages=[{"role": "user", "content": content}], images=images, ground_truth=None)


def _batch(processor, rows):
    """Prompts through the real encode_prompt path, each followed by random trained response tokens."""
    tok = get_tokenizer(processor)
    g = torch.Generator().manual_seed(0)
    trajectories = []
    for i, (size, words, n) in enumerate(rows):
        ids, mm = encode_prompt(processor, _sample(i, size, words))
        response = torch.randint(20, len(tok), (n,), generator=g).tolist()
        trajectories.append(Trajectory(sample=_sample(i, size, words), group_id=i, mm_inputs=mm, segments=[
            Segment(ids, trained=False), Segment(response, trained=True)]))
    return collate(trajectories, tok.pad_token_id)


def _logits(model, batch):
    with torch.no_grad():
        return model(**batch.model_inputs()).logits


def test_save_and_load_give_identical_logits(tmp_path, tinyllava_dir):
    model, processor = _load(tinyllava_dir)
    assert type(model).__name__ == "ModularVLMForConditionalGeneration" and model.config.model_type == "rllava_modular"
    batch = _batch(processor, [((112, 112), 1, 3), (None, 3, 2), ((80, 140), 0, 4)])
    saved = save_model(model, processor, str(tmp_path / "saved"))
    loaded, loaded_processor = _load(saved)
    (ids, mm), (loaded_ids, loaded_mm) = (encode_prompt(p, _sample(0)) for p in (processor, loaded_processor))
    assert loaded_ids == ids and torch.equal(loaded_mm["pixel_values"], mm["pixel_values"])
    torch.testing.assert_close(_logits(loaded, batch), _logits(model, batch), rtol=0, atol=0)


def _llm_dir(path, tok, tie):
    torch.manual_seed(1)
    llm = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie))
    llm.save_pretrained(path)
    tok.save_pretrained(path)
    return llm


def _vision_dir(path, kind):
    """A tiny CLIP (the whole two-tower checkpoint, as openai/clip-* ships), SigLIP or DINOv2 directory."""
    torch.manual_seed(2)
    v = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=14)
    processor = CLIPImageProcessorPil(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56})
    if kind == "clip":
        model = CLIPModel(CLIPConfig(vision_config=dict(v, image_size=56), text_config=dict(
            v, num_hidden_layers=1, vocab_size=99, bos_token_id=0, eos_token_id=1, pad_token_id=1)))
        tower = model.vision_model
    elif kind == "siglip":
        tower = model = SiglipVisionModel(SiglipVisionConfig(**v, image_size=56))
        processor = SiglipImageProcessorPil(size={"height": 56, "width": 56})
    else:
        tower = model = Dinov2Model(Dinov2Config(**v, image_size=518))  # position embeddings interpolated to 56 px
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return tower


@pytest.mark.parametrize("vision, connector, tie", [("siglip", "mlp2x_gelu", True), ("clip", "linear", False),
                                                    ("dinov2", "mlp2x_gelu", False)])
def test_compose_loads_each_part_from_its_own_directory(tmp_path, vision, connector, tie):
    tok = build_tokenizer()
    llm = _llm_dir(tmp_path / "llm", tok, tie)
    tower = _vision_dir(tmp_path / "vision", vision)
    # "<image>" is not in the tokenizer: compose adds it and grows the LLM's embeddings by one row
    template = CHAT_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", "<image>")
    model, processor = compose(str(tmp_path / "llm"), str(tmp_path / "vision"), connector=connector,
                               image_token="<image>", chat_template=template)
    assert len(get_tokenizer(processor)) == len(tok) + 1 == model.config.text_config.vocab_size
    assert model.config.image_token_id == len(tok)
    lm = model.model.language_model.state_dict()
    for name, p in llm.model.state_dict().items():
        want = p[:len(tok)] if name == "embed_tokens.weight" else p
        assert torch.equal(lm[name][:len(want)], want), name
    assert torch.equal(model.lm_head.weight[:len(tok)], llm.lm_head.weight)
    assert (model.lm_head.weight is model.model.language_model.embed_tokens.weight) == tie
    vt = model.model.vision_tower.state_dict()
    for name, p in tower.state_dict().items():
        assert torch.equal(vt[name], p), name
    layers = [type(m).__name__ for m in model.model.connector.modules() if len(list(m.children())) == 0]
    assert layers == (["Linear"] if connector == "linear" else ["Linear", "GELU", "Linear"])
    # 56 px images in 14 px patches: 16 image tokens; CLIP's and DINOv2's CLS token is dropped
    batch = _batch(processor, [((56, 56), 1, 2)])
    assert (batch.input_ids == model.config.image_token_id).sum() == 16
    assert _logits(model, batch).shape == (1, batch.input_ids.shape[1], len(tok) + 1)


def test_generate_with_an_image_prompt(tinyllava_dir):
    model, processor = _load(tinyllava_dir)
    ids, mm = encode_prompt(processor, _sample(0))
    features = model.get_image_features(**mm).pooler_output
    assert [f.shape for f in features] == [(16, model.config.text_config.hidden_size)]
    assert ids.count(model.config.image_token_id) == 16  # one placeholder per feature vector
    # greedy `generate` (image encoded once, before prefill; KV cache after) == re-running the whole sequence
    out = model.generate(input_ids=torch.tensor([ids]), **mm, max_new_tokens=5, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    seq = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(5):
            seq = torch.cat([seq, model(input_ids=seq, **mm).logits[:, -1:].argmax(-1)], 1)
    assert torch.equal(out, seq)
    # rllava's HF engine: left-padded rows with and without an image, n samples each
    tok = get_tokenizer(processor)
    engine = HFRolloutEngine(pad_token_id=tok.pad_token_id, stop_token_ids=[tok.eos_token_id],
                             banned_token_ids=[model.config.image_token_id], micro_batch_size=4,
                             device=torch.device("cpu"))
    requests = [GenerationRequest(*encode_prompt(processor, _sample(i, size, words)))
                for i, (size, words) in enumerate([((112, 112), 3), (None, 1), ((60, 90), 0)])]
    engine.load(model)
    greedy = engine.generate(requests, SamplingParams(n=1, temperature=0.0, max_new_tokens=4))
    sampled = engine.generate(requests, SamplingParams(n=2, temperature=1.0, max_new_tokens=4))
    alone = engine.generate(requests[2:], SamplingParams(n=1, temperature=0.0, max_new_tokens=4))
    engine.offload()
    assert [len(g) for g in sampled] == [2, 2, 2] and all(c.token_ids for g in sampled for c in g)
    assert greedy[2][0].token_ids == alone[0][0].token_ids  # the batch's padding and other images change nothing


@pytest.mark.parametrize("arch", ["tinyllava", "qwen2"])
def test_samples_share_one_prefill_at_left_padded_positions(tmp_path, tinyllava_dir, arch):
    """The HF engine prefills each prompt once for its n samples (a modular VLM and a text-only LM, neither with
    M-RoPE): on left-padded rows of different lengths every sample's rollout log-probs are the training
    forward's, so the copied cache holds each prompt at the positions the training forward gives it."""
    from tests.model.test_video_inputs import assert_rollout_logprobs_are_the_forwards, roll_out

    path = tinyllava_dir if arch == "tinyllava" else build_tiny("qwen2", str(tmp_path / "qwen2"), size="small")
    model, processor = _load(path)
    torch.manual_seed(0)
    size = (112, 112) if arch == "tinyllava" else None
    samples = [_sample(i, size if i % 2 == 0 else None, words) for i, words in enumerate([3, 0, 6])]
    _, batch = roll_out(model, processor, samples, n=3, max_new_tokens=6)
    assert_rollout_logprobs_are_the_forwards(model, batch)


def _part(name):
    return "vision_tower" if name.startswith("model.vision_tower.") else \
        "connector" if name.startswith("model.connector.") else "llm"


@pytest.mark.parametrize("frozen", [{"vision_tower"}, {"connector"}, {"llm"}, {"vision_tower", "llm"}])
def test_freezing_leaves_exactly_the_other_parts_trainable(tinyllava_dir, frozen):
    cfg = ModelConfig(model_path=tinyllava_dir, **{f"freeze_{part}": True for part in frozen})
    model, _ = build_policy(cfg, torch.device("cpu"))
    names = [n for n, _ in model.named_parameters()]
    assert {_part(n) for n in names} == {"vision_tower", "connector", "llm"}
    assert all(name.startswith(("model.", "lm_head.")) for name in names)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n in names if _part(n) not in frozen}


def test_freeze_errors():
    msgs = ModelConfig(freeze_vision_tower=True, freeze_connector=True, freeze_llm=True).check("actor.model")
    assert any("nothing is left to train" in m for m in msgs)
    text_lm = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(ModelLoadError, match="freeze_connector=true but the model has no connector"):
        freeze(text_lm, "connector")


def test_padding_free_matches_padded(tinyllava_dir):
    """Packed rows (positions restarting at 0, no attention mask) give the padded log-probs, entropy and
    gradients, images spliced in row order."""
    model, processor = _load(tinyllava_dir)
    model.train()
    batch = _batch(processor, [((112, 112), 1, 7), (None, 4, 3), ((84, 56), 2, 12), ((56, 112), 0, 1)])
    assert len(set(batch.attention_mask.sum(-1).tolist())) == 4

    def run(padding_free):
        model.zero_grad(set_to_none=True)
        lp, ent = token_logprobs(model, batch, temperature=0.7, with_entropy=True, entropy_grad=True,
                                 padding_free=padding_free)
        g = torch.Generator().manual_seed(2)
        (lp * torch.randn(lp.shape, generator=g) + ent * torch.randn(ent.shape, generator=g)).sum().backward()
        return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    (lp_p, ent_p, g_p), (lp, ent, g) = run(True), run(False)
    torch.testing.assert_close(lp_p, lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_p, ent, atol=1e-5, rtol=1e-5)
    assert g_p.keys() == g.keys() and any(n.startswith("model.vision_tower.") for n in g)
    for name in g:
        torch.testing.assert_close(g_p[name], g[name], atol=1e-5, rtol=1e-5, msg=name)


def test_rlvr_two_steps_train_the_unfrozen_parts(tmp_path, tinyllava_dir, counting_dir, monkeypatch):
    from rllava.train.pipeline import rlvr

    monkeypatch.chdir(REPO)
    out = str(tmp_path / "run")
    reward = tmp_path / "distinct.py"  # a random model never answers right: reward distinct characters
    reward.write_text("def compute_score(response, ground_truth):\n"
                      "    return {'overall': len(set(response)) / 20, 'accuracy': 0.0}\n")
    rlvr.main(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={tinyllava_dir}",
               f"data.train_files={counting_dir}/train.jsonl", f"data.val_files={counting_dir}/val.jsonl",
               "data.max_samples=16", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4",
               "actor.ppo_micro_batch_size=8", "rollout.n=4", "trainer.max_steps=2", "trainer.val_freq=2",
               "data.val_batch_size=8", *keys_for(out), "trainer.logger=[jsonl]",
               f"reward.reward_function={reward}:compute_score", "actor.model.freeze_vision_tower=true",
               "actor.model.padding_free=true"])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    steps, vals = [r for r in rows if "reward/mean" in r], [r for r in rows if "val/accuracy" in r]
    assert [r["step"] for r in steps] == [1, 2] and [r["step"] for r in vals] == [0, 2]
    assert all(k in steps[0] for k in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "timing/rollout"))
    before = load_file(os.path.join(tinyllava_dir, "model.safetensors"))
    after = load_file(os.path.join(out, "final", "model.safetensors"))
    assert before.keys() == after.keys()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert not {k for k in changed if _part(k) == "vision_tower"}  # frozen
    assert {_part(k) for k in changed} == {"connector", "llm"}
    llm = [k for k in before if _part(k) == "llm"]
    assert len(changed) > len(llm) // 2
