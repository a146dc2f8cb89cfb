"""KL in the reward: token rewards and the fixed / adaptive coefficient controllers, by hand."""

import torch
from torch.testing import assert_close

from rllava.algorithms.kl import KLController, outcome_token_rewards
from rllava.algorithms.losses import value_loss


def test_outcome_token_rewards_put_the_score_on_the_last_trained_token():
    mask = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    out = outcome_token_rewards(torch.tensor([2.0, 3.0, 4.0]), mask)
    assert_close(out, torch.tensor([[0, 0, 2.0, 0], [3.0, 0, 0, 0], [0, 0, 0, 0]]))


def test_adaptive_controller_shapes_rewards_then_moves_beta():
    ctrl = KLController("adaptive", 0.1, estimator="k1", target_kl=0.1, horizon=100)
    mask = torch.tensor([[1, 1], [1, 0]])
    old = torch.zeros(2, 2)
    ref = torch.tensor([[-1.0, 0.0], [0.2, 0.0]])  # k1 = old - ref = [[1, 0], [-0.2, (masked)]]
    rewards, m = ctrl.penalize(torch.tensor([1.0, 0.0]), mask, old, ref)
    # outcome [[0, 1], [0, .]] minus 0.1 * KL
    assert_close(rewards, torch.tensor([[-0.1, 1.0], [0.02, 0.0]]))
    # KL = (1 + 0 - 0.2) / 3 = 0.2667 -> error clip(2.667 - 1) = 0.2 -> beta = 0.1 * (1 + 0.2 * 2 / 100) = 0.1004
    assert abs(m["actor/reward_kl"] - 0.8 / 3) < 1e-6 and m["actor/reward_kl_coef"] == 0.1
    assert abs(ctrl.value - 0.1004) < 1e-9
    fixed = KLController("fixed", 0.1, estimator="k1")
    fixed.penalize(torch.tensor([1.0, 0.0]), mask, old, ref)
    assert fixed.value == 0.1


def test_clipped_value_loss():
    # token 1: V_clip = 0.5 + clip(0.5) = 0.7; max((1-1.5)^2, (0.7-1.5)^2) = 0.64 -> 0.32 (clipped branch)
    # token 2: V_clip = 0.7; max((2-0)^2, (0.7-0)^2) = 4 -> 2.0
    loss, clipfrac = value_loss(torch.tensor([[1.0, 2.0]]), torch.tensor([[0.5, 0.5]]), torch.tensor([[1.5, 0.0]]),
                                torch.tensor([[1, 1]]), cliprange=0.2)
    assert_close(loss, torch.tensor([[0.32, 2.0]]))
    assert clipfrac == 0.5
