"""KL in the reward: token rewards and the fixed / adaptive coefficient controllers, by hand."""

import math

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


# ---------------------------------------------------------------- full-vocabulary KL (kl_penalty / kl_loss_type=full)


def _identity_head(v):
    head = torch.nn.Linear(v, v, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(v))
    return head


def test_full_kl_by_hand_on_a_three_token_vocabulary():
    from rllava.model.forward import full_kl_from_hidden

    # identity heads: the hidden states are the logits. p = (1/2, 1/4, 1/4), q = (1/4, 1/4, 1/2):
    # KL(p || q) = 1/2 ln 2 + 1/4 ln 1 + 1/4 ln(1/2) = ln(2) / 4
    p, q = torch.tensor([[0.5, 0.25, 0.25]]), torch.tensor([[0.25, 0.25, 0.5]])
    kl = full_kl_from_hidden(_identity_head(3), p.log(), q.log(), torch.eye(3))
    assert_close(kl, torch.tensor([math.log(2) / 4]))
    # at temperature 2 both are softmax(log x / 2) ~ sqrt(x): p' = (.4142, .2929, .2929), q' = (.2929, .2929, .4142)
    pt, qt = p.sqrt() / p.sqrt().sum(), q.sqrt() / q.sqrt().sum()
    kl = full_kl_from_hidden(_identity_head(3), p.log(), q.log(), torch.eye(3), temperature=2.0)
    assert_close(kl, (pt * (pt / qt).log()).sum(-1))
    assert_close(kl, torch.tensor([(0.41421356 - 0.29289322) * math.log(0.41421356 / 0.29289322)]))


def test_full_kl_is_never_negative_and_zero_against_itself():
    from rllava.model.forward import full_kl_from_hidden

    torch.manual_seed(0)
    head, h, h_ref = torch.nn.Linear(8, 50, bias=False), torch.randn(20, 8), torch.randn(20, 8)
    with torch.no_grad():
        kl = full_kl_from_hidden(head, h, h_ref, head.weight, chunk_size=7)
        same = full_kl_from_hidden(head, h, h, head.weight, chunk_size=7)
    assert (kl > 0).all() and kl.shape == (20,)
    assert same.abs().max() < 1e-6


def test_full_kl_gradient_matches_the_dense_formula():
    """The chunked backward (recomputing each chunk; no [N x V] tensor kept) against autograd of
    sum_v p_v (log p_v - log q_v) on full logits, for h and the head weight; the reference gets none."""
    from rllava.model.forward import full_kl_from_hidden

    torch.manual_seed(1)
    head, g = torch.nn.Linear(6, 40, bias=False), torch.randn(9)
    h, h_ref, w_ref = torch.randn(9, 6, requires_grad=True), torch.randn(9, 6), torch.randn(40, 6, requires_grad=True)
    for temperature, chunk in ((1.0, 4), (0.7, 4), (0.7, -1)):
        kl = full_kl_from_hidden(head, h, h_ref, w_ref, temperature=temperature, chunk_size=chunk)
        got = torch.autograd.grad((kl * g).sum(), (h, head.weight))
        logp = torch.log_softmax(head(h) / temperature, -1)
        logq = torch.log_softmax(h_ref @ w_ref.T / temperature, -1)
        dense = (logp.exp() * (logp - logq)).sum(-1)
        want = torch.autograd.grad((dense * g).sum(), (h, head.weight))
        assert_close(kl, dense)
        for a, b in zip(got, want):
            assert_close(a, b, atol=1e-6, rtol=1e-5)
        assert w_ref.grad is None


def test_controller_takes_the_full_kl_when_given():
    ctrl = KLController("fixed", 0.5, estimator="full")
    mask = torch.tensor([[1, 1], [1, 0]])
    kl = torch.tensor([[0.2, 0.4], [0.6, 9.0]])  # the last one is masked out
    rewards, m = ctrl.penalize(torch.tensor([1.0, 0.0]), mask, None, None, kl)
    assert_close(rewards, torch.tensor([[-0.1, 0.8], [-0.3, 0.0]]))
    assert abs(m["actor/reward_kl"] - 0.4) < 1e-6
