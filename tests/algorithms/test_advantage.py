import math

import pytest
import torch

from rllava.algorithms.advantage import grpo
from rllava.algorithms.registry import ADV_ESTIMATORS, lookup


def test_grpo_hand_computed():
    # groups: g0 = [1, 0], g1 = [1, 1] (no signal), g2 = [0.5] (singleton), g3 = [0, 0, 3]
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.0, 0.0, 3.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 7, 7, 7])  # ids need not be contiguous
    mask = torch.ones(8, 3)
    mask[0, 2] = 0  # a padded token stays 0
    adv = grpo(scores, groups, mask, eps=0.0 + 1e-6)
    # g0: mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / 0.70711 = +-0.70711
    # g1: std 0 -> 0;  g2: singleton -> r itself;  g3: mean 1, std sqrt(6 / 2) = 1.73205
    expected = [0.70711, -0.70711, 0.0, 0.0, 0.5, -1 / math.sqrt(3), -1 / math.sqrt(3), 2 / math.sqrt(3)]
    assert torch.allclose(adv[:, 0], torch.tensor(expected), atol=1e-4)
    assert torch.allclose(adv[:, 1], adv[:, 0])
    assert adv[0, 2] == 0


def test_dr_grpo_drops_std():
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 3.0])
    groups = torch.tensor([0, 0, 1, 1, 1, 1])
    adv = grpo(scores, groups, torch.ones(6, 1), norm_adv_by_std_in_grpo=False)
    assert torch.allclose(adv[:, 0], torch.tensor([0.5, -0.5, -0.75, -0.75, -0.75, 2.25]))


def test_unknown_estimator_lists_choices():
    with pytest.raises(ValueError, match=r"registered: .*grpo.*did you mean 'grpo'"):
        lookup(ADV_ESTIMATORS, "grop", "algorithm.adv_estimator")


from torch.testing import assert_close  # noqa: E402

from rllava.algorithms.advantage import (  # noqa: E402
    dr_grpo, gae, gae_returns, gpg, grpo_passk, opo, reinforce_plus_plus, reinforce_plus_plus_baseline, remax, rloo)
from rllava.algorithms.registry import call_with_params  # noqa: E402
from rllava.errors import ConfigError  # noqa: E402

G = torch.tensor([0, 0, 0, 1, 1])  # a group of 3 and a group of 2
R = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])  # group 1 has no signal


def test_every_estimator_is_registered():
    for name in ["gae", "grpo", "dr_grpo", "grpo_passk", "rloo", "reinforce_plus_plus",
                 "reinforce_plus_plus_baseline", "remax", "opo", "gpg"]:
        assert name in ADV_ESTIMATORS


def test_dr_grpo_and_rloo_by_hand():
    mask = torch.ones(5, 2)
    # group 0 mean 1/3: 2/3, -1/3, -1/3; group 1: 0
    assert_close(dr_grpo(R, G, mask)[:, 0], torch.tensor([2 / 3, -1 / 3, -1 / 3, 0, 0]))
    # rloo: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5; group 1: 1 - 1 = 0
    assert_close(rloo(R, G, mask)[:, 0], torch.tensor([1.0, -0.5, -0.5, 0, 0]))
    assert_close(rloo(torch.tensor([0.7]), torch.tensor([3]), torch.ones(1, 1)), torch.tensor([[0.7]]))  # singleton


def test_grpo_passk_credits_only_the_best():
    scores = torch.tensor([0.2, 1.0, 0.5, 1.0, 1.0, 0.3])
    groups = torch.tensor([0, 0, 0, 1, 1, 2])
    adv = grpo_passk(scores, groups, torch.ones(6, 1), norm_adv_by_std_in_grpo=False)
    # group 0: best 1.0 over runner-up 0.5 -> 0.5; group 1 tie -> 0 margin; group 2 singleton -> 0
    assert_close(adv[:, 0], torch.tensor([0, 0.5, 0, 0, 0, 0]))
    adv = grpo_passk(scores, groups, torch.ones(6, 1), eps=0.0)
    # group 0 std: mean 17/30, deviations -11/30, 13/30, -2/30 -> var = (121 + 169 + 4) / 900 / 2 = 0.16333
    # -> std 0.404145, A = 0.5 / 0.404145 = 1.237179; group 1 (tie, std 0) stays 0, not 0 / 0
    assert_close(adv[:, 0], torch.tensor([0, 1.237179, 0, 0, 0, 0]), atol=1e-5, rtol=0)


def test_remax_opo_gpg_by_hand():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]])
    assert_close(remax(R, G, mask, baseline_scores=torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0]))[:, 0],
                 torch.tensor([0.0, -1.0, -1.0, 1.0, 1.0]))
    # opo group 0: lengths 3, 1, 4 -> b = (3 * 1) / 8 = 0.375 -> 0.625, -0.375, -0.375; group 1: b = 1 -> 0
    adv = opo(R, G, mask)
    assert_close(adv[:, 0], torch.tensor([0.625, -0.375, -0.375, 0.0, 0.0]))
    assert adv[1, 1] == 0 and adv[0, 3] == 0  # masked tokens stay 0
    # gpg: 3 of 5 samples are in a group with signal -> alpha = 5 / 3; group 0 centred: 2/3, -1/3, -1/3
    assert_close(gpg(R, G, mask)[:, 0], torch.tensor([10 / 9, -5 / 9, -5 / 9, 0, 0]))


def test_reinforce_plus_plus_returns_then_whitening():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    token_rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    # gamma 0.5: row 0 returns [0.5, 1]; row 1 [0, 0, 0] -> 5 tokens, mean 0.3, unbiased std:
    # deviations .2, .7, -.3, -.3, -.3 -> var = (.04 + .49 + .27) / 4 = 0.2
    adv = reinforce_plus_plus(None, None, mask, token_rewards=token_rewards, gamma=0.5)
    # std sqrt(0.2) = 0.447214: 0.2 / s = 0.447214, 0.7 / s = 1.565248, -0.3 / s = -0.670820
    assert_close(adv, torch.tensor([[0.447214, 1.565248, 0.0], [-0.670820, -0.670820, -0.670820]]),
                 atol=1e-5, rtol=0)
    # baseline variant: group [1, 0] has mean 0.5 -> centred [0.5, -0.5] over 2 + 3 tokens:
    # token mean (1 - 1.5) / 5 = -0.1; deviations .6, .6, -.4, -.4, -.4 -> var = (.72 + .48) / 4 = 0.3
    # -> 0.6 / sqrt(0.3) = 1.095445, -0.4 / sqrt(0.3) = -0.730297
    base = reinforce_plus_plus_baseline(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask)
    assert_close(base, torch.tensor([[1.095445, 1.095445, 0.0], [-0.730297, -0.730297, -0.730297]]),
                 atol=1e-5, rtol=0)
    assert_close(base.sum(), torch.tensor(0.0), atol=1e-6, rtol=0)


def test_gae_by_hand_and_padding_is_skipped():
    # one row [t0, t1, pad]: r = [0, 1], V = [0.5, 0.8]; gamma 0.9, lam 0.5
    # t1: delta = 1 + 0 - 0.8 = 0.2 -> A1 = 0.2
    # t0: delta = 0 + 0.9 * 0.8 - 0.5 = 0.22 -> A0 = 0.22 + 0.45 * 0.2 = 0.31; returns = A + V = 0.81, 1.0
    mask = torch.tensor([[1, 1, 0]])
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.8, 9.0]])  # the padded value must not leak in
    adv, ret = gae_returns(rewards, values, mask, gamma=0.9, lam=0.5)
    assert_close(adv, torch.tensor([[0.31, 0.2, 0.0]]))
    assert_close(ret, torch.tensor([[0.81, 1.0, 0.0]]))
    # a gap inside the row (an observation token) is skipped too: V after the gap is used at t0
    gap = torch.tensor([[1, 0, 1]])
    adv, _ = gae_returns(torch.tensor([[0.0, 5.0, 1.0]]), torch.tensor([[0.5, 7.0, 0.8]]), gap, gamma=0.9, lam=0.5)
    assert_close(adv, torch.tensor([[0.31, 0.0, 0.2]]))
    whitened = gae(None, None, mask, token_rewards=rewards, values=values, gamma=0.9, lam=0.5)
    assert_close(whitened, torch.tensor([[0.70711, -0.70711, 0.0]]), atol=1e-4, rtol=0)


def test_all_masked_rows_give_zeros_not_nan():
    mask = torch.zeros(2, 3)
    for adv in [rloo(R[:2], G[:2], mask), opo(R[:2], G[:2], mask), gpg(R[:2], G[:2], mask),
                dr_grpo(R[:2], G[:2], mask), grpo(R[:2], G[:2], mask), grpo_passk(R[:2], G[:2], mask),
                remax(R[:2], G[:2], mask, baseline_scores=torch.zeros(2)),
                reinforce_plus_plus(None, None, mask, token_rewards=torch.zeros(2, 3), gamma=1.0),
                reinforce_plus_plus_baseline(R[:2], G[:2], mask),
                gae(None, None, mask, token_rewards=torch.zeros(2, 3), values=torch.zeros(2, 3))]:
        assert torch.equal(adv, torch.zeros(2, 3))


def _pool(scores, mask, **extra):
    """Every tensor and hyperparameter the framework may offer an estimator."""
    B, T = mask.shape
    turn = torch.where(mask.bool(), 0, -1)  # agents: every row one turn, written after the prompt
    return {"gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True, "token_rewards": torch.zeros(B, T),
            "values": torch.zeros(B, T), "baseline_scores": torch.zeros(B), "discount": 0.95, "step_advantage_w": 1.0,
            "turn_index": turn, "turn_anchors": turn, "turn_rewards": torch.zeros(B, T), **extra}


OUTCOME = ["grpo", "dr_grpo", "grpo_passk", "rloo", "reinforce_plus_plus_baseline", "remax", "opo", "gpg"]


def test_every_estimator_takes_its_extras_by_keyword_from_the_pool():
    scores, mask = torch.tensor([1.0, 0.0, 0.5]), torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    for name, fn in ADV_ESTIMATORS.items():
        adv = call_with_params(fn, (scores, torch.tensor([0, 0, 1]), mask), _pool(scores, mask), "adv")
        assert adv.shape == (3, 3) and adv.is_floating_point() and torch.isfinite(adv).all(), name
    with pytest.raises(ConfigError, match="values"):  # gae without a critic is a configuration error
        call_with_params(gae, (scores, torch.tensor([0, 0, 1]), mask), {"token_rewards": torch.zeros(3, 3)}, "adv")


def test_identical_rewards_give_zero_advantage_exactly():
    # seven rewards of 0.7: a plain sum / 7 is an ulp off 0.7, which the std division used to blow up to +-0.06
    scores = torch.tensor([0.7] * 7 + [0.2, 0.2])
    groups = torch.tensor([4] * 7 + [9, 9])
    mask = torch.ones(9, 2)
    for name in OUTCOME:
        fn = ADV_ESTIMATORS[name]
        adv = fn(scores, groups, mask, baseline_scores=scores) if name == "remax" else fn(scores, groups, mask)
        assert torch.equal(adv, torch.zeros(9, 2)), name
    assert torch.equal(grpo_passk(scores, groups, mask, eps=0.0), torch.zeros(9, 2))  # no 0 / 0


def test_groups_of_size_one():
    # group 0 = [1, 0], group 5 = [0.5] alone: no baseline, so the singleton keeps its reward (verl's rule)
    scores, groups, mask = torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 0, 5]), torch.ones(3, 1)
    assert_close(dr_grpo(scores, groups, mask)[:, 0], torch.tensor([0.5, -0.5, 0.5]))
    assert_close(rloo(scores, groups, mask)[:, 0], torch.tensor([1.0, -1.0, 0.5]))  # 1 - 0, 0 - 1, 0.5
    assert_close(opo(scores, groups, mask)[:, 0], torch.tensor([0.5, -0.5, 0.5]))  # equal lengths: b = 0.5
    # passk: group 0 best 1 over 0 -> margin 1 (no std); the singleton has no runner-up -> 0
    assert_close(grpo_passk(scores, groups, mask, norm_adv_by_std_in_grpo=False)[:, 0], torch.tensor([1.0, 0, 0]))
    # rf++-baseline: centred [0.5, -0.5, 0.5], mean 1/6, deviations 1/3, -2/3, 1/3 -> var (6/9) / 2 = 1/3
    # -> 0.5773503, -1.1547005, 0.5773503
    assert_close(reinforce_plus_plus_baseline(scores, groups, mask)[:, 0],
                 torch.tensor([0.5773503, -1.1547005, 0.5773503]), atol=1e-5, rtol=0)
    # gpg: all 3 samples carry signal -> alpha 1; a singleton with reward 0 carries none:
    assert_close(gpg(scores, groups, mask)[:, 0], torch.tensor([0.5, -0.5, 0.5]))
    # [1, 0 | 0 alone]: 2 of 3 samples carry signal -> alpha 3/2 -> 0.75, -0.75, 0
    assert_close(gpg(torch.tensor([1.0, 0.0, 0.0]), groups, mask)[:, 0], torch.tensor([0.75, -0.75, 0.0]))
    # [1, 0 | 0.5 alone | 0.3, 0.3]: 3 of 5 carry signal -> alpha 5/3 -> 5/6, -5/6, 5/6, 0, 0
    adv = gpg(torch.tensor([1.0, 0.0, 0.5, 0.3, 0.3]), torch.tensor([0, 0, 5, 2, 2]), torch.ones(5, 1))
    assert_close(adv[:, 0], torch.tensor([5 / 6, -5 / 6, 5 / 6, 0.0, 0.0]))


def test_rows_of_different_lengths_broadcast_only_over_their_tokens():
    scores, groups = torch.tensor([1.0, 0.0, 0.5, 0.25]), torch.tensor([0, 0, 0, 1])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    for name in OUTCOME:
        fn = ADV_ESTIMATORS[name]
        adv = fn(scores, groups, mask, baseline_scores=torch.zeros(4)) if name == "remax" else fn(scores, groups, mask)
        assert torch.equal(adv, adv[:, :1] * mask), name  # one value per row, 0 on its padding
    # rloo by hand: 1 - (0 + 0.5) / 2 = 0.75; 0 - 0.75 = -0.75; 0.5 - 0.5 = 0; singleton 0.25
    assert_close(rloo(scores, groups, mask)[:, 0], torch.tensor([0.75, -0.75, 0.0, 0.25]))
    # opo: lengths 3, 1, 4 -> b = (3 + 0 + 2) / 8 = 0.625 -> 0.375, -0.625, -0.125; singleton 0.25
    assert_close(opo(scores, groups, mask)[:, 0], torch.tensor([0.375, -0.625, -0.125, 0.25]))


def test_gae_batched_rows_of_different_lengths():
    # gamma = lam = 1: A_t = (return-to-go) - V_t. Row 0 (3 tokens): r = [0, 0, 1], V = 0.5 -> A = 0.5, 0.5, 0.5,
    # returns 1, 1, 1. Row 1 (1 token): r = [0], V = 0.2 -> A = -0.2, return 0.
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.5, 0.5, 3.0], [0.2, 3.0, 3.0, 3.0]])
    adv, ret = gae_returns(rewards, values, mask, gamma=1.0, lam=1.0)
    assert_close(adv, torch.tensor([[0.5, 0.5, 0.5, 0.0], [-0.2, 0.0, 0.0, 0.0]]))
    assert_close(ret, torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    # whitened over 4 tokens: mean 1.3 / 4 = 0.325; deviations .175 (x3), -.525 -> var 0.3675 / 3 = 0.1225, std 0.35
    # -> 0.5, 0.5, 0.5, -1.5
    adv = gae(None, None, mask, token_rewards=rewards, values=values, gamma=1.0, lam=1.0)
    assert_close(adv, torch.tensor([[0.5, 0.5, 0.5, 0.0], [-1.5, 0.0, 0.0, 0.0]]), atol=1e-5, rtol=0)


def test_reinforce_plus_plus_restarts_the_return_after_a_masked_gap():
    # mask [1, 0, 1], r = [0, 5, 1], gamma 0.5: G_2 = 1, the gap passes nothing on -> G_0 = 0
    # whitened over 2 tokens: mean 0.5, var (0.25 + 0.25) / 1 -> std 0.707107 -> -0.707107, 0.707107
    adv = reinforce_plus_plus(None, None, torch.tensor([[1, 0, 1]]), token_rewards=torch.tensor([[0.0, 5.0, 1.0]]),
                              gamma=0.5)
    assert_close(adv, torch.tensor([[-0.707107, 0.0, 0.707107]]), atol=1e-5, rtol=0)


def test_an_all_masked_row_among_others():
    scores, groups = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0, 0, 0])
    mask = torch.tensor([[1, 1], [0, 0], [1, 1]])
    pool = _pool(scores, mask, token_rewards=torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]),
                 values=torch.full((3, 2), 0.5), baseline_scores=torch.full((3,), 0.5))
    for name, fn in ADV_ESTIMATORS.items():
        adv = call_with_params(fn, (scores, groups, mask), pool, "adv")
        assert torch.isfinite(adv).all() and torch.equal(adv[1], torch.zeros(2)), name
    # opo: the empty row weighs nothing: b = (2 * 1 + 0 + 2 * 0) / 4 = 0.5 -> 0.5, (0), -0.5
    assert_close(opo(scores, groups, mask)[:, 0], torch.tensor([0.5, 0.0, -0.5]))
    assert_close(remax(scores, groups, mask, baseline_scores=pool["baseline_scores"])[:, 0],
                 torch.tensor([0.5, 0.0, -0.5]))


def test_gigpo_hand_computed():
    """Two episodes of one group. A: turns 0, 1 (after the prompt P, then observation X), outcome 1.
    B: turns 0, 1, 2 (after P, X, Y), turn 0's call failed (-0.1), outcome 0: score -0.1. gamma 0.5, w 1.

        A_ep: mean 0.45 -> A +0.55, B -0.55
        G_A = [0 + 0.5 * 1, 1] = [0.5, 1];  G_B = [-0.1, 0, 0]
        step groups: P {0.5, -0.1} -> +-0.3;  X {1, 0} -> +-0.5;  Y {0} alone -> 0
        A: turn 0 0.85, turn 1 1.05;  B: turn 0 -0.85, turn 1 -1.05, turn 2 -0.55"""
    from rllava.data.protocol import Sample, Segment, Trajectory, collate

    def episode(turn_lengths, rewards, anchors):
        segments = [Segment([1, 1], trained=False)]
        for k, n in enumerate(turn_lengths):
            segments += ([Segment([2], trained=False)] if k else []) + [Segment([3] * n, trained=True)]
        return Trajectory(Sample(0, [], [], None), 0, segments, {}, turn_rewards=rewards, turn_anchors=anchors)

    batch = collate([episode([2, 2], [0.0, 0.0], ["", "X"]), episode([1, 1, 2], [-0.1, 0.0, 0.0], ["", "X", "Y"])], 0)
    assert batch.turn_index[1].tolist() == [-1, -1, 0, -1, 1, -1, 2, 2]
    assert batch.turn_rewards[1].tolist() == pytest.approx([0, 0, -0.1, 0, 0, 0, 0, 0])
    adv = ADV_ESTIMATORS["gigpo"](torch.tensor([1.0, -0.1]), batch.group_ids, batch.loss_mask,
                                  turn_index=batch.turn_index, turn_anchors=batch.turn_anchors,
                                  turn_rewards=batch.turn_rewards, discount=0.5, step_advantage_w=1.0,
                                  norm_adv_by_std_in_grpo=False)
    assert adv[0].tolist() == pytest.approx([0, 0, 0.85, 0.85, 0, 1.05, 1.05, 0])
    assert adv[1].tolist() == pytest.approx([0, 0, -0.85, 0, -1.05, 0, -0.55, -0.55])
    # with w = 0 it is GRPO's episode advantage on every model token
    ep = ADV_ESTIMATORS["gigpo"](torch.tensor([1.0, -0.1]), batch.group_ids, batch.loss_mask,
                                 turn_index=batch.turn_index, turn_anchors=batch.turn_anchors,
                                 turn_rewards=batch.turn_rewards, step_advantage_w=0.0)
    assert torch.allclose(ep, grpo(torch.tensor([1.0, -0.1]), batch.group_ids, batch.loss_mask))
