"""LoRA adapters through `peft`, injected into the HF model itself (`actor.model.use_peft=true`).

`peft.inject_adapter_in_model` replaces each target linear layer with a LoRA layer (W x + s B A x, s = lora_alpha / r,
or / sqrt(r) with rsLoRA) and freezes everything else, so the policy stays a plain `transformers` model (the training
forward, `generate` and the roles need no wrapper). The reference policy is the same model with its adapters switched
off (`adapters_disabled`): KL to the base needs no second copy of the weights. Saving writes a plain checkpoint with
B A merged into W (`merged_state_dict`), loadable by `transformers` alone, plus the adapter by itself under
`adapter/` (peft's format; `actor.model.lora_weight_path` resumes it).
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch
from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model, set_peft_model_state_dict
from peft.tuners.tuners_utils import BaseTunerLayer

from rllava.errors import RllavaError

ADAPTER = "default"  # peft's adapter name; rllava trains one adapter
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def lora_config(m) -> LoraConfig:
    """peft's LoraConfig from `actor.model.lora_*` (RLLaVA's keys; `use_rslora` is a twin of lora_use_rslora)."""
    return LoraConfig(r=m.lora_r, lora_alpha=m.lora_alpha, target_modules=list(m.lora_target_modules),
                      lora_dropout=m.lora_dropout, bias=m.lora_bias, use_rslora=m.lora_use_rslora or m.use_rslora,
                      modules_to_save=list(m.lora_modules_to_save) if m.lora_modules_to_save else None,
                      task_type=m.lora_task_type)


def apply_lora(model: torch.nn.Module, m, key: str = "actor.model") -> torch.nn.Module:
    """Inject fresh adapters (config `m`), or the saved adapter at `m.lora_weight_path`, into `model`."""
    path = m.lora_weight_path
    if path and not all(os.path.isfile(os.path.join(path, f)) for f in ("adapter_config.json", ADAPTER_WEIGHTS)):
        raise RllavaError(f"{key}.lora_weight_path={path!r}: expected a peft adapter directory "
                          f"(adapter_config.json + {ADAPTER_WEIGHTS})")
    try:
        config = LoraConfig.from_pretrained(path) if path else lora_config(m)
        model = inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    except (ValueError, OSError) as e:  # e.g. no module matches lora_target_modules
        raise RllavaError(f"{key}: LoRA could not be applied: {str(e).splitlines()[0]}") from e
    if path:
        from safetensors.torch import load_file

        result = set_peft_model_state_dict(model, load_file(os.path.join(path, ADAPTER_WEIGHTS)), adapter_name=ADAPTER)
        missing = [k for k in result.missing_keys if "lora_" in k]
        if result.unexpected_keys or missing:
            raise RllavaError(f"{key}.lora_weight_path={path!r} does not match the model: unexpected "
                              f"{result.unexpected_keys[:3]}, missing {missing[:3]}")
    return model


def lora_layers(model: torch.nn.Module) -> list[tuple[str, BaseTunerLayer]]:
    return [(name, mod) for name, mod in model.named_modules() if isinstance(mod, BaseTunerLayer)]


def has_lora(model: torch.nn.Module) -> bool:
    return any(True for _ in lora_layers(model))


@contextmanager
def adapters_disabled(model: torch.nn.Module):
    """Run the base model: every LoRA layer computes W x alone inside the block."""
    layers = [mod for _, mod in lora_layers(model)]
    for mod in layers:
        mod.enable_adapters(False)
    try:
        yield model
    finally:
        for mod in layers:
            mod.enable_adapters(True)


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor] | None = None,
                      merge: bool = True) -> dict[str, torch.Tensor]:
    """The model's weights with each adapter folded in (W + s B A) under the original parameter names, as a
    model without LoRA would have them; the live model is not modified. `state`: the model's full state dict
    if it is already gathered (FSDP2), else `model.state_dict()`. `merge=False`: the base weights alone."""
    state = model.state_dict() if state is None else state
    deltas = {}
    for name, mod in lora_layers(model) if merge else []:
        if ADAPTER not in getattr(mod, "lora_A", {}):
            continue
        a, b = state[f"{name}.lora_A.{ADAPTER}.weight"], state[f"{name}.lora_B.{ADAPTER}.weight"]
        if a.dim() == 2:  # linear adapters: from the (gathered) state
            delta = (b.float() @ a.float()) * mod.scaling[ADAPTER]
            deltas[f"{name}.weight"] = delta.T if getattr(mod, "fan_in_fan_out", False) else delta
        else:  # convolution adapters: peft's own formula
            deltas[f"{name}.weight"] = mod.get_delta_weight(ADAPTER)
    out = {}
    for k, v in state.items():
        if ".lora_" in k or ".original_module." in k:
            continue
        k = k.replace(".base_layer.", ".").replace(f".modules_to_save.{ADAPTER}.", ".")
        out[k] = (v.float() + deltas[k]).to(v.dtype) if k in deltas else v
    return out


def save_adapter(model: torch.nn.Module, path: str, state: dict[str, torch.Tensor] | None = None) -> None:
    """The adapter alone, in peft's format (adapter_config.json + adapter_model.safetensors)."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    model.peft_config[ADAPTER].save_pretrained(path)
    state = {k: v.contiguous() for k, v in
             get_peft_model_state_dict(model, state_dict=state, adapter_name=ADAPTER).items()}
    save_file(state, os.path.join(path, ADAPTER_WEIGHTS))
