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
    dr_grpo, gae, gae_returns, gpg, grpo_passk, masked_whiten, opo, reinforce_plus_plus,
    reinforce_plus_plus_baseline, remax, rloo)

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
    assert_close(adv[1, 0], torch.tensor(0.5 / 0.16333 ** 0.5), atol=1e-4, rtol=0)


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
    s = 0.2 ** 0.5
    assert_close(adv, torch.tensor([[0.2 / s, 0.7 / s, 0.0], [-0.3 / s, -0.3 / s, -0.3 / s]]), atol=1e-5, rtol=0)
    # baseline variant: centred scores [1 - 1/3 = 2/3, -1/3] over 2 + 3 tokens -> then whitened
    base = reinforce_plus_plus_baseline(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask)
    centred = torch.tensor([[0.5, 0.5, 0.0], [-0.5, -0.5, -0.5]])
    assert_close(base, masked_whiten(centred, mask))
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
                reinforce_plus_plus(None, None, mask, token_rewards=torch.zeros(2, 3), gamma=1.0),
                reinforce_plus_plus_baseline(R[:2], G[:2], mask),
                gae(None, None, mask, token_rewards=torch.zeros(2, 3), values=torch.zeros(2, 3))]:
        assert torch.equal(adv, torch.zeros(2, 3))
