"""One configured step's device memory, phase by phase (see rllava.train.memory), its batching and reference as
the trainer's builders decide them, and the single changes that lower its peak, each planned again."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import types
from dataclasses import dataclass

import torch
from torch.distributed.fsdp import FSDPModule

from rllava.train.memory.fake import fake_mode, on_real_values, real_values
from rllava.train.memory.torch_private import (device_peak, fake_constants, fake_process_group, fsdp_groups,
                                                  gathered, real_tensors, scale_)
from rllava.errors import RllavaError
from rllava.model import ulysses

GiB = 1024 ** 3


def show(n: int) -> str:
    """Bytes as GiB (or MiB below a tenth of one)."""
    return f"{n / GiB:.2f} GiB" if n >= GiB / 10 else f"{n / 2 ** 20:.1f} MiB"


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
    with real_tensors():  # plain tensors; in a fake mode they become constants
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
    return fake_constants(inputs)


def plan_batch(model, step: "Step", rows: int):
    """A rllava Batch of `rows` trajectories of the planned shapes: consecutive groups of rollout.n rows share
    their prompt and its image (as a group's samples do), each response as long as the config allows but the
    last row's, one token shorter (a batch is padded)."""
    from rllava.data.protocol import Batch, Segment, Trajectory

    media = []
    for _ in range(-(-rows // step.n)):  # one image (the same tensors) per group
        one = model_inputs(model, step, 1, step.response)
        media.append({k: one[k] for k in ("pixel_values", "image_grid_thw") if k in one})
    ids = real_values(one["input_ids"])[0].tolist()
    trajectories = [Trajectory(sample=None, group_id=i // step.n, mm_inputs=media[i // step.n],
                               segments=[Segment(ids[:step.prompt], trained=False),
                                         Segment(ids[step.prompt:], trained=True)]) for i in range(rows)]
    with real_tensors():
        mask = torch.ones(rows, len(ids), dtype=torch.long)
        mask[-1, -1] = 0
        loss_mask = mask.float()
        loss_mask[:, :step.prompt] = 0
        tensors = dict(input_ids=torch.tensor([ids] * rows), attention_mask=mask, loss_mask=loss_mask,
                       group_ids=torch.arange(rows) // step.n)
    return Batch(trajectories=trajectories, **fake_constants(tensors))


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
    keep_gathered: int = 0  # FSDP2: the last units gathered from forward to backward (actor.fsdp.keep_gathered_units)


def _rows(batching, length: int, rows: int) -> int:
    """Sequences in the first micro-batch the trainer's `batching` (a MicroBatching) splits `rows` sequences of
    `length` tokens into: its size, or as many as its token budget holds (at least one)."""
    from rllava.roles.batching import chunks, token_budget_groups

    return len(chunks(rows, batching.size)[0] if batching.max_tokens is None else
               token_budget_groups([length] * rows, batching.max_tokens, packed=batching.padding_free)[0])


def rank_rows(cfg, world: int = 1) -> tuple[int, int]:
    """(sequences of one step, sequences of its first mini-batch) on one of `world` ranks, as build_actor splits."""
    from rllava.roles.batching import chunks

    rows = max(1, cfg.data.train_batch_size * cfg.rollout.n // world)
    return rows, len(chunks(rows, max(1, cfg.actor.ppo_mini_batch_size * cfg.rollout.n // world))[0])


def step_of(cfg, config, world: int = 1, device: str = "cuda") -> Step:
    """`Step` of one rank from rllava's config `cfg`, the model's transformers `config`, the number of ranks and
    the run's device (which engine `actor.strategy=auto` picks). The micro-batches are the trainer's: the Actor's
    MicroBatching of build_actor's keywords (builders._actor_batching), the reference's of builders._ref_batching."""
    from rllava.config.schema import resolve_strategy
    from rllava.roles.batching import MicroBatching
    from rllava.train.builders import _actor_batching, _ref_batching

    a, d, fsdp, r, b = cfg.actor, cfg.data, cfg.actor.fsdp, cfg.rollout, _actor_batching(cfg)
    layout = (b["padding_free"], b["shared_prefix"])
    rows, mini = rank_rows(cfg, world)
    length = d.max_prompt_length + d.max_response_length
    update = _rows(MicroBatching(a.ppo_micro_batch_size, b["max_token_len"], *layout), length, mini)
    sharded = resolve_strategy(a.strategy, world, fsdp, device) != "single"
    host_opt = fsdp.enable_cpu_offload or (sharded and fsdp.offload_params)  # FSDP2: either is CPUOffloadPolicy
    return Step(prompt=d.max_prompt_length, response=d.max_response_length,
                grid=image_grid(config, d.max_pixels, d.max_prompt_length),
                gen_prompts=max(1, min(r.micro_batch_size, d.train_batch_size // world)), n=r.n,
                logprob_rows=_rows(MicroBatching(a.log_prob_micro_batch_size, b["log_prob_max_token_len"], *layout),
                                   length, rows),
                ref_rows=_rows(_ref_batching(cfg), length, rows), update_rows=update, accumulates=update < mini,
                forward=dict(chunk_size=b["logprob_chunk_size"], padding_free=layout[0], shared_prefix=layout[1]),
                max_grad_norm=a.max_grad_norm,
                optimizer_on_device=(not (fsdp.offload_optimizer or host_opt), not host_opt),
                host_shards=sharded and host_opt, engine=r.name,
                engine_fraction={"vllm": r.vllm.gpu_memory_utilization,
                                 "sglang": r.sglang.mem_fraction_static or 0.0}.get(r.name, 0.0),
                engine_awake=r.async_mode and r.name != "hf",
                params_off_in_rollout=fsdp.offload_params, sync_bucket=r.bucket_size * 2 ** 20,
                keep_gathered=fsdp.keep_gathered_units if sharded else 0)


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
    with gathered(model) as weights, torch.no_grad():
        getattr(model, model.base_model_prefix)(**model_inputs(model, step, step.gen_prompts, 0), use_cache=False)
    return weights


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
    """(c) the update: one micro-batch forward (with the entropy, as the actor's loss) and backward; under FSDP2
    the last step.keep_gathered units gathered from forward to backward, as the engine's update_phase keeps them."""
    from rllava.engine.train.fsdp2 import gathered_to_backward

    model.train()
    with gathered_to_backward(model, step.keep_gathered):
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
    scale_(grads, (step.max_grad_norm / (norm + 1e-6)).clamp(max=1.0))
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


def tracked(run, model, optimizer, *external, host: tuple[str, ...] = (), echo: int = 0) -> dict[str, int]:
    """The peak bytes on the device of `run()` and, at that peak, the bytes of each kind (COLUMNS), measured by
    torch's MemTracker (FSDPMemTracker for an FSDP2 model); `model`, `optimizer` and `external` (modules) exist
    before `run` and are counted too, except the kinds in `host`; `echo`: a tied weight's gradient bytes (see
    torch_private._DevicePeak)."""
    snap = device_peak(run, model, optimizer, *external, host=host, echo=echo)
    row = {c: sum(snap.get(k, 0) for k in kinds if k not in host) for c, kinds in COLUMNS.items()}
    return {**row, "peak": sum(row.values())}


def run_phases(model, optimizer, step: Step, kv_bytes: int = 0, ref=None, gpu_bytes: int | None = None,
               teachers=(), teacher_pass: bool = False, echo: int = 0, only: tuple[str, ...] | None = None) -> list[dict]:
    """One row per phase of the step: its peak bytes by kind on one device. Runs on a real or a fake model alike
    (whose `forward` is rllava's `_token_logprobs`: see `plannable`). The optimizer state exists from the start
    (a step after the first); the frozen reference `ref`, if any, is resident in every phase and has a log-prob
    pass of its own (`ref` is `model` itself for LoRA's adapter-free base); so are the distillation `teachers`,
    whose pass (`teacher_pass`: a sampled-token loss) runs each on the reference's micro-batch. `kv_bytes`: the
    HF engine's KV cache, added to the rollout; vLLM / SGLang reserve step.engine_fraction of `gpu_bytes` instead.
    `echo`: a tied weight's gradient bytes (tracked's). `only`: the phases to run (None: all)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)  # a step starts without gradients
    adam_states(optimizer)  # as a previous step left them
    frozen = ([ref] if ref is not None and ref is not model else []) + list(teachers)
    shards = ("Sharded Param", "Sharded Grad", "OptState") if step.host_shards else ()
    opt_off = ("Optstate", "OptState")

    def phase(name, run, *host):
        return dict(phase=name, **tracked(run, model, optimizer, *frozen, host=tuple(set(shards + host)), echo=echo))

    def wanted(name: str) -> bool:
        return only is None or name in only

    between, rows = (() if step.optimizer_on_device[0] else opt_off), []
    if wanted("rollout") and step.engine == "hf":
        gathered = []
        rows.append(phase("rollout", lambda: gathered.append(prefill_pass(model, step)), *between))
        moved = min(gathered[0], rows[0]["activations"])  # FSDP2's gathered weights are parameters
        rows[0].update(kv_cache=kv_bytes, parameters=rows[0]["parameters"] + moved,
                       activations=rows[0]["activations"] - moved)
    elif wanted("rollout"):  # the engine samples on its own copy; the trainer's weights stay unless offload_params
        weights = (("Parameter", "Buffer", "Gradient", "Sharded Param", "Sharded Grad")  # moves them
                   if step.params_off_in_rollout else ())
        rows.append(phase("rollout", lambda: None, *between, *weights))
        rows[0]["kv_cache"] = int(step.engine_fraction * gpu_bytes)
        rows[0]["temporaries"] += step.sync_bucket  # the weight sync's gathered bucket, beside the woken engine
        rows[0]["peak"] += step.sync_bucket
    if wanted("old log-prob"):
        rows.append(phase("old log-prob", lambda: logprob_pass(model, step), *between))
    if ref is not None and wanted("ref log-prob"):
        rows.append(phase("ref log-prob", lambda: ref_pass(ref, step), *between))
    if teachers and teacher_pass and wanted("teacher log-prob"):
        rows.append(phase("teacher log-prob", lambda: [logprob_pass(t, step, step.ref_rows) for t in teachers],
                          *between))
    during = () if step.optimizer_on_device[1] else opt_off
    for p in trainable if step.accumulates else []:  # a later micro-batch: the earlier ones' gradients are held
        p.grad = torch.zeros_like(p)
    if wanted("update"):
        rows.append(phase("update", lambda: update_pass(model, step), *during))
    if wanted("optimizer"):
        rows.append(phase("optimizer", lambda: optimizer_pass(model, optimizer, step), *during))
        opt = rows[-1]  # no activation lives in the optimizer phase: what the trackers file so is the step's scratch
        opt["activations"], opt["temporaries"] = 0, opt["temporaries"] + opt["activations"]
    if step.host_shards:  # CPUOffloadPolicy: each shard is copied to the device as its all-gather's input, and the
        copy = max((_local(f.sharded_param).nbytes for g in fsdp_groups(model) for f in g.fsdp_params), default=0)
        for row in (r for r in rows if r["phase"] in ("old log-prob", "update")):  # largest copy meets the unit's
            held = row["parameters"] + row["gradients"] + row["optimizer"]  # gathered weights (no copy on the
            if held + copy > row["peak"]:  # planner's CPU mesh; H200, Qwen3-VL-4B: the embedding's 0.72 GiB copy
                row.update(activations=0, temporaries=copy, peak=held + copy)  # made the old log-prob's peak)
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
        backbone.get_rope_index = on_real_values(backbone.get_rope_index)
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
    from rllava.train.builders import needs_reference

    return [what for what, on in (
        ("the critic", cfg.critic is not None),
        (f"DeepSpeed: planned as FSDP2 (ZeRO-3's sharding) with the actor.fsdp.* offload switches; its ZeRO-"
         f"{cfg.actor.deepspeed.zero_stage} and actor.deepspeed.enable_cpu_offload are not planned",
         resolve_strategy(cfg.actor.strategy) == "deepspeed"),
        ("actor.model.enable_activation_offload: checkpointed activations planned on the device",
         cfg.actor.model.enable_activation_offload),
        ("the exact KL's second model in the update (actor.kl_loss_type=full, algorithm.distill.loss=full): its "
         "hidden states and the chunked vocabulary buffers", needs_reference(cfg) and "full" in (
             cfg.actor.kl_loss_type if cfg.algorithm.use_kl_loss else None,
             cfg.algorithm.kl_penalty if cfg.algorithm.use_kl_in_reward else None) or _distill_needs(cfg, "full_kl")),
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
    ulysses.enable(model)  # as load_frozen: its passes cut like the policy's
    return plannable(shard(model) if shard else model)


def plan(cfg, gpu_bytes: int | None = None, device: str = "cuda", world: int = 1) -> list[dict]:
    """The phase rows of one step of `cfg` on one of `world` ranks (see the module docstring), each with `fits`
    (None: no GPU size)."""
    with planned(cfg, gpu_bytes, device, world) as (run, _, _):
        rows = run()
    for row in rows:
        row["fits"] = None if gpu_bytes is None else row["peak"] <= gpu_bytes
    return rows


@contextlib.contextmanager
def planned(cfg, gpu_bytes: int | None = None, device: str = "cuda", world: int = 1):
    """`cfg`'s policy (fake weights), optimizer, reference and teachers built once, as `plan` plans them; yields
    (run, step, units): run(step=step, only=None) -> `run_phases`' rows of that Step (another micro-batch: see
    rllava.train.memory.auto), of the phases in `only` (None: all); units: the policy's FSDP2 units (0: unsharded)."""
    from rllava.config.schema import AUTO_SIZES, resolve_strategy
    from rllava.engine.train.fsdp2 import mixed_precision_policy, shard_model

    strategy = resolve_strategy(cfg.actor.strategy, world, cfg.actor.fsdp, device)
    if world > 1 and strategy == "single":
        raise RllavaError(f"--world-size {world} with actor.strategy=single: several ranks shard with fsdp2 "
                          "(actor.strategy=auto or fsdp2)")
    if strategy != "single" and torch.distributed.is_initialized():  # FSDP2 shards over a fake group of its own
        raise RllavaError("the planner shards over a fake process group of its own: plan before torch.distributed "
                          "is initialised (or in another process)")
    if (sp := cfg.actor.model.ulysses_size) > 1 and world % sp:
        raise RllavaError(f"actor.model.ulysses_size={sp} splits each sequence over {sp} ranks: give --world-size "
                          f"a multiple of {sp}")
    if cfg.rollout.name != "hf" and gpu_bytes is None:
        raise RllavaError(f"rollout.name={cfg.rollout.name} reserves a fraction of the GPU while it samples: give "
                          "--gpu-memory")
    if "auto" in [getattr(cfg.actor, k) for k in AUTO_SIZES] + [cfg.actor.fsdp.keep_gathered_units]:
        raise RllavaError("the plan of an actor size set to auto: size it first (rllava.train.memory.auto.resolve)")
    with (fake_process_group(world) if strategy != "single" else contextlib.nullcontext()) as mesh, fake_mode(), \
            ulysses.groups(sp):  # Ulysses: the training passes' decoders on 1/sp of each sequence, as they run
        model, config = policy_from_config(cfg, device)
        step = step_of(cfg, config, world, device)
        mp = mixed_precision_policy(cfg.actor.fsdp.mixed_precision)
        shard = None if mesh is None else functools.partial(
            shard_model, device=torch.device("cpu"), mp=mp, cpu_offload=step.host_shards, mesh=mesh,
            forward_prefetch=cfg.actor.fsdp.forward_prefetch)
        kv = kv_cache_bytes(config, step, model.dtype)
        head = model.get_output_embeddings()
        tied = head is not None and head.weight is model.get_input_embeddings().weight and head.weight.requires_grad
        echo = head.weight.numel() * ((shard and mp.param_dtype) or head.weight.dtype).itemsize if tied else 0
        model = plannable(shard(model, reshard_after_forward=cfg.actor.fsdp.reshard_after_forward) if shard else model)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
        ref, frozen = reference(cfg, model, shard), teachers(cfg, model, shard)
        teacher_pass = _distill_needs(cfg, "teacher_logprobs")

        def run(step: Step = step, only: tuple[str, ...] | None = None) -> list[dict]:
            return run_phases(model, optimizer, step, kv, ref, gpu_bytes, frozen, teacher_pass, echo, only)
        yield run, step, sum(isinstance(m, FSDPModule) for m in model.modules() if m is not model)


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


