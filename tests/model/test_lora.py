"""LoRA through peft: adapters only train, the adapter-disabled model is the reference, saves merge."""

import json
import os

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from rllava.config.schema import ModelConfig
from rllava.errors import RllavaError
from rllava.model.loader import load_model, save_model
from rllava.model.lora import adapters_disabled, apply_lora, has_lora
from rllava.model.processor import load_processor

IDS = torch.tensor([[1, 20, 30, 40, 50, 60, 70, 80]])


def _cfg(**kw):
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig),
                                               dict(use_peft=True, lora_r=4, lora_alpha=8, lora_dropout=0.0, **kw)))


def _logits(model):
    with torch.no_grad():
        return model(input_ids=IDS).logits


def _perturb_adapters(model, seed=0):
    """Stand-in for training: give every lora_B a non-zero value (peft initialises B = 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


@pytest.fixture
def lora_model(tiny_model_dir):
    return apply_lora(load_model(tiny_model_dir, dtype=torch.float32), _cfg())


def test_only_adapters_train_and_start_as_the_base(tiny_model_dir, lora_model):
    base = _logits(load_model(tiny_model_dir, dtype=torch.float32))
    trainable = [n for n, p in lora_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert not any("visual" in n for n in trainable)  # Qwen2-VL's vision attention is `qkv`, not a target
    torch.testing.assert_close(_logits(lora_model), base, rtol=0, atol=0)  # B = 0: the adapter is a no-op
    _perturb_adapters(lora_model)
    assert not torch.allclose(_logits(lora_model), base)
    with adapters_disabled(lora_model):  # the reference: the base model, exactly
        torch.testing.assert_close(_logits(lora_model), base, rtol=0, atol=0)
    assert not torch.allclose(_logits(lora_model), base)  # adapters are back on after the block


def test_save_merges_adapters_and_keeps_the_adapter(tmp_path, tiny_model_dir, lora_model):
    _perturb_adapters(lora_model)
    want = _logits(lora_model)
    out = save_model(lora_model, load_processor(tiny_model_dir), str(tmp_path / "final"))
    names = set(load_file(os.path.join(out, "model.safetensors")))
    assert not any("lora_" in n or "base_layer" in n for n in names)
    assert names == set(load_file(os.path.join(tiny_model_dir, "model.safetensors")))
    merged = load_model(out, dtype=torch.float32)  # plain transformers, no peft involved
    assert not has_lora(merged)
    torch.testing.assert_close(_logits(merged), want, rtol=1e-5, atol=1e-5)
    # the adapter alone resumes through actor.model.lora_weight_path
    assert json.load(open(os.path.join(out, "adapter", "adapter_config.json")))["r"] == 4
    resumed = apply_lora(load_model(tiny_model_dir, dtype=torch.float32), _cfg(lora_weight_path=f"{out}/adapter"))
    torch.testing.assert_close(_logits(resumed), want, rtol=0, atol=0)


def test_bad_lora_settings_name_the_key(tmp_path, tiny_model_dir):
    model = load_model(tiny_model_dir, dtype=torch.float32)
    with pytest.raises(RllavaError, match="actor.model: LoRA could not be applied"):
        apply_lora(model, _cfg(lora_target_modules=["no_such_proj"]))
    with pytest.raises(RllavaError, match="lora_weight_path"):
        apply_lora(model, _cfg(lora_weight_path=str(tmp_path)))
