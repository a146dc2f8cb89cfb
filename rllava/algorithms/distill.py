"""On-policy distillation (`algorithm.distill`): the student samples, a frozen teacher scores every token of those
samples, and the student moves toward the teacher's next-token distribution at each position it visited.

    student pi_theta, teacher q (both at the rollout temperature), x_<t a prefix the student sampled:
    KL_t = KL(pi_theta(. | x_<t) || q(. | x_<t)) = sum_v pi_theta(v | x_<t) (log pi_theta(v | x_<t) - log q(v | x_<t))
    L_distill = coef * aggregate_t(loss_t)       (actor.loss_agg_mode, over the trained tokens: the model's turns)

The reverse KL is mode-seeking: the student is pulled toward what the teacher would say at the states it reaches
itself, and pays for every token the teacher finds unlikely (GKD with beta = 1, arXiv:2306.13649; MiniLLM,
arXiv:2306.08543; the Thinking Machines "On-Policy Distillation" post, 2025). Each loss below is a registered function
of the tensors it declares; `algorithm.distill.use_reward=false` trains on it alone, else it is added to the RL loss
(a dense term beside the reward). Samples from pi_rollout, not pi_old (async, partial rollouts, another engine), are
corrected as the RL term (`rllava.roles.actor.Actor._rollout_correction`): rejected tokens (algorithm.rollout_rs)
leave it; a loss of the sampled token (k1, k3: an expectation over x_t ~ pi_old) is multiplied by the RL term's IS
weight (if rollout_is=none, under decoupled_ppo or on stale samples still the token weight min(pi_old / pi_rollout,
rollout_is_cap)), restoring that expectation at each prefix; a full_kl loss is exact whichever token was drawn, so it
takes only the sequence weight (rollout_is=sequence: unbiased for the prefix's distribution too, the later tokens'
ratios averaging 1). At token level the prefixes stay pi_rollout's, as for the RL term's TIS.

Under torchrun each rank scores its own rows, and a teacher's pass is collective (its micro-batch count is agreed over
the ranks, an FSDP2 / ZeRO-3 teacher gathers weights in each forward, a tensor-parallel vLLM teacher scores its
group's requests together). So with `.route_field` every rank runs every route that any rank's rows hit, in the
routes' name order, with as many forwards as the rank that needs the most (`rllava.roles.teacher.Teachers`): a rank
with no rows for a route scores a 2-token stand-in row and drops the result, one with fewer rows runs a row again.
A route no rank hit gets no pass (one all-reduce per step). `loss=full` runs its teacher inside the update, on the
single-device engine only (refused at start-up on FSDP2 and DeepSpeed), so on one rank.
"""

from __future__ import annotations

import torch

from rllava.algorithms.losses import LossInputs
from rllava.algorithms.registry import register_distill_loss


@register_distill_loss("full", reads=("full_kl",))
def full(inp: LossInputs) -> torch.Tensor:
    """Exact reverse KL over the whole vocabulary, differentiated directly:

        loss_t = KL(pi_theta(. | x_<t) || q(. | x_<t))
        d loss_t / d z_j = pi_j (log pi_j - log q_j - KL_t)          (z = student logits / temperature)

    The teacher's LM head runs chunk by chunk beside the student's (`rllava.model.forward.full_kl_from_hidden`): no
    [B, T, V] tensor stored, no top-k truncation, no sampling variance. Needs both heads whole in one process (the
    single-device engine) and the teacher run in the update (`engine=hf`).

    Reference: GKD's generalized JSD at beta = 1 (the reverse KL) over full-vocabulary logits, TRL
    `trl/trainer/gkd_trainer.py` `generalized_jsd_loss` (arXiv:2306.13649); rllava adds nothing, chunked."""
    return inp.full_kl["teacher"]


@register_distill_loss("k1", reads=("logprobs", "old_logprobs", "teacher_logprobs"))
def k1(inp: LossInputs) -> torch.Tensor:
    """The sampled log-ratio as a per-token advantage, trained by importance sampling (the OPD post):

        A_t = log q(x_t | x_<t) - log pi_old(x_t | x_<t)                 (no grad; discount 0)
        loss_t = -(pi_theta(x_t) / pi_old(x_t)) A_t
        E_{x_t ~ pi}[grad loss_t] = grad KL_t at theta = theta_old   (the score-function gradient of the reverse KL)

    One teacher log-prob per token, so any teacher works (vLLM / SGLang too). Differentiating `log pi - log q` itself
    would give zero gradient in expectation: the sampled token carries the signal through its advantage.

    Reference: tinker-cookbook `tinker_cookbook/distillation/train_on_policy.py` `incorporate_kl_penalty`
    (line 48 at 0333e7c): advantage += -kl_penalty_coef * (sampled_logprobs - teacher_logprobs), then the
    `importance_sampling` loss -ratio * advantage; ROLL's OPD pipeline (advantage = teacher_log_prob -
    student_log_prob). rllava adds this as a term of its own beside the reward's advantage: the sum is the
    cookbook's under an unclipped policy loss (PPO's clip clips only the reward's part). A stale sampler: the
    cookbook's ratio is pi_theta / pi_sampler, its advantage log q - log pi_sampler; rllava's advantage is against
    pi_old, its ratio times the correction's truncated pi_old / pi_rollout (the reverse KL's gradient at pi_old)."""
    old = inp.need("old_logprobs", "k1")
    advantage = (inp.need("teacher_logprobs", "k1") - old).detach()
    return -torch.exp(inp.logprobs - old.detach()) * advantage


@register_distill_loss("k3", reads=("logprobs", "teacher_logprobs"))
def k3(inp: LossInputs) -> torch.Tensor:
    """Schulman's k3 estimate of the reverse KL at the sampled token, differentiated directly:

        d_t = log q(x_t | x_<t) - log pi_theta(x_t | x_<t)
        loss_t = exp(d_t) - 1 - d_t         (>= 0; E_{x_t ~ pi}[loss_t] = KL_t)
        grad loss_t = (1 - q(x_t) / pi_theta(x_t)) grad log pi_theta(x_t)

    Low variance, never negative; its expected gradient is the forward KL(q || pi_theta)'s, as for GRPO's KL term.

    Reference: TRL `trl/trainer/grpo_trainer.py` per-token KL, `exp(ref - logp) - (ref - logp) - 1` with the
    teacher in the reference's place; torchrl `DistillationLoss` (k3, kl_direction="reverse"). Not clamped."""
    d = inp.need("teacher_logprobs", "k3") - inp.logprobs
    return torch.exp(d) - 1 - d
