"""data.sampler (rllava.algorithms.curriculum): the difficulty pools, their weights, the set-aside schedule, the state
a checkpoint keeps, the config's one-line errors, and two ranks holding one state (gloo, `curriculum_worker.py`)."""

import json
import os
import subprocess
import sys

import pytest

from rllava.algorithms.curriculum import DifficultyPools, apportion, build_sampler, sampler_class
from rllava.config import load_config
from rllava.data.records import DataError
from rllava.data.sampler import EpochSampler
from rllava.errors import ConfigError

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def _sampler(n=30, batch=10, **kwargs):
    return DifficultyPools(n, batch, shuffle=True, seed=3, **kwargs)


def _observe(s, rates):
    """Prompt i's group: 4 responses, round(4 * rates[i]) of them right (None: not observed)."""
    s.observe([(i, [1.0] * round(4 * r) + [0.0] * (4 - round(4 * r))) for i, r in enumerate(rates) if r is not None])


def test_apportion_by_largest_remainders():
    assert apportion(8, {"easy": 0.1, "medium": 0.8, "hard": 0.1}) == {"easy": 1, "medium": 6, "hard": 1}
    assert apportion(10, {"easy": 1, "medium": 1, "hard": 1}) == {"easy": 4, "medium": 3, "hard": 3}
    assert apportion(5, {"easy": 0.0, "medium": 2.0, "hard": 1.0}) == {"easy": 0, "medium": 3, "hard": 2}
    assert apportion(5, {"easy": 0.0, "medium": 0.0}) == {"easy": 0, "medium": 0}
    for total in range(1, 40):
        assert sum(apportion(total, {"a": 0.37, "b": 0.21, "c": 0.42}).values()) == total


def test_pools_follow_the_running_pass_rate():
    """Inclusive thresholds (0.25 hard, 0.75 medium), unseen prompts medium; rate <- rate + ema (p - rate)."""
    s = _sampler(n=10, ema=0.5)
    _observe(s, [0.0, 0.25, 0.5, 0.75, 1.0])
    assert [s.pool(i) for i in range(6)] == ["hard", "hard", "medium", "medium", "easy", "medium"]
    s.observe([(4, [0.0, 0.0, 1.0, 1.0])])  # 1 -> 1 + 0.5 (0.5 - 1)
    assert s.rates[4] == 0.75 and s.pool(4) == "medium" and s.rates[5] is None
    assert s.metrics() == {"sampler/easy": 0.0, "sampler/medium": 8.0, "sampler/hard": 2.0,
                           "sampler/set_aside": 0.0, "sampler/unseen": 5.0}
    assert s.pool(0) == "hard" and s.streak[0] == 1  # no signal once, set_aside_after=2: still in its pool


def test_a_batch_takes_each_pools_share_by_its_weight_and_size():
    """10 easy, 10 medium, 10 hard prompts, weights 0.2 / 0.5 / 0.3, 10 a batch: 2, 5 and 3 from each, the least
    recently drawn first, so the medium pool's 10 come round in two batches. A weight is per prompt (prime-rl's):
    2 medium prompts beside 20 hard ones at the default weights 1 and 0.2 get 2 of 6, not 6 * 1 / 1.2."""
    s = _sampler(easy_weight=0.2, medium_weight=0.5, hard_weight=0.3, set_aside_after=0)
    _observe(s, [1.0] * 10 + [0.5] * 10 + [0.0] * 10)
    first, second = s.next_batch(), s.next_batch()
    for batch in (first, second):
        assert len(set(batch)) == 10
        assert [sum(s.pool(i) == p for i in batch) for p in ("easy", "medium", "hard")] == [2, 5, 3]
    assert sorted(i for i in first + second if s.pool(i) == "medium") == list(range(10, 20))
    small = _sampler(n=22, batch=6)
    _observe(small, [0.5] * 2 + [0.25] * 20)  # medium: 2 x 1, hard: 20 x 0.2
    assert [small.pool(i) for i in small.next_batch()].count("medium") == 2


def test_short_pools_leave_their_share_to_medium_then_hard_then_easy_then_the_set_aside():
    s = _sampler(n=12, batch=10, easy_weight=0.2, medium_weight=10, hard_weight=0.2, readmit_after=5)
    _observe(s, [1.0] * 4 + [0.5] * 2 + [0.0] * 2 + [None] * 4)  # easy 0-3, medium 4-5 + unseen 8-11, hard 6-7
    batch = s.next_batch()  # medium's share is all 10 but it holds 6: hard's 2, then 2 of easy's 4 fill the rest
    assert len(set(batch)) == 10 and set(range(4, 12)) < set(batch) and len(set(batch) & {0, 1, 2, 3}) == 2
    s.observe([(i, [1.0, 1.0]) for i in (0, 1, 2, 3)] + [(i, [0.0, 0.0]) for i in (6, 7)])  # streak 2: aside
    assert [s.pool(i) for i in (0, 1, 2, 3, 6, 7)] == [None] * 6
    batch = s.next_batch()  # 6 in the pools, then the set-aside ones due back soonest
    assert len(set(batch)) == 10 and {4, 5, 8, 9, 10, 11} < set(batch)
    zero = _sampler(n=12, batch=4, easy_weight=0, hard_weight=0, set_aside_after=0)  # weight 0: only to fill
    _observe(zero, [1.0] * 4 + [0.5] * 2 + [0.0] * 6)
    batch = zero.next_batch()
    assert {4, 5} < set(batch) and [zero.pool(i) for i in batch].count("hard") == 2


def test_set_aside_then_readmitted_on_schedule():
    """Two groups in a row without signal set a prompt aside for readmit_after batches; back in its pool (by its
    rate), one more such group sends it away again; a group with signal ends the streak."""
    s = _sampler(n=20, batch=5, readmit_after=3, set_aside_after=2)
    s.next_batch()  # draws = 1
    s.observe([(0, [1.0, 1.0]), (1, [0.0, 0.0]), (2, [1.0, 0.0])])
    assert s.streak[:3] == [1, 1, 0] and s.aside_until[:3] == [0, 0, 0]
    s.observe([(0, [1.0, 1.0]), (1, [0.0, 1.0]), (2, [1.0, 0.0])])
    assert s.streak[:3] == [2, 0, 0] and s.aside_until[0] == 1 + 3 and s.pool(0) is None
    for _ in range(2):  # batches 2 and 3: prompt 0 stays out (18 others to draw from)
        assert 0 not in s.next_batch()
    s.next_batch()  # batch 4: due back, readmitted before the draw, in the easy pool
    assert s.aside_until[0] == 0 and s.pool(0) == "easy"
    s.observe([(0, [1.0, 1.0])])
    assert s.aside_until[0] == 4 + 3  # straight back
    never = _sampler(n=20, batch=5, set_aside_after=0)
    for _ in range(5):
        never.observe([(0, [0.0, 0.0])])
    assert never.pool(0) == "hard"


def test_every_prompt_is_drawn_once_before_any_twice():
    s = _sampler(n=30, batch=10)
    drawn = s.next_batch() + s.next_batch() + s.next_batch()
    assert sorted(drawn) == list(range(30)) and len(s) == 3
    unshuffled = DifficultyPools(30, 10, shuffle=False, seed=3)
    assert unshuffled.next_batch() == list(range(10))


def test_state_round_trips_through_json_and_the_draws_go_on_alike():
    a = _sampler(set_aside_after=1, readmit_after=2)
    for step in range(6):
        batch = a.next_batch()
        a.observe([(i, [float((i * step) % 3 == 0), float(i % 2)]) for i in batch])
    b = _sampler(set_aside_after=1, readmit_after=2)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.state_dict() == a.state_dict() and b.metrics() == a.metrics()
    for step in range(6, 12):
        batch = a.next_batch()
        assert b.next_batch() == batch
        groups = [(i, [float((i * step) % 3 == 0), float(i % 2)]) for i in batch]
        a.observe(groups)
        b.observe(groups)
    assert b.state_dict() == a.state_dict()
    with pytest.raises(DataError, match="has no draws, rates, streak, aside_until, last_drawn"):
        b.load_state_dict({"epoch": 0, "position": 3})
    with pytest.raises(DataError, match="covers 30 prompts, the train set has 40"):
        _sampler(n=40).load_state_dict(a.state_dict())


def _cfg(*keys):
    return load_config(["config=examples/tasks/counting/tiny_cpu.yaml", "data.sampler=difficulty_pools", *keys])


@pytest.fixture
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


@pytest.mark.parametrize("keys, message", [
    (["data.sampler=difficulty_pool"], "data.sampler='difficulty_pool' is not registered (registered: "
                                       "difficulty_pools, epoch); did you mean 'difficulty_pools'?"),
    (["data.sampler_kwargs.easy=0.2"], "data.sampler_kwargs.easy is not a key of data.sampler=difficulty_pools "
                                       "(its keys: easy_weight, medium_weight, hard_weight, hard_max, medium_max, "
                                       "ema, set_aside_after, readmit_after)"),
    (["data.sampler=epoch", "data.sampler_kwargs.ema=0.5"], "data.sampler_kwargs.ema is not a key of "
                                                            "data.sampler=epoch (its keys: none)"),
    (["data.sampler_kwargs.ema=fast"], "data.sampler_kwargs.ema='fast' must be a number"),
    (["data.sampler_kwargs.easy_weight=true"], "data.sampler_kwargs.easy_weight=True must be a number"),
    (["data.sampler_kwargs.readmit_after=2.5"], "data.sampler_kwargs.readmit_after=2.5 must be a whole number"),
    (["data.sampler_kwargs.hard_weight=-0.1"], "data.sampler_kwargs.hard_weight=-0.1 is negative"),
    (["data.sampler_kwargs={easy_weight: 0, medium_weight: 0, hard_weight: 0}"], "the weights sum to 0"),
    (["data.sampler_kwargs.hard_max=0.8"], "0 <= hard_max < medium_max must hold (hard_max=0.8, medium_max=0.75)"),
    (["data.sampler_kwargs.hard_max=-0.1"], "0 <= hard_max < medium_max must hold (hard_max=-0.1"),
    (["data.sampler_kwargs.ema=0"], "data.sampler_kwargs.ema=0 must be in (0, 1]"),
    (["data.sampler_kwargs.ema=1.5"], "data.sampler_kwargs.ema=1.5 must be in (0, 1]"),
    (["data.sampler_kwargs.set_aside_after=-1"], "data.sampler_kwargs.set_aside_after=-1 must be >= 0"),
    (["data.sampler_kwargs.readmit_after=0"], "data.sampler_kwargs.readmit_after=0 must be >= 1"),
    (["trainer.async_training=true", "trainer.rollout_ranks=1"],
     "data.sampler=difficulty_pools learns from each step's rewards before the next draw: "
     "trainer.async_training=true draws ahead of them; use data.sampler=epoch"),
])
def test_bad_sampler_keys_are_one_line(_in_repo, keys, message):
    with pytest.raises(ConfigError) as e:
        sampler_class(_cfg(*keys))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_sft_refuses_a_learning_sampler_and_the_epoch_sampler_is_the_default(_in_repo):
    with pytest.raises(ConfigError, match="SFT has no rewards; use data.sampler=epoch"):
        sampler_class(_cfg(), sft=True)
    default = load_config(["config=examples/tasks/counting/tiny_cpu.yaml"])
    assert type(build_sampler(default, 16)) is EpochSampler
    pools = build_sampler(_cfg("data.sampler_kwargs={ema: 1, readmit_after: 4}"), 16)
    assert (pools.ema, pools.readmit_after, pools.batch_size, len(pools)) == (1, 4, 8, 2)


def test_two_ranks_hold_one_state_and_draw_one_batch(tmp_path):
    """Under torchrun (2 ranks, gloo) each rank scores its half of every batch; the gathered groups give every rank
    the state one process reaches on the whole batches, so they keep drawing the same batches."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           os.path.join(HERE, "curriculum_worker.py"), str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    subprocess.run([sys.executable, os.path.join(HERE, "curriculum_worker.py"), str(tmp_path / "one")], check=True)
    ranks = [json.load(open(tmp_path / f"rank_{r}.json")) for r in (0, 1)]
    one = json.load(open(tmp_path / "one" / "rank_0.json"))
    assert ranks[0] == ranks[1] == one
    assert one["state"]["aside_until"].count(0) < 24 and len(one["batches"]) == 8  # it did set prompts aside
