"""The Rollout role for single-turn tasks: prompts -> K trajectories each, through any rollout engine.

The driver owns the conversation (chat template, images) and the engine only continues token sequences, so a
multi-turn agent driver replaces this file's `generate` and keeps the engine.
"""

from __future__ import annotations

from rllava.data.dataset import encode_prompt
from rllava.data.protocol import Sample, Segment, Trajectory
from rllava.engine.inference.base import GenerationRequest, RolloutEngine, SamplingParams
from rllava.model.processor import get_tokenizer


class Rollout:
    def __init__(self, engine: RolloutEngine, processor, *, skip_special_tokens: bool = True):
        self.engine, self.processor = engine, processor
        self.tokenizer = get_tokenizer(processor)
        self.skip_special_tokens = skip_special_tokens

    def generate(self, samples: list[Sample], sampling: SamplingParams) -> list[Trajectory]:
        """`sampling.n` trajectories per sample; the k samples of prompt i get group id i."""
        encoded = [encode_prompt(self.processor, s) for s in samples]
        requests = [GenerationRequest(ids, mm) for ids, mm in encoded]
        groups = self.engine.generate(requests, sampling)
        trajectories = []
        for i, (sample, (prompt_ids, mm), completions) in enumerate(zip(samples, encoded, groups)):
            for c in completions:
                trajectories.append(Trajectory(
                    sample=sample, group_id=i, mm_inputs=mm, finish_reason=c.finish_reason,
                    segments=[Segment(prompt_ids, trained=False),
                              Segment(c.token_ids, trained=True, logprobs=c.logprobs)],
                    response=self.tokenizer.decode(c.token_ids, skip_special_tokens=self.skip_special_tokens)))
        return trajectories
