"""build_policy's memory switches: gradient checkpointing changes memory, never the gradients."""

import pytest
import torch
from omegaconf import OmegaConf

from rllava.config.schema import ModelConfig
from rllava.model.loader import build_policy

IDS = torch.tensor([[1, 20, 30, 40, 50, 60, 70, 80], [1, 21, 31, 41, 51, 61, 71, 81]])


def _grads(model_dir, **kw):
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig),
                                              dict(model_path=model_dir, torch_dtype="float32", **kw)))
    model, _ = build_policy(cfg, torch.device("cpu"))
    model.train()
    model(input_ids=IDS, labels=IDS).loss.backward()
    return model, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("offload", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir, offload):
    plain_model, plain = _grads(tiny_model_dir)
    ckpt_model, ckpt = _grads(tiny_model_dir, enable_gradient_checkpointing=True, enable_activation_offload=offload)
    assert ckpt_model.is_activation_checkpointing and not plain_model.is_activation_checkpointing
    assert plain.keys() == ckpt.keys() and len(plain) > 10
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-5, atol=1e-6, msg=name)
