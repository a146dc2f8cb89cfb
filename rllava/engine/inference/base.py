"""The rollout-engine interface: continue a batch of conversations, K samples each.

An engine only *continues* token sequences; the driver (single-turn `rllava.roles.rollout`, or a multi-turn
agent) owns the conversation. `load(model)` syncs the current policy weights into the engine before rollout
and `offload()` frees its memory afterwards; `generate_context` wraps both so the pipeline never asks which
engine runs (HF generate shares the training model; vLLM/SGLang hold a copy).
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Protocol

import torch

from rllava.errors import RllavaError
from rllava.model.processor import get_tokenizer


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1  # completions per request
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    max_new_tokens: int = 512


@dataclass
class GenerationRequest:
    prompt_ids: list[int]  # the conversation so far, image placeholders already expanded
    mm_inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # pixel_values, image_grid_thw, ...
    # For engines that run the processor themselves (vLLM, SGLang): the same conversation with one
    # <|image_pad|> / <|video_pad|> per image / video (not expanded), and the raw images and videos
    raw_prompt_ids: list[int] | None = None
    images: list = field(default_factory=list)  # PIL images (Sample.images)
    videos: list = field(default_factory=list)  # rllava.data.video.Video (Sample.videos)


@dataclass
class Completion:
    token_ids: list[int]  # generated tokens, up to and including EOS
    logprobs: list[float]  # sampling log-prob of each generated token
    finish_reason: str  # "stop" or "length"


class RolloutEngine(Protocol):
    # True when the engine samples with the training model itself (HF generate): the train engine must then
    # keep its weights on the device during rollout; engines with their own copy let it offload them.
    shares_train_model: bool

    def load(self, model: torch.nn.Module) -> None: ...
    def offload(self) -> None: ...
    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]: ...


def copy_greedy(grouped: list[list[Completion]], sampling: SamplingParams) -> list[list[Completion]]:
    """Greedy samples are identical: one was drawn per request, copied `n` times instead of recomputed."""
    return [g * sampling.n for g in grouped] if sampling.temperature == 0 else grouped


class ColocatedEngine:
    """What the vLLM and SGLang engines share: weights of their own, asleep (`_sleep`: GPU memory freed) outside
    `load` .. `offload` and `score` unless `stay_awake` (RLLaVA's rollout.async_mode: memory kept between rollouts)."""

    shares_train_model = False

    @classmethod
    def from_config(cls, cfg, *, pad_token_id: int, stop_token_ids: list[int], banned_token_ids: list[int],
                    device: torch.device, model=None, **overrides):
        """rollout.* and the engine's own keys (`_options`), `overrides` over them (a teacher's
        algorithm.distill.engine_kwargs). `model`: a teacher's model_path / tokenizer_path / trust_remote_code, the
        context length left to the engine; None: actor.model, data.max_prompt_length + max_response_length."""
        r, m = cfg.rollout, model or cfg.actor.model
        max_len = cfg.data.max_prompt_length + cfg.data.max_response_length if model is None else None
        return cls(model_path=m.model_path, stop_token_ids=stop_token_ids, banned_token_ids=banned_token_ids,
                   seed=r.seed, load_format=r.load_format, bucket_mb=r.bucket_size,
                   trust_remote_code=m.trust_remote_code, stay_awake=r.async_mode,
                   **{**cls._options(cfg, m, max_len, device), **overrides})

    @staticmethod
    def _import(module: str, name: str):
        try:
            return importlib.import_module(module)
        except ImportError as e:
            raise RllavaError(f'rollout.name={module} needs {name}, which is not installed: '
                              f'pip install "rllava[{module}]"') from e

    def offload(self) -> None:
        if not self.stay_awake:
            self._sleep()

    def score(self, requests: list[GenerationRequest]) -> list[list[float]]:
        """log p(x_t | x_<t) at temperature 1 of every token of each request's whole sequence, as the engine
        processed it (placeholders expanded): entry t is token t's log-prob given tokens < t; entry 0 is 0.0.
        For an engine holding its own weights (a teacher): awake for the call only, asleep again after it."""
        if not self.stay_awake:
            self._wake()
        try:
            return self._score(requests)
        finally:
            self.offload()


def weight_buckets(model: torch.nn.Module, bucket_mb: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The policy's current weights as (HF parameter name, full tensor) lists of about `bucket_mb` MB each, for an
    engine that holds its own copy. LoRA adapters are merged into the base weights (`merged_state_dict`), so the
    engine sees a plain model. FSDP2 shards (DTensors) are gathered one parameter at a time: every rank must
    call this, in the same order (the gather is a collective)."""
    from torch.distributed.tensor import DTensor

    from rllava.model.lora import has_lora, merged_state_dict

    def full(t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, DTensor):
            return t.detach()
        if t.device.type == "cpu" and torch.cuda.is_available():  # offloaded shards: NCCL gathers on the GPU
            t = t.cuda()
        return t.full_tensor().detach()

    state = model.state_dict()
    if has_lora(model):  # merging needs whole A, B and W
        state = merged_state_dict(model, {k: full(v) for k, v in state.items()})
    bucket, size = [], 0
    for name, tensor in state.items():
        tensor = full(tensor)
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= bucket_mb * 2**20:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


@contextmanager
def generate_context(engine: RolloutEngine, train_engine):
    """Sync the policy from `train_engine` into `engine` for the duration of the block, then free the rollout
    engine's memory. The train engine gets the device ready first (`rollout_phase`: FSDP2 gathers its shards
    for HF generate; with a separate engine it may offload its own weights)."""
    with train_engine.rollout_phase(engine.shares_train_model):
        engine.load(train_engine.model)
        try:
            yield engine
        finally:
            engine.offload()


ROLLOUT_ENGINES = {"hf": "rllava.engine.inference.hf:HFRolloutEngine",  # rollout.name -> its class (lazily:
                   "vllm": "rllava.engine.inference.vllm:VLLMRolloutEngine",  # vLLM and SGLang are optional
                   "sglang": "rllava.engine.inference.sglang:SGLangRolloutEngine"}  # extras)
VISION_PLACEHOLDERS = ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>"]


def build_rollout_engine(cfg, pad_token_id: int, stop_token_ids: list[int], banned_token_ids: list[int],
                         device: torch.device, model=None, **overrides) -> RolloutEngine:
    """rollout.name's engine, reading its own keys: `hf` samples with the training model, `vllm` / `sglang` hold a copy
    synced before each rollout. `model`: another config than actor.model; `overrides`: over rollout.vllm / sglang's."""
    module, name = ROLLOUT_ENGINES[cfg.rollout.name].split(":")
    return getattr(importlib.import_module(module), name).from_config(
        cfg, pad_token_id=pad_token_id, stop_token_ids=stop_token_ids, banned_token_ids=banned_token_ids,
        device=device, model=model, **overrides)


def engine_for(cfg, processor, device: torch.device, model=None, ignore_eos: bool = False) -> RolloutEngine:
    """The rollout engine for the model of `processor`: its EOS ends a response (unless `ignore_eos`), vision
    placeholders are never sampled. `model`: another model's config than the policy's (a judge)."""
    tok = get_tokenizer(processor)
    vocab = tok.get_vocab()
    banned = [vocab[t] for t in VISION_PLACEHOLDERS if t in vocab]
    return build_rollout_engine(cfg, tok.pad_token_id, [] if ignore_eos else [tok.eos_token_id], banned, device,
                                model=model)
