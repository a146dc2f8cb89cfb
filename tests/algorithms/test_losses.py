import pytest
import torch

from rllava.algorithms.losses import LossInputs, aggregate, kl_penalty, vanilla
from rllava.algorithms.registry import call_with_params


def test_vanilla_ppo_hand_computed():
    adv = torch.tensor([[1.0], [1.0], [-1.0], [-1.0]])
    ratio = torch.tensor([[1.5], [0.9], [0.5], [4.0]])
    old = torch.zeros(4, 1)
    logp = torch.log(ratio).requires_grad_(True)
    inp = LossInputs(logprobs=logp, mask=torch.ones(4, 1), advantages=adv, old_logprobs=old)
    loss, m = vanilla(inp, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    # i0: max(-1.5, -1.2) = -1.2 (clipped)   i1: -0.9 (inside)
    # i2: max(0.5, 0.8) = 0.8 (clipped)      i3: max(4, 1.2) = 4 > c=3 -> dual clip 3
    assert torch.allclose(loss[:, 0], torch.tensor([-1.2, -0.9, 0.8, 3.0]))
    assert m["pg_clipfrac"] == pytest.approx(0.5)
    assert m["pg_clipfrac_lower"] == pytest.approx(0.25)
    total = aggregate(loss, inp.mask, "token-mean", max_len=1)
    assert total.item() == pytest.approx((-1.2 - 0.9 + 0.8 + 3.0) / 4)
    total.backward()
    # only the unclipped token has a gradient: d(-A r)/d logp = -A r = -0.9, / 4 tokens
    assert torch.allclose(logp.grad[:, 0], torch.tensor([0.0, -0.9 / 4, 0.0, 0.0]))


def test_vanilla_needs_advantages():
    inp = LossInputs(logprobs=torch.zeros(1, 1), mask=torch.ones(1, 1))
    with pytest.raises(ValueError, match="LossInputs.advantages"):
        vanilla(inp)


def test_aggregation_modes():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(loss, mask, "token-mean", max_len=3).item() == pytest.approx(10 / 4)
    assert aggregate(loss, mask, "seq-mean-token-sum", max_len=3).item() == pytest.approx((6 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-mean", max_len=3).item() == pytest.approx((2 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", max_len=5).item() == pytest.approx(10 / (2 * 5))
    # global normalisers: two micro-batches sum to the unsplit token-mean
    a = aggregate(loss[:1], mask[:1], "token-mean", max_len=3, num_tokens=4)
    b = aggregate(loss[1:], mask[1:], "token-mean", max_len=3, num_tokens=4)
    assert (a + b).item() == pytest.approx(10 / 4)


def test_kl_estimators():
    logp, ref = torch.tensor([0.0, -1.0]), torch.tensor([-1.0, 0.0])  # d = [1, -1]
    assert torch.allclose(kl_penalty(logp, ref, "k1"), torch.tensor([1.0, -1.0]))
    assert torch.allclose(kl_penalty(logp, ref, "abs"), torch.tensor([1.0, 1.0]))
    assert torch.allclose(kl_penalty(logp, ref, "k2"), torch.tensor([0.5, 0.5]))
    e = torch.exp(torch.tensor(1.0))
    assert torch.allclose(kl_penalty(logp, ref, "low_var_kl"), torch.tensor([1 / e - 1 + 1, e - 1 - 1]))
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(logp, ref, "k9")


def test_call_with_params_reports_missing():
    def needs(inp, *, alpha):
        return alpha

    assert call_with_params(needs, (None,), {"alpha": 2, "other": 1}, "k") == 2
    with pytest.raises(ValueError, match="needs parameter 'alpha'"):
        call_with_params(needs, (None,), {}, "k")
