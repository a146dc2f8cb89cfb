"""Rollout with SGLang's offline `Engine`, colocated: each training process starts one engine on its own GPU.

Written against SGLang 0.5 (`sglang.Engine`, python/sglang/srt/entrypoints/engine.py):

- `Engine(model_path=..., enable_memory_saver=True, base_gpu_id=LOCAL_RANK, ...)` starts the scheduler
  subprocesses; `release_memory_occupation()` / `resume_memory_occupation()` free and restore the weights and
  the KV cache (torch_memory_saver), so the trainer has the GPU outside rollout.
- `load(model)`: resume, then `update_weights_from_tensor(named_tensors, flush_cache=...)` with the policy's
  current weights (LoRA merged) by HF name, in `rollout.bucket_size` MB buckets (CUDA tensors travel to the
  scheduler as IPC handles), flushing the radix cache after the last bucket.
- `generate(input_ids=..., image_data=..., video_data=..., sampling_params=..., return_logprob=True)`: each
  result has `output_ids`, `meta_info["output_token_logprobs"]` as (logprob, token_id, text) and
  `meta_info["finish_reason"]["type"]` ("stop" / "length" / "abort"). A request is repeated n times (one
  sample each) rather than using SGLang's `n`, so the results line up with the requests.
- `score` (a frozen teacher's log-probs of sequences the student sampled, for on-policy distillation): the same
  inputs with `return_logprob=True, logprob_start_len=0, sampling_params={"max_new_tokens": 0, "temperature": 1}`.
  From SGLang's sources:
  - `max_new_tokens=0` is valid (`>= 0`: python/sglang/srt/sampling/sampling_params.py `verify`): a prefill-only
    request (python/sglang/srt/managers/schedule_batch.py `Req.is_prefill_only`: nothing is sampled), as SGLang's
    own scoring API sends (`score_request`, python/sglang/srt/managers/tokenizer_manager.py, later
    tokenizer_manager_score_mixin.py).
  - `meta_info["input_token_logprobs"]` is one (logprob, token_id, text) per input token from
    `logprob_start_len`, the first padded with logprob None and the last position's next-token log-prob popped
    (python/sglang/srt/managers/scheduler_output_processor_mixin.py `add_input_logprob_return_values`), over the
    processed input (placeholders expanded; image positions carry pad ids there, so their entries mean nothing).
  - The log-probs are `log_softmax(logits / temperature)`, renormalized under top-p only when top_p != 1
    (python/sglang/srt/layers/logits_processor.py `compute_temp_top_p_normalized_logprobs`): at temperature 1 and
    the default top_p, the raw model's.
  - An input must be shorter than the context length (`input + max_new_tokens >= context_len` is refused:
    tokenizer_manager.py `_validate_one_request`).
  - `release_memory_occupation()` (no tags: all of them) pauses the "weights" region of torch_memory_saver after
    stashing only the model's buffers (`_export_static_state`: `named_buffers()`), and resume restores just those
    (python/sglang/srt/managers/scheduler_update_weights_mixin.py); a paused region comes back undefined unless
    allocated with `enable_cpu_backup` (torch_memory_saver's own cpu-backup example asserts so). The model is
    loaded inside `region(GPU_MEMORY_TYPE_WEIGHTS, enable_cpu_backup=server_args.enable_weights_cpu_backup)`
    (python/sglang/srt/model_executor/model_runner.py; `--enable-weights-cpu-backup`, "Save model weights to CPU
    memory during release_weights_occupation and resume_weights_occupation"; in ServerArgs from 0.5.3, as verl
    checks before passing it). A rollout engine gets the policy's weights after every resume (`load`); a teacher,
    never loaded, is built from its own checkpoint (`load_format="auto"`) with `keep_weights=True` (the backup:
    its weights wait in host memory between scores) or `stay_awake=True`.
"""

from __future__ import annotations

import torch

from rllava import distributed as D
from rllava.engine.inference.base import (ColocatedEngine, Completion, GenerationRequest, SamplingParams, copy_greedy,
                                          weight_buckets)
from rllava.engine.inference.vllm import BAN
from rllava.errors import ConfigError, RllavaError


class SGLangRolloutEngine(ColocatedEngine):
    """SGLang behind the RolloutEngine interface; `engine_kwargs` go to `sglang.Engine` (ServerArgs names:
    dtype, mem_fraction_static, context_length, trust_remote_code, ...)."""

    @staticmethod
    def _options(cfg, m, max_len: int | None, device: torch.device) -> dict:
        """rollout.sglang.*; rollout.tensor_parallel_size and rollout.sglang.tp_size name the same thing."""
        r, sg, world = cfg.rollout, cfg.rollout.sglang, D.world_size()
        tp = max(r.tensor_parallel_size, sg.tp_size)
        if min(r.tensor_parallel_size, sg.tp_size) > 1 and r.tensor_parallel_size != sg.tp_size:
            raise ConfigError(f"rollout.tensor_parallel_size={r.tensor_parallel_size} and rollout.sglang.tp_size="
                              f"{sg.tp_size} name the same thing: set one")
        if tp > 1 and world > 1:
            raise ConfigError(f"rollout.tensor_parallel_size={tp} with sglang needs a single training process (each "
                              f"of the {world} ranks starts its own engine on its own GPU)")
        return {"tensor_parallel_size": tp, "gpu_id": device.index or 0, "dtype": sg.dtype,
                "mem_fraction_static": sg.mem_fraction_static, "skip_server_warmup": sg.skip_server_warmup,
                "context_length": max_len}

    def __init__(self, *, model_path: str, stop_token_ids: list[int], banned_token_ids: list[int],
                 tensor_parallel_size: int, seed: int | None, load_format: str, bucket_mb: int,
                 gpu_id: int, stay_awake: bool = False, keep_weights: bool = False, **engine_kwargs):
        sglang = self._import("sglang", "SGLang")
        self.stop_token_ids, self.bucket_mb = stop_token_ids, bucket_mb
        self.logit_bias = {str(t): BAN for t in banned_token_ids}  # SGLang keys token ids as strings
        if seed is not None:
            engine_kwargs["random_seed"] = seed + D.rank()  # one engine per rank: distinct streams
        if keep_weights:  # a teacher: its own weights survive release / resume in host memory
            engine_kwargs["enable_weights_cpu_backup"] = True
        self.keep_weights, self.stay_awake = keep_weights, stay_awake
        self.engine = sglang.Engine(model_path=model_path, tp_size=tensor_parallel_size, base_gpu_id=gpu_id,
                                    load_format=load_format, enable_memory_saver=True, **engine_kwargs)
        self.offload()

    def _sleep(self) -> None:
        self.engine.release_memory_occupation()

    def _wake(self) -> None:
        self.engine.resume_memory_occupation()

    def load(self, model: torch.nn.Module) -> None:
        if not self.stay_awake:
            self._wake()
        buckets = weight_buckets(model, self.bucket_mb)
        bucket = next(buckets, None)
        while bucket is not None:  # the radix cache is flushed after the last bucket
            sent, bucket = bucket, next(buckets, None)
            self.engine.update_weights_from_tensor(sent, flush_cache=bucket is None)

    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        k = 1 if sampling.temperature == 0 else sampling.n
        rows = [r for r in requests for _ in range(k)]
        params = {"n": 1, "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                  "max_new_tokens": sampling.max_new_tokens, "stop_token_ids": self.stop_token_ids,
                  "skip_special_tokens": False, **({"logit_bias": self.logit_bias} if self.logit_bias else {})}
        outputs = self.engine.generate(**_inputs(rows), sampling_params=params, return_logprob=True)
        completions = [_completion(o) for o in outputs]
        return copy_greedy([completions[i * k:(i + 1) * k] for i in range(len(requests))], sampling)

    def score(self, requests: list[GenerationRequest]) -> list[list[float]]:
        if not (self.keep_weights or self.stay_awake):
            raise RllavaError("SGLangRolloutEngine.score: the engine's weights do not survive "
                              "release_memory_occupation; build a scoring engine with keep_weights=True (SGLang's "
                              "enable_weights_cpu_backup) or stay_awake=True")
        return super().score(requests)

    def _score(self, requests: list[GenerationRequest]) -> list[list[float]]:
        outputs = self.engine.generate(**_inputs(requests), return_logprob=True, logprob_start_len=0,
                                       sampling_params={"max_new_tokens": 0, "temperature": 1.0})  # prefill only
        return [[0.0] + [lp for lp, _, _ in o["meta_info"]["input_token_logprobs"][1:]] for o in outputs]


def _inputs(rows: list[GenerationRequest]) -> dict:
    """`Engine.generate`'s input keywords: the unexpanded ids (SGLang's processor expands the placeholders) and,
    when any row has them, one list of images / videos per row."""
    inputs = {"input_ids": [r.raw_prompt_ids if r.raw_prompt_ids is not None else r.prompt_ids for r in rows]}
    if any(r.images for r in rows):
        inputs["image_data"] = [list(r.images) for r in rows]
    if any(r.videos for r in rows):  # frames as [T, H, W, C] arrays, already sampled and sized
        inputs["video_data"] = [[v.array() for v in r.videos] for r in rows]
    return inputs


def _completion(out: dict) -> Completion:
    meta = out["meta_info"]
    return Completion(list(out["output_ids"]), [lp for lp, _, _ in meta["output_token_logprobs"]],
                      "length" if meta["finish_reason"]["type"] == "length" else "stop")
