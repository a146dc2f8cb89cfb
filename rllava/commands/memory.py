"""Will it fit? The device memory of one configured RL step, planned without weights and without a GPU:

    python -m rllava.commands.memory config=examples/tasks/counting/tiny_cpu.yaml k=v ... [--gpu-memory 24GiB] [--world-size N]

The policy is built from its config.json under torch's FakeTensorMode (tensors with shapes and dtypes, no
storage), with the config's training switches (frozen parts, LoRA, gradient checkpointing), and each phase of
one step runs on it under torch's `MemTracker`, which adds up every live tensor and keeps the peak by kind
(parameters, gradients, optimizer state, activations, temporaries). The forward passes are rllava's own
(`rllava.model.forward._token_logprobs` on a Batch of the planned shapes): the chunked LM head
(actor.logprob_chunk_size), padding_free and shared_prefix run as configured.

  rollout       HF engine: a prefill forward (no grad) of one generate call's prompts, and its KV cache, counted
                from the config: 2 (K, V) x layers x kv_heads x head_dim x dtype bytes per token, for
                rollout.micro_batch_size prompts x rollout.n samples x (max_prompt_length + max_response_length).
                vLLM / SGLang: the engine's reservation, rollout.vllm.gpu_memory_utilization (SGLang:
                rollout.sglang.mem_fraction_static) x --gpu-memory, beside what the trainer keeps on the device
                (not its weights and gradients with actor.fsdp.offload_params), and one weight-sync bucket
                (rollout.bucket_size MB: the policy reaches the engine a bucket at a time). Outside the rollout
                the engine sleeps (vLLM sleep(level=1), SGLang release_memory_occupation): none of it is on the device.
  old log-prob  a forward without grad of one micro-batch: actor.log_prob_micro_batch_size sequences, or with
                actor.model.dynamic_batching as many full-length ones as actor.log_prob_max_token_len_per_gpu holds.
  ref log-prob  with a KL (algorithm.use_kl_loss, use_kl_in_reward): the same on the frozen reference (a copy of
                the starting weights, resident in every phase; for LoRA without ref.model_path the policy itself,
                adapters off), ref.log_prob_micro_batch_size (or ref.log_prob_max_token_len_per_gpu) sequences.
  teacher log-prob  algorithm.distill with a sampled-token loss (k1, k3): the same on each teacher (its own
                config; every teacher resident in every phase, as the reference; engine=vllm|sglang not planned).
  update        a forward + backward of one micro-batch (actor.ppo_micro_batch_size, or
                actor.ppo_max_token_len_per_gpu tokens), beside the gradients of the mini-batch's earlier
                micro-batches where it has several.
  optimizer     gradient clipping and torch.optim.AdamW's step (foreach kernels, as on CUDA): 2 states per
                trainable parameter, in the parameters' dtype; none on the device with actor.fsdp.enable_cpu_offload
                (the step runs on the host), outside the update with actor.fsdp.offload_optimizer.

FSDP2 (actor.strategy fsdp / fsdp2; auto with --world-size > 1, or on a GPU with actor.fsdp.enable_cpu_offload /
offload_params, RLLaVA's offload switches, as rllava runs it): rllava's own `shard_model` shards the model over
a fake process group of --world-size ranks (FSDP2's mixed precision and reshard_after_forward as configured; the
reference sharded too) and torch's `FSDPMemTracker` tracks it; each rank plans its share of the
batch (train_batch_size x n / N rows, mini-batches likewise). With either offload switch the shards, their
gradients and Adam's states are on the host (CPUOffloadPolicy): tracked, but not counted on the device. For HF
generate every unit is gathered for the whole rollout, as rllava does. DeepSpeed plans as FSDP2 (ZeRO-3's sharding).

Every phase holds the weights, and the optimizer state a previous step left. Every sequence is as long as the
config allows, every prompt holds one square image as large as data.max_pixels and max_prompt_length allow
(Qwen-VL: one token per merged (patch x 2)^2 pixels; the image's tokens count in the prompt's length), and the
rollout.n samples of a prompt share it; padding_free therefore saves nothing here (no sequence is short). Not
counted: the CUDA context and the allocator's cache and fragmentation (~1-2 GiB on a real GPU), the generate
loop's own transients, a critic, the exact KL's in-update buffers (named under the table).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import itertools
import math
import os
import re
import sys
import types
from dataclasses import dataclass

import torch
import torch._subclasses.fake_tensor as fake_tensor
import torch.utils._pytree as pytree
from torch._guards import active_fake_mode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker

from rllava.errors import RllavaError

GiB = 1024 ** 3


def _seed(model_type: str, tie: bool, text: tuple, vision: dict) -> dict:
    """A SEED_MODELS entry: text = (vocab, hidden, MLP, layers, heads, KV heads) of the language model."""
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads")
    text_config = dict(zip(keys, text), tie_word_embeddings=tie, **({"head_dim": 128} if "qwen3" in model_type else {}))
    return dict(model_type=model_type, tie_word_embeddings=tie, text_config=text_config,
                vision_config=dict(patch_size=16 if "qwen3" in model_type else 14, spatial_merge_size=2,
                                   temporal_patch_size=2, **vision))


_QWEN2_5_VISION = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, window_size=112,
                       fullatt_block_indexes=[7, 15, 23, 31])
# Architecture hyperparameters of the seeds' models, as published in each model's config.json on the Hugging
# Face hub (text_config: the language model; vision_config: the vision tower). Only these size-setting fields;
# the rest take transformers' defaults. `actor.model.model_path=<hub id>` plans from this table.
SEED_MODELS: dict[str, dict] = {
    # Qwen/Qwen2-VL-2B-Instruct/config.json: as ported by mllm (models/qwen2vl configuration_qwen2vl.hpp, two
    # versions); the vision tower's hidden_size is the merger's output, the LLM's width
    "Qwen/Qwen2-VL-2B-Instruct": _seed("qwen2_vl", True, (151936, 1536, 8960, 28, 12, 2),
                                       dict(depth=32, embed_dim=1280, mlp_ratio=4, num_heads=16, hidden_size=1536)),
    # Qwen/Qwen2-VL-7B-Instruct/config.json: the model's printed module tree (zhenhua32/Qwen2-VL READ.md;
    # acproject/duorou docs/new_feat.md): vocab 152064 x 3584, 28 layers, k/v 512 wide (4 heads of 128), MLP
    # 18944; vision 32 blocks of 1280, MLP 5120 (ratio 4), merged into 3584
    "Qwen/Qwen2-VL-7B-Instruct": _seed("qwen2_vl", False, (152064, 3584, 18944, 28, 28, 4),
                                       dict(depth=32, embed_dim=1280, mlp_ratio=4, num_heads=16, hidden_size=3584)),
    # Qwen/Qwen2.5-VL-3B-Instruct/config.json: two public copies of that file, identical in these fields
    "Qwen/Qwen2.5-VL-3B-Instruct": _seed("qwen2_5_vl", True, (151936, 2048, 11008, 36, 16, 2),
                                         dict(out_hidden_size=2048, **_QWEN2_5_VISION)),
    # Qwen/Qwen2.5-VL-7B-Instruct/config.json: a copy inside DiffSynth-Studio's Nexus-GenV2 (a Qwen2.5-VL-7B
    # fine-tune, same architecture) and the printed module tree (acproject/duorou docs/qwen2.5vl_graph.md)
    "Qwen/Qwen2.5-VL-7B-Instruct": _seed("qwen2_5_vl", False, (152064, 3584, 18944, 28, 28, 4),
                                         dict(out_hidden_size=3584, **_QWEN2_5_VISION)),
    # Qwen/Qwen3-VL-2B-Instruct/config.json: torchtitan's experiments/qwen3_vl/__init__.py ("2B") and an HF-format
    # copy inlined in openvino.genai's qwen3_vl_spec_test.cpp, identical here (the 4B's vision tower, merged into
    # 2048; a Qwen3-1.7B-shaped language model)
    "Qwen/Qwen3-VL-2B-Instruct": _seed("qwen3_vl", True, (151936, 2048, 6144, 28, 16, 8),
                                       dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                                            out_hidden_size=2048, num_position_embeddings=2304,
                                            deepstack_visual_indexes=[5, 11, 17])),
    # Qwen/Qwen3-VL-4B-Instruct/config.json: two public copies (text encoders built on it), identical here
    "Qwen/Qwen3-VL-4B-Instruct": _seed("qwen3_vl", True, (151936, 2560, 9728, 36, 32, 8),
                                       dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                                            out_hidden_size=2560, num_position_embeddings=2304,
                                            deepstack_visual_indexes=[5, 11, 17])),
    # Qwen/Qwen3-VL-8B-Instruct/config.json: two public copies (a TensorRT-LLM-style test config, a text
    # encoder wrapper), identical here
    "Qwen/Qwen3-VL-8B-Instruct": _seed("qwen3_vl", False, (151936, 4096, 12288, 36, 32, 8),
                                       dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                                            out_hidden_size=4096, num_position_embeddings=2304,
                                            deepstack_visual_indexes=[8, 16, 24])),
}


def model_config(path: str | None, key: str = "actor.model.model_path"):
    """The transformers config of the model at `key`: a local model directory's config.json, or a hub id from
    SEED_MODELS (nothing is downloaded)."""
    from transformers import AutoConfig

    if path and os.path.isdir(path):
        return AutoConfig.from_pretrained(path)
    if path in SEED_MODELS:
        seed = SEED_MODELS[path]
        return AutoConfig.for_model(seed["model_type"], **{k: v for k, v in seed.items() if k != "model_type"})
    raise RllavaError(f"{key}={path!r}: no such local directory, and not a model the planner knows "
                      f"by name ({', '.join(SEED_MODELS) or 'none'})")


def image_grid(config, max_pixels: int | None, max_prompt_length: int) -> tuple[int, int]:
    """(h, w) patches of one square image as large as data.max_pixels allows and as its prompt allows (a prompt,
    its image tokens included, is at most max_prompt_length: longer ones are filtered), in whole merged tokens
    as Qwen-VL's processor makes them. (0, 0) for a model without a Qwen-VL vision tower."""
    vision = getattr(config, "vision_config", None)
    if vision is None or not max_pixels or not hasattr(vision, "temporal_patch_size"):
        return 0, 0
    m = vision.spatial_merge_size
    side = max(1, min(math.isqrt(max_pixels) // (vision.patch_size * m), math.isqrt(max_prompt_length - 2)))
    return side * m, side * m


def model_inputs(model, step: "Step", rows: int, response: int) -> dict:
    """Forward kwargs for `rows` sequences of step.prompt + `response` tokens: ids (the image's tokens at the start
    of each prompt), mask, pixels, grid and Qwen-VL's M-RoPE positions (computed on real tensors: they depend on
    the ids' values)."""
    config, (gh, gw) = model.config, step.grid
    m = config.vision_config.spatial_merge_size if gh else 1
    n_image, length = gh * gw // (m * m), step.prompt + response
    if n_image >= step.prompt - 1:
        raise RllavaError(f"an image at data.max_pixels is {n_image} tokens, data.max_prompt_length={step.prompt} "
                          "leaves no room for the text: lower data.max_pixels or raise data.max_prompt_length")
    row = [1] + [getattr(config, "image_token_id", 1)] * n_image + [1] * (length - n_image - 1)
    with fake_tensor.unset_fake_temporarily():  # plain tensors; in a fake mode they become constants
        ids, mask = torch.tensor([row] * rows), torch.ones(rows, length, dtype=torch.long)
        mask[-1, 0] = 0  # one pad token, as in any batch of prompts of different lengths: the attention mask is
        # then built (transformers drops it only where nothing is padded, and cannot tell under a fake mode)
        inputs = {"input_ids": ids, "attention_mask": mask}
        if gh:
            inputs["image_grid_thw"] = torch.tensor([[1, gh, gw]] * rows)
            inputs["mm_token_type_ids"] = (ids == config.image_token_id).int()
            inputs["position_ids"], _ = getattr(model, model.base_model_prefix).get_rope_index(
                ids, mm_token_type_ids=inputs["mm_token_type_ids"], attention_mask=mask,
                image_grid_thw=inputs["image_grid_thw"])
    if gh:
        v = config.vision_config
        inputs["pixel_values"] = torch.zeros(rows * gh * gw, v.in_channels * v.temporal_patch_size * v.patch_size ** 2,
                                             dtype=model.dtype)
    return _constants(inputs)


def plan_batch(model, step: "Step", rows: int):
    """A rllava Batch of `rows` trajectories of the planned shapes: consecutive groups of rollout.n rows share
    their prompt and its image (as a group's samples do), each response as long as the config allows but the
    last row's, one token shorter (a batch is padded)."""
    from rllava.data.protocol import Batch, Segment, Trajectory

    media = []
    for _ in range(-(-rows // step.n)):  # one image (the same tensors) per group
        one = model_inputs(model, step, 1, step.response)
        media.append({k: one[k] for k in ("pixel_values", "image_grid_thw") if k in one})
    ids = _real_values(one["input_ids"])[0].tolist()
    trajectories = [Trajectory(sample=None, group_id=i // step.n, mm_inputs=media[i // step.n],
                               segments=[Segment(ids[:step.prompt], trained=False),
                                         Segment(ids[step.prompt:], trained=True)]) for i in range(rows)]
    with fake_tensor.unset_fake_temporarily():
        mask = torch.ones(rows, len(ids), dtype=torch.long)
        mask[-1, -1] = 0
        loss_mask = mask.float()
        loss_mask[:, :step.prompt] = 0
        tensors = dict(input_ids=torch.tensor([ids] * rows), attention_mask=mask, loss_mask=loss_mask,
                       group_ids=torch.arange(rows) // step.n)
    return Batch(trajectories=trajectories, **_constants(tensors))


def _constants(tree):
    """Inside a fake mode: small integer tensors as fake *constants* (their values kept, so that the model's
    index arithmetic on ids and grids runs); big tensors are fake already."""
    mode = active_fake_mode()
    if mode is None:
        return tree
    return pytree.tree_map_only(torch.Tensor, lambda t: t if isinstance(t, fake_tensor.FakeTensor) else
                                mode.fake_tensor_converter.from_real_tensor(mode, t, make_constant=True), tree)


def _real_values(x):
    """`x` with each fake constant replaced by its real value (inside tuples, lists, dicts and the tensor fields
    of a dataclass such as a Batch)."""
    if isinstance(x, fake_tensor.FakeTensor):
        return x if x.constant is None else x.constant
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: _real_values(getattr(x, f.name)) for f in dataclasses.fields(x)
                                         if f.init and torch.is_tensor(getattr(x, f.name))})
    if isinstance(x, (tuple, list)):
        return type(x)(_real_values(v) for v in x)
    return {k: _real_values(v) for k, v in x.items()} if isinstance(x, dict) else x


def _on_real_values(fn, counted: tuple[str, ...] = ()):
    """`fn` run on the real values of its (constant) arguments, outside the fake mode: index arithmetic a fake
    tensor cannot answer (.tolist(), nonzero) in transformers' vision helpers and get_rope_index, and rllava's
    shared-prefix layout. Its output tensors come back as fake constants, each holding a fake tensor of its size
    for as long as it lives (the tracker counts that: on a GPU they are on the device); `counted`: output
    entries that need no values (the shared-prefix mask), made again as plain fake tensors."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with fake_tensor.unset_fake_temporarily():
            out = fn(*_real_values(args), **_real_values(kwargs))
        redo = {k: out.pop(k) for k in counted}
        made = [t for t in pytree.tree_leaves(out)
                if isinstance(t, torch.Tensor) and not isinstance(t, fake_tensor.FakeTensor)]
        out = _constants(out)
        if active_fake_mode() is not None:
            for t in pytree.tree_leaves(out):
                if isinstance(t, fake_tensor.FakeTensor) and any(t.constant is m for m in made):
                    t.rllava_storage = torch.empty(t.shape, dtype=t.dtype)
        return {**out, **{k: torch.zeros(t.shape, dtype=t.dtype) for k, t in redo.items()}} if counted else out
    run.rllava_original = fn
    return run


def _vision_helpers():
    """(module, name) of every transformers `get_vision_*` helper bound in a loaded module."""
    import transformers.vision_utils as vision_utils

    return [(mod, name) for mod in list(sys.modules.values())
            if getattr(mod, "__name__", "").startswith("transformers.models.") or mod is vision_utils
            for name in list(vars(mod)) if name.startswith("get_vision_")]


def _module_to(self, *args, **kwargs):
    """nn.Module.to under the planner's fake mode: each parameter and buffer replaced by its converted copy (torch
    cannot swap a fake parameter in place, as nn.Module.to does; peft moves each new adapter to its layer's
    device and dtype)."""
    device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    for module in self.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                new = None if t is None else t.to(device=device, dtype=dtype if t.is_floating_point() else None)
                if new is not t:
                    table[name] = torch.nn.Parameter(new, t.requires_grad) if table is module._parameters else new
    return self


def _same_shapes(a, b) -> bool:
    """shared_prefix._same_media for planned rows (a group's rows share its image by construction; FSDP2's mixed
    precision casts each row's pixels apart, and fake pixels have no values to compare)."""
    return a.mm_inputs.keys() == b.mm_inputs.keys() and all(
        a.mm_inputs[k].shape == b.mm_inputs[k].shape for k in a.mm_inputs)


@contextlib.contextmanager
def fake_mode():
    """FakeTensorMode in which rllava's training forward runs on a Qwen-VL: integer tensors up to 2^24 elements
    stay constants; transformers' `get_vision_*` helpers (a modeling module imported inside binds the wrapped
    one) and rllava's shared-prefix layout run on real values (`_on_real_values`); all restored on exit."""
    import rllava.model.forward as forward
    import rllava.model.shared_prefix as shared_prefix

    patches = [(mod, name, _on_real_values(getattr(mod, name))) for mod, name in _vision_helpers()
               if getattr(mod, name).__module__ == "transformers.vision_utils"]
    patches += [(forward, "prefix_layout", _on_real_values(forward.prefix_layout)),
                (forward, "layout_inputs", _on_real_values(forward.layout_inputs, counted=("attention_mask",))),
                (torch.nn.Module, "to", _module_to), (shared_prefix, "_same_media", _same_shapes),
                (fake_tensor, "CONSTANT_NUMEL_LIMIT", 1 << 24)]
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patches]
    for mod, name, new in patches:
        setattr(mod, name, new)
    try:
        with fake_tensor.FakeTensorMode(allow_non_fake_inputs=True):
            yield
    finally:
        for mod, name, old in saved:
            setattr(mod, name, old)
        for mod, name in _vision_helpers():
            setattr(mod, name, getattr(getattr(mod, name), "rllava_original", getattr(mod, name)))


@contextlib.contextmanager
def fake_world(world: int):
    """A fake process group of `world` ranks (this process is rank 0; collectives return at once) and its CPU
    device mesh, for FSDP2 to shard over; made outside the fake mode."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RllavaError("the planner shards over a fake process group of its own: plan before torch.distributed "
                          "is initialised (or in another process)")
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (world,))
    finally:
        dist.destroy_process_group()


@dataclass
class Step:
    """The sizes and switches of one configured step that decide its memory on one rank (read by `step_of`)."""
    prompt: int
    response: int
    grid: tuple[int, int]
    gen_prompts: int  # prompts per HF generate call (rollout.micro_batch_size)
    n: int  # samples per prompt
    logprob_rows: int  # sequences per old-log-prob forward
    ref_rows: int  # sequences per reference log-prob forward
    update_rows: int  # sequences per update forward + backward
    accumulates: bool  # several micro-batches per mini-batch: the later ones run beside the earlier ones' gradients
    forward: dict  # rllava.model.forward._token_logprobs keywords: chunk_size, padding_free, shared_prefix
    max_grad_norm: float
    optimizer_on_device: tuple[bool, bool]  # (between updates, during the update): offload_optimizer / cpu optimizer
    host_shards: bool = False  # FSDP2 with CPUOffloadPolicy (enable_cpu_offload): shards, grads and Adam on the host
    engine: str = "hf"  # rollout.name
    engine_fraction: float = 0.0  # vLLM / SGLang: the share of the GPU the engine reserves while it samples
    engine_awake: bool = False  # rollout.async_mode: vLLM / SGLang keep that reservation in every phase
    params_off_in_rollout: bool = False  # offload_params: the trainer's weights on the host while vLLM/SGLang sample
    sync_bucket: int = 0  # vLLM / SGLang: bytes of one weight-sync bucket (rollout.bucket_size MB, whole tensors)


def _rows(fixed: int, budget: int, length: int, dynamic: bool, cap: int) -> int:
    """Sequences per forward: `fixed`, or with dynamic batching as many full-length rows as `budget` tokens hold
    (rllava.roles.batching.token_budget_groups: at least one), at most `cap`."""
    return max(1, min(budget // length if dynamic else fixed, cap))


def step_of(cfg, config, world: int = 1, device: str = "cuda") -> Step:
    """`Step` of one rank from rllava's config `cfg`, the model's transformers `config`, the number of ranks and
    the run's device (which engine `actor.strategy=auto` picks)."""
    from rllava.config.schema import resolve_strategy

    a, d, fsdp, m, r = cfg.actor, cfg.data, cfg.actor.fsdp, cfg.actor.model, cfg.rollout
    rows = max(1, d.train_batch_size * r.n // world)
    mini = max(1, min(a.ppo_mini_batch_size * r.n // world, rows))
    length, dyn = d.max_prompt_length + d.max_response_length, m.dynamic_batching
    update = _rows(a.ppo_micro_batch_size, a.ppo_max_token_len_per_gpu, length, dyn, mini)
    sharded = resolve_strategy(a.strategy, world, fsdp, device) != "single"
    host_opt = fsdp.enable_cpu_offload or (sharded and fsdp.offload_params)  # FSDP2: either is CPUOffloadPolicy
    return Step(prompt=d.max_prompt_length, response=d.max_response_length,
                grid=image_grid(config, d.max_pixels, d.max_prompt_length),
                gen_prompts=max(1, min(r.micro_batch_size, d.train_batch_size // world)), n=r.n,
                logprob_rows=_rows(a.log_prob_micro_batch_size, a.log_prob_max_token_len_per_gpu, length, dyn, rows),
                ref_rows=_rows(cfg.ref.log_prob_micro_batch_size, cfg.ref.log_prob_max_token_len_per_gpu, length, dyn,
                               rows),
                update_rows=update, accumulates=update < mini,
                forward=dict(chunk_size=a.logprob_chunk_size, padding_free=m.padding_free,
                             shared_prefix=m.use_shared_prefix),
                max_grad_norm=a.max_grad_norm,
                optimizer_on_device=(not (fsdp.offload_optimizer or host_opt), not host_opt),
                host_shards=sharded and host_opt, engine=r.name,
                engine_fraction={"vllm": r.vllm.gpu_memory_utilization,
                                 "sglang": r.sglang.mem_fraction_static or 0.0}.get(r.name, 0.0),
                engine_awake=r.async_mode and r.name != "hf",
                params_off_in_rollout=fsdp.offload_params, sync_bucket=r.bucket_size * 2 ** 20)


def kv_cache_bytes(config, step: Step, dtype: torch.dtype) -> int:
    """The HF engine's KV cache for one generate call, counted (not run): K and V, per layer, per KV head, of
    head_dim values, for gen_prompts x n sequences of prompt + response tokens, in the model's dtype."""
    text = config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    tokens = step.gen_prompts * step.n * (step.prompt + step.response)
    return 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * tokens * dtype.itemsize


def prefill_pass(model, step: Step) -> int:
    """(a) the rollout's prefill: one generate call's prompts through the backbone, no grad (the KV cache it
    writes is counted by `kv_cache_bytes`). Under FSDP2 every unit is gathered first, for the whole rollout, as
    rllava's rollout_phase does: returns the gathered weights' bytes (the tracker files them as activations)."""
    from torch.distributed.fsdp import FSDPModule

    groups = [g for g in (m._get_fsdp_state()._fsdp_param_group for m in model.modules() if isinstance(m, FSDPModule))
              if g is not None]
    for group in groups:
        group.unshard()
        group.wait_for_unshard()
    gathered = sum(p.unsharded_param.numel() * p.unsharded_param.element_size() for g in groups for p in g.fsdp_params)
    with torch.no_grad():
        getattr(model, model.base_model_prefix)(**model_inputs(model, step, step.gen_prompts, 0), use_cache=False)
    for group in groups:
        group.reshard()
    return gathered


def logprob_pass(model, step: Step, rows: int | None = None) -> None:
    """(b) old log-probs (and the reference's, `rows` = its micro-batch): one micro-batch forward without grad,
    rllava's training forward (`_token_logprobs`) with the configured chunking and layout."""
    model.eval()
    with torch.no_grad():
        model(plan_batch(model, step, rows or step.logprob_rows), **step.forward)


def ref_pass(ref, step: Step) -> None:
    """(b') the reference's log-probs: its own micro-batch; a LoRA policy's base runs with its adapters off."""
    from rllava.model.lora import adapters_disabled

    with adapters_disabled(ref):
        logprob_pass(ref, step, step.ref_rows)


def update_pass(model, step: Step) -> None:
    """(c) the update: one micro-batch forward (with the entropy, as the actor's loss) and backward."""
    model.train()
    logprobs, _ = model(plan_batch(model, step, step.update_rows), with_entropy=True, **step.forward)
    (-logprobs.sum()).backward()


def _local(t: torch.Tensor) -> torch.Tensor:
    """A rank's own part of an FSDP2 shard (DTensor), or the tensor."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def adam_states(optimizer) -> None:
    """AdamW's states as its first step makes them (step, exp_avg, exp_avg_sq per parameter), without the step."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            optimizer.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                  "exp_avg_sq": torch.zeros_like(p)}


@torch.no_grad()
def optimizer_pass(model, optimizer, step: Step) -> None:
    """(d) clip the gradients, step AdamW (on the device), drop the gradients (zero_grad(set_to_none=True)).
    Both run on each rank's own shards, as under FSDP2 (whose clip all-reduces one number): torch's foreach
    kernels on the local tensors (on fake DTensors the clip would copy the gradients, and the step's sharding
    propagation takes a minute at 3B). FSDP2's shards on the host: all of it runs there."""
    from torch.optim.adam import adam

    if step.host_shards:
        return model.zero_grad(set_to_none=True)
    params = [p for p in model.parameters() if p.grad is not None]
    grads = [_local(p.grad) for p in params]
    norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    torch._foreach_mul_(grads, (step.max_grad_norm / (norm + 1e-6)).clamp(max=1.0))
    if step.optimizer_on_device[1]:
        g, states = optimizer.param_groups[0], [optimizer.state[p] for p in params]
        adam([_local(p) for p in params], grads, *([_local(s[k]) for s in states]
                              for k in ("exp_avg", "exp_avg_sq")), [], [s["step"] for s in states], foreach=True,
                              decoupled_weight_decay=True, amsgrad=False, beta1=g["betas"][0], beta2=g["betas"][1],
                              lr=g["lr"], weight_decay=g["weight_decay"], eps=g["eps"], maximize=False)
    model.zero_grad(set_to_none=True)


# the kinds torch's trackers file tensors under (MemTracker's, then FSDPMemTracker's), by column of the table
COLUMNS = {"parameters": ("Parameter", "Buffer", "Sharded Param", "Unsharded Param"),
           "gradients": ("Gradient", "Sharded Grad", "Unsharded Grad"), "optimizer": ("Optstate", "OptState"),
           "activations": ("Activation",), "temporaries": ("Temp", "Other", "All Gather", "Reduce Scatter", "Inputs")}


class _DevicePeak:
    """torch's memory trackers keeping only the peak of what is on the device: `host` kinds (COLUMNS' names) are
    tracked but live in host memory in this phase. They skip the per-module peaks, which cost a pass over every
    module at every op (minutes for a 3B model)."""
    host: tuple[str, ...] = ()

    def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
        # a frozen parameter (the reference, a frozen tower) takes no gradient hook: torch refuses one; a module
        # mixing both leaves its parameters to its submodules' hooks
        return super()._track_module_params_and_buffers(
            module, install_grad_hooks=install_grad_hooks and all(p.requires_grad for p in module.parameters()))

    def _on_device(self, snap: dict) -> int:
        return snap["Total"] - sum(snap.get(k, 0) for k in self.host)

    def __enter__(self):
        super().__enter__()  # its peak so far is the Total on entry: only what is on the device counts here
        self._peak_mem = {dev: self._on_device(snap) for dev, snap in self._peak_mem_snap.items()}
        return self

    def _update_peak_stats(self, peak_state) -> None:
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < self._on_device(snap):
                self._peak_mem[dev], self._peak_mem_snap[dev] = self._on_device(snap), dict(snap)


class PeakTracker(_DevicePeak, MemTracker):
    def _pre_fw_hook(self, module, inputs) -> None:
        try:
            super()._pre_fw_hook(module, inputs)
        except NotImplementedError:  # a second forward of the root (several micro-batches): torch's per-module
            self.reset_mod_stats()  # stats refuse it; the device-wide peak goes on
            super()._pre_fw_hook(module, inputs)


class FSDPPeakTracker(_DevicePeak, FSDPMemTracker):
    def track_external(self, *modules) -> None:
        """The shards of other FSDP2 modules (the reference; torch's FSDPMemTracker tracks its root's only)."""
        from torch.distributed.fsdp import FSDPModule

        for unit in (u for m in modules for u in m.modules() if isinstance(u, FSDPModule)):
            if unit._get_fsdp_state()._fsdp_param_group:
                self._instrument_fsdp_sharded_params_grads(unit._get_fsdp_state()._fsdp_param_group)


def tracked(run, model, optimizer, *external, host: tuple[str, ...] = ()) -> dict[str, int]:
    """The peak bytes on the device of `run()` and, at that peak, the bytes of each kind (COLUMNS), measured by
    torch's MemTracker (FSDPMemTracker for an FSDP2 model); `model`, `optimizer` and `external` (modules) exist
    before `run` and are counted too, except the kinds in `host`."""
    from torch.distributed.fsdp import FSDPModule

    tracker = FSDPPeakTracker(model, optimizer) if isinstance(model, FSDPModule) else PeakTracker()
    tracker.host = host
    tracker.track_external(*external, *(() if isinstance(model, FSDPModule) else (model, optimizer)))
    with tracker:
        run()
    snap = {k: v for dev in tracker.get_tracker_snapshot("peak").values() for k, v in dev.items()}
    row = {c: sum(snap.get(k, 0) for k in kinds if k not in host) for c, kinds in COLUMNS.items()}
    return {**row, "peak": sum(row.values())}


def run_phases(model, optimizer, step: Step, kv_bytes: int = 0, ref=None, gpu_bytes: int | None = None,
               teachers=(), teacher_pass: bool = False) -> list[dict]:
    """One row per phase of the step: its peak bytes by kind on one device. Runs on a real or a fake model alike
    (whose `forward` is rllava's `_token_logprobs`: see `plannable`). The optimizer state exists from the start
    (a step after the first); the frozen reference `ref`, if any, is resident in every phase and has a log-prob
    pass of its own (`ref` is `model` itself for LoRA's adapter-free base); so are the distillation `teachers`,
    whose pass (`teacher_pass`: a sampled-token loss) runs each on the reference's micro-batch. `kv_bytes`: the
    HF engine's KV cache, added to the rollout; vLLM / SGLang reserve step.engine_fraction of `gpu_bytes` instead."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    adam_states(optimizer)  # as a previous step left them
    frozen = ([ref] if ref is not None and ref is not model else []) + list(teachers)
    shards = ("Sharded Param", "Sharded Grad", "OptState") if step.host_shards else ()
    opt_off = ("Optstate", "OptState")

    def phase(name, run, *host):
        return dict(phase=name, **tracked(run, model, optimizer, *frozen, host=tuple(set(shards + host))))

    between = () if step.optimizer_on_device[0] else opt_off
    if step.engine == "hf":
        gathered = []
        rows = [phase("rollout", lambda: gathered.append(prefill_pass(model, step)), *between)]
        moved = min(gathered[0], rows[0]["activations"])  # FSDP2's gathered weights are parameters
        rows[0].update(kv_cache=kv_bytes, parameters=rows[0]["parameters"] + moved,
                       activations=rows[0]["activations"] - moved)
    else:  # the engine samples on its own copy; the trainer's weights stay unless offload_params moves them
        weights = (("Parameter", "Buffer", "Gradient", "Sharded Param", "Sharded Grad")
                   if step.params_off_in_rollout else ())
        rows = [phase("rollout", lambda: None, *between, *weights)]
        rows[0]["kv_cache"] = int(step.engine_fraction * gpu_bytes)
        rows[0]["temporaries"] += step.sync_bucket  # the weight sync's gathered bucket, beside the woken engine
        rows[0]["peak"] += step.sync_bucket
    rows.append(phase("old log-prob", lambda: logprob_pass(model, step), *between))
    if ref is not None:
        rows.append(phase("ref log-prob", lambda: ref_pass(ref, step), *between))
    if teachers and teacher_pass:
        rows.append(phase("teacher log-prob", lambda: [logprob_pass(t, step, step.ref_rows) for t in teachers],
                          *between))
    during = () if step.optimizer_on_device[1] else opt_off
    for p in trainable if step.accumulates else []:  # a later micro-batch: the earlier ones' gradients are held
        p.grad = torch.zeros_like(p)
    rows.append(phase("update", lambda: update_pass(model, step), *during))
    rows.append(phase("optimizer", lambda: optimizer_pass(model, optimizer, step), *during))
    opt = rows[-1]  # no activation lives in the optimizer phase: what the trackers file so is the step's scratch
    opt["activations"], opt["temporaries"] = 0, opt["temporaries"] + opt["activations"]
    for row in rows:
        row.setdefault("kv_cache", int(step.engine_fraction * gpu_bytes) if step.engine_awake else 0)
        row["peak"] += row["kv_cache"]
    return rows


def plannable(model):
    """`model` as the planner runs it: its forward is rllava's training forward (`_token_logprobs` on a Batch),
    so that an FSDP2 root's hooks run around it as around rllava's registered forward method; Qwen-VL's
    get_rope_index on real values (it reads the ids)."""
    from rllava.model.forward import _token_logprobs

    backbone = getattr(model, model.base_model_prefix)
    if hasattr(backbone, "get_rope_index"):
        backbone.get_rope_index = _on_real_values(backbone.get_rope_index)
    model.forward = types.MethodType(_token_logprobs, model)
    return model


def policy_from_config(cfg, device: str = "cuda"):
    """(model, transformers config) of `actor.model` as rllava.model.loader.build_policy makes it: Auto class, dtype
    (actor.model.torch_dtype; None = bfloat16 on `device` cuda, float32 on cpu), attention, then the training
    switches (frozen parts, LoRA, gradient checkpointing). Inside `fake_mode()` the weights are fake."""
    from rllava.model.loader import auto_class, make_trainable, resolve_dtype

    m = cfg.actor.model
    config = model_config(m.model_path)
    for k, v in (m.override_config or {}).items():
        setattr(config, k, v)
    model = auto_class(config).from_config(config, dtype=resolve_dtype(m.torch_dtype, torch.device(device)),
                                           attn_implementation=m.attn_implementation)
    return make_trainable(model, m, torch.device("cpu")), config


def unplanned(cfg) -> list[str]:
    """What this config's step holds that the planner does not count, or counts another way, for the table."""
    from rllava.config.schema import resolve_strategy

    return [what for what, on in (
        ("the critic", cfg.critic is not None),
        (f"DeepSpeed: planned as FSDP2 (ZeRO-3's sharding) with the actor.fsdp.* offload switches; its ZeRO-"
         f"{cfg.actor.deepspeed.zero_stage} and actor.deepspeed.enable_cpu_offload are not planned",
         resolve_strategy(cfg.actor.strategy) == "deepspeed"),
        ("actor.model.enable_activation_offload: checkpointed activations planned on the device",
         cfg.actor.model.enable_activation_offload),
        ("the exact KL's second model in the update (actor.kl_loss_type=full, algorithm.distill.loss=full): its "
         "hidden states and the chunked vocabulary buffers", (cfg.algorithm.use_kl_loss and cfg.actor.kl_loss_type ==
         "full") or (cfg.algorithm.use_kl_in_reward and cfg.algorithm.kl_penalty == "full") or (
             _distill_needs(cfg, "full_kl"))),
        ("algorithm.distill.offload: the teachers planned resident", cfg.algorithm.distill.offload),
        (f"algorithm.distill.engine={cfg.algorithm.distill.engine}: the teacher's engine and its share of the GPU",
         cfg.algorithm.distill.engine != "hf")) if on]


def reference(cfg, policy, shard=None):
    """The frozen reference policy rllava builds when a KL uses it (rllava.train.builders.build_reference_role):
    a copy of the policy's starting weights, or ref.model_path's; the policy itself for LoRA without
    ref.model_path (its adapters off); None without a KL. `shard`: FSDP2's, as the engine's shard_frozen."""
    from rllava.train.builders import needs_reference

    if not needs_reference(cfg):
        return None
    if cfg.actor.model.use_peft and not cfg.ref.model_path:
        return policy
    same = not cfg.ref.model_path or cfg.ref.model_path == cfg.actor.model.model_path
    return _frozen(cfg, policy.config if same else model_config(cfg.ref.model_path, "ref.model_path"), policy, shard)


def teachers(cfg, policy, shard=None) -> list:
    """algorithm.distill's teachers as rllava builds them in the trainer (engine=hf; builders.build_distillation):
    teacher_path's and each of teachers' models, frozen, planned resident (offload=true too: named in `unplanned`)."""
    from rllava.train.builders import distill_routes

    if not cfg.algorithm.distill.on or cfg.algorithm.distill.engine != "hf":
        return []
    return [_frozen(cfg, model_config(path, key), policy, shard) for key, path in distill_routes(cfg).values()]


def _distill_needs(cfg, name: str) -> bool:
    """The configured distillation loss declares `name` (rllava.roles.actor.Distillation.needs)."""
    from rllava.roles.actor import Distillation
    from rllava.train.builders import distill_loss

    return cfg.algorithm.distill.on and Distillation(distill_loss(cfg), 0.0, None).needs(name)


def _frozen(cfg, config, policy, shard):
    from rllava.model.loader import auto_class

    model = auto_class(config).from_config(config, dtype=policy.dtype,
                                           attn_implementation=cfg.actor.model.attn_implementation)
    model = model.requires_grad_(False).eval()
    return plannable(shard(model) if shard else model)


def plan(cfg, gpu_bytes: int | None = None, device: str = "cuda", world: int = 1) -> list[dict]:
    """The phase rows of one step of `cfg` on one of `world` ranks (see the module docstring), each with `fits`
    (None: no GPU size)."""
    from rllava.config.schema import resolve_strategy
    from rllava.engine.train.fsdp2 import mixed_precision_policy, shard_model

    strategy = resolve_strategy(cfg.actor.strategy, world, cfg.actor.fsdp, device)
    if world > 1 and strategy == "single":
        raise RllavaError(f"--world-size {world} with actor.strategy=single: several ranks shard with fsdp2 "
                          "(actor.strategy=auto or fsdp2)")
    if cfg.rollout.name != "hf" and gpu_bytes is None:
        raise RllavaError(f"rollout.name={cfg.rollout.name} reserves a fraction of the GPU while it samples: give "
                          "--gpu-memory")
    with (fake_world(world) if strategy != "single" else contextlib.nullcontext()) as mesh, fake_mode():
        model, config = policy_from_config(cfg, device)
        step = step_of(cfg, config, world, device)
        shard = None if mesh is None else functools.partial(
            shard_model, device=torch.device("cpu"), mp=mixed_precision_policy(cfg.actor.fsdp.mixed_precision),
            cpu_offload=step.host_shards, mesh=mesh)
        kv = kv_cache_bytes(config, step, model.dtype)
        model = plannable(shard(model, reshard_after_forward=cfg.actor.fsdp.reshard_after_forward) if shard else model)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
        rows = run_phases(model, optimizer, step, kv, reference(cfg, model, shard), gpu_bytes,
                          teachers(cfg, model, shard), _distill_needs(cfg, "teacher_logprobs"))
    for row in rows:
        row["fits"] = None if gpu_bytes is None else row["peak"] <= gpu_bytes
    return rows


def fixes(cfg, world: int = 1, device: str = "cuda") -> list[tuple[str, list[str], int]]:
    """The single changes that lower a step's peak, least intrusive first, as (what, overrides, world size):
    gradient checkpointing, halving each micro-batch (or token budget), the optimizer on the host
    (actor.fsdp.enable_cpu_offload: under FSDP2 the shards too), LoRA, FSDP2 on the same GPUs (one device: so
    that the offload takes the weights too), twice the GPUs."""
    from rllava.config.schema import resolve_strategy

    a, out = cfg.actor, []
    if not a.model.enable_gradient_checkpointing:
        out.append("actor.model.enable_gradient_checkpointing=true")
    if a.model.dynamic_batching:
        out += [f"{key}={value // 2}" for key, value in (
            ("actor.ppo_max_token_len_per_gpu", a.ppo_max_token_len_per_gpu),
            ("actor.log_prob_max_token_len_per_gpu", a.log_prob_max_token_len_per_gpu))]
    else:
        out += [f"{key}={value // 2}" for key, value in (("actor.ppo_micro_batch_size", a.ppo_micro_batch_size),
                ("actor.log_prob_micro_batch_size", a.log_prob_micro_batch_size)) if value > 1]
    if cfg.rollout.name == "hf" and cfg.rollout.micro_batch_size > 1:
        out.append(f"rollout.micro_batch_size={cfg.rollout.micro_batch_size // 2}")
    if not a.fsdp.enable_cpu_offload:
        out.append("actor.fsdp.enable_cpu_offload=true")
    if not a.model.use_peft:
        out.append("actor.model.use_peft=true")
    changes = [(c, [c], world) for c in out]
    if resolve_strategy(a.strategy, world, a.fsdp, device) == "single":  # FSDP2: with the offload, weights on host
        sharded = ["actor.strategy=fsdp2"]
        if not a.fsdp.enable_cpu_offload:
            sharded.append("actor.fsdp.enable_cpu_offload=true")
        changes.append((" ".join(sharded), sharded, world))
    if resolve_strategy(a.strategy, 2) != "single":
        changes.append((f"--world-size {2 * world}", [], 2 * world))
    return changes


def suggest(overrides: list[str], gpu_bytes: int, device: str = "cuda", world: int = 1) -> list[tuple[str, int]]:
    """(change, step peak) of each of `fixes` re-planned on top of the command line's `overrides` (not guessed),
    then, if none fits alone, of all of them together."""
    from rllava.config import load_config

    def peak(extra: list[str], ranks: int) -> int:
        return max(r["peak"] for r in plan(load_config([*overrides, *extra]), gpu_bytes, device, ranks))

    changes = fixes(load_config(overrides), world, device)
    tried = [(what, peak(extra, ranks)) for what, extra, ranks in changes]
    if changes and not any(p <= gpu_bytes for _, p in tried):
        tried.append((" ".join(what for what, _, _ in changes),
                      peak([o for _, extra, _ in changes for o in extra], max(r for _, _, r in changes))))
    return tried


def parse_size(text: str) -> int:
    """'24GiB', '80GB', '24G', '512MiB' or a number of bytes -> bytes (GB and G are read as GiB, as GPUs are sold)."""
    match = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)(i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise RllavaError(f"--gpu-memory={text!r}: expected a size such as 24GiB or 80GB")
    return int(float(match.group(1)) * 1024 ** "_KMGT".index(match.group(2).upper() or "_"))


def show(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB / 10 else f"{n / 2 ** 20:.1f} MiB"


def table(rows: list[dict], gpu_bytes: int | None) -> str:
    """The plan as one text table: a row per phase, a column per kind of memory, the peak and whether it fits."""
    cols = ["parameters", "gradients", "optimizer", "activations", "kv_cache", "temporaries", "peak"]
    head = ["phase", *cols] + (["fits"] if gpu_bytes else [])
    body = [[r["phase"], *(show(r[c]) for c in cols)] + (["yes" if r["fits"] else "NO"] if gpu_bytes else [])
            for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(str(x).rjust(w) for x, w in zip(line, widths)) for line in [head, *body]]
    peak = max(r["peak"] for r in rows)
    verdict = "" if not gpu_bytes else f" of {show(gpu_bytes)}: {'fits' if peak <= gpu_bytes else 'does NOT fit'}"
    return "\n".join(lines + [f"step peak {show(peak)}{verdict} (tensors only: add ~1-2 GiB for the CUDA context "
                                  "and the allocator's cache)"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rllava.commands.memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="config=FILE and key=value overrides, as for training")
    parser.add_argument("--gpu-memory", type=str, default=None, help="the GPU's memory, e.g. 24GiB or 80GB")
    parser.add_argument("--world-size", type=int, default=1, help="GPUs the run shards over (FSDP2), as torchrun's")
    args = parser.parse_intermixed_args(argv)
    try:
        from rllava.config import load_config

        gpu = parse_size(args.gpu_memory) if args.gpu_memory else None
        cfg = load_config(args.overrides)
        if args.world_size < 1:
            raise RllavaError(f"--world-size={args.world_size} must be at least 1")
        for what in unplanned(cfg):
            print(f"note: {what}")
        rows = plan(cfg, gpu, world=args.world_size)
        print(table(rows, gpu))
        if gpu and max(r["peak"] for r in rows) > gpu:
            print("changes, each planned again:")
            for change, peak in suggest(args.overrides, gpu, world=args.world_size):
                print(f"  {change}: step peak {show(peak)} ({'fits' if peak <= gpu else 'does NOT fit'})")
    except RllavaError as e:
        print(f"rllava: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
