import math

import pytest
import torch

from rllava.algorithms.correction import rollout_importance_weights
from rllava.algorithms.losses import (LossInputs, aggregate, cispo, clip_cov, dapo, geo_mean, gpg, gspo, kl_cov,
                                      kl_penalty, sapo, vanilla)
from rllava.algorithms.registry import POLICY_LOSSES, call_with_params


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


# ---------------------------------------------------------------------------------------------------------------
# Policy-loss family. Convention in these tests: logprobs = old + log(ratio), so the ratios are literals.


def _inputs(ratio, adv, mask=None, old=None):
    ratio = torch.tensor(ratio)
    old = torch.zeros_like(ratio) if old is None else torch.tensor(old)
    logp = (old + torch.log(ratio)).requires_grad_(True)
    mask = torch.ones_like(ratio) if mask is None else torch.tensor(mask)
    return LossInputs(logprobs=logp, mask=mask, advantages=torch.tensor(adv), old_logprobs=old)


def _grad(loss, inp):
    (loss * inp.mask).sum().backward()  # d(sum of masked per-token losses) / d logp
    return inp.logprobs.grad


NEW_LOSSES = ["dapo", "gspo", "geo_mean", "gmpo", "gpg", "clip_cov", "kl_cov", "cispo", "sapo"]


def test_new_losses_are_registered():
    for name in NEW_LOSSES:
        assert name in POLICY_LOSSES
    assert POLICY_LOSSES["gmpo"] is POLICY_LOSSES["geo_mean"] is geo_mean


def test_losses_take_their_hyperparameters_from_the_config_pool():
    # the pool PPO builds from actor.* and actor.policy_loss.* (schema defaults); new keys fall back to defaults
    pool = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0, "clip_cov_ratio": 0.0002,
            "clip_cov_lb": 1.0, "clip_cov_ub": 5.0, "kl_cov_ratio": 0.0002, "ppo_kl_coef": 0.1}
    for name in NEW_LOSSES:
        inp = _inputs([[1.0, 1.0]], [[1.0, 1.0]])
        loss, metrics = call_with_params(POLICY_LOSSES[name], (inp,), pool, "actor.policy_loss.loss_mode")
        assert loss.shape == (1, 2) and all(torch.is_tensor(v) and v.dim() == 0 and not v.requires_grad
                                            for v in metrics.values())


def test_dapo_clip_higher_without_dual_clip():
    inp = _inputs([[1.5, 1.25], [0.5, 4.0]], [[1.0, 1.0], [-1.0, -1.0]])
    loss, m = dapo(inp, clip_ratio_low=0.2, clip_ratio_high=0.28)
    # A=+1: r=1.5 -> max(-1.5, -1.28) = -1.28 (clipped at 1+0.28); r=1.25 inside [0.8, 1.28] -> -1.25
    #       (symmetric PPO with 0.2 would clip it to -1.2)
    # A=-1: r=0.5 -> max(0.5, 0.8) = 0.8 (clipped at 1-0.2); r=4 -> max(4, 1.28) = 4, no dual-clip cap at 3
    assert torch.allclose(loss, torch.tensor([[-1.28, -1.25], [0.8, 4.0]]))
    assert m["pg_clipfrac"] == pytest.approx(2 / 4)
    assert m["ppo_kl"] == pytest.approx(-math.log(1.5 * 1.25 * 0.5 * 4.0) / 4)  # mean(-log r) = -ln(3.75)/4
    # only unclipped tokens have gradient d(-A r)/d logp = -A r: -1.25 and +4
    assert torch.allclose(_grad(loss, inp), torch.tensor([[0.0, -1.25], [0.0, 4.0]]))


def test_gspo_sequence_ratio_and_its_gradient():
    # row 0: token ratios 2, 0.5, 1.331 -> s_0 = (2 * 0.5 * 1.331)^(1/3) = 1.1 (inside [0.8, 1.2])
    # row 1: ratios 4, 1 and a masked token (ratio e^5, must not count) -> s_1 = sqrt(4) = 2 -> clipped to 1.2
    ratio = [[2.0, 0.5, 1.331], [4.0, 1.0, math.exp(5.0)]]
    inp = _inputs(ratio, [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], mask=[[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, m = gspo(inp, clip_ratio_low=0.2, clip_ratio_high=0.2)
    # every token of a sequence carries the same value: -A s_0 = -1.1; row 1: max(-2, -1.2) = -1.2
    assert torch.allclose(loss, torch.tensor([[-1.1, -1.1, -1.1], [-1.2, -1.2, -1.2]]))
    assert m["pg_clipfrac"] == pytest.approx(2 / 5)  # the 2 masked tokens of row 1
    assert m["ppo_kl"] == pytest.approx(-math.log(2 * 0.5 * 1.331 * 4 * 1) / 5)
    # s_it = sg[s_i] pi/sg[pi]: d L_it / d logp_it = -A s_i = -1.1 for every token of row 0, even the ones whose
    # own ratio (2, 0.5) token-level PPO would clip; the clipped sequence has no gradient
    assert torch.allclose(_grad(loss, inp), torch.tensor([[-1.1, -1.1, -1.1], [0.0, 0.0, 0.0]]))


def test_geo_mean_log_space_clip_and_even_split():
    # log ratios: row 0 (A=+1) [0.2, 0.6, masked 9.0]; row 1 (A=-1) [0.5, -0.6, 0.2]; eps = 0.4 in log space
    logr = [[0.2, 0.6, 9.0], [0.5, -0.6, 0.2]]
    inp = _inputs([[math.exp(x) for x in row] for row in logr], [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]],
                  mask=[[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, m = geo_mean(inp, clip_ratio_low=0.4, clip_ratio_high=0.4)
    # row 0, A>0 caps at +0.4: [0.2, 0.4] -> mean 0.3 -> L_0 = -e^0.3 = -1.3498588, / 2 tokens = -0.6749294
    # row 1, A<0 floors at -0.4: [0.5, -0.4, 0.2] -> mean 0.1 -> L_1 = e^0.1 = 1.1051709, / 3 tokens = 0.3683903
    assert torch.allclose(loss[0, :2], torch.tensor([-0.6749294, -0.6749294]))
    assert torch.allclose(loss[1], torch.tensor([0.3683903, 0.3683903, 0.3683903]))
    assert m["pg_clipfrac"] == pytest.approx(2 / 5)  # 0.6 in row 0, -0.6 in row 1
    # seq-mean-token-sum recovers the paper's mean_i L_i = (-1.3498588 + 1.1051709) / 2
    total = aggregate(loss, inp.mask, "seq-mean-token-sum", max_len=3)
    assert total.item() == pytest.approx(-0.12234395, abs=1e-6)
    total.backward()
    # dL_i/dlogp_t = -A_i e^{mean l} / |o_i| on unclipped tokens, then / 2 sequences:
    # row 0 token 0: -e^0.3 / 2 / 2 = -0.3374647; row 1 tokens 0, 2: e^0.1 / 3 / 2 = 0.1841952
    assert torch.allclose(inp.logprobs.grad, torch.tensor([[-0.3374647, 0.0, 0.0], [0.1841952, 0.0, 0.1841952]]))


def test_gpg_is_plain_policy_gradient():
    logp = torch.tensor([[-0.5, -1.0], [-2.0, -0.1]], requires_grad=True)
    inp = LossInputs(logprobs=logp, mask=torch.ones(2, 2), advantages=torch.tensor([[1.0, 1.0], [-2.0, -2.0]]))
    loss, m = gpg(inp)  # needs no old log-probs
    # -A logp: [-(1)(-0.5), -(1)(-1)], [-(-2)(-2), -(-2)(-0.1)]
    assert torch.allclose(loss, torch.tensor([[0.5, 1.0], [-4.0, -0.2]]))
    assert m == {}
    assert torch.allclose(_grad(loss, inp), torch.tensor([[-1.0, -1.0], [2.0, 2.0]]))  # -A


def test_clip_cov_detaches_the_in_band_token():
    # logp = [[2, 6], [-2, -6]] (mean 0), A = [[1, 1], [-1, -1]] (mean 0) -> cov = A * logp = [[2, 6], [2, 6]]
    # (1, 0) has ratio 0.5 with A<0, already clipped by PPO -> excluded; cov 6 > ub 5 excluded -> only (0, 0)
    logp = torch.tensor([[2.0, 6.0], [-2.0, -6.0]])
    old = logp - torch.log(torch.tensor([[1.0, 1.0], [0.5, 1.0]]))
    inp = LossInputs(logprobs=logp.clone().requires_grad_(True), mask=torch.ones(2, 2),
                     advantages=torch.tensor([[1.0, 1.0], [-1.0, -1.0]]), old_logprobs=old)
    loss, m = clip_cov(inp, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_cov_ratio=1.0, clip_cov_lb=1.0,
                       clip_cov_ub=5.0)
    # values are PPO's: -1, -1, max(0.5, 0.8) = 0.8, 1
    assert torch.allclose(loss, torch.tensor([[-1.0, -1.0], [0.8, 1.0]]))
    assert m["pg_clipfrac"] == pytest.approx(1 / 4) and m["clip_cov_frac"] == pytest.approx(1 / 4)
    # gradient -A r, except the detached (0, 0) and the PPO-clipped (1, 0)
    assert torch.allclose(_grad(loss, inp), torch.tensor([[0.0, -1.0], [0.0, 1.0]]))


def test_clip_cov_random_selection_uses_the_global_rng():
    # all 4 tokens have cov 2 in the band; clip_cov_ratio 0.5 -> 2 of them are drawn
    def run():
        logp = torch.tensor([[2.0, 2.0], [-2.0, -2.0]], requires_grad=True)
        inp = LossInputs(logprobs=logp, mask=torch.ones(2, 2), advantages=torch.tensor([[1.0, 1.0], [-1.0, -1.0]]),
                         old_logprobs=logp.detach().clone())
        loss, m = clip_cov(inp, clip_cov_ratio=0.5)
        assert m["clip_cov_frac"] == pytest.approx(0.5)
        return _grad(loss, inp)

    torch.manual_seed(0)
    first = run()
    assert int((first == 0).sum()) == 2  # two detached; the others keep -A r = -A
    torch.manual_seed(0)
    assert torch.equal(run(), first)


def test_kl_cov_penalises_the_top_covariance_tokens():
    # logp = [[0.5, 3], [-1.5, -2]] (mean 0), A = [[1, 1], [-1, -1]] -> cov = [[0.5, 3], [1.5, 2]]
    # kl_cov_ratio 0.5 of 4 tokens -> top 2: (0, 1) cov 3 and (1, 1) cov 2
    logp = torch.tensor([[0.5, 3.0], [-1.5, -2.0]])
    ratio = torch.tensor([[1.2, 1.5], [0.8, 2.0]])
    inp = LossInputs(logprobs=logp.clone().requires_grad_(True), mask=torch.ones(2, 2),
                     advantages=torch.tensor([[1.0, 1.0], [-1.0, -1.0]]), old_logprobs=logp - torch.log(ratio))
    loss, m = kl_cov(inp, kl_cov_ratio=0.5, ppo_kl_coef=0.1)
    # unclipped -A r everywhere, + 0.1 |log r| on the selected: -1.5 + 0.1 ln 1.5, 2 + 0.1 ln 2
    assert torch.allclose(loss, torch.tensor([[-1.2, -1.45945349], [0.8, 2.06931472]]))
    assert m["kl_cov_frac"] == pytest.approx(0.5)
    assert m["ppo_kl"] == pytest.approx(-math.log(1.2 * 1.5 * 0.8 * 2.0) / 4)  # -ln(2.88)/4
    # gradient -A r (+ 0.1 sign(log r) on the selected): -1.2, -1.5 + 0.1, 0.8, 2 + 0.1
    assert torch.allclose(_grad(loss, inp), torch.tensor([[-1.2, -1.4], [0.8, 2.1]]))


def test_cispo_clips_the_weight_but_keeps_every_gradient():
    logp = torch.tensor([[-0.5, -1.0], [-2.0, -0.25]])
    ratio = torch.tensor([[2.0, 1.1], [0.1, 1.5]])
    inp = LossInputs(logprobs=logp.clone().requires_grad_(True), mask=torch.ones(2, 2),
                     advantages=torch.tensor([[1.0, 1.0], [-1.0, -1.0]]), old_logprobs=logp - torch.log(ratio))
    loss, m = cispo(inp, cispo_clip_ratio_low=1.0, cispo_clip_ratio_high=0.28)
    # w = clip(r, 0, 1.28) = [[1.28, 1.1], [0.1, 1.28]] (no lower bound: 0.1 stays 0.1)
    # L = -w A logp: -1.28*1*(-0.5) = 0.64, -1.1*(-1) = 1.1, -0.1*(-1)*(-2) = -0.2, -1.28*(-1)*(-0.25) = -0.32
    assert torch.allclose(loss, torch.tensor([[0.64, 1.1], [-0.2, -0.32]]))
    assert m["pg_clipfrac"] == pytest.approx(2 / 4)
    # grad = -w A (the weight is a constant): truncated tokens still get gradient, unlike PPO
    assert torch.allclose(_grad(loss, inp), torch.tensor([[-1.28, -1.1], [0.1, 1.28]]))


def test_sapo_soft_gate_by_hand():
    ratio = torch.tensor([[1.0, 1.5], [1.0, 0.5]])
    logp = torch.tensor([[-0.5, -1.0], [-2.0, -0.25]])
    inp = LossInputs(logprobs=logp.clone().requires_grad_(True), mask=torch.ones(2, 2),
                     advantages=torch.tensor([[1.0, 1.0], [-1.0, -1.0]]), old_logprobs=logp - torch.log(ratio))
    loss, m = sapo(inp, tau_pos=1.0, tau_neg=1.05)
    # s = sigmoid(tau (r - 1)), L = -(4 / tau) s A, grad wrt logp = -4 s (1 - s) r A
    # A=+1, tau=1:    r=1   -> s=0.5, L=-2;                         r=1.5 -> s=sigmoid(0.5)=0.62246, L=-2.48984
    # A=-1, tau=1.05: r=1   -> s=0.5, L=(4/1.05) 0.5 = 1.90476;     r=0.5 -> s=sigmoid(-0.525)=0.37169, L=1.41594
    assert torch.allclose(loss, torch.tensor([[-2.0, -2.4898373], [1.9047619, 1.4159383]]))
    # w = 4 s (1 - s): 1, 0.940015, 1, 0.934140 -> grad = -w r A: -1, -1.410022, 1, 0.467070
    assert torch.allclose(_grad(loss, inp), torch.tensor([[-1.0, -1.4100223], [1.0, 0.4670699]]))
    assert m["sapo_weight"] == pytest.approx((1 + 0.9400148 + 1 + 0.9341398) / 4)
    # a soft gate, not a clip: at r = 3 (PPO: clipped, gradient 0) the weight has decayed to 4 s (1 - s) < 0.5
    far = LossInputs(logprobs=torch.zeros(1, 1, requires_grad=True), mask=torch.ones(1, 1),
                     advantages=torch.ones(1, 1), old_logprobs=torch.full((1, 1), -math.log(3.0)))
    loss, m = sapo(far)
    s = 1 / (1 + math.exp(-2.0))
    assert m["sapo_weight"].item() == pytest.approx(4 * s * (1 - s)) and m["sapo_weight"] < 0.5
    assert _grad(loss, far).item() == pytest.approx(-4 * s * (1 - s) * 3.0)


@pytest.mark.parametrize("name", ["vanilla", "dapo", "gspo", "geo_mean", "clip_cov", "kl_cov", "cispo", "gpg", "sapo"])
def test_on_policy_ratio_one(name):
    # ratio exactly 1: ratio losses equal -A with no clipping, and every loss has gradient -A (geo_mean: -A/|o|)
    adv = torch.tensor([[0.5, 0.5], [-0.3, -0.3]])  # small |cov| < 1 keeps clip_cov from detaching anything
    logp = torch.tensor([[-0.7, -0.2], [-1.1, -0.4]], requires_grad=True)
    inp = LossInputs(logprobs=logp, mask=torch.ones(2, 2), advantages=adv, old_logprobs=logp.detach().clone())
    loss, m = POLICY_LOSSES[name](inp)
    if name == "geo_mean":
        assert torch.allclose(loss, -adv / 2)  # -A split over 2 tokens
    elif name in ("cispo", "gpg"):
        assert torch.allclose(loss, -adv * logp)  # w = 1
    elif name == "sapo":
        assert torch.allclose(loss, -adv * 2 / torch.tensor([[1.0], [1.05]]))  # -A (4 / tau) sigmoid(0)
    else:
        assert torch.allclose(loss, -adv)
    assert m.get("pg_clipfrac", 0.0) == 0.0 and m.get("ppo_kl", 0.0) == 0.0
    assert torch.allclose(_grad(loss, inp), -adv / 2 if name == "geo_mean" else -adv)


@pytest.mark.parametrize("name", ["vanilla", "sft"] + NEW_LOSSES)
@pytest.mark.parametrize("mask", [[[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
def test_all_masked_rows_give_no_nan(name, mask):
    logp = torch.tensor([[-0.5, -1.5, -3.0], [-2.0, -0.1, -9.0]], requires_grad=True)
    inp = LossInputs(logprobs=logp, mask=torch.tensor(mask), advantages=torch.tensor([[1.0] * 3, [-1.0] * 3]),
                     old_logprobs=torch.tensor([[-0.6, -1.0, 0.0], [-1.0, -0.5, 0.0]]))
    loss, m = POLICY_LOSSES[name](inp)
    assert loss.shape == (2, 3) and torch.isfinite(loss).all()
    assert all(math.isfinite(v) for v in m.values())
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        total = aggregate(loss, inp.mask, mode, max_len=3)
        assert torch.isfinite(total)
    total.backward()
    assert torch.isfinite(logp.grad).all()
    assert (logp.grad[1] == 0).all()  # the empty row contributes nothing


def test_rollout_importance_weights_token_and_sequence():
    # log(pi_old / pi_rollout) = [[ln 3, ln 0.5, (masked) 7], [ln 1.5, ln 1.2, ln 2.5]], cap 2
    d = torch.log(torch.tensor([[3.0, 0.5, 1.0], [1.5, 1.2, 2.5]]))
    d[0, 2] = 7.0
    rollout = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.2]])
    old = (rollout + d).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    w, m = rollout_importance_weights(old, rollout, mask, cap=2.0)
    # min(r, 2) per token; masked token -> 1 (neutral)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 1.0], [1.5, 1.2, 2.0]]))
    assert not w.requires_grad
    assert m["rollout_is_mean"] == pytest.approx((2 + 0.5 + 1.5 + 1.2 + 2) / 5)  # 1.44
    assert m["rollout_is_truncated_frac"] == pytest.approx(2 / 5)  # 3 -> 2 and 2.5 -> 2
    assert m["rollout_log_ratio_abs"] == pytest.approx(math.log(3 * 2 * 1.5 * 1.2 * 2.5) / 5)  # ln(27)/5
    w, m = rollout_importance_weights(old, rollout, mask, cap=2.0, level="sequence")
    # row 0: 3 * 0.5 = 1.5 (masked 7 ignored); row 1: 1.5 * 1.2 * 2.5 = 4.5 -> truncated to 2
    assert torch.allclose(w, torch.tensor([[1.5, 1.5, 1.0], [2.0, 2.0, 2.0]]))
    assert m["rollout_is_mean"] == pytest.approx((1.5 * 2 + 2.0 * 3) / 5)  # 1.8
    assert m["rollout_is_truncated_frac"] == pytest.approx(3 / 5)
    with pytest.raises(ValueError, match="importance-sampling level"):
        rollout_importance_weights(old, rollout, mask, cap=2.0, level="batch")


def test_docs_algorithms_md_is_generated_from_the_registries():
    """docs/algorithms.md cannot drift: regenerate with `python -m rllava.commands.docs`."""
    import os

    from rllava.commands.docs import render_algorithms as render

    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "algorithms.md")
    with open(path) as f:
        assert f.read() == render(), "stale: run python -m rllava.commands.docs"
