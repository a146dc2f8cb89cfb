"""The rollout-engine interface: continue a batch of conversations, K samples each.

An engine only *continues* token sequences; the driver (single-turn `rllava.roles.rollout`, or a multi-turn
agent) owns the conversation. `load(model)` syncs the current policy weights into the engine before rollout
and `offload()` frees its memory afterwards; `generate_context` wraps both so the pipeline never asks which
engine runs (HF generate shares the training model; vLLM/SGLang hold a copy).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch


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
