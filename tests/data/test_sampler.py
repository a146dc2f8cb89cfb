"""rllava/data/sampler.py: coverage per epoch, reshuffling, exact resume, and its errors."""

import pytest
import torch

from rllava.data.records import DataError
from rllava.data.sampler import EpochSampler


def test_each_epoch_is_a_permutation_and_reshuffles():
    s = EpochSampler(10, 3, shuffle=True, seed=5)
    assert len(s) == 3  # 10 // 3, the last record of each epoch is dropped
    epochs = [[i for _ in range(len(s)) for i in s.next_batch()] for _ in range(3)]
    for e, seen in enumerate(epochs):
        order = torch.randperm(10, generator=torch.Generator().manual_seed(5 + e)).tolist()
        assert seen == order[:9]  # epoch e is the permutation seeded by seed + e
        assert len(set(seen)) == 9
    assert epochs[0] != epochs[1] != epochs[2]
    assert s.state_dict() == {"epoch": 2, "position": 3}


def test_iteration_covers_the_dataset_once_per_epoch():
    s = EpochSampler(12, 4, shuffle=True, seed=0)
    first = list(s)
    assert [len(b) for b in first] == [4, 4, 4] and sorted(i for b in first for i in b) == list(range(12))
    second = list(s)  # a finished epoch rolls over to the next one
    assert sorted(i for b in second for i in b) == list(range(12)) and second != first
    assert s.state_dict() == {"epoch": 1, "position": 3}


def test_keep_last_partial_batch_and_no_shuffle():
    s = EpochSampler(7, 3, shuffle=False, seed=0, drop_last=False)
    assert len(s) == 3
    assert list(s) == [[0, 1, 2], [3, 4, 5], [6]]
    assert s.next_batch() == [0, 1, 2]  # epoch 1, same order without shuffle
    assert s.state_dict() == {"epoch": 1, "position": 1}


@pytest.mark.parametrize("stop", [1, 4, 5, 11])  # mid-epoch, last batch of an epoch, epoch boundary, later
def test_resume_from_state_dict_is_exact(stop):
    full = EpochSampler(23, 4, shuffle=True, seed=3)
    expected = [full.next_batch() for _ in range(20)]

    first = EpochSampler(23, 4, shuffle=True, seed=3)
    for _ in range(stop):
        first.next_batch()
    state = dict(first.state_dict())
    resumed = EpochSampler(23, 4, shuffle=True, seed=3)
    resumed.load_state_dict(state)
    assert [resumed.next_batch() for _ in range(20 - stop)] == expected[stop:]


def test_iter_after_resume_yields_the_rest_of_the_epoch():
    s = EpochSampler(20, 5, shuffle=True, seed=1)
    s.load_state_dict({"epoch": 2, "position": 1})
    rest = list(s)
    order = torch.randperm(20, generator=torch.Generator().manual_seed(3)).tolist()
    assert rest == [order[5:10], order[10:15], order[15:20]]


def test_errors():
    with pytest.raises(DataError, match=r"has 3 records, fewer than one batch of 8 \(data.train_batch_size\)"):
        EpochSampler(3, 8, shuffle=True, seed=0)
    assert len(EpochSampler(3, 8, shuffle=True, seed=0, drop_last=False)) == 1
    with pytest.raises(DataError, match="batch size must be >= 1, got 0"):
        EpochSampler(3, 0, shuffle=True, seed=0)
    with pytest.raises(DataError, match="has 0 records"):
        EpochSampler(0, 1, shuffle=True, seed=0, drop_last=False)
    s = EpochSampler(10, 2, shuffle=True, seed=0)
    with pytest.raises(DataError, match="sampler state has no position"):
        s.load_state_dict({"epoch": 1})
    with pytest.raises(DataError, match=r"position=9 does not fit 5 batches per epoch .*did the dataset change"):
        s.load_state_dict({"epoch": 1, "position": 9})
