"""CHORD, CHORD-phi, UFT and HPT against their reference implementations: the whole step loss and its gradient
d loss / d log p on small float64 examples.

rllava composes each hybrid in `Actor.update` (`rllava.roles.actor`): the policy loss on the RL tokens, an SFT
term -w_t log p_t on the expert tokens, each normalised over its own tokens, combined as
rl_coef L_RL + sft_coef L_SFT with the coefficients of `rllava.train.hybrid_step.Hybrid`. Each test drives
`Actor.update` over one mini-batch (the model's forward replaced by fixed log-probs) and compares with the
reference's objective, written out below from the reference code:

  CHORD, CHORD-phi (arXiv:2508.11408): Trinity-RFT, read at yanxi-chen/Trinity-RFT@9051d63 (a mirror of
      agentscope-ai/Trinity-RFT; modelscope/Trinity-RFT@0414330 has the same formulas):
      trinity/algorithm/policy_loss_fn/chord_policy_loss.py  L14-31 mu_schedule_function, L62-67 phi_function,
          L89-97 SFTPhiLossFn (-log p * phi(p).detach(), token-mean), L202-228 MIXCHORDPolicyLossFn
          (GRPO on ~expert_mask rows, SFT on expert rows, L228 loss = (1 - mu) grpo_loss + mu sft_loss)
      trinity/algorithm/policy_loss_fn/sft_loss.py  L22 (-log p, token-mean)
      trinity/algorithm/policy_loss_fn/ppo_policy_loss.py  L53-76 (PPO clip, then dual clip at clip_ratio_c = 3
          for A < 0: MIXCHORDPolicyLossFn L156-161 does not pass clip_ratio_c, so it is always on), L107
      trinity/algorithm/utils.py  L27-28, L58-60 (token-mean = masked mean)
      trinity/trainer/trainer.py L139 + trinity/algorithm/sample_strategy/mix_sample_strategy.py L64, L79: the
          first update runs with step = 1
  UFT (arXiv:2505.16984): liumy2010/UFT@ad3c8ec
      verl/workers/actor/dp_actor.py  L249, L257-273 (cross-entropy on the hint tokens, masked mean over them),
          L275-279 (PPO on the response), L284 (policy_loss = pg_loss - entropy + sft_loss * sft_loss_coef)
      verl/trainer/ppo/core_algos.py  L185-192 (PPO clip, token-mean, no dual clip)
      verl/utils/torch_functional.py  L252-253 (hint_mask: the hint tokens appended to the prompt)
      run.py  L15 (sft_loss_coef = 0.001)
  HPT (arXiv:2509.04419): TsinghuaC3I/Unify-Post-Training@ae332f5
      exp_scripts/train.sh  L24-28 (switch, SWITCH_GATE=0, SFT_LOSS_COEF=1.0), L108-109 (loss_remove_token_mean,
          loss_remove_clip)
      hpt/verl/verl/mix_src/mix_trainer.py  L394-407 (on_solve_num <= switch_gate: the 8 rollouts out, 1
          demonstration in), L609 (on_solve_num = #rewards == success_value), L941-962 (the rollouts dropped)
      hpt/verl/verl/mix_src/mix_actor.py  L135-165 (offline_loss_type=sft: SFT token-mean on the rows holding a
          prefix, PPO on the others, pg_loss = sft_loss * sft_loss_coef + pg_loss), L477 (/ gradient_accumulation)
      hpt/verl/verl/mix_src/mix_core_alg.py  L7-10 (compute_sft_pure_loss: masked mean of -log p)
      hpt/verl/verl/trainer/ppo/core_algos.py  L307-320 (clip unless loss_remove_clip; token-mean, or
          sum / response length with loss_remove_token_mean);  mix_src/config/mix_ppo_trainer.yaml L89-91 (defaults)

The references normalise per micro-batch (then / gradient accumulation); one micro-batch of the whole
mini-batch is the case where their objective is the formula below. KL and entropy terms are off (both are
rllava's standard ones, tested elsewhere).
"""

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch

import rllava.roles.actor as actor_module
from rllava.algorithms.losses import LossInputs
from rllava.algorithms.ppo import build_algorithm
from rllava.config.schema import ActorConfig, AlgorithmConfig, PolicyLossConfig
from rllava.data.protocol import Batch
from rllava.roles.actor import Actor, ExpertLoss
from rllava.train.hybrid_step import Hybrid

F64 = torch.float64


# -- the references' formulas, independent of rllava ---------------------------------------------------------------
def ref_ppo(lp, old, adv, *, eps=0.2, clip=True, dual_clip_c=None):
    """Per-token PPO loss (UFT core_algos.py L185-192; HPT core_algos.py L307-315; Trinity ppo_policy_loss.py
    L53-76, which adds the dual clip min(., -A c) where A < 0)."""
    ratio = torch.exp(lp - old)
    loss = -adv * ratio
    if clip:
        loss = torch.maximum(loss, -adv * ratio.clamp(1 - eps, 1 + eps))
    if dual_clip_c is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip_c), loss)
    return loss


def mean_over(x, mask):
    """The references' masked_mean (their 1e-8 / 1e-6 guards against an empty mask do not matter here)."""
    return (x * mask).sum() / mask.sum()


def trinity_mu(step, warmup, decay, peak, valley):
    """chord_policy_loss.py L14-31."""
    if step < warmup:
        return step / warmup * peak
    if step >= warmup + decay:
        return valley
    return (peak - valley) * 0.5 * (1 + math.cos(math.pi * (step - warmup) / decay)) + valley


def with_grad(fn, lp):
    """(value, d value / d lp) of a reference objective."""
    leaf = lp.clone().requires_grad_()
    value = fn(leaf)
    value.backward()
    return value.detach(), leaf.grad


# -- rllava's Actor over one mini-batch ----------------------------------------------------------------------------
class _Engine:
    device = torch.device("cpu")

    def __init__(self):
        self.losses = []

    def backward(self, loss):
        self.losses.append(loss.detach())
        loss.backward()

    def update_phase(self):
        return contextlib.nullcontext()

    def optimizer_step(self):
        return 0.0


def actor_step(monkeypatch, mode, lp, old, adv, loss_mask, off, *, rl_coef, sft_coef, sft_only=None, micro=None,
               loss_agg_mode="token-mean", max_len=4, phi=False, token_level_sft=True, loss_remove_clip=False,
               entropy=None, scores=None, **actor_keys):
    """(loss, d loss / d lp) of one `Actor.update` over the rows given, the forward returning `lp` and `entropy`
    (row i of a micro-batch is found by input_ids[:, 0] = i)."""
    leaf = lp.clone().requires_grad_()
    ent = torch.zeros_like(lp) if entropy is None else entropy
    monkeypatch.setattr(actor_module, "token_logprobs",
                        lambda model, b, **kw: (leaf[b.input_ids[:, 0]], ent[b.input_ids[:, 0]]))
    n, t = lp.shape
    batch = Batch(trajectories=[SimpleNamespace(mm_inputs=None)] * n, input_ids=torch.arange(n)[:, None].repeat(1, t),
                  attention_mask=torch.ones(n, t, dtype=torch.long), loss_mask=loss_mask,
                  group_ids=torch.zeros(n, dtype=torch.long), advantages=adv, old_logprobs=old, off_policy_mask=off,
                  sft_only=sft_only, scores=scores)
    cfg = ActorConfig(policy_loss=PolicyLossConfig(loss_mode=mode), loss_remove_clip=loss_remove_clip, **actor_keys)
    engine = _Engine()
    actor = Actor(torch.nn.Module(), engine, build_algorithm(AlgorithmConfig(), cfg), ppo_epochs=1, mini_batch_size=n,
                  micro_batch_size=micro or n, log_prob_micro_batch_size=n, loss_agg_mode=loss_agg_mode,
                  max_response_length=max_len, temperature=1.0, use_kl_loss=False, kl_loss_coef=0.0,
                  kl_loss_type="low_var_kl", entropy_coeff=0.0, expert=ExpertLoss(mode, phi, token_level_sft))
    actor.update(batch, rl_coef=rl_coef, sft_coef=sft_coef)
    return sum(engine.losses), leaf.grad


def t64(rows):
    return torch.tensor(rows, dtype=F64)


def assert_rl_per_token(mode, lp, old, adv, mask, want, **actor_cfg):
    """rllava's registered per-token loss on the RL tokens against the reference's."""
    cfg = ActorConfig(policy_loss=PolicyLossConfig(loss_mode=mode), **actor_cfg)
    got, _ = build_algorithm(AlgorithmConfig(), cfg).policy_loss(
        LossInputs(logprobs=lp, mask=mask, advantages=adv, old_logprobs=old))
    torch.testing.assert_close(got * mask, want * mask)


def assert_parity(got, want):
    torch.testing.assert_close(got[0], want[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got[1], want[1], rtol=1e-10, atol=1e-12)


# CHORD's batch: 3 rollouts (row 0 has a token clipped above, row 1 one clipped below; rows of 4, 3, 2 tokens) and
# 2 demonstrations (rows 3, 4: every token the expert's, 4 and 2 tokens, their own group: A = 0)
CHORD_P = t64([[0.55, 0.70, 0.40, 0.30], [0.30, 0.55, 0.25, 0.9], [0.5, 0.2, 0.9, 0.9], [0.9, 0.5, 0.2, 0.7],
               [0.3, 0.6, 0.9, 0.9]])
CHORD_P_OLD = t64([[0.5, 0.5, 0.4, 0.6], [0.5, 0.5, 0.2, 0.9], [0.4, 0.25, 0.9, 0.9], [1, 1, 1, 1], [1, 1, 1, 1]])
CHORD_A = t64([[1.0] * 4, [-0.5] * 4, [0.5] * 4, [0.0] * 4, [0.0] * 4])
CHORD_MASK = t64([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
CHORD_OFF = t64([[0] * 4, [0] * 4, [0] * 4, [1] * 4, [1] * 4])
DEMOS = torch.tensor([False, False, False, True, True])


@pytest.mark.parametrize("ratio_above_dual_clip", [
    pytest.param(False, id="ratios_below_3"),
    # Trinity's CHORD GRPO term caps -A r at -A * 3 where A < 0 (ppo_policy_loss.py L71-76, clip_ratio_c = 3 always
    # on in MIXCHORDPolicyLossFn): so does rllava's chord (actor.clip_ratio_c)
    pytest.param(True, id="ratio_above_dual_clip"),
])
def test_chord_matches_trinity_mix_chord(monkeypatch, ratio_above_dual_clip):
    """CHORD-mu (examples/algorithms/chord.sh's schedule): L = (1 - mu) L_GRPO + mu L_SFT, L_GRPO = token-mean
    PPO over the rollouts' tokens only, L_SFT = token-mean -log p over the demonstrations' tokens only.
    Fails if mu weights the wrong term, if the demonstrations enter the GRPO term (its clip, its token count), or
    if the SFT term is a mean over sequences or over all tokens."""
    p, p_old = CHORD_P.clone(), CHORD_P_OLD.clone()
    if ratio_above_dual_clip:  # row 1 (A < 0), token 1: r = 0.7 / 0.2 = 3.5 > 3
        p[1, 1], p_old[1, 1] = 0.7, 0.2
    lp, old = torch.log(p), torch.log(p_old)
    schedule = dict(warmup=0, decay=200, peak=0.9, valley=0.05)  # chord.sh
    step = 101  # rllava's step t runs mu(t - 1) (mu(0) first), Trinity's the same update runs mu(t): one step apart
    mu = trinity_mu(step - 1, **schedule)
    alg = AlgorithmConfig(mu_warmup_steps=0, mu_decay_steps=200, mu_peak=0.9, mu_valley=0.05)
    rl_coef, sft_coef = Hybrid.coefficients(SimpleNamespace(mode="chord", a=alg), step)
    assert (rl_coef, sft_coef) == pytest.approx((1 - mu, mu)) and 0.4 < mu < 0.5

    rollouts, demos = CHORD_MASK * (1 - CHORD_OFF), CHORD_MASK * CHORD_OFF
    assert_rl_per_token("chord", lp, old, CHORD_A, rollouts, ref_ppo(lp, old, CHORD_A, dual_clip_c=3.0))
    want = with_grad(lambda x: (1 - mu) * mean_over(ref_ppo(x, old, CHORD_A, dual_clip_c=3.0), rollouts)
                     + mu * mean_over(-x, demos), lp)
    got = actor_step(monkeypatch, "chord", lp, old, CHORD_A, CHORD_MASK, CHORD_OFF, rl_coef=rl_coef,
                     sft_coef=sft_coef, sft_only=DEMOS, micro=2)  # 3 micro-batches, normalised as one
    assert_parity(got, want)


def test_chord_phi_matches_trinity_sft_phi(monkeypatch):
    """CHORD-phi (chord_phi.sh: constant mu = 0.1): L_SFT = token-mean of -phi(p) log p, phi(p) = p (1 - p)
    detached, so d L_SFT / d log p_t = -phi(p_t) / N_expert_tokens. Fails if phi is not detached (the gradient
    gains -(1 - 2p) p log p), is left out, or the SFT term is averaged per sequence."""
    lp, old = torch.log(CHORD_P), torch.log(CHORD_P_OLD)
    alg = AlgorithmConfig(mu_warmup_steps=0, mu_decay_steps=0, mu_peak=0.1, mu_valley=0.1, enable_phi_function=True)
    rl_coef, sft_coef = Hybrid.coefficients(SimpleNamespace(mode="chord", a=alg), 7)
    mu = trinity_mu(7, 0, 0, 0.1, 0.1)
    assert (rl_coef, sft_coef) == pytest.approx((1 - mu, mu))

    rollouts, demos = CHORD_MASK * (1 - CHORD_OFF), CHORD_MASK * CHORD_OFF

    def reference(x):
        p = torch.exp(x)
        sft = mean_over(-x * (p * (1 - p)).detach(), demos)  # SFTPhiLossFn, L89-97
        return (1 - mu) * mean_over(ref_ppo(x, old, CHORD_A, dual_clip_c=3.0), rollouts) + mu * sft

    want = with_grad(reference, lp)
    p = CHORD_P * demos
    assert torch.allclose(want[1] * demos, -mu * p * (1 - p) / demos.sum())  # the weight phi, as a gradient
    got = actor_step(monkeypatch, "chord", lp, old, CHORD_A, CHORD_MASK, CHORD_OFF, rl_coef=rl_coef,
                     sft_coef=sft_coef, sft_only=DEMOS, phi=True)
    assert_parity(got, want)


def test_uft_matches_authors_dp_actor(monkeypatch):
    """UFT (uft.sh): 2 prompts x 2 rollouts; prompt 0's rollouts start with a 2-token hint, prompt 1's with a
    1-token one (rllava: off-policy tokens at the start of the response; UFT: appended to the prompt). L = PPO
    token-mean over the continuation + beta x token-mean -log p over every row's hint tokens, beta = 0.001.
    Fails if the hint enters the PPO term, beta weights the wrong term, or the SFT mean runs over other tokens."""
    p = t64([[0.6, 0.3, 0.5, 0.7, 0.2], [0.6, 0.3, 0.4, 0.9, 0.5], [0.2, 0.5, 0.6, 0.5, 0.8],
             [0.2, 0.3, 0.7, 0.4, 0.4]])
    p_old = t64([[0.5, 0.5, 0.4, 0.5, 0.2], [0.5, 0.5, 0.5, 0.6, 0.5], [0.2, 0.4, 0.5, 0.5, 0.9],
                 [0.2, 0.3, 0.5, 0.4, 0.4]])
    adv = t64([[1.0] * 5, [-1.0] * 5, [0.7] * 5, [-0.7] * 5])
    mask = t64([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    hint = t64([[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0]])
    lp, old = torch.log(p), torch.log(p_old)
    beta = 0.001  # run.py L15
    rl_coef, sft_coef = Hybrid.coefficients(
        SimpleNamespace(mode="uft", cfg=SimpleNamespace(actor=SimpleNamespace(sft_loss_coef=beta))), 3)
    assert (rl_coef, sft_coef) == (1.0, beta)

    response = mask * (1 - hint)  # UFT's response_mask: what follows the hint
    assert_rl_per_token("uft", lp, old, adv, response, ref_ppo(lp, old, adv))
    want = with_grad(lambda x: mean_over(ref_ppo(x, old, adv), response) + beta * mean_over(-x, hint), lp)
    got = actor_step(monkeypatch, "uft", lp, old, adv, mask, hint, rl_coef=rl_coef, sft_coef=sft_coef, max_len=5)
    assert_parity(got, want)


@pytest.mark.parametrize("flags", ["mix_ppo_trainer.yaml", "train.sh"])
def test_hpt_matches_authors_switch(monkeypatch, flags):
    """HPT, unify_strategy=switch, switch_gate=1: 3 prompts x 2 rollouts solved 0, 2 and 1 times; prompts 0 and 2
    (solved <= 1 times) train on their demonstrations (rows 6, 7: 3 and 2 tokens) instead of their rollouts, prompt
    1 on its rollouts. L = L_PG(rollouts of prompt 1) + c x token-mean -log p over the demonstrations, c = 0.3.
    `mix_ppo_trainer.yaml`: the reference's defaults (PPO clip, token-mean), as rllava's hpt.sh runs.
    `train.sh`: the authors' script (no clip, the token sum / the response length L_max per micro-batch); rllava's
    nearest (actor.loss_remove_clip, loss_agg_mode=seq-mean-token-sum-norm) also divides by the number of
    sequences (Dr.GRPO's normaliser), here the 2 rollouts: a convention, pinned below.
    Fails if the gate is strict (<), the switched rollouts or the demonstrations enter the PG term, or the SFT
    term is averaged per sequence."""
    scores = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    rollouts = [SimpleNamespace(group_id=i // 2, sample=f"prompt {i // 2}") for i in range(6)]
    hybrid = SimpleNamespace(a=AlgorithmConfig(unify_strategy="switch", switch_gate=1), mode="hpt",
                             demonstration=lambda sample, group: SimpleNamespace(group_id=group, sample=sample))
    rows, _, _, dropped = Hybrid.demonstrations(hybrid, rollouts, scores, [{}] * 6)
    sft_prompts = [g for g in range(3) if int((scores[2 * g:2 * g + 2] == 1.0).sum()) <= 1]  # mix_trainer L397, L609
    assert [r.sample for r in rows[6:]] == [f"prompt {g}" for g in sft_prompts] == ["prompt 0", "prompt 2"]
    assert sorted(dropped) == [0, 1, 4, 5]

    p = t64([[0.3, 0.2, 0.6], [0.1, 0.4, 0.3], [0.7, 0.65, 0.5], [0.3, 0.6, 0.5], [0.5, 0.2, 0.3], [0.4, 0.4, 0.4],
             [0.8, 0.3, 0.6], [0.2, 0.9, 0.5]])
    p_old = t64([[0.3, 0.2, 0.6], [0.1, 0.4, 0.3], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5], [0.5, 0.2, 0.3],
                 [0.4, 0.4, 0.4], [1, 1, 1], [1, 1, 1]])
    adv = t64([[0.0] * 3, [0.0] * 3, [1.0] * 3, [-1.0] * 3, [0.5] * 3, [-0.5] * 3, [0.0] * 3, [0.0] * 3])
    mask = t64([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0]])
    off = torch.zeros(8, 3, dtype=F64)
    off[6:] = 1.0
    loss_mask = mask.clone()
    loss_mask[dropped] = 0  # rllava.train.pipeline.rlvr: the switched groups' rollouts leave the loss
    lp, old = torch.log(p), torch.log(p_old)
    rl_coef, c = Hybrid.coefficients(SimpleNamespace(mode="hpt", cfg=SimpleNamespace(actor=SimpleNamespace(
        sft_loss_coef=0.3))), 5)  # train.sh L28: 1.0, "0.3 for Qwen2.5-Math-1.5B"
    assert rl_coef == 1.0
    rl_rows = 2

    pg_rows = t64([[0], [0], [1], [1], [0], [0], [0], [0]]) * mask  # prompt 1's rollouts (mix_actor L144-151)
    demo_rows = off * mask
    clip = flags == "mix_ppo_trainer.yaml"
    assert_rl_per_token("hpt", lp, old, adv, pg_rows, ref_ppo(lp, old, adv, clip=clip), loss_remove_clip=not clip)
    if clip:
        def pg(x):
            return mean_over(ref_ppo(x, old, adv), pg_rows)
        kw = {}
    else:  # core_algos.py L314-317 with loss_remove_clip, loss_remove_token_mean; / 2 rows: rllava's normaliser
        def pg(x):
            return (ref_ppo(x, old, adv, clip=False) * pg_rows).sum() / pg_rows.shape[-1] / rl_rows
        kw = dict(loss_remove_clip=True, loss_agg_mode="seq-mean-token-sum-norm", max_len=3)
    want = with_grad(lambda x: pg(x) + c * mean_over(-x, demo_rows), lp)
    got = actor_step(monkeypatch, "hpt", lp, old, adv, loss_mask, off, rl_coef=rl_coef, sft_coef=c,
                     sft_only=torch.tensor([False] * 6 + [True] * 2), **kw)
    assert_parity(got, want)


# -- LUFFY and SRFT ------------------------------------------------------------------------------------------------
# LUFFY (arXiv:2504.14945): ElliottYan/LUFFY, read at TheRoadQaQ/LUFFY@c4eab08,
#     luffy/verl/verl/mix_src/mix_core_alg.py `compute_token_on_off_policy_loss`: L62-87 the own ratio's shaping
#     (p_div_p_0.1: f(p) / f(p_old), f(p) = p / (p + 0.1)), L89-97 clip on the shaped ratio, L104-121 the expert's
#     f(p), L148 -A f(p), L155 the two joined, then a token-mean over every trained token.
# SRFT (arXiv:2506.19767): RLLaVA's rllava/ppo/plugins/policy_loss.py@4753d4a `compute_policy_loss_srft`: L356-359
#     H_i per sequence (masked mean over the row, dim=-1), w_SFT,i = 0.5 exp(-H_i), w_RL,i = 0.1 exp(H_i);
#     L362-367 correct_i = (reward_i == 1): own tokens -w_RL,i log p if correct else +log p; L388-401 the clamp of
#     log p to [1 - eps, 1 + eps] (no effect on a correct row's log p < 0); L420-454 the expert's -A f(p) as LUFFY;
#     L463-468 SFT: token-mean of -w_SFT,i log p over the demonstration rows; L482-485 token-mean + SFT.
def ref_f(p, gamma=0.1):
    return p / (p + gamma)


def ref_luffy_own(lp, old, adv, *, clip=True, eps=0.2):
    """LUFFY's own tokens with on_policy_reshape=p_div_p_0.1 (L74-79, L89-97)."""
    ratio = ref_f(torch.exp(lp)) / ref_f(torch.exp(old))
    loss = -adv * ratio
    return torch.maximum(loss, -adv * ratio.clamp(1 - eps, 1 + eps)) if clip else loss


@pytest.mark.parametrize("clip", [False, True], ids=["loss_remove_clip", "clipped"])
def test_luffy_on_policy_reshape_matches_luffy(monkeypatch, clip):
    """LUFFY with on_policy_reshape=p_div_p_0.1: the own ratio is f(p)/f(p_old). Row 0 at r = 1 (p = 0.9, 0.5, 0.05,
    A = 1): LUFFY's d L_t / d log p_t = -0.1 / (p + 0.1) = -0.1, -0.167, -0.667, where shaping r itself (RLLaVA's
    r / (r + 0.1), now `rllava_p_div_p_0.1`) gives -0.083 each. Row 1 moved off r = 1 (clipped above with A > 0);
    rows 2-3 the expert's (-A f(p), never clipped). Step loss: token-mean over all trained tokens."""
    p = t64([[0.9, 0.5, 0.05], [0.8, 0.3, 0.6], [0.4, 0.7, 0.02], [0.6, 0.1, 0.5]])
    p_old = t64([[0.9, 0.5, 0.05], [0.4, 0.35, 0.6], [1, 1, 1], [1, 1, 1]])
    adv = t64([[1.0] * 3, [0.5] * 3, [0.8] * 3, [-0.3] * 3])
    mask = t64([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]])
    off = t64([[0] * 3, [0] * 3, [1] * 3, [1] * 3])
    lp, old = torch.log(p), torch.log(p_old)
    keys = dict(on_policy_reshape="p_div_p_0.1", off_policy_reshape="p_div_p_0.1")

    def reference(x):
        own = ref_luffy_own(x, old, adv, clip=clip)
        expert = -adv * ref_f(torch.exp(x))
        return mean_over(expert * off + own * (1 - off), mask)

    want = with_grad(reference, lp)
    got = actor_step(monkeypatch, "luffy", lp, old, adv, mask, off, rl_coef=1.0, sft_coef=0.0, max_len=3,
                     loss_remove_clip=not clip, **keys)
    assert_parity(got, want)
    one = LossInputs(logprobs=lp[:1].clone().requires_grad_(), mask=mask[:1], advantages=adv[:1], old_logprobs=old[:1])
    cfg = ActorConfig(policy_loss=PolicyLossConfig(loss_mode="luffy"), loss_remove_clip=True, **keys)
    build_algorithm(AlgorithmConfig(), cfg).policy_loss(one)[0].sum().backward()
    assert one.logprobs.grad[0].tolist() == pytest.approx([-0.1, -0.1 / 0.6, -0.1 / 0.15])
    cfg = ActorConfig(policy_loss=PolicyLossConfig(loss_mode="luffy"), loss_remove_clip=True,
                      on_policy_reshape="rllava_p_div_p_0.1")
    one = LossInputs(logprobs=lp[:1].clone().requires_grad_(), mask=mask[:1], advantages=adv[:1], old_logprobs=old[:1])
    build_algorithm(AlgorithmConfig(), cfg).policy_loss(one)[0].sum().backward()
    assert one.logprobs.grad[0].tolist() == pytest.approx([-0.1 / 1.1 ** 2] * 3)  # RLLaVA's meaning, kept by name


@pytest.mark.parametrize("case", ["all_correct", "mixed"])
def test_srft_matches_reference(monkeypatch, case):
    """SRFT: 3 own rollouts + the expert's response in one group. `all_correct` (the issue's reproduction): every
    reward 1, so GRPO's advantages are 0; p = 0.6 and H = 0.5 on the own tokens: SRFT reinforces each with
    d L_t / d log p_t = -w_RL = -0.1 e^0.5 = -0.165 (deciding correctness by A > 0 pushed them down, +1).
    `mixed`: rewards 1, 0, 0.5 (0.5 < the threshold 1: wrong), each row its own entropy, so its own w_RL and the
    demonstration its own w_SFT (one micro-batch mean would give every row the same). With actor.loss_remove_clip
    (the reference clamps a wrong row's log p into [0.8, 1.2], leaving it no gradient; rllava does not: see srft's
    docstring). Step loss: token-mean of the RL terms + token-mean of -w_SFT,i log p over the demonstration."""
    mixed = case == "mixed"
    p = t64([[0.6, 0.6, 0.6], [0.6, 0.6, 0.6], [0.6, 0.6, 0.6], [0.3, 0.8, 0.5]])
    if mixed:
        p = t64([[0.6, 0.2, 0.7], [0.4, 0.5, 0.9], [0.3, 0.6, 0.6], [0.3, 0.8, 0.5]])
    ent = t64([[0.5] * 3, [0.5] * 3, [0.5] * 3, [1.2, 0.4, 0.8]])
    if mixed:
        ent = t64([[0.2, 0.4, 0.9], [1.5, 0.5, 1.0], [0.3, 0.3, 0.3], [1.2, 0.4, 0.8]])
    scores = torch.tensor([1.0, 0.0, 0.5, 1.0]) if mixed else torch.ones(4)
    adv = (scores - scores.mean()) / (scores.std() + 1e-6) if mixed else torch.zeros(4)  # GRPO over the group
    adv = adv.to(F64)[:, None].expand(4, 3).clone()
    mask = t64([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]])
    off = t64([[0] * 3, [0] * 3, [0] * 3, [1] * 3])
    lp = torch.log(p)
    old = lp.detach().clone()
    h = (ent * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)  # L356
    w_sft, w_rl = 0.5 * torch.exp(-h), 0.1 * torch.exp(h)  # L358-359
    correct = (scores == 1.0)[:, None]  # L362

    def reference(x):
        on_adv = torch.where(correct, w_rl, torch.full_like(w_rl, -1.0))  # L363-367
        own = -on_adv * x  # L388, srft_type=paper
        if not mixed:  # L396-401: the clamp of log p (not reached by a correct row, whose -w log p > -w 0.8)
            own = torch.maximum(own, -on_adv * x.clamp(0.8, 1.2))
        expert = -adv * ref_f(torch.exp(x))
        sft = mean_over(-x * w_sft, off * mask)  # L465-468
        return mean_over(expert * off + own * (1 - off), mask) + sft

    want = with_grad(reference, lp)
    got = actor_step(monkeypatch, "srft", lp, old, adv, mask, off, rl_coef=1.0, sft_coef=1.0, max_len=3,
                     loss_remove_clip=mixed, entropy=ent, scores=scores, off_policy_reshape="p_div_p_0.1")
    assert_parity(got, want)
    if not mixed:
        one = LossInputs(logprobs=lp.clone().requires_grad_(), mask=mask, advantages=adv, old_logprobs=old,
                         off_policy=off, entropy=ent, scores=scores)
        build_algorithm(AlgorithmConfig(), ActorConfig(policy_loss=PolicyLossConfig(loss_mode="srft"))) \
            .policy_loss(one)[0].sum().backward()
        assert one.logprobs.grad[:3][mask[:3] > 0].tolist() == pytest.approx([-0.1 * math.exp(0.5)] * 8)
