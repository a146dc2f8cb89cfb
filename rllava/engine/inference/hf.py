"""Rollout with Hugging Face `generate` on the training model itself (no weight copy, works everywhere)."""

from __future__ import annotations

import inspect
import logging

import torch
from transformers import (CompileConfig, DynamicCache, GenerationConfig, LogitsProcessor, LogitsProcessorList,
                          StaticCache, StoppingCriteria, StoppingCriteriaList, TemperatureLogitsWarper,
                          TopKLogitsWarper, TopPLogitsWarper)
from transformers.cache_utils import DynamicLayer, StaticLayer

from rllava.config.schema import HF_DECODE_MODES
from rllava.data.protocol import concat_mm
from rllava.engine.inference.base import Completion, GenerationRequest, SamplingParams, copy_greedy
from rllava.errors import ConfigError
from rllava.model.forward import modality_types
from rllava.model.modular import CACHE_KWARG

log = logging.getLogger(__name__)


class HFRolloutEngine:
    """Left-pads `micro_batch_size` requests at a time and samples `n` completions per request.

    `stop_token_ids` end a completion (the tokenizer's EOS); `banned_token_ids` (image/video placeholders) are
    never sampled: one in a response would break the training forward's image-token count ("image features and
    image tokens do not match").

    Each prompt (images included) is prefilled once and its KV cache copied for its n samples, instead of
    `generate`'s n full copies (`num_return_sequences`): the vision tower and the prompt's layers run once per
    prompt, not n times (benchmarks/vs_trl.py).

    Each sampled token's log-prob under the distribution it was drawn from is taken as it is sampled
    (`SampledLogProbs`), not from `generate`'s `output_scores`, which keeps every step's [rows, vocabulary] fp32
    scores until the end: 80 GB for 256 rows of 512 tokens on a 152k vocabulary. `generate` gets a GenerationConfig
    of its own, so a checkpoint's generation_config.json (Qwen-VL's repetition_penalty, top_k) never leaks in.

    `decode` (rollout.hf_decode) is the cache the samples are decoded with:
      eager    the prefill's DynamicCache, grown by one column per token (torch.cat each step, shapes change);
      static   a StaticCache of [N * n rows, heads, L, head_dim] per layer, L = P + max_new_tokens rounded up to a
               multiple of STATIC_ROUND: the prefill's keys/values are copied into its first P - 1 columns (each
               prompt's repeated n times) and every decode step writes one column in place and attends over all L
               under a [rows, 1, 1, L] mask, so each step has the same shapes (same tokens and log-probs as eager);
      compiled static, and `generate` compiles the decode step (torch.compile of the model's forward, CUDA graphs:
               transformers' CompileConfig defaults, mode reduce-overhead); CUDA and the single-device train
               engine only (the config refuses it beside FSDP2 / DeepSpeed: not built for sharded weights yet).
               L is rounded, and one StaticCache refilled per rollout, so that micro-batches of near lengths
               share one compiled graph.
    The static cache serves models whose text layers are all full attention in plain KV layers (Qwen2-VL,
    Qwen2.5-VL, Qwen3-VL, Qwen2/Qwen3 LMs, the modular VLMs over them); any other (sliding-window or linear
    attention layers) keeps the eager path, with a warning once (`static_cache_ok`)."""

    shares_train_model = True

    @classmethod
    def from_config(cls, cfg, *, pad_token_id: int, stop_token_ids: list[int], banned_token_ids: list[int],
                    device: torch.device, model=None, **overrides) -> "HFRolloutEngine":
        """rollout.micro_batch_size and rollout.hf_decode (`model`, `overrides`: a separate engine's, unused)."""
        if cfg.rollout.hf_decode == "compiled" and torch.device(device).type != "cuda":
            raise ConfigError(f"rollout.hf_decode=compiled compiles the decode step for CUDA graphs; this run's "
                              f"device is {device}: use rollout.hf_decode=static (no compile) or eager")
        return cls(pad_token_id=pad_token_id, stop_token_ids=stop_token_ids, banned_token_ids=banned_token_ids,
                   micro_batch_size=cfg.rollout.micro_batch_size, device=device, decode=cfg.rollout.hf_decode)

    def __init__(self, *, pad_token_id: int, stop_token_ids: list[int], banned_token_ids: list[int],
                 micro_batch_size: int, device: torch.device, decode: str = "eager"):
        if decode not in HF_DECODE_MODES:
            raise ValueError(f"decode={decode!r} is not one of {HF_DECODE_MODES}")
        if decode == "compiled" and torch.device(device).type != "cuda":
            raise ValueError(f"decode=compiled compiles the decode step for CUDA graphs: it needs a CUDA device "
                             f"(this one is {device}); decode=static is the same cache without the compile")
        self.decode, self.pad_token_id, self.stop_token_ids = decode, pad_token_id, stop_token_ids
        self.banned_token_ids, self.micro_batch_size, self.device = banned_token_ids, micro_batch_size, device
        self.model, self._static = None, None

    def load(self, model: torch.nn.Module) -> None:
        self.model, self._static, self._was_training = model, None, model.training
        model.eval()

    def offload(self) -> None:
        if self.model is not None and self._was_training:
            self.model.train()
        self.model, self._static = None, None

    @torch.no_grad()
    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        if self.model is None:
            raise RuntimeError("HFRolloutEngine.generate called outside generate_context (no model loaded)")
        out = []
        for s in range(0, len(requests), self.micro_batch_size):
            out += self._generate(requests[s:s + self.micro_batch_size], sampling)
        return out

    def _generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        P = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((len(requests), P), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for i, r in enumerate(requests):  # left padding: every prompt ends at column P
            input_ids[i, P - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            attention_mask[i, P - len(r.prompt_ids):] = 1
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask,
                  **concat_mm([r.mm_inputs for r in requests])}
        types = modality_types(self.model, input_ids)
        if types is not None and ("image_grid_thw" in inputs or "video_grid_thw" in inputs):
            inputs["mm_token_type_ids"] = types
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        greedy = sampling.temperature == 0
        n = 1 if greedy else sampling.n
        static = self.decode != "eager" and static_cache_ok(self.model)
        compiled = static and self.decode == "compiled"
        if n > 1 or static:  # a static cache of L = P + max_new_tokens columns, rounded up to STATIC_ROUND
            L = -(-(P + sampling.max_new_tokens) // STATIC_ROUND) * STATIC_ROUND
            inputs = self._prefill_once(inputs, n, L if static else None)
        record = SampledLogProbs()
        warpers = [] if greedy else [warper(value) for warper, value, on in (  # generate's order, before the recorder
            (TemperatureLogitsWarper, sampling.temperature, sampling.temperature != 1.0),
            (TopKLogitsWarper, sampling.top_k, sampling.top_k > 0),
            (TopPLogitsWarper, sampling.top_p, sampling.top_p < 1.0)) if on]
        config = GenerationConfig(  # the warpers are ours: none of generate's own (they would run after the recorder)
            do_sample=not greedy, **({} if greedy else dict(temperature=1.0, top_k=0, top_p=1.0)),
            max_new_tokens=sampling.max_new_tokens, eos_token_id=self.stop_token_ids, pad_token_id=self.pad_token_id,
            suppress_tokens=self.banned_token_ids or None, num_return_sequences=1,
            disable_compile=not compiled, compile_config=CompileConfig() if compiled else None)
        # generate fills every field left unset from the model's own generation_config (the checkpoint's file):
        # a clean one stands in for it meanwhile, so only generate's neutral defaults fill them
        own, self.model.generation_config = self.model.generation_config, GenerationConfig()
        try:
            sequences = self.model.generate(**inputs, generation_config=config,
                                            logits_processor=LogitsProcessorList([*warpers, record]),
                                            stopping_criteria=StoppingCriteriaList([record]))
        finally:
            self.model.generation_config = own
        new_tokens = sequences[:, P:].cpu()  # [N * n, L]
        token_logps = torch.stack(record.logps[:new_tokens.shape[1]], 1).cpu() if new_tokens.shape[1] else \
            torch.zeros(new_tokens.shape)  # [N * n, L]
        completions = []
        for ids, logps in zip(new_tokens.tolist(), token_logps.tolist()):
            stop = next((j for j, t in enumerate(ids) if t in self.stop_token_ids), None)
            end = len(ids) if stop is None else stop + 1
            completions.append(Completion(ids[:end], logps[:end], "length" if stop is None else "stop"))
        return copy_greedy([completions[i * n:(i + 1) * n] for i in range(len(requests))], sampling)

    def _prefill_once(self, inputs: dict, n: int, static_len: int | None = None) -> dict:
        """Run every prompt but its last token through the model once, then copy the KV cache n times: `generate`
        goes on from the copies with the last token, so each of the n samples starts from its prompt's one
        prefill. Qwen-VL's M-RoPE offsets (`rope_deltas`, set by the prefill) are copied with the rows.
        `static_len`: the copies go into a StaticCache of that many columns (`static_copy`) instead."""
        cache, params = DynamicCache(), inspect.signature(self.model.forward).parameters
        prefix = {k: v[:, :-1] if k in ("input_ids", "attention_mask", "mm_token_type_ids") else v
                  for k, v in inputs.items()}
        if "position_ids" in params:  # as `generate` makes them: over the left padding (and M-RoPE's 3-D ones)
            prefix["position_ids"] = self.model._prepare_position_ids_for_generation(prefix["input_ids"], dict(prefix))
        self.model(**prefix, **{CACHE_KWARG: cache}, use_cache=True, logits_to_keep=1)
        if static_len is None:
            cache.batch_repeat_interleave(n)
        else:  # one StaticCache per rollout, refilled by each micro-batch of its shape (freed by `offload`)
            keys, old = cache.layers[0].keys, self._static.layers[0] if self._static is not None else None
            if old is not None and (old.batch_size, old.max_cache_len, old.keys.dtype) != \
                    (keys.shape[0] * n, static_len, keys.dtype):
                self._static = None  # another shape: freed before the next one is allocated
            del keys, old
            cache = self._static = static_copy(self.model, cache, n, static_len, self._static)
        inner = getattr(self.model, "model", None)
        if getattr(inner, "rope_deltas", None) is not None:
            inner.rope_deltas = inner.rope_deltas.repeat_interleave(n, dim=0)
        return {"input_ids": inputs["input_ids"].repeat_interleave(n, dim=0),
                "attention_mask": inputs["attention_mask"].repeat_interleave(n, dim=0), CACHE_KWARG: cache}


STATIC_ROUND = 128  # a static cache's length, P + max_new_tokens, rounded up to a multiple of this (fewer graphs)


def static_cache_ok(model) -> bool:
    """Whether the static decode path serves `model`: its StaticCache would be plain full-attention layers
    (StaticLayer, keys/values [rows, heads, L, head_dim]) matching the DynamicCache's DynamicLayers the prefill
    fills, layer for layer. Sliding-window, chunked, linear-attention or shared-KV layers keep the eager path."""
    ok = getattr(model, "_rllava_static_ok", None)
    if ok is None:
        static, dynamic = StaticCache(config=model.config, max_cache_len=1), DynamicCache(config=model.config)
        ok = len(static.layers) == len(dynamic.layers) and \
            all(type(a) is StaticLayer for a in static.layers) and all(type(b) is DynamicLayer for b in dynamic.layers)
        if not ok:
            log.warning("rollout.hf_decode: %s has layers other than full attention: it decodes with the eager "
                        "(dynamic) cache", type(model).__name__)
        model._rllava_static_ok = ok
    return ok


def static_copy(model, cache: DynamicCache, n: int, length: int, reuse: StaticCache | None = None) -> StaticCache:
    """A StaticCache of `length` columns holding `cache`'s keys/values [N, heads, t, head_dim] in columns
    0 .. t - 1, each row repeated n times (repeat_interleave order: prompt i's samples are rows i*n .. i*n + n - 1);
    its length counters read t, so `generate` writes the next token at column t. One layer is copied at a time
    (the only temporary; each copied layer of `cache` is freed). `reuse`: a filled StaticCache of the same rows,
    length and dtype, refilled instead of a new one (same addresses: compiled CUDA graphs are not recorded again)."""
    static = reuse if reuse is not None else StaticCache(config=model.config, max_cache_len=length)
    static.reset()
    for src, dst in zip(cache.layers, static.layers):
        dst.update(src.keys.repeat_interleave(n, dim=0), src.values.repeat_interleave(n, dim=0))
        src.keys = src.values = None
    return static


class SampledLogProbs(LogitsProcessor, StoppingCriteria):
    """Last of `generate`'s logits processors, it keeps the scores the sampler draws from; as a stopping criterion
    (run right after the draw, the drawn token last in `input_ids`) it stores that token's log-prob, [rows], and
    never stops a row. One step's scores are held at a time."""

    def __init__(self):
        self.scores, self.logps = None, []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor | None):
        if isinstance(scores, torch.Tensor):  # as a logits processor
            self.scores = scores
            return scores
        self.logps.append(torch.log_softmax(self.scores.float(), -1).gather(-1, input_ids[:, -1:])[:, 0])
        self.scores = None
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
