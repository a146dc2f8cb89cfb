"""rollout.partial_rollout under trainer.max_staleness: a fake driver (responses of random lengths written in chunks)
through PartialRollouts, step by step, on the synchronous and the asynchronous schedule."""

import random
from collections import Counter

import pytest

from rllava.data.protocol import Sample, Segment, Trajectory
from rllava.engine.inference.base import SamplingParams
from rllava.roles.rollout import PartialRollouts
from rllava.train.async_rl import version_for

LENGTHS, SIZE, CHUNK, MAX_NEW = (1, 1, 1, 2, 8, 16), 4, 4, 16


class _Data:
    def __getitem__(self, i):
        return Sample(i, [], [], None)


class _Driver:
    """Response k of prompt i is a length drawn from LENGTHS (by (i, k)), written CHUNK tokens a round; the
    prompt segment holds that length; `finished` counts partial_finish calls (an episode closes its environment)."""

    finished = 0

    def partial_begin(self, samples, sampling, chunk, max_new):
        groups = [[Trajectory(s, 0, [Segment([random.Random(f"{s.index}/{k}").choice(LENGTHS)], False)], {})
                   for k in range(sampling.n)] for s in samples]
        self.partial_advance([t for g in groups for t in g], sampling, chunk, max_new)
        return groups

    def partial_advance(self, units, sampling, chunk, max_new):
        for t in units:
            t.segments.append(Segment([0] * min(chunk, t.segments[0].token_ids[0] - t.num_response_tokens), True))

    def partial_done(self, t, max_new):
        return t.num_response_tokens >= t.segments[0].token_ids[0]

    def partial_segments(self, t):
        return t.segments

    def partial_finish(self, t):
        self.finished += 1
        return t

    def partial_state(self, t):
        return {"index": t.sample.index, "segments": [[s.token_ids, s.trained, s.version] for s in t.segments]}

    def partial_load(self, state, dataset):
        return Trajectory(dataset[state["index"]], 0, [Segment(ids, tr, version=v) for ids, tr, v in state["segments"]],
                          {})


def _draw(drawn):
    def draw():
        drawn[0] += SIZE
        return [Sample(i, [], [], None) for i in range(drawn[0] - SIZE, drawn[0])]
    return draw


def _steps(pool, drawn, k, asynchronous, first, last):
    """Steps first..last; per step the lags (trained-at version - token version) of its tokens, the drops and
    how many groups the pool holds beyond those the next steps can train within the bound."""
    out = []
    for s in range(first, last + 1):
        v = version_for(s, k, 5) if asynchronous else s - 1  # sampling step s (saves at 5, 10, ...)
        batch = pool.next_batch(_draw(drawn), SamplingParams(n=2, max_new_tokens=MAX_NEW), SIZE, v, s - 1)
        assert sorted({t.group_id for t in batch}) == list(range(SIZE)) and len(batch) == 2 * SIZE
        assert all(pool.rollout.partial_done(t, MAX_NEW) for t in batch)
        out.append(([s - 1 - seg.version for t in batch for seg in t.segments if seg.trained], pool.dropped,
                    len(pool.groups) - (k - (s - 1 - v)) * SIZE))  # > 0: more started than the bound lets train
        pool.dropped = 0
    return out


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("k", [0, 1, 2])
def test_no_trained_token_exceeds_max_staleness(k, asynchronous):
    """AReaL's bound (areal/infra/staleness_manager.py L79-113 at inclusionAI/AReaL 4aef98d, `get_capacity`: a
    rollout starts only if it can be consumed within max_staleness versions): no trained token's lag (trained-at
    version - token version) exceeds trainer.max_staleness. Before it, paused groups and complete ones beyond a
    batch carried over without limit: over these 24 steps tokens lagged up to 3 at every k on the synchronous
    schedule, up to 4 at k=1 and k=2 on the asynchronous one. Now groups over the bound are dropped and counted,
    and the pool restored from its state mid-run goes on (drops included) as the live one."""
    pool, drawn = PartialRollouts(_Driver(), _Data(), CHUNK, MAX_NEW, max_staleness=k), [0]
    steps = _steps(pool, drawn, k, asynchronous, 1, 12)
    again = PartialRollouts(_Driver(), _Data(), CHUNK, MAX_NEW, max_staleness=k)
    again.load_state_dict(pool.state_dict())
    rest = _steps(pool, list(drawn), k, asynchronous, 13, 24)
    assert rest == _steps(again, list(drawn), k, asynchronous, 13, 24)
    lags = [lag for ls, _, _ in steps + rest for lag in ls]
    assert max(lags) <= k, f"lags (tokens per lag): {sorted(Counter(lags).items())}"
    assert max(over for _, _, over in steps + rest) <= 0  # nothing started that FIFO would train too late
    if k == 0:  # nothing pauses: the synchronous run, written in rounds
        assert all(d == 0 for _, d, _ in steps + rest)
    if k and not asynchronous:  # responses still pause and go on under newer weights
        assert max(lags) >= 1
    dropped = sum(d for _, d, _ in steps + rest)
    assert pool.rollout.finished == 2 * (24 * SIZE + dropped)  # dropped responses are finished too
    if k == 1 and not asynchronous:  # and some groups went over: dropped, counted
        assert dropped > 0
