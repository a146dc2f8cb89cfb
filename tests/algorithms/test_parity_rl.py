"""SAPO, GMPO and GiGPO against their reference implementations on small float64 examples.

Each expected value below is computed in the test from the reference's own formula, written out here and not
taken from rllava's code:

  SAPO (arXiv:2511.20347): verl, volcengine/verl@b178a3c verl/trainer/ppo/core_algos.py
      L1364-1366 gate f(r, tau) = sigmoid(tau (r - 1)) * 4 / tau;  L1378-1382 tau = tau_pos if A_t > 0 else tau_neg;
      L1388 pg_losses = -gates * advantages;  L1394-1397 aggregated with loss_agg_mode="seq-mean-token-mean"
      whatever the config says;  L1065-1071 agg_loss seq-mean-token-mean = mean_i (sum_t l_it / |y_i|).
  GMPO (arXiv:2507.20673): the authors' callsys/GMPO@205b2bf train_zero_math_gmpo.py
      L675-701: sgn = -1 if A >= 0 else 1 (one scalar advantage per sequence), the log-ratio clipped on the
      pessimistic side (torch.max of sgn * d and its clamp to [-c, c]), ratio = exp(masked mean), pg = -A * ratio;
      L620-623 + scripts/qwen2.5-math-7b-gmpo.sh (--train_batch_size_per_device 1, --beta 0): one sequence per
      micro-batch, L851 backward with gradient accumulation, so the step objective is the mean over sequences.
      (verl's geo_mean, core_algos.py L1635-1718, is the same with pg_loss = torch.mean(pg_losses).)
  GiGPO (arXiv:2505.10978): langfengQ/verl-agent gigpo/core_gigpo.py at 29e3e8b (Lang Feng, 2025-09-03; read in
      the mirror johnhaofu/verl-agent): one batch row per turn ("step"), each carrying its episode's reward
      (agent_system/reward_manager/episode.py L72-79);
      L174-241 episode_norm_reward: L180 compute_mean_std_cross_steps=True by default (L161 never passes it);
      L214-222 with False each (group, trajectory) pair counts once, with True every step row counts;
      L224-227 a group of one entry has mean 0, std 1; L229-230 torch.mean and torch.std (unbiased);
      L233-237 (R - mean) / (std + eps) or R - mean (remove_std);
      L87-119 compute_step_discounted_returns (Eq. 5); L243-331 build_step_group (per group id, same anchor
      observation); L334-383 step_norm_reward (L367-369 a group of one: its own mean, std 1 -> 0);
      L161-170 scores = episode advantage + step_advantage_w * step advantage.

The aggregation the losses are checked with is the one their example script sets (parsed from the script, so
script and test cannot drift); each example has sequences of different lengths, where token-mean differs.
GiGPO's example has episodes of different numbers of turns, where the two episode baselines differ.
"""

import math
import os
import re
import statistics

import pytest
import torch

import rllava.algorithms.advantage  # noqa: F401  (registers the estimators)
from rllava.algorithms.losses import LossInputs, aggregate
from rllava.algorithms.ppo import build_algorithm
from rllava.algorithms.registry import call_with_params
from rllava.config import load_config

F64 = torch.float64
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def script_config(name: str):
    """The config examples/algorithms/NAME.sh runs with, for its algorithm's keys: examples/config.yaml plus the
    key=value arguments the script adds to grpo.sh."""
    text = open(os.path.join(REPO, "examples", "algorithms", f"{name}.sh")).read()
    overrides = re.findall(r"^\s+([A-Za-z_][\w.]*=\S+)\s*\\$", text, flags=re.M)
    assert any(o.startswith("actor.loss_agg_mode=") for o in overrides), f"{name}.sh sets no actor.loss_agg_mode"
    return load_config([f"config={os.path.join(REPO, 'examples', 'config.yaml')}", *overrides])


def rllava_loss(cfg, logp_values, old, adv, mask):
    """rllava's step policy loss as the actor computes it: the configured loss, then `aggregate` with
    actor.loss_agg_mode; returns (loss, d loss / d logprobs)."""
    logp = logp_values.clone().requires_grad_(True)
    algo = build_algorithm(cfg.algorithm, cfg.actor, discount=cfg.rollout.discount)
    per_token, _ = algo.policy_loss(LossInputs(logprobs=logp, mask=mask, advantages=adv, old_logprobs=old))
    loss = aggregate(per_token, mask, cfg.actor.loss_agg_mode, max_len=cfg.data.max_response_length)
    loss.backward()
    return loss.detach(), logp.grad, per_token.detach()


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# -- SAPO -----------------------------------------------------------------------------------------------------------

def sapo_reference(logp, old, adv, mask, tau_pos, tau_neg):
    """verl core_algos.py L1364-1397 with agg_loss seq-mean-token-mean (L1065-1071), and its gradient
    d/d logp of -(4/tau) sigmoid(tau (r - 1)) A / (|y_i| G) = -4 s (1 - s) r A / (|y_i| G)."""
    B, T = len(mask), len(mask[0])
    seqs = [i for i in range(B) if sum(mask[i]) > 0]
    G = len(seqs)
    loss, grad = 0.0, [[0.0] * T for _ in range(B)]
    for i in seqs:
        n = sum(mask[i])
        for t in range(T):
            if not mask[i][t]:
                continue
            r = math.exp(logp[i][t] - old[i][t])
            tau = tau_pos if adv[i][t] > 0 else tau_neg
            s = _sigmoid(tau * (r - 1.0))
            loss += -(4.0 / tau) * s * adv[i][t] / n / G
            grad[i][t] = -4.0 * s * (1.0 - s) * r * adv[i][t] / n / G
    return loss, grad


def test_sapo_matches_verl_with_the_scripts_aggregation():
    cfg = script_config("sapo")
    assert cfg.actor.policy_loss.loss_mode == "sapo"
    # three responses of 5, 2 and 3 tokens; the last one's advantages vary over its tokens (tau per token);
    # padding carries junk that must not count
    log_ratio = [[0.3, -0.2, 0.5, -0.6, 0.1], [-0.4, 0.7, 9.0, 9.0, 9.0], [0.2, -0.3, 0.9, -7.0, 3.0]]
    old = [[-1.2, -0.5, -2.0, -0.8, -1.5], [-0.3, -1.7, -0.2, -0.2, -0.2], [-0.9, -1.1, -0.4, -0.6, -0.6]]
    adv = [[0.8] * 5, [-1.3] * 2 + [5.0] * 3, [0.6, -0.4, 0.3, 5.0, 5.0]]
    mask = [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]
    logp = [[o + d for o, d in zip(ro, rd)] for ro, rd in zip(old, log_ratio)]
    want, want_grad = sapo_reference(logp, old, adv, mask, cfg.actor.policy_loss.tau_pos,
                                     cfg.actor.policy_loss.tau_neg)
    t = lambda x: torch.tensor(x, dtype=F64)  # noqa: E731
    loss, grad, per_token = rllava_loss(cfg, t(logp), t(old), t(adv), t(mask))
    assert loss.item() == pytest.approx(want, rel=1e-12, abs=1e-15)
    torch.testing.assert_close(grad, t(want_grad), rtol=1e-12, atol=1e-15)
    # the example tells the aggregations apart: token-mean (examples/config.yaml's default) is another objective
    assert abs(aggregate(per_token, t(mask), "token-mean", max_len=5).item() - want) > 0.1 * abs(want)


# -- GMPO -----------------------------------------------------------------------------------------------------------

def gmpo_reference(logp, old, seq_adv, mask, clip):
    """The authors' train_zero_math_gmpo.py L675-701 per sequence, averaged over the sequences (one per
    micro-batch, gradient accumulation), and its gradient: d/d logp_t of -A exp(mean_t m_t) is
    -A ratio / |o_i| where m_t follows log rho_t (the unclamped branch of the max), 0 where the clamp wins."""
    B, T = len(mask), len(mask[0])
    loss, grad = 0.0, [[0.0] * T for _ in range(B)]
    for i in range(B):
        n = sum(mask[i])
        sgn = -1.0 if seq_adv[i] >= 0 else 1.0
        kept, flows = [], []
        for t in range(T):
            if not mask[i][t]:
                continue
            d = logp[i][t] - old[i][t]
            sd, sd_clamp = sgn * d, min(max(sgn * d, -clip), clip)
            kept.append(sgn * max(sd, sd_clamp))
            flows.append((t, sd >= sd_clamp))
        ratio = math.exp(sum(kept) / n)
        loss += -seq_adv[i] * ratio / B
        for t, f in flows:
            grad[i][t] = -seq_adv[i] * ratio / n / B if f else 0.0
    return loss, grad


def test_gmpo_matches_the_authors_code_with_the_scripts_aggregation():
    cfg = script_config("gmpo")
    assert cfg.actor.policy_loss.loss_mode in ("gmpo", "geo_mean")
    clip = cfg.actor.clip_ratio_high
    assert cfg.actor.clip_ratio_low == clip == 0.4  # the authors' --cliprange 0.4, one symmetric band
    # four responses of 6, 2, 4 and 3 tokens, one advantage per sequence (GRPO's); log-ratios beyond +-0.4 on
    # both sides, so the pessimistic clip zeroes some tokens' gradient and leaves the others' alone
    log_ratio = [[0.1, 0.6, -0.6, 0.25, -0.1, 0.45], [-0.55, 0.5, 2.0, 2.0, 2.0, 2.0],
                 [0.05, -0.3, 0.2, 0.35, -3.0, -3.0], [-0.2, 0.3, -0.45, 1.0, 1.0, 1.0]]
    old = [[-1.0, -0.4, -2.2, -0.7, -1.3, -0.9], [-0.6, -1.8, -0.1, -0.1, -0.1, -0.1],
           [-0.3, -1.2, -0.8, -2.5, -0.5, -0.5], [-1.4, -0.2, -0.9, -0.3, -0.3, -0.3]]
    seq_adv = [1.2, -0.3, 0.9, -0.4]
    lengths = [6, 2, 4, 3]
    mask = [[1] * n + [0] * (6 - n) for n in lengths]
    logp = [[o + d for o, d in zip(ro, rd)] for ro, rd in zip(old, log_ratio)]
    want, want_grad = gmpo_reference(logp, old, seq_adv, mask, clip)
    t = lambda x: torch.tensor(x, dtype=F64)  # noqa: E731
    adv = t([[a] * 6 for a in seq_adv])
    loss, grad, per_token = rllava_loss(cfg, t(logp), t(old), adv, t(mask))
    assert loss.item() == pytest.approx(want, rel=1e-12, abs=1e-15)
    torch.testing.assert_close(grad, t(want_grad), rtol=1e-12, atol=1e-15)
    assert (grad == 0).sum() > (t(mask) == 0).sum()  # some masked-in tokens are clipped
    # token-mean is the paper's objective divided by N_tokens / N_seqs = 15 / 4: the example tells them apart
    assert abs(aggregate(per_token, t(mask), "token-mean", max_len=6).item() - want) > 0.1 * abs(want)


# -- GiGPO ----------------------------------------------------------------------------------------------------------

# Two groups. Group 0: episode A (1 turn), B (3 turns), C (2 turns); group 1: episode D (2 turns) alone.
# Per-turn (step) rewards, the episode reward R = their sum; anchors: 0 = the prompt, then the observation each
# later turn was written after (B's and C's second turns share observation 1).
EPISODES = [  # (group, step rewards, anchors, token layout: the turn of each token, -1 = not written by the policy)
    (0, [1.0], [0], [-1, -1, 0, 0, 0, -1, -1, -1]),
    (0, [-0.1, 0.2, 0.5], [0, 1, 2], [-1, -1, 0, -1, 1, 1, -1, 2]),
    (0, [0.0, -0.3], [0, 1], [-1, -1, 0, 0, -1, 1, -1, -1]),
    (1, [-0.1, 1.0], [0, 3], [-1, -1, 0, -1, 1, 1, 1, -1]),
]
GAMMA, W, EPS = 0.9, 0.7, 1e-6


def gigpo_reference(cross_steps: bool, mean_std_norm: bool) -> dict[tuple[int, int], float]:
    """verl-agent's compute_gigpo_outcome_advantage on one row per step: {(episode, turn): advantage}."""
    rows = []  # (group, trajectory, turn, R, discounted return G, anchor)
    for i, (group, rewards, anchors, _) in enumerate(EPISODES):
        running, returns = 0.0, [0.0] * len(rewards)
        for k in reversed(range(len(rewards))):  # L87-119, Eq. 5
            running = rewards[k] + GAMMA * running
            returns[k] = running
        rows += [(group, i, k, sum(rewards), returns[k], anchors[k]) for k in range(len(rewards))]

    def normalised(x, values, alone_mean):  # L224-237 (alone_mean 0) and L366-381 (alone_mean: its own value)
        mean, std = (alone_mean, 1.0) if len(values) == 1 else (statistics.fmean(values), statistics.stdev(values))
        return (x - mean) / (std + EPS) if mean_std_norm else x - mean

    episode_scores, seen = {}, set()
    for group, traj, _, R, _, _ in rows:  # L214-222
        if (group, traj) in seen:
            continue
        episode_scores.setdefault(group, []).append(R)
        if not cross_steps:
            seen.add((group, traj))
    step_scores = {}
    for group, _, _, _, g, anchor in rows:  # L243-331: same group id, same anchor observation
        step_scores.setdefault((group, anchor), []).append(g)
    out = {}
    for group, traj, k, R, g, anchor in rows:
        ep = normalised(R, episode_scores[group], alone_mean=0.0)
        step = normalised(g, step_scores[(group, anchor)], alone_mean=g)
        out[(traj, k)] = ep + W * step
    return out


def gigpo_inputs():
    layout = torch.tensor([e[3] for e in EPISODES])
    anchors = torch.full_like(layout, -1)
    rewards = torch.zeros(layout.shape, dtype=F64)
    for i, (_, step_rewards, turn_anchors, turns) in enumerate(EPISODES):
        for k, (r, a) in enumerate(zip(step_rewards, turn_anchors)):
            at = [j for j, tk in enumerate(turns) if tk == k]
            anchors[i, at] = a
            rewards[i, at[0]] = r  # a turn's reward, on one of its tokens
    scores = torch.tensor([sum(e[1]) for e in EPISODES], dtype=F64)
    return scores, torch.tensor([e[0] for e in EPISODES]), (layout >= 0).to(F64), layout, anchors, rewards


@pytest.mark.parametrize("mean_std_norm", [True, False])
@pytest.mark.parametrize("cross_steps", [False, True])
def test_gigpo_matches_verl_agent_per_episode_and_cross_steps(cross_steps, mean_std_norm):
    """cross_steps=False is the paper's Eq. 3 (rllava's default); True is verl-agent's default, wired through
    algorithm.gigpo_mean_std_cross_steps."""
    cfg = load_config([f"config={os.path.join(REPO, 'examples', 'config.yaml')}", "rollout.agent.tools=[zoom]",
                       "algorithm.adv_estimator=gigpo", f"algorithm.gigpo_mean_std_cross_steps={cross_steps}",
                       f"algorithm.norm_adv_by_std_in_grpo={mean_std_norm}", f"rollout.discount={GAMMA}",
                       f"algorithm.step_advantage_w={W}"])
    assert cfg.algorithm.gigpo_mean_std_cross_steps is cross_steps
    algo = build_algorithm(cfg.algorithm, cfg.actor, discount=cfg.rollout.discount)
    scores, group_ids, mask, layout, anchors, rewards = gigpo_inputs()
    adv = call_with_params(algo.estimator, (scores, group_ids, mask),
                           {**algo.adv_params, "turn_index": layout, "turn_anchors": anchors, "turn_rewards": rewards},
                           "algorithm.adv_estimator")
    want = gigpo_reference(cross_steps, mean_std_norm)
    expected = torch.tensor([[want[(i, k)] if k >= 0 else 0.0 for k in row.tolist()] for i, row in enumerate(layout)],
                            dtype=F64)
    torch.testing.assert_close(adv, expected, rtol=1e-10, atol=1e-12)
    # the example tells the two episode baselines apart (episode B has three turns, A one, C two; D is alone)
    other = gigpo_reference(not cross_steps, mean_std_norm)
    assert all(abs(want[(i, 0)] - other[(i, 0)]) > 1e-2 for i in range(len(EPISODES)))


def test_gigpo_cross_steps_is_refused_without_gigpo():
    """Like algorithm.step_advantage_w: read only by GiGPO, so a changed value elsewhere is a start-up error."""
    from rllava.config import ConfigError
    config = f"config={os.path.join(REPO, 'examples', 'config.yaml')}"
    with pytest.raises(ConfigError, match="algorithm.gigpo_mean_std_cross_steps=true is read only by agent rollouts"):
        load_config([config, "algorithm.gigpo_mean_std_cross_steps=true"])
    with pytest.raises(ConfigError, match=r"algorithm.gigpo_mean_std_cross_steps=true is read only by GiGPO"):
        load_config([config, "rollout.agent.tools=[zoom]", "algorithm.gigpo_mean_std_cross_steps=true"])
    assert load_config([config, "rollout.agent.tools=[zoom]", "algorithm.adv_estimator=gigpo",
                        "algorithm.gigpo_mean_std_cross_steps=true"]).algorithm.gigpo_mean_std_cross_steps
