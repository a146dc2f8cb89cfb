"""Reward shaping from the rollout itself: the n-gram repetition penalty (rllava.reward.shaping)."""

import os

import pytest

from rllava.config import load_config
from rllava.data.protocol import Sample, Segment, Trajectory
from rllava.reward.shaping import repetition_penalty, response_token_ids
from rllava.train.builders import build_reward


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_repetition_penalty_by_hand():
    # 1 2 3 1 2 3 1 2, n=2: bigrams 12 23 31 12 23 31 12 -> 7, distinct {12, 23, 31} -> 3: 4 repeats
    assert repetition_penalty([1, 2, 3, 1, 2, 3, 1, 2], 2, 0.5) == pytest.approx(-0.5 * 4 / 7)
    # n=3: 123 231 312 123 231 312 -> 6, distinct 3 -> 3 repeats
    assert repetition_penalty([1, 2, 3, 1, 2, 3, 1, 2], 3, 1.0) == pytest.approx(-3 / 6)
    assert repetition_penalty([5, 6, 7, 8], 2, 1.0) == 0.0  # nothing repeats
    assert repetition_penalty([5, 6], 3, 1.0) == 0.0  # shorter than n: no n-gram
    assert repetition_penalty([9] * 101, 1, 2.0) == pytest.approx(-2.0 * 100 / 101)  # a loop -> nearly -factor


def _traj(ids):
    # a prompt (not the policy's) that repeats the response's n-grams, and an agent-style response: two model
    # turns around an observation; only the model's tokens count
    segments = [Segment([1, 2, 1, 2], trained=False), Segment(ids[:3], trained=True), Segment([1, 2], trained=False),
                Segment(ids[3:], trained=True)]
    return Trajectory(Sample(0, [], [], "3"), 0, segments, {}, response="x")


def test_it_lands_in_the_training_score_only(tmp_path):
    reward = tmp_path / "r.py"
    reward.write_text("def f(response, ground_truth):\n    return {'overall': 1.0, 'accuracy': 1.0}\n")
    cfg = load_config(["config=examples/tasks/counting/tiny_cpu.yaml", f"reward.reward_function={reward}:f",
                       "reward.repetition_penalty.enable=true", "reward.repetition_penalty.ngram_size=2",
                       "reward.repetition_penalty.penalty_factor=0.5"])
    fn = build_reward(cfg)
    try:
        t = _traj([1, 2, 3, 1, 2, 3, 1, 2])
        assert response_token_ids(t) == [1, 2, 3, 1, 2, 3, 1, 2]
        scores, details = fn.score([t, _traj([4, 5, 6, 7])], train=True)  # the rollout stage of a training step
        assert details[0]["repetition_penalty"] == pytest.approx(-0.5 * 4 / 7)
        assert scores.tolist() == pytest.approx([1.0 - 0.5 * 4 / 7, 1.0])
        assert details[1]["repetition_penalty"] == 0.0
        scores, details = fn.score([t])  # validation (rllava.train.evaluate) scores without shaping
        assert scores.tolist() == [1.0] and "repetition_penalty" not in details[0]
    finally:
        fn.close()
    off = build_reward(load_config(["config=examples/tasks/counting/tiny_cpu.yaml", f"reward.reward_function={reward}:f"]))
    assert off.score([t], train=True)[0].tolist() == [1.0]  # reward.repetition_penalty.enable=false (default)
    off.close()


@pytest.mark.parametrize("arg, message", [
    ("reward.repetition_penalty.ngram_size=0", "reward.repetition_penalty.ngram_size=0 must be > 0"),
    ("reward.repetition_penalty.penalty_factor=-1", "reward.repetition_penalty.penalty_factor=-1.0 must be >= 0"),
])
def test_bad_keys_are_one_line_errors(arg, message):
    from rllava.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_config(["config=examples/tasks/counting/tiny_cpu.yaml", arg])
