"""The Rollout role for single-turn tasks: prompts -> K trajectories each, through any rollout engine.

The driver owns the conversation (chat template, images) and the engine only continues token sequences, so a
multi-turn agent driver replaces this file's `generate` and keeps the engine.
"""

from __future__ import annotations

from dataclasses import replace

from rllava.data.dataset import encode_prompt
from rllava.data.protocol import Batch, Sample, Segment, Trajectory
from rllava.engine.inference.base import Completion, GenerationRequest, RolloutEngine, SamplingParams
from rllava.model.processor import get_tokenizer


def raw_prompt_ids(processor, sample: Sample, prompt_ids: list[int]) -> list[int]:
    """The chat template's text tokenized without the processor: one <|image_pad|> / <|video_pad|> per image or
    video, for engines that expand placeholders themselves (vLLM, SGLang). Text-only prompts: `prompt_ids`."""
    if not sample.images and not sample.videos:
        return prompt_ids
    text = processor.apply_chat_template(sample.messages, add_generation_prompt=True, tokenize=False)
    return get_tokenizer(processor)(text, add_special_tokens=False)["input_ids"]


def logprob_gap_metrics(batch: Batch) -> dict[str, float]:
    """|rollout_logprobs - old_logprobs| over trained tokens: how far the engine that sampled is from the trainer
    scoring the same tokens (kernels, dtype, a stale weight sync). It is what `algorithm.rollout_is` corrects for.
    Empty when either side is missing."""
    if batch.rollout_logprobs is None or batch.old_logprobs is None:
        return {}
    mask = batch.loss_mask.bool()
    if batch.off_policy_mask is not None:  # an expert's tokens were not sampled
        mask &= batch.off_policy_mask == 0
    gap = (batch.rollout_logprobs - batch.old_logprobs.to(batch.rollout_logprobs))[mask].abs()  # [trained tokens]
    if gap.numel() == 0:
        return {}
    return {"rollout/logprob_gap_mean": gap.mean().item(), "rollout/logprob_gap_max": gap.max().item()}


def model_image_sizes(processor, sample: Sample, mm: dict) -> list[tuple[int, int]]:
    """(width, height) of each image as the vision tower saw it. Qwen-VL processors resize to multiples of
    patch x merge within their pixel bounds (`smart_resize`) and report the patch grid, so the size is
    image_grid_thw's (h, w) x patch_size; for other processors, the image as given to the processor."""
    grid, patch = mm.get("image_grid_thw"), getattr(getattr(processor, "image_processor", None), "patch_size", None)
    if grid is None or not isinstance(patch, int):
        return [img.size for img in sample.images]
    return [(int(w) * patch, int(h) * patch) for _, h, w in grid.tolist()]


class Rollout:
    def __init__(self, engine: RolloutEngine, processor, *, skip_special_tokens: bool = True):
        self.engine, self.processor = engine, processor
        self.tokenizer = get_tokenizer(processor)
        self.skip_special_tokens = skip_special_tokens

    def generate(self, samples: list[Sample], sampling: SamplingParams,
                 prefixes: list[list[list[int] | None]] | None = None) -> list[Trajectory]:
        """`sampling.n` trajectories per sample; the k samples of prompt i get group id i.

        `prefixes[i][k]` (SFT+RL hybrids): expert tokens the k-th response to prompt i starts with, an off-policy
        segment the policy continues within the rest of the response budget (one ending in EOS is the whole
        response: nothing is sampled), or None for a response sampled from the prompt alone. Equal prefixes of
        one prompt are sampled as one request."""
        encoded = [encode_prompt(self.processor, s) for s in samples]
        prefixes = prefixes or [[None] * sampling.n for _ in samples]
        # one request per (prompt, distinct prefix still to continue); requests of equal (n, budget) go together
        jobs: dict[tuple[int, int], list[tuple[int, list[int] | None]]] = {}
        for i, ps in enumerate(prefixes):
            for p in dict.fromkeys(tuple(p) if p is not None else None for p in ps):
                budget = sampling.max_new_tokens - (len(p) if p else 0)
                if p is None or (budget > 0 and p[-1] != self.tokenizer.eos_token_id):
                    n = sum((tuple(q) if q is not None else None) == p for q in ps)
                    jobs.setdefault((n, budget), []).append((i, list(p) if p else None))
        results: dict[tuple[int, tuple | None], list] = {}
        for (n, budget), items in jobs.items():
            requests = []
            for i, p in items:
                ids, mm = encoded[i]
                raw = raw_prompt_ids(self.processor, samples[i], ids)
                requests.append(GenerationRequest(ids + (p or []), mm, raw + (p or []), samples[i].images,
                                                  samples[i].videos))
            out = self.engine.generate(requests, replace(sampling, n=n, max_new_tokens=budget))
            for (i, p), completions in zip(items, out):
                results[(i, tuple(p) if p else None)] = list(completions)
        trajectories = []
        for i, (sample, (prompt_ids, mm), ps) in enumerate(zip(samples, encoded, prefixes)):
            sizes = model_image_sizes(self.processor, sample, mm)
            for p in ps:
                key = (i, tuple(p) if p is not None else None)
                c = results[key].pop(0) if key in results else Completion([], [], "stop" if p and p[-1] ==
                                                                           self.tokenizer.eos_token_id else "length")
                segments = [Segment(prompt_ids, trained=False)]
                if p:
                    segments.append(Segment(list(p), trained=True, off_policy=True))
                if c.token_ids or not p:
                    segments.append(Segment(c.token_ids, trained=True, logprobs=c.logprobs))
                trajectories.append(Trajectory(
                    sample=sample, group_id=i, mm_inputs=mm, finish_reason=c.finish_reason, model_image_sizes=sizes,
                    segments=segments, response=self.tokenizer.decode((list(p) if p else []) + c.token_ids,
                                                                      skip_special_tokens=self.skip_special_tokens)))
        return trajectories
