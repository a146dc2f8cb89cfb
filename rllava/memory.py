"""Will it fit? The device memory of one configured RL step, planned without weights and without a GPU:

    python -m rllava.memory config=examples/tasks/counting/tiny_cpu.yaml k=v ... [--gpu-memory 24GiB]

The policy is built from its config.json under torch's FakeTensorMode (tensors with shapes and dtypes, no
storage) and each phase of one step runs on it under torch's `MemTracker`, which adds up every live tensor and
keeps the peak by kind (parameters, gradients, optimizer state, activations, temporaries):

  rollout       HF engine: a prefill forward (no grad) of one generate call's prompts, and its KV cache, counted
                from the config: 2 (K, V) x layers x kv_heads x head_dim x dtype bytes per token, for
                rollout.micro_batch_size prompts x rollout.n samples x (max_prompt_length + max_response_length).
  old log-prob  a forward without grad of actor.log_prob_micro_batch_size sequences (LM head chunked by
                actor.logprob_chunk_size, as rllava.model.forward runs it).
  ref log-prob  with a KL (algorithm.use_kl_loss, use_kl_in_reward): the same on the frozen reference (a copy of
                the starting weights, resident in every phase), ref.log_prob_micro_batch_size sequences.
  update        a forward + backward of actor.ppo_micro_batch_size sequences, gradient checkpointing as
                configured, beside the gradients of the mini-batch's earlier micro-batches where it has several.
  optimizer     gradient clipping and torch.optim.AdamW's step (foreach kernels, as on CUDA): 2 states per
                trainable parameter, in the parameters' dtype; none on the device with
                actor.fsdp.enable_cpu_offload (the step runs on the host), outside the update with
                actor.fsdp.offload_optimizer.

Every phase holds the weights, and the optimizer state a previous step left. Every sequence is as long as the
config allows, every prompt holds one square image as large as data.max_pixels and max_prompt_length allow
(Qwen-VL: one token per merged (patch x 2)^2 pixels; the image's tokens count in the prompt's length). One
device. Not counted: the CUDA context and the allocator's cache and fragmentation (~1-2 GiB on a real GPU),
the generate loop's own transients.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import re
import sys
from dataclasses import dataclass

import torch
import torch._subclasses.fake_tensor as fake_tensor
import torch.utils._pytree as pytree
from torch._guards import active_fake_mode
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


def model_config(path: str | None):
    """The transformers config of `actor.model.model_path`: a local model directory's config.json, or a hub id
    from SEED_MODELS (nothing is downloaded)."""
    from transformers import AutoConfig

    if path and os.path.isdir(path):
        return AutoConfig.from_pretrained(path)
    if path in SEED_MODELS:
        seed = SEED_MODELS[path]
        return AutoConfig.for_model(seed["model_type"], **{k: v for k, v in seed.items() if k != "model_type"})
    raise RllavaError(f"actor.model.model_path={path!r}: no such local directory, and not a model the planner knows "
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


def response_logprobs(model, inputs: dict, response: int, *, chunk_size: int, with_entropy: bool) -> torch.Tensor:
    """log p of each response token, as rllava.model.forward computes it: the backbone's last hidden states at
    the positions whose next token is trained ([N, H]), then the LM head `chunk_size` tokens at a time."""
    from rllava.model.forward import logprobs_from_hidden

    backbone, head = getattr(model, model.base_model_prefix), model.get_output_embeddings()
    hidden = backbone(**inputs, use_cache=False).last_hidden_state[:, -response - 1:-1]
    labels = inputs["input_ids"][:, -response:].reshape(-1)
    lp, _ = logprobs_from_hidden(head, hidden.reshape(-1, hidden.shape[-1]), labels, with_entropy=with_entropy,
                                 chunk_size=chunk_size)
    return lp


def _constants(tree):
    """Inside a fake mode: small integer tensors as fake *constants* (their values kept, so that the model's
    index arithmetic on ids and grids runs); big tensors are fake already."""
    mode = active_fake_mode()
    if mode is None:
        return tree
    return pytree.tree_map_only(torch.Tensor, lambda t: t if isinstance(t, fake_tensor.FakeTensor) else
                                mode.fake_tensor_converter.from_real_tensor(mode, t, make_constant=True), tree)


def _on_real_values(fn):
    """`fn` run on the real values of its (constant) arguments, outside the fake mode: transformers' vision_utils
    helpers compute index tensors from the image grids with ops a fake tensor cannot answer (.tolist(), nonzero)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        args, kwargs = pytree.tree_map_only(fake_tensor.FakeTensor, lambda t: t if t.constant is None else t.constant,
                                            (args, kwargs))
        with fake_tensor.unset_fake_temporarily():
            out = fn(*args, **kwargs)
        return _constants(out)
    run.rllava_original = fn
    return run


def _vision_helpers():
    """(module, name) of every transformers `get_vision_*` helper bound in a loaded module."""
    import transformers.vision_utils as vision_utils

    return [(mod, name) for mod in list(sys.modules.values())
            if getattr(mod, "__name__", "").startswith("transformers.models.") or mod is vision_utils
            for name in list(vars(mod)) if name.startswith("get_vision_")]


@contextlib.contextmanager
def fake_mode():
    """FakeTensorMode in which a Qwen-VL forward runs: integer tensors up to 2^24 elements stay constants, and
    transformers' `get_vision_*` helpers run on real values (`_on_real_values`; a modeling module imported inside
    binds the wrapped helper, and is restored on exit too)."""
    for mod, name in _vision_helpers():
        if getattr(mod, name).__module__ == "transformers.vision_utils":
            setattr(mod, name, _on_real_values(getattr(mod, name)))
    limit, fake_tensor.CONSTANT_NUMEL_LIMIT = fake_tensor.CONSTANT_NUMEL_LIMIT, 1 << 24
    try:
        with fake_tensor.FakeTensorMode(allow_non_fake_inputs=True):
            yield
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = limit
        for mod, name in _vision_helpers():
            setattr(mod, name, getattr(getattr(mod, name), "rllava_original", getattr(mod, name)))


@dataclass
class Step:
    """The sizes of one configured step that decide its memory (read from the config by `step_of`)."""
    prompt: int
    response: int
    grid: tuple[int, int]
    gen_prompts: int  # prompts per HF generate call (rollout.micro_batch_size)
    n: int  # samples per prompt
    logprob_rows: int  # sequences per old-log-prob forward
    ref_rows: int  # sequences per reference log-prob forward (ref.log_prob_micro_batch_size)
    update_rows: int  # sequences per update forward + backward
    accumulates: bool  # several micro-batches per mini-batch: the later ones run beside the earlier ones' gradients
    chunk: int  # actor.logprob_chunk_size
    max_grad_norm: float
    optimizer_on_device: tuple[bool, bool]  # (between updates, during the update): offload_optimizer / cpu optimizer


def step_of(cfg, config) -> Step:
    """`Step` from rllava's config `cfg` and the model's transformers `config`."""
    a, d, fsdp = cfg.actor, cfg.data, cfg.actor.fsdp
    rows = d.train_batch_size * cfg.rollout.n
    return Step(prompt=d.max_prompt_length, response=d.max_response_length,
                grid=image_grid(config, d.max_pixels, d.max_prompt_length),
                gen_prompts=min(cfg.rollout.micro_batch_size, d.train_batch_size), n=cfg.rollout.n,
                logprob_rows=min(a.log_prob_micro_batch_size, rows), ref_rows=min(cfg.ref.log_prob_micro_batch_size, rows),
                update_rows=min(a.ppo_micro_batch_size, a.ppo_mini_batch_size * cfg.rollout.n, rows),
                accumulates=a.ppo_micro_batch_size < min(a.ppo_mini_batch_size * cfg.rollout.n, rows),
                chunk=a.logprob_chunk_size, max_grad_norm=a.max_grad_norm,
                optimizer_on_device=(not (fsdp.offload_optimizer or fsdp.enable_cpu_offload),
                                     not fsdp.enable_cpu_offload))


def kv_cache_bytes(config, step: Step, dtype: torch.dtype) -> int:
    """The HF engine's KV cache for one generate call, counted (not run): K and V, per layer, per KV head, of
    head_dim values, for gen_prompts x n sequences of prompt + response tokens, in the model's dtype."""
    text = config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    tokens = step.gen_prompts * step.n * (step.prompt + step.response)
    return 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * tokens * dtype.itemsize


def prefill_pass(model, step: Step) -> None:
    """(a) the rollout's prefill: one generate call's prompts through the backbone, no grad (the KV cache it
    writes is counted by `kv_cache_bytes`)."""
    with torch.no_grad():
        getattr(model, model.base_model_prefix)(**model_inputs(model, step, step.gen_prompts, 0), use_cache=False)


def logprob_pass(model, step: Step, rows: int | None = None) -> None:
    """(b) old log-probs (and the reference's, `rows` = its micro-batch): one micro-batch forward without grad."""
    with torch.no_grad():
        response_logprobs(model, model_inputs(model, step, rows or step.logprob_rows, step.response), step.response,
                          chunk_size=step.chunk, with_entropy=False)


def update_pass(model, step: Step) -> None:
    """(c) the update: one micro-batch forward (with the entropy, as the actor's loss) and backward."""
    model.train()
    lp = response_logprobs(model, model_inputs(model, step, step.update_rows, step.response), step.response,
                           chunk_size=step.chunk, with_entropy=True)
    (-lp.mean()).backward()


def optimizer_pass(model, optimizer, step: Step) -> None:
    """(d) clip the gradients, step AdamW (on the device), drop the gradients (zero_grad(set_to_none=True))."""
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], step.max_grad_norm,
                                   foreach=True)
    if step.optimizer_on_device[1]:
        optimizer.step()
    model.zero_grad(set_to_none=True)


COLUMNS = {"parameters": ("Parameter", "Buffer"), "gradients": ("Gradient",), "optimizer": ("Optstate",),
           "activations": ("Activation",), "temporaries": ("Temp", "Other")}


class PeakTracker(MemTracker):
    """torch's MemTracker keeping only the device-wide peak: it skips the per-module peaks, which cost a pass over
    every module of the model at every op (minutes for a 3B model)."""

    def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
        # a frozen parameter (the reference, a frozen tower) takes no gradient hook: torch refuses one; a module
        # mixing both leaves its parameters to its submodules' hooks
        return super()._track_module_params_and_buffers(
            module, install_grad_hooks=install_grad_hooks and all(p.requires_grad for p in module.parameters()))

    def _update_peak_stats(self, peak_state) -> None:
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap["Total"]:
                self._peak_mem[dev], self._peak_mem_snap[dev] = snap["Total"], dict(snap)


def tracked(run, *external) -> dict[str, int]:
    """The peak bytes of `run()` and, at that peak, the bytes of each kind (COLUMNS), measured by torch's
    MemTracker; `external`: the model / optimizer whose tensors exist before `run` (counted too)."""
    tracker = PeakTracker()
    tracker.track_external(*external)
    with tracker:
        run()
    snap = {k.value if hasattr(k, "value") else k: v for dev in tracker.get_tracker_snapshot("peak").values()
            for k, v in dev.items()}
    return {**{c: sum(snap.get(k, 0) for k in kinds) for c, kinds in COLUMNS.items()}, "peak": snap.get("Total", 0)}


def run_phases(model, optimizer, step: Step, kv_bytes: int = 0, ref=None) -> list[dict]:
    """One row per phase of the step: its peak bytes by kind, `kv_cache` added to the rollout's. Runs on a real
    or a fake model alike. The optimizer state exists from the start (a step after the first); the frozen
    reference `ref`, if any, is resident in every phase and has a log-prob pass of its own."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:  # AdamW's states, as a previous step left them
        p.grad = torch.zeros_like(p)
    optimizer.step()
    model.zero_grad(set_to_none=True)
    frozen = [ref] if ref is not None else []
    resident = [*frozen, optimizer] if step.optimizer_on_device[0] else frozen
    rows = [dict(phase="rollout", **tracked(lambda: prefill_pass(model, step), model, *resident)),
            dict(phase="old log-prob", **tracked(lambda: logprob_pass(model, step), model, *resident))]
    if ref is not None:
        rows.append(dict(phase="ref log-prob", **tracked(lambda: logprob_pass(ref, step, step.ref_rows), model,
                                                         *resident)))
    resident = [*frozen, optimizer] if step.optimizer_on_device[1] else frozen
    for p in trainable if step.accumulates else []:  # a later micro-batch: the earlier ones' gradients are held
        p.grad = torch.zeros_like(p)
    rows.append(dict(phase="update", **tracked(lambda: update_pass(model, step), model, *resident)))
    rows.append(dict(phase="optimizer", **tracked(lambda: optimizer_pass(model, optimizer, step), model, *resident)))
    update, opt = rows[-2], rows[-1]
    extra = opt["optimizer"] - update["optimizer"]  # MemTracker counts the step's scratch as optimizer state
    opt["optimizer"], opt["temporaries"] = update["optimizer"], opt["temporaries"] + extra
    for row in rows:
        row["kv_cache"] = kv_bytes if row["phase"] == "rollout" else 0
        row["peak"] += row["kv_cache"]
    return rows


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
    """What this config's step holds that the planner does not count yet (issue 34), for the table's footer."""
    return [what for what, on in (("the critic", cfg.critic is not None),
                                  (f"rollout.name={cfg.rollout.name}'s own reservation (planned as the HF engine)",
                                   cfg.rollout.name != "hf")) if on]


def reference(cfg, policy):
    """The frozen reference policy rllava builds when a KL uses it (rllava.train.builders.build_reference_role):
    a copy of the policy's starting weights, or ref.model_path's; None without a KL."""
    from rllava.model.loader import auto_class
    from rllava.train.builders import needs_reference

    if not needs_reference(cfg):
        return None

    same = not cfg.ref.model_path or cfg.ref.model_path == cfg.actor.model.model_path
    config = policy.config if same else model_config(cfg.ref.model_path)
    ref = auto_class(config).from_config(config, dtype=policy.dtype,
                                         attn_implementation=cfg.actor.model.attn_implementation)
    return ref.requires_grad_(False).eval()


def plan(cfg, gpu_bytes: int | None = None, device: str = "cuda") -> list[dict]:
    """The phase rows of one step of `cfg` (see the module docstring), each with `fits` (None: no GPU size)."""
    if cfg.actor.model.use_peft:
        raise RllavaError("actor.model.use_peft=true: the planner does not plan LoRA yet (issue 34); plan the "
                          "full-parameter run, an upper bound")
    with fake_mode():
        model, config = policy_from_config(cfg, device)
        step = step_of(cfg, config)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
        rows = run_phases(model, optimizer, step, kv_cache_bytes(config, step, model.dtype), reference(cfg, model))
    for row in rows:
        row["fits"] = None if gpu_bytes is None else row["peak"] <= gpu_bytes
    return rows


def fixes(cfg) -> list[str]:
    """The single changes that lower a step's peak, least intrusive first: gradient checkpointing, halving each
    micro-batch, the optimizer on the host (actor.fsdp.enable_cpu_offload)."""
    a, out = cfg.actor, []
    if not a.model.enable_gradient_checkpointing:
        out.append("actor.model.enable_gradient_checkpointing=true")
    for key, value in (("actor.ppo_micro_batch_size", a.ppo_micro_batch_size),
                       ("actor.log_prob_micro_batch_size", a.log_prob_micro_batch_size),
                       ("rollout.micro_batch_size", cfg.rollout.micro_batch_size)):
        if value > 1:
            out.append(f"{key}={value // 2}")
    if not a.fsdp.enable_cpu_offload:
        out.append("actor.fsdp.enable_cpu_offload=true")
    return out


def suggest(overrides: list[str], gpu_bytes: int, device: str = "cuda") -> list[tuple[str, int]]:
    """(change, step peak) of each of `fixes` re-planned on top of the command line's `overrides` (not guessed),
    then, if none fits alone, of all of them together."""
    from rllava.config import load_config

    def peak(extra: list[str]) -> int:
        return max(r["peak"] for r in plan(load_config([*overrides, *extra]), None, device))

    changes = fixes(load_config(overrides))
    tried = [(change, peak([change])) for change in changes]
    if changes and not any(p <= gpu_bytes for _, p in tried):
        tried.append((" ".join(changes), peak(changes)))
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
    parser = argparse.ArgumentParser(prog="python -m rllava.memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="config=FILE and key=value overrides, as for training")
    parser.add_argument("--gpu-memory", type=str, default=None, help="the GPU's memory, e.g. 24GiB or 80GB")
    args = parser.parse_intermixed_args(argv)
    try:
        from rllava.config import load_config

        gpu = parse_size(args.gpu_memory) if args.gpu_memory else None
        cfg = load_config(args.overrides)
        for what in unplanned(cfg):
            print(f"note: not counted yet: {what}")
        rows = plan(cfg, gpu)
        print(table(rows, gpu))
        if gpu and max(r["peak"] for r in rows) > gpu:
            print("changes, each planned again:")
            for change, peak in suggest(args.overrides, gpu):
                print(f"  {change}: step peak {show(peak)} ({'fits' if peak <= gpu else 'does NOT fit'})")
    except RllavaError as e:
        print(f"rllava: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
