"""Rollout with SGLang's offline `Engine`, colocated: each training process starts one engine on its own GPU.

Written against SGLang 0.5 (`sglang.Engine`, python/sglang/srt/entrypoints/engine.py):

- `Engine(model_path=..., enable_memory_saver=True, base_gpu_id=LOCAL_RANK, ...)` starts the scheduler
  subprocesses; `release_memory_occupation()` / `resume_memory_occupation()` free and restore the weights and
  the KV cache (torch_memory_saver), so the trainer has the GPU outside rollout.
- `load(model)`: resume, then `update_weights_from_tensor(named_tensors, flush_cache=...)` with the policy's
  current weights (LoRA merged) by HF name, in `rollout.bucket_size` MB buckets (CUDA tensors travel to the
  scheduler as IPC handles); the radix cache is flushed after the last bucket.
- `generate(input_ids=..., image_data=..., video_data=..., sampling_params=..., return_logprob=True)`: each
  result has `output_ids`, `meta_info["output_token_logprobs"]` as (logprob, token_id, text) and
  `meta_info["finish_reason"]["type"]` ("stop" / "length" / "abort"). A request is repeated n times (one
  sample each) rather than using SGLang's `n`, so the results line up with the requests without bookkeeping.
"""

from __future__ import annotations

import torch

from rllava import distributed as D
from rllava.engine.inference.base import Completion, GenerationRequest, SamplingParams, weight_buckets
from rllava.engine.inference.vllm import BAN
from rllava.errors import RllavaError


class SGLangRolloutEngine:
    """SGLang behind the RolloutEngine interface; `engine_kwargs` go to `sglang.Engine` (ServerArgs names:
    dtype, mem_fraction_static, context_length, trust_remote_code, ...)."""

    shares_train_model = False

    def __init__(self, *, model_path: str, stop_token_ids: list[int], banned_token_ids: list[int],
                 tensor_parallel_size: int, seed: int | None, load_format: str, bucket_mb: int,
                 gpu_id: int, stay_awake: bool = False, **engine_kwargs):
        try:
            import sglang
        except ImportError as e:
            raise RllavaError('rollout.name=sglang needs SGLang, which is not installed: '
                              'pip install "rllava[sglang]"') from e
        self.stop_token_ids, self.bucket_mb = stop_token_ids, bucket_mb
        self.logit_bias = {str(t): BAN for t in banned_token_ids}  # SGLang keys token ids as strings
        if seed is not None:
            engine_kwargs["random_seed"] = seed + D.rank()  # one engine per rank: distinct streams
        self.engine = sglang.Engine(model_path=model_path, tp_size=tensor_parallel_size, base_gpu_id=gpu_id,
                                    load_format=load_format, enable_memory_saver=True, **engine_kwargs)
        self.stay_awake = stay_awake  # rollout.async_mode (RLLaVA's): no release / resume between rollouts
        if not stay_awake:
            self.engine.release_memory_occupation()

    def load(self, model: torch.nn.Module) -> None:
        if not self.stay_awake:
            self.engine.resume_memory_occupation()
        buckets = weight_buckets(model, self.bucket_mb)
        bucket = next(buckets, None)
        while bucket is not None:
            following = next(buckets, None)
            self.engine.update_weights_from_tensor(bucket, flush_cache=following is None)
            bucket = following

    def offload(self) -> None:
        if not self.stay_awake:
            self.engine.release_memory_occupation()

    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        greedy = sampling.temperature == 0
        k = 1 if greedy else sampling.n
        rows = [r for r in requests for _ in range(k)]
        params = {"n": 1, "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                  "max_new_tokens": sampling.max_new_tokens, "stop_token_ids": self.stop_token_ids,
                  "skip_special_tokens": False}
        if self.logit_bias:
            params["logit_bias"] = self.logit_bias
        mm = {}
        if any(r.images for r in rows):
            mm["image_data"] = [list(r.images) for r in rows]
        if any(r.videos for r in rows):  # frames as [T, H, W, C] arrays, already sampled and sized
            mm["video_data"] = [[v.array() for v in r.videos] for r in rows]
        outputs = self.engine.generate(
            input_ids=[r.raw_prompt_ids if r.raw_prompt_ids is not None else r.prompt_ids for r in rows],
            sampling_params=params, return_logprob=True, **mm)
        completions = [_completion(o) for o in outputs]
        grouped = [completions[i * k:(i + 1) * k] for i in range(len(requests))]
        return [g * sampling.n for g in grouped] if greedy else grouped  # greedy samples are identical


def _completion(out: dict) -> Completion:
    meta = out["meta_info"]
    return Completion(list(out["output_ids"]), [lp for lp, _, _ in meta["output_token_logprobs"]],
                      "length" if meta["finish_reason"]["type"] == "length" else "stop")
