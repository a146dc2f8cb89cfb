"""Rank bookkeeping that needs no process group: prompt shards and equal micro-batch counts over ranks."""

import pytest

from rllava import distributed as D
from rllava.roles.actor import equal_count


@pytest.mark.parametrize("world", [1, 2, 4])
def test_each_rank_takes_its_contiguous_share(monkeypatch, world):
    items = list(range(8))
    shares = []
    for r in range(world):
        monkeypatch.setattr(D, "world_size", lambda: world)
        monkeypatch.setattr(D, "rank", lambda r=r: r)
        shares.append(D.shard(items, "prompts"))
    assert [x for s in shares for x in s] == items and len({len(s) for s in shares}) == 1


def test_uneven_share_is_an_error(monkeypatch):
    monkeypatch.setattr(D, "world_size", lambda: 3)
    with pytest.raises(ValueError, match="8 prompts cannot be split evenly over 3 processes"):
        D.shard(list(range(8)), "prompts")


def test_equal_count_halves_the_biggest_group():
    assert equal_count([[0, 1, 2, 3], [4]], 2) == [[0, 1, 2, 3], [4]]
    assert equal_count([[0, 1, 2, 3], [4]], 3) == [[0, 1], [2, 3], [4]]
    assert equal_count([[0, 1, 2, 3], [4]], 5) == [[0], [1], [2], [3], [4]]
