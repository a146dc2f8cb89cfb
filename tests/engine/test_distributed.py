"""Rank bookkeeping that needs no process group: prompt shards, mini-batches of whole groups and equal micro- /
mini-batch counts over ranks."""

import types

import pytest
import torch

from rllava import distributed as D
from rllava.data.protocol import Batch
from rllava.roles.actor import Actor
from rllava.roles.batching import equal_count, mini_batches


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


def _rows(groups: list[int]) -> Batch:
    """A batch whose row i belongs to group groups[i], one trained token each."""
    B = len(groups)
    ones = torch.ones(B, 2, dtype=torch.long)
    return Batch(trajectories=[None] * B, input_ids=ones, attention_mask=ones, loss_mask=ones,
                 group_ids=torch.tensor(groups))


# 4 prompts x 8 responses, and two rows an agent's episodes in group 1 added (each a turn the endpoint retokenized)
AGENT_ROWS = [g for g in range(4) for _ in range(8)]
AGENT_ROWS[16:16] = [1, 1]


def test_a_mini_batch_takes_whole_groups_with_the_rows_an_agent_added():
    batch = _rows(AGENT_ROWS)
    # 4 prompts per step, 4 per mini-batch: one optimizer step of all 34 rows (by row count: 32, then one of 2)
    assert [len(m) for m, _ in mini_batches(batch, 1, 32, group_size=8)] == [34]
    # 2 prompts per mini-batch: groups 0-1 (18 rows) then 2-3 (16), each normalised over its own tokens
    minis = list(mini_batches(batch, 1, 16, group_size=8))
    assert [m for m, _ in minis] == [list(range(18)), list(range(18, 34))]
    assert [float(n["num_seqs"]) for _, n in minis] == [18.0, 16.0]
    # without agents' rows, whole groups are the row-count split
    assert [m for m, _ in mini_batches(_rows([g for g in range(4) for _ in range(8)]), 2, 16, group_size=8)] == \
        [list(range(16)), list(range(16, 32))] * 2


def test_every_rank_takes_as_many_mini_batches_as_the_rank_with_the_most(monkeypatch):
    monkeypatch.setattr(D, "all_max", lambda value: 3)  # another rank's share makes 3 mini-batches
    minis = [m for m, _ in mini_batches(_rows([g for g in range(4) for _ in range(2)]), 1, 4, group_size=2)]
    assert minis == [[0, 1], [2, 3], [4, 5, 6, 7]]  # (its own 2, the first halved)


def test_old_log_probs_are_skipped_when_the_added_rows_stay_in_one_mini_batch(monkeypatch):
    actor = Actor(None, None, types.SimpleNamespace(loss_name="vanilla"), ppo_epochs=1, mini_batch_size=32,
                  group_size=8, micro_batch_size=8, log_prob_micro_batch_size=8, loss_agg_mode="token-mean",
                  max_response_length=2, temperature=1.0, use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="kl",
                  entropy_coeff=0.0)
    assert not actor.needs_old_logprobs(_rows(AGENT_ROWS))  # 34 rows, one mini-batch: pi_old is the update's own
    monkeypatch.setattr(D, "all_max", lambda value: 2)  # another rank steps twice: every rank needs pi_old
    assert actor.needs_old_logprobs(_rows(AGENT_ROWS))
