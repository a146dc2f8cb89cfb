"""The Rollout role for single-turn tasks: prompts -> K trajectories each, through any rollout engine. The driver
owns the conversation (chat template, images), the engine only continues token sequences, so a multi-turn agent
driver replaces this file's `generate` and keeps the engine.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

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


def continuation_request(processor, t: Trajectory) -> GenerationRequest:
    """A single-turn trajectory's prompt and response so far as one request (to continue it, or for a teacher engine
    to score it): the response tokens follow the prompt's expanded ids and its raw ones alike."""
    prompt, response = t.segments[0].token_ids, [x for s in t.segments[1:] for x in s.token_ids]
    return GenerationRequest(prompt + response, t.mm_inputs, raw_prompt_ids(processor, t.sample, prompt) + response,
                             t.sample.images, t.sample.videos)


def logprob_gap_metrics(batch: Batch) -> dict[str, float]:
    """|rollout_logprobs - old_logprobs| over sampled tokens: how far the sampling engine is from the trainer on the
    same tokens (kernels, dtype, a stale weight sync; what `algorithm.rollout_is` corrects). Empty if one is missing."""
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
    """(width, height) of each image as the vision tower saw it: Qwen-VL processors resize (`smart_resize`) and
    report the patch grid, so image_grid_thw's (h, w) x patch_size; for other processors, the image as given."""
    grid, patch = mm.get("image_grid_thw"), getattr(getattr(processor, "image_processor", None), "patch_size", None)
    if grid is None or not isinstance(patch, int):
        return [img.size for img in sample.images]
    return [(int(w) * patch, int(h) * patch) for _, h, w in grid.tolist()]


def truncate(c: Completion, budget: int) -> Completion:
    """The first `budget` tokens of a completion sampled with a larger budget: the same distribution as
    sampling with `budget`, so one engine call serves responses with different budgets left."""
    if len(c.token_ids) <= budget:
        return c
    return Completion(c.token_ids[:budget], c.logprobs[:budget], "length")


def tag_segments(segments: list[Segment], version: int) -> None:
    """Mark the sampled segments not marked yet as written by the weights after update `version`."""
    for seg in segments:
        if seg.trained and not seg.off_policy and seg.version is None:
            seg.version = version


def tag_versions(trajectories: list[Trajectory], version: int) -> None:
    for t in trajectories:
        tag_segments(t.segments, version)


class Rollout:
    def __init__(self, engine: RolloutEngine, processor, *, skip_special_tokens: bool = True):
        self.engine, self.processor = engine, processor
        self.tokenizer = get_tokenizer(processor)
        self.skip_special_tokens = skip_special_tokens

    def generate(self, samples: list[Sample], sampling: SamplingParams,
                 prefixes: list[list[list[int] | None]] | None = None) -> list[Trajectory]:
        """`sampling.n` trajectories per sample; the k samples of prompt i get group id i. `prefixes[i][k]` (SFT+RL
        hybrids): expert tokens the k-th response to prompt i starts with, an off-policy segment the policy continues
        within the rest of the budget (one ending in EOS is the whole response), or None: sampled from the prompt
        alone. Equal prefixes of one prompt are sampled as one request."""
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

    def extend(self, trajectories: list[Trajectory], sampling: SamplingParams, budgets: list[int]) -> None:
        """Continue each response by at most its budget of tokens (rollout.partial_rollout): the prompt and the
        response so far as one request; the new tokens are a trained segment of their own."""
        requests = [continuation_request(self.processor, t) for t in trajectories]
        out = self.engine.generate(requests, replace(sampling, n=1, max_new_tokens=max(budgets)))
        for t, (c,), budget in zip(trajectories, out, budgets):
            c = truncate(c, budget)
            t.segments.append(Segment(c.token_ids, trained=True, logprobs=c.logprobs))
            t.finish_reason = c.finish_reason
            t.response = self._decode(t.segments)

    def _decode(self, segments: list[Segment]) -> str:
        return self.tokenizer.decode([x for s in segments[1:] for x in s.token_ids],
                                     skip_special_tokens=self.skip_special_tokens)

    # rollout.partial_rollout (PartialRollouts): a response being written is its Trajectory
    def partial_begin(self, samples: list[Sample], sampling: SamplingParams, chunk: int, max_new: int) -> list[list]:
        fresh = self.generate(samples, replace(sampling, max_new_tokens=min(chunk, max_new)))
        return [[t for t in fresh if t.group_id == i] for i in range(len(samples))]

    def partial_advance(self, units: list[Trajectory], sampling: SamplingParams, chunk: int, max_new: int) -> None:
        self.extend(units, sampling, [min(chunk, max_new - t.num_response_tokens) for t in units])

    def partial_done(self, t: Trajectory, max_new: int) -> bool:
        return t.finish_reason == "stop" or t.num_response_tokens >= max_new

    def partial_segments(self, t: Trajectory) -> list[Segment]:
        return t.segments

    def partial_finish(self, t: Trajectory) -> Trajectory:
        return t

    def partial_state(self, t: Trajectory) -> dict:
        return {"index": t.sample.index, "finish": t.finish_reason,
                "segments": [[s.token_ids, s.logprobs, s.version] for s in t.segments[1:]]}

    def partial_load(self, state: dict, dataset) -> Trajectory:
        sample = dataset[state["index"]]
        prompt, mm = encode_prompt(self.processor, sample)
        segments = [Segment(prompt, trained=False)] + [Segment(list(ids), trained=True, logprobs=lps, version=v)
                                                       for ids, lps, v in state["segments"]]
        return Trajectory(sample=sample, group_id=0, segments=segments, mm_inputs=mm, finish_reason=state["finish"],
                          model_image_sizes=model_image_sizes(self.processor, sample, mm),
                          response=self._decode(segments))


class PartialRollouts:
    """rollout.partial_rollout (slime's and AReaL's partial rollouts): `size` prompt groups are written at a time,
    in rounds of at most `chunk` tokens of each response (rollout.partial_rollout_tokens) or one turn of each agent
    episode. A step runs rounds until `size` groups are complete (every response ended: EOS or
    data.max_response_length; an episode: its answer, max_turns or its budget) and trains on the oldest `size`;
    the others pause and go on in the next step under its weights, so a long response no longer holds back a step.
    Each round's tokens carry the version that wrote them (`Segment.version`), for the staleness metrics and the
    rollout correction. The driver (`Rollout`, `AgentRollout`) supplies the `partial_*` methods over its unit of work
    (a Trajectory, an Episode). The pool (groups, and prompts drawn but not started) is checkpointed as data: per
    response its dataset row, tokens, log-probs and versions (an episode: its observations and tool state too).

    trainer.max_staleness (k) bounds it as AReaL's StalenessManager (areal/infra/staleness_manager.py L79-113,
    `get_capacity`): no trained token lags more than k updates behind the policy training on it. A group whose
    oldest token is older is dropped and counted (`dropped`: async/dropped_stale), and a group starts only while the
    pool (trained oldest first) holds fewer groups than the steps within its bound train, so none starts that would
    train too late unless a younger one overtakes it (k=0: nothing pauses). Dropped, not rewritten: a group goes
    over because its responses are long, so rewritten it would likely go over again. Resume stays exact: the rule
    reads only the checkpointed pool and the step."""

    def __init__(self, rollout: Rollout, dataset, chunk: int, max_new_tokens: int, max_staleness: float = math.inf):
        self.rollout, self.dataset, self.chunk, self.max_new_tokens = rollout, dataset, chunk, max_new_tokens
        self.max_staleness, self.dropped = max_staleness, 0  # dropped: stale groups, until the caller resets it
        self.groups: list[list] = []  # started, oldest first (complete ones included)
        self.waiting: list[Sample] = []  # drawn, not started

    def next_batch(self, draw: Callable[[], list[Sample]], sampling: SamplingParams, size: int,
                   version: int, policy: int | None = None) -> list[Trajectory]:
        """`size` complete groups (ids 0..size-1), written in rounds under this step's weights (`version`) or, if paused
        earlier, theirs, for the policy after update `policy` to train on (the step's - 1; default `version`: sync)."""
        r, budget, policy = self.rollout, (self.chunk, self.max_new_tokens), version if policy is None else policy
        complete = lambda g: all(r.partial_done(u, self.max_new_tokens) for u in g)  # noqa: E731
        stale = [min((s.version for u in g for s in r.partial_segments(u) if s.version is not None), default=version)
                 < policy - self.max_staleness for g in self.groups]  # over the bound, now and at any later step
        for u in (u for g, old in zip(self.groups, stale) if old for u in g):
            r.partial_finish(u)  # dropped: an episode's environment releases what it holds
        self.groups, self.dropped = [g for g, old in zip(self.groups, stale) if not old], self.dropped + sum(stale)
        room = (self.max_staleness + 1 - (policy - version)) * size  # groups the steps in a new group's bound train
        while sum(map(complete, self.groups)) < size:  # a round: the paused responses go on, new groups start
            running = [u for g in self.groups for u in g if not r.partial_done(u, self.max_new_tokens)]
            if running:
                r.partial_advance(running, sampling, *budget)
            starting = min(size - len(self.groups) + sum(map(complete, self.groups)),  # `size` being written
                           room - len(self.groups))
            while len(self.waiting) < starting:
                self.waiting += draw()
            if starting > 0:
                new, self.waiting = self.waiting[:starting], self.waiting[starting:]
                self.groups += r.partial_begin(new, sampling, *budget)
            for u in (u for g in self.groups for u in g):
                tag_segments(r.partial_segments(u), version)
        batch = [g for g in self.groups if complete(g)][:size]
        self.groups = [g for g in self.groups if not any(g is b for b in batch)]
        return [replace(r.partial_finish(u), group_id=i) for i, g in enumerate(batch) for u in g]

    def state_dict(self) -> dict:
        return {"groups": [[self.rollout.partial_state(u) for u in g] for g in self.groups],
                "waiting": [s.index for s in self.waiting]}

    def load_state_dict(self, state: dict) -> None:
        self.waiting = [self.dataset[i] for i in state["waiting"]]
        self.groups = [[self.rollout.partial_load(u, self.dataset) for u in g] for g in state["groups"]]
