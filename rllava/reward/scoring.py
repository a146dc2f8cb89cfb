"""The Scoring stage: every reward source scores the trajectories, and each gets one reward,

    r = sum_m alpha_m R_m  (+ agents' tool-level rewards, + the shaping penalties in training)

A source is any object with
    score(trajectories, train) -> (scores: tensor [B], details: list of {name: float} with an `overall` entry)
    errors       samples it gave the fallback score so far (a failure under reward.strict=false)
    last_error   the line of the latest one (or None)
    close()
`RewardFunction` (a user's `file.py:fn`, rllava.reward.function) is one; `rllava.train.builders.build_reward` builds
them from the config. A new kind of source is a class with these four members and a line there.

What is logged (`reward/<key>_mean` per step, `val/<key>` per validation, one key per details entry):
- `reward.reward_function=file.py:fn`: one source of weight 1, its details as returned (`overall`, `format`, ...).
- `reward.reward_functions=[{function, weight, name, kwargs, reward_type}, ...]`: each source's unweighted
  score as `<name>` and its own parts as `<name>/<part>`; `overall` is the weighted sum.
- `tool_reward` (agents), and in training `overlong_penalty` (`reward.overlong_buffer`) and `repetition_penalty`
  (`reward.repetition_penalty`; both in rllava.reward.shaping), each added once to the sum.

Failures: a source handles its own (reward.strict: raise; else the fallback score, counted in `reward/errors`).
Here a non-finite score or sum is one more (NaN/inf never reach the advantage), and a source failing on every sample
of a call of two or more stops the run even when not strict: it is broken, and all-fallback scores teach nothing."""

from __future__ import annotations

import logging
from typing import Any

import torch

from rllava.data.protocol import Trajectory
from rllava.reward.function import RewardError
from rllava.reward.shaping import overlong_penalty, repetition_penalty, response_token_ids

log = logging.getLogger(__name__)


class Scoring:
    """The Reward role: (name, weight, source) triples -> one reward per trajectory and its named parts.
    `named=False` (the single reward.reward_function form) logs the one source's details as they are."""

    def __init__(self, sources: list[tuple[str, float, Any]], *, named: bool = True, strict: bool = False,
                 fallback_score: float = 0.0, overlong: tuple[int, int, float] | None = None,
                 repetition: tuple[int, float] | None = None):
        self.sources, self.named, self.strict, self.fallback_score = sources, named, strict, fallback_score
        self.overlong = overlong  # (max_response_length, buffer length, penalty factor) for training rewards
        self.repetition = repetition  # (n-gram size, penalty factor) for training rewards
        self.own_errors = 0  # non-finite scores or sums given the fallback here

    @property
    def errors(self) -> int:
        return self.own_errors + sum(source.errors for _, _, source in self.sources)

    def score(self, trajectories: list[Trajectory], train: bool = False) -> tuple[torch.Tensor, list[dict[str, float]]]:
        """Scores [B] (the `overall` entries) and each trajectory's details. `train`: also the shaping penalties."""
        details = [{} for _ in trajectories]
        total = torch.zeros(len(trajectories), dtype=torch.float64)
        for name, weight, source in self.sources:
            before = source.errors
            scores, parts = source.score(trajectories, train)
            scores, failed, last = self._finite(scores.to(torch.float64, copy=True), f"reward {name}", trajectories)
            failed += source.errors - before
            if failed >= len(trajectories) > 1:
                raise RewardError(f"reward {name}: all {failed} samples of this call failed (last: "
                                  f"{last or source.last_error}); reward.strict=false gives single failing samples "
                                  "reward.fallback_score, but a reward failing on every sample is broken: fix it")
            total += weight * scores
            for d, p, s in zip(details, parts, scores.tolist()):  # named: the score, then its parts as <name>/<part>
                d.update({name: s, **{f"{name}/{k}": v for k, v in p.items() if k != "overall"}} if self.named else p)
        for i, (d, t) in enumerate(zip(details, trajectories)):
            extra = {"tool_reward": float(sum(t.turn_rewards))} if t.turn_rewards else {}  # agents: their tools'
            if train and self.overlong is not None:
                extra["overlong_penalty"] = overlong_penalty(t.num_response_tokens, *self.overlong)
            if train and self.repetition is not None:
                extra["repetition_penalty"] = repetition_penalty(response_token_ids(t), *self.repetition)
            for k, v in extra.items():  # each added once, in this order
                d[k] = v
                total[i] += v
        total, _, _ = self._finite(total, "the weighted sum of the rewards", trajectories, float32=True)
        for d, s in zip(details, total.tolist()):
            d["overall"] = s
        return total.float(), details

    def _finite(self, scores: torch.Tensor, what: str, trajectories: list[Trajectory],
                float32: bool = False) -> tuple[torch.Tensor, int, str | None]:
        """Non-finite entries (in float32 too, when that is what trains) -> raised (strict) or the fallback."""
        bad = ~torch.isfinite(scores.float() if float32 else scores)
        message = None
        for i in bad.nonzero().flatten().tolist():
            message = (f"{what}, sample {trajectories[i].sample.index}: {scores[i].item()!r} is not a finite "
                       + ("float32" if float32 else "number"))
            if self.strict:
                raise RewardError(message + " (reward.strict=false scores such samples reward.fallback_score)")
            log.warning("%s: scored %g (reward.strict=false)", message, self.fallback_score)
            scores[i], self.own_errors = self.fallback_score, self.own_errors + 1
        return scores, int(bad.sum()), message

    def close(self) -> None:
        """Stop each source's workers (reward.num_cpus > 1) or models."""
        for _, _, source in self.sources:
            source.close()

