"""DAPO's dynamic sampling (`algorithm.online_filtering`; Yu et al. 2025, arXiv:2503.14476): train only on groups that
carry a learning signal (a group whose K responses all score the same gets zero GRPO-style advantages), sampling prompts
until the batch is full. RLLaVA's keys: a group is kept when the mean of its `algorithm.filter_key` score is within
[filter_low, filter_high] and its scores are not all equal; at most `trainer.max_try_make_batch` rounds fill one batch.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import torch

from rllava import distributed as D
from rllava.errors import ConfigError

log = logging.getLogger(__name__)


def informative_groups(group_ids: list, values: list[float], *, low: float, high: float) -> set:
    """Ids of the groups to keep: low <= mean(values of the group) <= high and not all values equal."""
    by_group = defaultdict(list)
    for g, v in zip(group_ids, values):
        by_group[g].append(v)
    return {g for g, vs in by_group.items() if low <= sum(vs) / len(vs) <= high and max(vs) > min(vs)}


def fill_batch(draw, num_groups: int, *, filter_key: str, low: float, high: float, max_tries: int):
    """Call `draw()` -> (trajectories, scores [N], details) until `num_groups` informative groups are collected or
    `max_tries` rounds are spent (-1: no limit). Returns (trajectories, scores, details, metrics) of the first
    `num_groups` kept groups (fewer if the rounds ran out; none informative: the last round unfiltered, zero
    advantages), group ids renumbered 0..G-1. Running out is warned and counted (`batch/filter_exhausted`)."""
    kept, rounds, seen = [], 0, 0  # kept: ((round, group id), trajectory, score, details)
    # Under torchrun every rank draws until all are full: a rollout round is a collective (FSDP2 gathers the
    # weights for it), so the ranks must run the same number of rounds; a full rank's extra groups are dropped.
    while D.all_max(int(len({row[0] for row in kept}) < num_groups)) and (max_tries < 0 or rounds < max_tries):
        trajectories, scores, details = draw()
        rounds += 1
        rows = [((rounds, t.group_id), t, s, d) for t, s, d in zip(trajectories, scores.tolist(), details)]
        if filter_key not in details[0]:
            raise ConfigError(f"algorithm.filter_key={filter_key!r} is not a score the reward function returns "
                              f"(it returns: {', '.join(sorted(details[0]))})")
        good = informative_groups([r[0] for r in rows], [r[3][filter_key] for r in rows], low=low, high=high)
        seen += len({r[0] for r in rows})
        kept += [r for r in rows if r[0] in good]
    informative = len({row[0] for row in kept})
    exhausted = informative < num_groups
    if exhausted:
        log.warning("algorithm.online_filtering: %d of %d groups carry a learning signal after "
                    "trainer.max_try_make_batch=%d rounds; training on %s (raise trainer.max_try_make_batch, or "
                    "widen algorithm.filter_low/filter_high)", informative, num_groups, max_tries,
                    f"those {informative}" if informative else "the last round unfiltered (zero advantages)")
    kept = kept or rows
    order = list(dict.fromkeys(r[0] for r in kept))[:num_groups]
    renumber = {key: i for i, key in enumerate(order)}
    kept = [r for r in kept if r[0] in renumber]
    for key, t, _, _ in kept:
        t.group_id = renumber[key]
    metrics = {"batch/sampling_rounds": float(rounds), "batch/groups_kept": float(len(order)),
               "batch/groups_sampled": float(seen), "batch/filter_exhausted": float(exhausted)}
    return [r[1] for r in kept], torch.tensor([r[2] for r in kept]), [r[3] for r in kept], metrics
