"""Rollout correction (rllava.algorithms.correction) and the decoupled PPO loss: expected numbers come from the
references' formulas (verl rollout_corr_helper.py, AReaL ppo_actor_loss_fn) evaluated by hand on a small example,
not from the code under test."""

import json
import math
import os
import types

import pytest
import torch

from rllava.algorithms.correction import mismatch_metrics, rollout_importance_weights, rollout_rejection_mask
from rllava.algorithms.losses import LossInputs, decoupled_ppo, vanilla
from rllava.config import ConfigError, load_config
from rllava.roles.actor import Actor
from rllava.train import builders as B

# log rho = old - rollout: row 0 [0.5, -1.0, 0.0, (masked)], row 1 [0.0, -0.2, 0.5, 0.0]
OLD = [[-1.0, -2.0, -0.5, 0.0], [-0.3, -1.2, -2.0, -0.7]]
ROLLOUT = [[-1.5, -1.0, -0.5, -9.0], [-0.3, -1.0, -2.5, -0.7]]
MASK = [[1, 1, 1, 0], [1, 1, 1, 1]]
LR = [[o - r for o, r in zip(orow, rrow)] for orow, rrow in zip(OLD, ROLLOUT)]
TOKENS = [(i, t) for i in range(2) for t in range(4) if MASK[i][t]]


def _t(x):
    return torch.tensor(x, dtype=torch.float32)


def _rs(options, thresholds):
    return rollout_rejection_mask(_t(OLD), _t(ROLLOUT), _t(MASK), options=options, thresholds=thresholds)


def _kept(keep):
    return [[int(keep[i][t]) for t in range(4)] for i in range(2)]


def test_token_tis():
    w, m = rollout_importance_weights(_t(OLD), _t(ROLLOUT), _t(MASK), cap=1.5)
    expect = [[min(math.exp(LR[i][t]), 1.5) if MASK[i][t] else 1.0 for t in range(4)] for i in range(2)]
    assert torch.allclose(w, _t(expect))
    assert float(m["rollout_is_mean"]) == pytest.approx(sum(expect[i][t] for i, t in TOKENS) / 7)
    assert float(m["rollout_is_max"]) == pytest.approx(math.exp(0.5))  # before truncation
    assert float(m["rollout_is_truncated_frac"]) == pytest.approx(2 / 7)  # the two 0.5 tokens


def test_sequence_tis():
    w, m = rollout_importance_weights(_t(OLD), _t(ROLLOUT), _t(MASK), cap=2.0, level="sequence")
    seq = [min(math.exp(sum(LR[i][t] for t in range(4) if MASK[i][t])), 2.0) for i in range(2)]  # e^-0.5, e^0.3
    assert w[0, :3].tolist() == pytest.approx([seq[0]] * 3) and w[1].tolist() == pytest.approx([seq[1]] * 4)
    assert float(m["rollout_is_mean"]) == pytest.approx((3 * seq[0] + 4 * seq[1]) / 7)
    assert float(m["rollout_is_max"]) == pytest.approx(math.exp(0.3))


def test_token_k1_rejection_with_lower_and_upper_ratio_bounds():
    keep, m = _rs("token_k1", "0.7_1.5")  # keep log 0.7 <= -log rho <= log 1.5
    expect = [[int(not MASK[i][t] or math.log(0.7) <= -LR[i][t] <= math.log(1.5)) for t in range(4)]
              for i in range(2)]
    assert _kept(keep) == expect == [[0, 0, 1, 1], [1, 1, 0, 1]]
    assert float(m["rollout_rs_masked_fraction"]) == pytest.approx(3 / 7)
    assert float(m["rollout_rs_token_k1_masked_fraction"]) == pytest.approx(3 / 7)
    assert float(m["rollout_rs_seq_masked_fraction"]) == pytest.approx(1.0)
    keep, _ = _rs("token_k1", "0.55_1.5")  # asymmetric bounds: k1 = -log rho, not log rho
    assert _kept(keep) == [[int(not MASK[i][t] or math.log(0.55) <= -LR[i][t] <= math.log(1.5)) for t in range(4)]
                           for i in range(2)] == [[1, 0, 1, 1], [1, 1, 1, 1]]
    keep, _ = _rs("token_k1", "1.8")  # a single value is the upper bound, lower = 1 / upper
    expect = [[int(not MASK[i][t] or -math.log(1.8) <= -LR[i][t] <= math.log(1.8)) for t in range(4)]
              for i in range(2)]
    assert _kept(keep) == expect == [[1, 0, 1, 1], [1, 1, 1, 1]]


def test_token_k2_rejection():
    keep, _ = _rs("token_k2", "0.15")
    expect = [[int(not MASK[i][t] or 0.5 * LR[i][t] ** 2 <= 0.15) for t in range(4)] for i in range(2)]
    assert _kept(keep) == expect == [[1, 0, 1, 1], [1, 1, 1, 1]]


def _rows(ok):
    return [[int(ok[i] or not MASK[i][t]) for t in range(4)] for i in range(2)]


def test_sequence_k1_rejection_is_the_sequence_ratio():
    keep, m = _rs("seq_sum_k1", "0.7_1.5")
    s = [sum(-LR[i][t] for t in range(4) if MASK[i][t]) for i in range(2)]  # 0.5, -0.3
    assert _kept(keep) == _rows([math.log(0.7) <= v <= math.log(1.5) for v in s]) == _rows([False, True])
    assert float(m["rollout_rs_seq_masked_fraction"]) == pytest.approx(0.5)
    assert float(m["rollout_rs_masked_fraction"]) == pytest.approx(3 / 7)


def test_geometric_mean_rejection():
    keep, _ = _rs("seq_mean_k1", "0.9_1.1")
    s = [sum(-LR[i][t] for t in range(4) if MASK[i][t]) / sum(MASK[i]) for i in range(2)]  # 0.167, -0.075
    assert _kept(keep) == _rows([math.log(0.9) <= v <= math.log(1.1) for v in s]) == _rows([False, True])
    keep, _ = _rs("seq_mean_k3", "0.01")
    s = [sum(math.exp(LR[i][t]) - 1 - LR[i][t] for t in range(4) if MASK[i][t]) / sum(MASK[i]) for i in range(2)]
    assert _kept(keep) == _rows([v <= 0.01 for v in s])


def test_max_k3_vetoes_a_sequence_with_one_catastrophic_token():
    keep, _ = _rs("seq_max_k3", "0.2")
    s = [max(math.exp(LR[i][t]) - 1 - LR[i][t] for t in range(4) if MASK[i][t]) for i in range(2)]  # .368, .149
    assert _kept(keep) == _rows([v <= 0.2 for v in s]) == _rows([False, True])


def test_options_combine_and_each_takes_its_threshold():
    keep, m = _rs("token_k2,seq_max_k3", "0.1,0.2")  # token_k2 rejects (0,0) (0,1) (1,2); seq_max_k3 row 0
    assert _kept(keep) == [[0, 0, 0, 1], [1, 1, 0, 1]]
    assert float(m["rollout_rs_seq_max_k3_masked_fraction"]) == pytest.approx(3 / 7)
    assert float(m["rollout_rs_masked_fraction"]) == pytest.approx(4 / 7)


def test_mismatch_metrics():
    m = mismatch_metrics(_t(OLD), _t(ROLLOUT), _t(MASK))
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    lr = [LR[i][t] for i, t in TOKENS]
    seq_o = [mean([OLD[i][t] for t in range(4) if MASK[i][t]]) for i in range(2)]
    seq_r = [mean([ROLLOUT[i][t] for t in range(4) if MASK[i][t]]) for i in range(2)]
    seq_lr = [sum(LR[i][t] for t in range(4) if MASK[i][t]) for i in range(2)]
    expect = {"mismatch_kl": mean([-x for x in lr]), "mismatch_k3_kl": mean([math.exp(x) - x - 1 for x in lr]),
              "mismatch_chi2_token": mean([math.exp(x) ** 2 for x in lr]) - 1,
              "mismatch_chi2_seq": mean([math.exp(2 * s) for s in seq_lr]) - 1,
              "mismatch_log_ppl_diff": mean([r - o for r, o in zip(seq_r, seq_o)]),
              "mismatch_training_ppl": mean([math.exp(-o) for o in seq_o]),
              "mismatch_rollout_ppl": mean([math.exp(-r) for r in seq_r])}
    assert {k: float(v) for k, v in m.items()} == pytest.approx(expect)


def test_decoupled_ppo_by_hand():
    """AReaL ppo_actor_loss_fn: r = pi / pi_prox clipped, times w = pi_prox / pi_behav, w over the cap -> 0."""
    logp, prox, behav = [-1.0, -0.5, -2.0, -1.0], [-1.2, -0.5, -1.0, -1.0], [-1.0, -2.0, -1.1, -0.9]
    adv = [1.0, -1.0, -2.0, 0.5]
    inp = LossInputs(logprobs=_t([logp]), mask=torch.ones(1, 4), advantages=_t([adv]), old_logprobs=_t([prox]),
                     rollout_logprobs=_t([behav]))
    loss, m = decoupled_ppo(inp, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, behav_imp_weight_cap=4.0)
    expect = []
    for lp, px, bh, a in zip(logp, prox, behav, adv):
        r, w = math.exp(lp - px), math.exp(px - bh)
        pg = max(-a * r, -a * min(max(r, 0.8), 1.2))
        pg = min(pg, 3.0 * abs(a)) if a < 0 else pg  # AReaL's dual clip: min(pg, sign(A) c A)
        expect.append(pg * (w if w <= 4.0 else 0.0))
    assert loss[0].tolist() == pytest.approx(expect)
    assert float(m["behav_filtered_frac"]) == pytest.approx(0.25)  # w = e^1.5 > 4 on token 1
    kept = [math.exp(p - b) for p, b in zip(prox, behav) if math.exp(p - b) <= 4.0]
    assert float(m["behav_imp_weight"]) == pytest.approx(sum(kept) / 3)


def test_decoupled_ppo_is_vanilla_when_the_sampler_is_the_trainer():
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(3, 5, generator=g) * 2).requires_grad_()
    old = logp.detach() + torch.randn(3, 5, generator=g) * 1.5  # wide enough that the clip and dual clip act
    inp = dict(logprobs=logp, mask=torch.ones(3, 5), advantages=torch.randn(3, 5, generator=g), old_logprobs=old)
    ours, _ = decoupled_ppo(LossInputs(**inp, rollout_logprobs=old.clone()), clip_ratio_c=3.0)
    ref, m = vanilla(LossInputs(**inp), clip_ratio_c=3.0)
    assert float(m["pg_clipfrac_lower"]) > 0 and float(m["pg_clipfrac"]) > 0
    assert torch.allclose(ours, ref)
    (g1,) = torch.autograd.grad(ours.sum(), logp)
    (g2,) = torch.autograd.grad(ref.sum(), logp)
    assert torch.allclose(g1, g2)


def _cfg(*extra):
    return load_config(["config=examples/tasks/counting/tiny_cpu.yaml", *extra])


def _actor(cfg, loss_name="vanilla"):
    from rllava.algorithms.registry import POLICY_LOSSES  # the registered loss: what it reads (decoupled_ppo)

    algorithm = types.SimpleNamespace(loss_name=loss_name, loss_fn=POLICY_LOSSES[loss_name])
    return Actor(None, None, algorithm, ppo_epochs=1, mini_batch_size=2, micro_batch_size=2, log_prob_micro_batch_size=2, loss_agg_mode="token-mean", max_response_length=4,
                 temperature=1.0, use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="kl", entropy_coeff=0.0,
                 **B._rollout_is(cfg, False))


def _micro():
    return types.SimpleNamespace(rollout_logprobs=_t(ROLLOUT), off_policy_mask=None,
                                 need=lambda name: _t(ROLLOUT))


def test_rollout_rs_keys_reach_the_actor_and_drop_tokens_from_the_rl_mask():
    cfg = _cfg("algorithm.rollout_rs=token_k1,seq_max_k3", "algorithm.rollout_rs_threshold=0.7_1.5,0.2",
               "algorithm.rollout_is=token", "algorithm.rollout_is_cap=1.5")
    mask, weights, _, m = _actor(cfg)._rollout_correction(_micro(), _t(MASK), _t(OLD))
    assert mask.tolist() == [[0, 0, 0, 0], [1, 1, 0, 1]]  # token_k1 as above; seq_max_k3 rejects row 0
    assert weights[1].tolist() == pytest.approx([1.0, math.exp(-0.2), 1.5, 1.0])  # TIS before rejection (verl)
    assert "mismatch_kl" in m and "rollout_is_max" in m
    assert float(m["rollout_rs_masked_fraction"]) == pytest.approx(4 / 7)
    _, weights, _, m = _actor(_cfg())._rollout_correction(_micro(), _t(MASK), _t(OLD))
    assert weights is None and m == {}  # off by default
    _, weights, _, m = _actor(_cfg(), "decoupled_ppo")._rollout_correction(_micro(), _t(MASK), _t(OLD))
    assert weights is None and "mismatch_k3_kl" in m  # decoupled_ppo: metrics, no second weighting


def test_the_sequence_weight_is_taken_over_the_whole_response_before_rejection():
    """verl's `compute_rollout_correction_and_rejection_mask` (verl/trainer/ppo/rollout_corr_helper.py@b178a3c
    L782-808) computes the IS weights over the full response_mask (Step 2), then the rejection mask (Step 3):
    log rho = [0.1, 3.0, 0.1], token_k1 at 0.5_2.0 rejects token 1 (rho = e^3 > 2), and the kept tokens' sequence
    weight is min(exp(0.1 + 3.0 + 0.1), 2) = 2.0 (rllava before: over the kept tokens, e^0.2 = 1.2214)."""
    cfg = _cfg("algorithm.rollout_is=sequence", "algorithm.rollout_is_cap=2.0", "algorithm.rollout_rs=token_k1",
               "algorithm.rollout_rs_threshold=0.5_2.0")
    log_rho = [0.1, 3.0, 0.1]
    micro = types.SimpleNamespace(off_policy_mask=None, need=lambda name: torch.zeros(1, 3))
    mask, weights, *_ = _actor(cfg)._rollout_correction(micro, torch.ones(1, 3), _t([log_rho]))
    assert mask.tolist() == [[1, 0, 1]]
    assert weights[0, [0, 2]].tolist() == pytest.approx([min(math.exp(sum(log_rho)), 2.0)] * 2)


def test_new_keys_start_and_bad_values_are_one_line_errors():
    assert _cfg("algorithm.rollout_rs=seq_mean_k1", "algorithm.rollout_rs_threshold=0.999_1.001").algorithm.rollout_rs
    cfg = _cfg("actor.policy_loss.loss_mode=decoupled_ppo", "actor.policy_loss.behav_imp_weight_cap=5.0",
               "algorithm.rollout_rs=seq_sum_k1", "algorithm.rollout_rs_threshold=0.5_2.0")
    assert cfg.actor.policy_loss.behav_imp_weight_cap == 5.0
    for args, key in [(["algorithm.rollout_rs=seq_mean_k4", "algorithm.rollout_rs_threshold=1"],
                       "algorithm.rollout_rs"),
                      (["algorithm.rollout_rs=seq_mean_k1"], "algorithm.rollout_rs_threshold"),
                      (["algorithm.rollout_rs=token_k3", "algorithm.rollout_rs_threshold=0.1_0.2"],
                       "algorithm.rollout_rs_threshold"),
                      (["algorithm.rollout_rs=token_k1,token_k2", "algorithm.rollout_rs_threshold=1,2,3"],
                       "algorithm.rollout_rs_threshold"),
                      (["algorithm.rollout_rs_threshold=0.5_2.0"], "algorithm.rollout_rs_threshold"),
                      (["actor.policy_loss.loss_mode=decoupled_ppo", "actor.policy_loss.behav_imp_weight_cap=0.5"],
                       "actor.policy_loss.behav_imp_weight_cap"),
                      (["actor.policy_loss.behav_imp_weight_cap=5.0"], "actor.policy_loss.behav_imp_weight_cap"),
                      (["actor.policy_loss.loss_mode=decoupled_ppo", "actor.tis_imp_ratio_cap=2.0"],
                       "actor.tis_imp_ratio_cap")]:
        with pytest.raises(ConfigError) as e:
            _cfg(*args)
        assert key in str(e.value) and "\n" not in str(e.value), (args, str(e.value))


@pytest.mark.parametrize("extra, expect", [
    (["algorithm.rollout_is=sequence", "algorithm.rollout_rs=token_k1,seq_max_k3",
      "algorithm.rollout_rs_threshold=0.5_2.0,0.01"],
     ["actor/rollout_is_mean", "actor/rollout_is_max", "actor/rollout_rs_masked_fraction",
      "actor/rollout_rs_seq_masked_fraction", "actor/mismatch_kl", "actor/mismatch_k3_kl"]),
    (["actor.policy_loss.loss_mode=decoupled_ppo", "actor.policy_loss.behav_imp_weight_cap=5.0", "actor.ppo_epochs=2"],
     ["actor/behav_imp_weight", "actor/behav_filtered_frac", "actor/mismatch_kl", "timing/old_logprob"]),
])
def test_a_run_step_with_rollout_correction(tmp_path, tiny_model_dir, counting_dir, extra, expect):
    from rllava.train.outputs import keys_for
    from rllava.train.pipeline import rlvr

    out = str(tmp_path / "run")
    config = os.path.join(os.path.dirname(__file__), "..", "..", "examples/tasks/counting/tiny_cpu.yaml")
    rlvr.main([f"config={config}", f"actor.model.model_path={tiny_model_dir}",
               f"data.train_files={counting_dir}/train.jsonl", f"data.val_files={counting_dir}/val.jsonl",
               "data.max_samples=16", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4",
               "actor.ppo_micro_batch_size=8", "rollout.n=4", "trainer.max_steps=1", "trainer.val_before_train=false",
               "trainer.val_freq=-1", *keys_for(out), "trainer.logger=[jsonl]", *extra])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    row = [r for r in rows if "reward/mean" in r][0]
    assert all(key in row for key in expect), sorted(row)
    assert all(v == v for v in row.values()), row  # no NaN
