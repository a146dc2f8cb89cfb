"""Rollout with vLLM, colocated: each training process holds its own vLLM engine on its own GPU(s).

Written against vLLM 0.33 (V1 engine; the calls below exist since 0.10):

- `LLM(..., distributed_executor_backend="external_launcher", enable_sleep_mode=True)` runs the model inside
  this process (no engine-core subprocess; `VLLM_ENABLE_V1_MULTIPROCESSING=0`), under torchrun's ranks, as TRL's
  `vllm_mode="colocate"` and verl's SPMD rollout do. `rollout.tensor_parallel_size` consecutive ranks form one
  tensor-parallel engine: they pool their prompts, each generates them all, and each keeps its own share.
- `load(model)`: `wake_up(tags=["weights"])`, then the policy's current weights (LoRA merged) go in by HF name
  through `collective_rpc(fn)`, which calls `fn(worker)` in this process, and
  `worker.model_runner.model.load_weights(weights)` maps HF names to vLLM's fused layers; then
  `wake_up(tags=["kv_cache"])`. `offload()`: `sleep(level=1)` frees the KV cache and moves weights to the CPU.
- `generate`: `{"prompt_token_ids", "multi_modal_data"}` prompts (vLLM's processor expands the placeholders),
  `SamplingParams(logprobs=0)` returns the sampled token's log-prob, after temperature
  (`logprobs_mode="processed_logprobs"`), which is what the trainer computes at the same temperature.
"""

from __future__ import annotations

import os
import random

import torch
import torch.distributed as dist

from rllava.engine.inference.base import Completion, GenerationRequest, SamplingParams, weight_buckets
from rllava.errors import RllavaError

BAN = -100.0  # logit bias that keeps a token from being sampled (exp(-100) ~ 1e-44; OpenAI's bound)


def _load_weights(worker, weights):
    """Runs on the vLLM worker (here: in this process): HF-named tensors into the model's own layout."""
    worker.model_runner.model.load_weights(weights=weights)


class VLLMRolloutEngine:
    """vLLM behind the RolloutEngine interface; `engine_kwargs` are passed to `vllm.LLM` as they are
    (dtype, gpu_memory_utilization, max_model_len, enforce_eager, ... from `rollout.vllm.*`)."""

    shares_train_model = False

    def __init__(self, *, model_path: str, stop_token_ids: list[int], banned_token_ids: list[int],
                 tensor_parallel_size: int, seed: int | None, load_format: str, bucket_mb: int,
                 stay_awake: bool = False, **engine_kwargs):
        try:
            import vllm
        except ImportError as e:
            raise RllavaError('rollout.name=vllm needs vLLM, which is not installed: pip install "rllava[vllm]"') from e
        self.vllm = vllm
        self.stop_token_ids, self.bucket_mb = stop_token_ids, bucket_mb
        self.logit_bias = {t: BAN for t in banned_token_ids}
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                           ("MASTER_PORT", str(_free_port()))):
            os.environ.setdefault(key, value)  # a plain `python -m` run: a world of one
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process (external_launcher)
        self.tp_group = _tp_group(tensor_parallel_size)
        # the ranks of one tensor-parallel engine must sample identically: they share a seed; engines differ
        if seed is None:  # rollout.seed=null: a fresh one
            shared = [random.SystemRandom().randrange(2**31)]
            if self.tp_group is not None:
                dist.broadcast_object_list(shared, group_src=0, group=self.tp_group)
            seed = shared[0]
        else:
            seed += int(os.environ["RANK"]) // tensor_parallel_size
        self.llm = vllm.LLM(model=model_path, tensor_parallel_size=tensor_parallel_size, seed=seed,
                            load_format=load_format, distributed_executor_backend="external_launcher",
                            enable_sleep_mode=True, logprobs_mode="processed_logprobs", **engine_kwargs)
        self.stay_awake = stay_awake  # rollout.async_mode (RLLaVA's): the engine keeps its memory between rollouts
        if not stay_awake:
            self.llm.sleep(level=1)

    def load(self, model: torch.nn.Module) -> None:
        if not self.stay_awake:
            self.llm.wake_up(tags=["weights"])
        for bucket in weight_buckets(model, self.bucket_mb):
            self.llm.collective_rpc(_load_weights, args=(bucket,))
        if not self.stay_awake:
            self.llm.wake_up(tags=["kv_cache"])
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the previous weights

    def offload(self) -> None:
        if not self.stay_awake:
            self.llm.sleep(level=1)

    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        greedy = sampling.temperature == 0
        params = self.vllm.SamplingParams(
            n=1 if greedy else sampling.n, temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k, max_tokens=sampling.max_new_tokens, stop_token_ids=self.stop_token_ids,
            logprobs=0, logit_bias=self.logit_bias or None)
        mine, everyone = len(requests), _gather(requests, self.tp_group)
        outputs = self.llm.generate([_prompt(r) for r in everyone], params, use_tqdm=False)
        start = dist.get_rank(self.tp_group) * mine if self.tp_group is not None else 0
        grouped = [[_completion(c) for c in out.outputs] for out in outputs[start:start + mine]]
        return [g * sampling.n for g in grouped] if greedy else grouped  # greedy samples are identical


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


def _tp_group(tp: int):
    """This rank's tensor-parallel group (consecutive ranks), or None for tp = 1."""
    if tp == 1:
        return None
    world = dist.get_world_size()
    group, _ = dist.new_subgroups_by_enumeration([list(range(i, i + tp)) for i in range(0, world, tp)])
    return group


def _gather(requests: list[GenerationRequest], group) -> list[GenerationRequest]:
    """Every rank's requests, in rank order, within the tensor-parallel group (equal counts: `D.shard`)."""
    if group is None:
        return requests
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, [GenerationRequest(r.prompt_ids, {}, r.raw_prompt_ids, r.images, r.videos)
                                      for r in requests], group=group)  # pixel tensors stay home
    return [r for rank_requests in everyone for r in rank_requests]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
