"""Rank bookkeeping that needs no process group: prompt shards and equal micro-batch counts over ranks."""

import pytest

from rllava import distributed as D
from rllava.roles.batching import equal_count


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


def test_whitening_takes_the_statistics_of_every_ranks_share(monkeypatch):
    """REINFORCE++ / GAE whiten over the batch: under torchrun that is the global batch, so two ranks holding
    two rows each get exactly the single-process result (all_sum played by two threads)."""
    import threading

    import torch

    from rllava.algorithms.advantage import masked_whiten

    x = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [4.0, 5.0, 6.0], [9.0, 0.0, 0.0]])
    mask = (x != 0).float()
    barrier, sent = threading.Barrier(2), {}

    def all_sum(values):  # each thread's values, summed once both have arrived
        sent[threading.get_ident()] = values
        barrier.wait()
        total = [sum(v[i] for v in sent.values()) for i in range(len(values))]
        barrier.wait()
        return total

    monkeypatch.setattr(D, "world_size", lambda: 2)
    monkeypatch.setattr(D, "all_sum", all_sum)
    parts = {}
    threads = [threading.Thread(target=lambda r=r: parts.__setitem__(r, masked_whiten(x[2 * r:2 * r + 2],
                                                                                      mask[2 * r:2 * r + 2])))
               for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    monkeypatch.setattr(D, "world_size", lambda: 1)
    torch.testing.assert_close(torch.cat([parts[0], parts[1]]), masked_whiten(x, mask))
    assert not torch.allclose(parts[0], masked_whiten(x[:2], mask[:2]))  # a rank's own statistics differ


def test_a_group_member_exits_without_interpreter_teardown(monkeypatch):
    """`destroy_process_group` leaves gloo's threads running while DTensor/DeepSpeed still hold the group, so a
    torchrun worker ends through os._exit after its atexit handlers (see `exit_process`); a plain process exits
    as usual."""
    calls = []
    monkeypatch.setattr(D.atexit, "_run_exitfuncs", lambda: calls.append("atexit"))
    monkeypatch.setattr(D.os, "_exit", lambda code: calls.append(("_exit", code)))
    monkeypatch.setattr(D, "_joined", True)
    D.exit_process(3)
    assert calls == ["atexit", ("_exit", 3)]
    monkeypatch.setattr(D, "_joined", False)
    with pytest.raises(SystemExit) as e:
        D.exit_process(2)
    assert e.value.code == 2 and len(calls) == 2


@pytest.mark.parametrize("fails", [False, True])
def test_the_command_line_closes_the_group_then_exits_through_exit_process(monkeypatch, fails):
    from rllava.errors import RllavaError
    from rllava.train import cli

    calls = []

    def train(cfg):
        if fails:
            raise RllavaError("bad data")
        return "out"

    monkeypatch.setattr(cli, "load_config", lambda argv: None)
    monkeypatch.setattr(cli.sys, "argv", ["rlvr"])
    monkeypatch.setattr(D, "close", lambda: calls.append("close"))
    monkeypatch.setattr(D, "exit_process", lambda code: calls.append(("exit", code)))
    cli.run_cli(train)
    assert calls == ([("exit", 2)] if fails else ["close", ("exit", 0)])  # a failed rank does not wait for others
