"""SFT+RL hybrid schedules, weights and losses (rllava.algorithms.hybrid) against hand-computed values."""

import dataclasses
import math

import pytest
import torch

from rllava.algorithms.advantage import grpo
from rllava.algorithms.hybrid import (HYBRID_LOSSES, chunk_bounds, hint_probability, luffy,
                                      mu_schedule, phi, reshape, sft_token_weights, srft, srft_weights, uft)
from rllava.algorithms.losses import LossInputs, aggregate
from rllava.config.schema import HYBRIDS, _is_reshape
from rllava.roles.actor import ExpertLoss


def test_mu_schedule_warms_up_decays_and_stays():
    mu = [mu_schedule(t, warmup=2, decay=2, peak=0.5, valley=0.1) for t in range(6)]
    # linear 0 -> 0.5 over 2 steps; cosine 0.5 -> 0.1 over 2 steps (midpoint 0.3); then 0.1
    assert mu == pytest.approx([0.0, 0.25, 0.5, 0.3, 0.1, 0.1])
    assert mu_schedule(7, warmup=0, decay=0, peak=0.1, valley=0.1) == pytest.approx(0.1)  # CHORD-phi's constant mu
    assert mu_schedule(0, warmup=0, decay=200, peak=0.9, valley=0.05) == pytest.approx(0.9)  # the mu variant


def test_phi_weights_uncertain_tokens_most():
    assert phi(torch.tensor([0.5, 0.9, 0.0, 1.0])).tolist() == pytest.approx([0.25, 0.09, 0.0, 0.0])
    lp = torch.log(torch.tensor([[0.5, 0.9]]))
    w = sft_token_weights("chord", lp, torch.zeros_like(lp), torch.ones_like(lp), enable_phi_function=True)
    assert w.tolist()[0] == pytest.approx([0.25, 0.09]) and not w.requires_grad
    assert sft_token_weights("chord", lp, lp, lp).tolist()[0] == [1.0, 1.0]  # phi off
    assert sft_token_weights("hpt", lp, lp, lp).tolist()[0] == [1.0, 1.0]


def test_reshapes():
    r, lp = torch.tensor([0.25]), torch.log(torch.tensor([0.25]))
    assert reshape(r, lp, "no_reshape").item() == pytest.approx(0.25)
    assert reshape(r, lp, "p_div_p_0.1").item() == pytest.approx(0.25 / 0.35)
    assert reshape(r, lp, "square_root").item() == pytest.approx(0.5)
    assert reshape(r, lp, "pow", pow_exp=2.0).item() == pytest.approx(0.0625)
    assert reshape(r, lp, "logp", weight=0.1).item() == pytest.approx(0.1 * math.log(0.25))
    assert _is_reshape("p_div_p_0.05") and not _is_reshape("p_div_p_x") and not _is_reshape("sqrt")


def _inputs(p, adv, off, old=None, entropy=None):
    lp = torch.log(torch.tensor([p], dtype=torch.float64)).requires_grad_()
    return LossInputs(logprobs=lp, mask=torch.ones_like(lp), advantages=torch.tensor([adv], dtype=torch.float64),
                      old_logprobs=lp.detach() if old is None else torch.log(torch.tensor([old], dtype=torch.float64)),
                      off_policy=torch.tensor([off], dtype=torch.float64),
                      entropy=None if entropy is None else torch.tensor([entropy], dtype=torch.float64))


def test_luffy_shapes_expert_tokens_without_clipping():
    """Expert tokens: L = -A p / (p + 0.1), pi_old = 1 (the stored old log-prob is ignored), gradient
    dL/dlogp = -A 0.1 p / (p + 0.1)^2 however far p is from anything: never clipped. Own tokens: PPO clip."""
    inp = _inputs([0.1, 0.5, 0.5, 0.5], [1.0, 1.0, 1.0, 1.0], [1, 1, 0, 0], old=[0.9, 0.9, 0.25, 0.5])
    loss, m = luffy(inp, off_policy_reshape="p_div_p_0.1")
    # own token 3: ratio 0.5 / 0.25 = 2 > 1.2, A > 0: clipped to -1.2; own token 4: ratio 1: -1
    assert loss.tolist()[0] == pytest.approx([-0.5, -0.5 / 0.6, -1.2, -1.0])
    loss.sum().backward()
    assert inp.logprobs.grad.tolist()[0][:2] == pytest.approx([-0.1 * 0.1 / 0.2 ** 2, -0.1 * 0.5 / 0.6 ** 2])
    assert inp.logprobs.grad[0, 2] == 0 and m["pg_clipfrac"] == pytest.approx(0.5)
    loss, _ = luffy(_inputs([0.5, 0.5], [1.0, 1.0], [0, 0], old=[0.25, 0.25]), loss_remove_clip=True)
    assert loss.tolist()[0] == pytest.approx([-2.0, -2.0])  # LUFFY's script: no clip on own tokens either
    loss, _ = luffy(_inputs([0.1, 0.95], [1.0, 1.0], [1, 0]), all_max_clip=0.9)
    assert loss[0, 1] == 0  # all_max_clip: no loss on tokens the policy already gives p > 0.9


def test_luffy_group_advantages_include_the_injected_expert_sample():
    """One group of 4: the expert's response (reward 1) beside 3 rollouts (rewards 0, 0, 1). GRPO over the
    mixed group: mean 0.5, unbiased std sqrt(1/3): A = +-0.5 / 0.57735 = +-0.866, the expert's too."""
    scores, ids = torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long)
    adv = grpo(scores, ids, torch.ones(4, 2))[:, 0]
    assert adv.tolist() == pytest.approx([0.866, -0.866, -0.866, 0.866], abs=1e-3)
    # without the expert the group (0, 0, 1) has a different baseline: 1/3
    assert grpo(scores[1:], ids[1:], torch.ones(3, 1))[:, 0].tolist() == pytest.approx([-0.577, -0.577, 1.155], abs=1e-3)


def test_srft_weights_and_terms():
    """Per-sequence weights from each row's own entropy; correctness from the reward, not the advantage: row 1 is
    correct with A = 0 (an all-correct group), row 2 wrong with A > 0 (all its group wrong but it less so)."""
    assert srft_weights(torch.tensor(0.0))[0].item() == pytest.approx(0.5)
    assert [w.item() for w in srft_weights(torch.tensor(1.0))] == pytest.approx([0.5 / math.e, 0.1 * math.e])
    lp = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.2, 0.4]], dtype=torch.float64)).requires_grad_()
    inp = LossInputs(logprobs=lp, mask=torch.ones(3, 2), advantages=torch.tensor([[0.0] * 2, [1.0] * 2, [1.0] * 2]),
                     old_logprobs=lp.detach(), off_policy=torch.tensor([[0.0] * 2, [0.0] * 2, [1.0] * 2]),
                     entropy=torch.tensor([[0.5, 1.5], [2.0, 2.0], [3.0, 1.0]]), scores=torch.tensor([1.0, 0.0, 1.0]))
    loss, m = srft(inp)
    w_rl = 0.1 * math.e  # row 1's mean entropy (0.5 + 1.5) / 2 = 1
    assert loss[0].tolist() == pytest.approx([-w_rl * math.log(0.5)] * 2) and loss[1].tolist() == pytest.approx(
        [math.log(0.5)] * 2)
    assert loss[2].tolist() == pytest.approx([-0.2 / 0.3, -0.4 / 0.5])
    assert m["srft_on_coef"].item() == pytest.approx((w_rl + 0.1 * math.exp(2)) / 2)
    assert m["srft_entropy"].item() == pytest.approx(1.5)
    w = sft_token_weights("srft", inp.logprobs, inp.entropy, inp.mask)
    assert w[2].tolist() == pytest.approx([0.5 * math.exp(-2)] * 2)  # the demonstration row's own entropy (3 + 1) / 2
    inp = dataclasses.replace(inp, scores=torch.tensor([0.5, 0.0, 1.0]))
    assert srft(inp, success_reward_threshold=0.5)[0][0].tolist() == pytest.approx([-w_rl * math.log(0.5)] * 2)
    assert srft(inp)[0][0].tolist() == pytest.approx([math.log(0.5)] * 2)  # 0.5 < 1: wrong


def test_hint_schedule_and_chunks():
    """UFT: p(t) cosine 0.95 -> 0.05 over 300 steps, 0 after; a hint of k chunks = the first bounds[k-1] tokens."""
    p = [hint_probability(t, steps=300, start=0.95, end=0.05) for t in (0, 150, 299, 300, 400)]
    assert p[:2] == pytest.approx([0.95, 0.5]) and 0.05 < p[2] < 0.0501 and p[3:] == [0.0, 0.0]
    assert chunk_bounds(10, 4) == [3, 6, 8, 10] and chunk_bounds(3, 5) == [1, 2, 3] and chunk_bounds(5, 5) == [1, 2, 3, 4, 5]


def test_expert_loss_masks_and_separate_normalisation():
    """Tokens: row 0 = a 2-token expert hint then 2 sampled tokens, row 1 = 4 sampled tokens.
    UFT: RL on the 6 own tokens, SFT on the 2 expert ones; LUFFY: RL on all 8; SRFT: RL on all, SFT on expert."""
    mask, off = torch.ones(2, 4), torch.tensor([[1.0, 1, 0, 0], [0, 0, 0, 0]])
    rl, sft = ExpertLoss("uft").masks(mask, off)
    assert rl.sum() == 6 and sft.sum() == 2 and (rl * sft).sum() == 0
    rl, sft = ExpertLoss("luffy").masks(mask, off)
    assert rl.sum() == 8 and sft.sum() == 0
    rl, sft = ExpertLoss("srft").masks(mask, off)
    assert rl.sum() == 8 and sft.sum() == 2
    # the SFT term is a mean over its own tokens: -mean log p of the 2 hint tokens
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.9, 0.9], [0.9, 0.9, 0.9, 0.9]]))
    rl, sft = ExpertLoss("uft").masks(mask, off)
    assert aggregate(-lp, sft, "token-mean", max_len=4).item() == pytest.approx(-(math.log(0.5) + math.log(0.25)) / 2)
    loss, _ = uft(LossInputs(logprobs=lp, mask=rl, advantages=torch.ones(2, 4), old_logprobs=lp))
    assert aggregate(loss, rl, "token-mean", max_len=4).item() == pytest.approx(-1.0)  # -A r over the 6 own tokens


def test_every_hybrid_name_the_config_accepts_is_a_registered_policy_loss():
    from rllava.algorithms.registry import POLICY_LOSSES

    assert HYBRID_LOSSES is HYBRIDS and set(HYBRIDS) <= set(POLICY_LOSSES)
