"""DAPO dynamic sampling: which groups are kept, and how a batch is filled across rounds."""

from types import SimpleNamespace

import pytest
import torch

from rllava.algorithms.filtering import fill_batch, informative_groups
from rllava.errors import ConfigError


def test_informative_groups():
    ids = [0, 0, 1, 1, 2, 2, 3, 3]
    acc = [1, 0, 1, 1, 0, 0, 0.5, 0.5]  # group 0 mixed; 1 all right; 2 all wrong; 3 equal (not 0/1)
    assert informative_groups(ids, acc, low=0.01, high=0.99) == {0}
    assert informative_groups(ids, acc, low=0.6, high=1.0) == set()  # group 0's mean 0.5 is outside the band


def _round(group_scores):
    """A fake rollout+reward round: trajectories with group ids, their scores and score dicts."""
    trajs, scores = [], []
    for g, vals in enumerate(group_scores):
        for v in vals:
            trajs.append(SimpleNamespace(group_id=g, tag=(len(group_scores), g, v)))
            scores.append(v)
    return trajs, torch.tensor(scores, dtype=torch.float), [{"overall": s, "accuracy": s} for s in scores]


def test_fill_batch_keeps_sampling_until_full_and_renumbers_groups():
    rounds = iter([_round([[1, 1], [0, 1]]), _round([[0, 0], [1, 0], [0, 1]])])
    trajs, scores, details, m = fill_batch(lambda: next(rounds), 2, filter_key="accuracy", low=0.01, high=0.99,
                                           max_tries=5)
    assert [t.group_id for t in trajs] == [0, 0, 1, 1]
    assert scores.tolist() == [0, 1, 1, 0]  # round 1 group 1, then round 2 group 1 (the first informative ones)
    assert m == {"batch/sampling_rounds": 2.0, "batch/groups_kept": 2.0, "batch/groups_sampled": 5.0,
                 "batch/filter_exhausted": 0.0}


def test_fill_batch_stops_at_max_tries():
    calls = []

    def draw():
        calls.append(1)
        return _round([[1, 1], [0, 0]])  # never informative

    trajs, scores, _, m = fill_batch(draw, 2, filter_key="overall", low=0.01, high=0.99, max_tries=3)
    assert len(calls) == 3 and m["batch/groups_kept"] == 2.0  # falls back to the last round, unfiltered
    assert scores.tolist() == [1, 1, 0, 0]
    with pytest.raises(ConfigError, match="algorithm.filter_key='acc' is not a score"):
        fill_batch(draw, 2, filter_key="acc", low=0.01, high=0.99, max_tries=3)


def test_fill_batch_running_out_of_rounds_warns_and_counts(caplog):
    """DAPO trains on when trainer.max_try_make_batch runs out, but never silently: a warning and a metric."""
    rounds = iter([_round([[1, 1], [0, 1]]), _round([[0, 0], [1, 1]])])  # one informative group of the two wanted
    with caplog.at_level("WARNING", logger="rllava.algorithms.filtering"):
        trajs, _, _, m = fill_batch(lambda: next(rounds), 2, filter_key="accuracy", low=0.01, high=0.99,
                                    max_tries=2)
    assert m["batch/filter_exhausted"] == 1.0 and m["batch/groups_kept"] == 1.0 and len(trajs) == 2
    (record,) = caplog.records
    assert "1 of 2 groups carry a learning signal after trainer.max_try_make_batch=2 rounds" in record.getMessage()
