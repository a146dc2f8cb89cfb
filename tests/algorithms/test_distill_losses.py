"""On-policy distillation's losses (`rllava.algorithms.distill`) against the reverse KL computed by hand from its
definition, KL(pi || q) = sum_v pi_v (log pi_v - log q_v), on a three-token vocabulary: its value and its gradient
with respect to the student's logits, d KL / d z_j = pi_j (log pi_j - log q_j - KL) (differentiate the sum), and
the sampled forms' expectations over the student's own tokens."""

import math
from types import SimpleNamespace

import pytest
import torch

from rllava.algorithms.distill import full, k1, k3
from rllava.algorithms.losses import LossInputs
from rllava.model.forward import full_kl_from_hidden

Z = [1.0, 0.0, -1.0]  # student logits
Q = [0.2, 0.5, 0.3]  # teacher probabilities


def _softmax(z):
    e = [math.exp(x) for x in z]
    return [x / sum(e) for x in e]


PI = _softmax(Z)  # 0.6652, 0.2447, 0.0900
KL = sum(p * (math.log(p) - math.log(q)) for p, q in zip(PI, Q))
GRAD = [p * (math.log(p) - math.log(q) - KL) for p, q in zip(PI, Q)]


def test_hand_numbers():
    """The example's numbers, worked on paper: KL = 0.6652 ln(0.6652 / 0.2) + 0.2447 ln(0.2447 / 0.5)
    + 0.0900 ln(0.0900 / 0.3) = 0.7995 - 0.1749 - 0.1084 = 0.5163; the gradient sums to zero (softmax)."""
    assert [round(p, 4) for p in PI] == [0.6652, 0.2447, 0.09]
    assert round(KL, 4) == 0.5163
    assert [round(g, 4) for g in GRAD] == [0.456, -0.3012, -0.1548]


@pytest.mark.parametrize("chunk", [1, 0])
def test_full_loss_and_gradient_equal_the_hand_computed_reverse_kl(chunk):
    """The student's head is the identity (its hidden state is its logits); the teacher's hidden state is log q
    through an identity head too, plus a padding row (a head of another length): the KL is over the real tokens."""
    head = torch.nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3))
    z = torch.tensor([Z], requires_grad=True)
    teacher_h = torch.tensor([[math.log(q) for q in Q] + [0.0]])
    teacher_w = torch.cat([torch.eye(4)[:3], torch.tensor([[0.0, 0.0, 0.0, -1e4]])])  # row 4: a padding token
    exact = full_kl_from_hidden(head, z, teacher_h, teacher_w, chunk_size=chunk)
    kl = full(LossInputs(logprobs=z, mask=torch.ones(1), full_kl={"teacher": exact}))
    kl.sum().backward()
    assert kl.item() == pytest.approx(KL, abs=1e-6)
    assert z.grad[0].tolist() == pytest.approx(GRAD, abs=1e-6)


def test_k1_is_the_ops_advantage_and_its_expected_gradient_is_the_kl_gradient():
    """loss_t = -ratio * (log q - log pi_old): at the sampling policy its value is log pi - log q and its gradient
    in log pi is -(log q - log pi); averaged over the student's tokens (x ~ pi), d/dz equals d KL / d z."""
    z = torch.tensor(Z, requires_grad=True)
    logp = torch.log_softmax(z, -1)
    old, teacher = logp.detach(), torch.tensor([math.log(q) for q in Q])
    per_token = k1(LossInputs(logprobs=logp, mask=torch.ones(3), old_logprobs=old, teacher_logprobs=teacher))
    assert per_token.tolist() == pytest.approx([math.log(p) - math.log(q) for p, q in zip(PI, Q)], abs=1e-6)
    (per_token * torch.tensor(PI)).sum().backward()  # E_{x ~ pi}, the weights held fixed (no grad)
    assert z.grad.tolist() == pytest.approx(GRAD, abs=1e-6)
    assert (torch.tensor(PI) * per_token.detach()).sum().item() == pytest.approx(KL, abs=1e-6)


def test_k3_value_gradient_and_expectation():
    """loss_t = exp(d) - 1 - d, d = log q - log pi: at pi = 0.5, q = 0.25 it is 0.5 - 1 + ln 2 = 0.1931 and its
    gradient in log pi is 1 - q / pi = 0.5; averaged over x ~ pi it is the reverse KL (unbiased)."""
    logp = torch.tensor([math.log(0.5)], requires_grad=True)
    loss = k3(LossInputs(logprobs=logp, mask=torch.ones(1), teacher_logprobs=torch.tensor([math.log(0.25)])))
    loss.backward()
    assert loss.item() == pytest.approx(0.5 - 1 + math.log(2), abs=1e-6) and round(loss.item(), 4) == 0.1931
    assert logp.grad.item() == pytest.approx(0.5, abs=1e-6)
    per_token = k3(LossInputs(logprobs=torch.tensor([math.log(p) for p in PI]), mask=torch.ones(3),
                              teacher_logprobs=torch.tensor([math.log(q) for q in Q])))
    assert (torch.tensor(PI) * per_token).sum().item() == pytest.approx(KL, abs=1e-6)


# -- a stale sampler (asynchronous / partial rollouts): the Actor's distillation term in expectation ---------------
# Two positions over the three-token vocabulary: the student's logits at position 1 (Z) and, given the first token a,
# at position 2 (Z2[a]); the teacher's Q, Q2[a]; the sampler's PR, PR2[a] (not the student: pi_rollout != pi_old)
Z2 = [[0.5, -0.5, 0.0], [-1.0, 1.0, 0.5], [0.0, 0.3, -0.3]]
Q2 = [[0.5, 0.2, 0.3], [0.1, 0.3, 0.6], [0.3, 0.3, 0.4]]
PR = [0.45, 0.35, 0.2]
PR2 = [[0.3, 0.3, 0.4], [0.2, 0.5, 0.3], [0.4, 0.35, 0.25]]


class _Engine:
    device = torch.device("cpu")
    p = 1.0  # the outcome's sampling probability: the gradients accumulate to the expectation over the sampler

    def backward(self, loss):
        (self.p * loss).backward()


def _expected_actor_grad(monkeypatch, loss, rollout_is, cap):
    """sum_x pi_rollout(x) d L(x) / d (Z, Z2) of `Actor._backward`'s distillation term, every two-token outcome x =
    (a, b) run alone (seq-mean-token-sum over one sequence: L(x) = sum_t w_t loss_t), theta = theta_old."""
    import rllava.roles.actor as actor_module
    from rllava.algorithms.ppo import build_algorithm
    from rllava.config.schema import ActorConfig, AlgorithmConfig
    from rllava.data.protocol import Batch
    from rllava.roles.actor import Actor, Distillation

    z1, z2 = torch.tensor(Z, dtype=torch.float64, requires_grad=True), torch.tensor(Z2, dtype=torch.float64,
                                                                                      requires_grad=True)
    logq1, logq2 = torch.tensor(Q, dtype=torch.float64).log(), torch.tensor(Q2, dtype=torch.float64).log()

    def forward(model, micro, ref_hidden=(), **kw):
        a, b = micro.input_ids[0].tolist()
        dists = [(z1.log_softmax(-1), logq1), (z2[a].log_softmax(-1), logq2[a])]
        kl = torch.stack([(lp.exp() * (lp - lq)).sum() for lp, lq in dists])[None]
        return (torch.stack([dists[0][0][a], dists[1][0][b]])[None], torch.zeros(1, 2, dtype=torch.float64),
                *([kl] if ref_hidden else []))

    monkeypatch.setattr(actor_module, "token_logprobs", forward)
    engine = _Engine()
    actor = Actor(torch.nn.Module(), engine, build_algorithm(AlgorithmConfig(), ActorConfig()), ppo_epochs=1,
                  mini_batch_size=1, micro_batch_size=1, log_prob_micro_batch_size=1,
                  loss_agg_mode="seq-mean-token-sum", max_response_length=2, temperature=1.0, use_kl_loss=False,
                  kl_loss_coef=0.0, kl_loss_type="kl", entropy_coeff=0.0, rollout_is=rollout_is, rollout_is_cap=cap,
                  off_policy=True)
    actor.distill = Distillation({"full": full, "k1": k1, "k3": k3}[loss], 1.0, SimpleNamespace(hidden=lambda m: 0))
    for a in range(3):
        for b in range(3):
            ids = torch.tensor([[a, b]])
            with torch.no_grad():
                old = forward(None, SimpleNamespace(input_ids=ids))[0]
            micro = Batch(trajectories=[SimpleNamespace(mm_inputs=None)], input_ids=ids,
                          attention_mask=torch.ones(1, 2, dtype=torch.long), loss_mask=torch.ones(1, 2),
                          group_ids=torch.zeros(1, dtype=torch.long), advantages=torch.zeros(1, 2), old_logprobs=old,
                          rollout_logprobs=torch.tensor([[math.log(PR[a]), math.log(PR2[a][b])]], dtype=torch.float64),
                          teacher_logprobs=torch.stack([logq1[a], logq2[a][b]])[None])
            engine.p = PR[a] * PR2[a][b]
            actor._backward(micro, {"num_tokens": torch.tensor(2.0), "num_seqs": torch.tensor(1.0)})
    return z1.grad.tolist(), z2.grad.flatten().tolist()


@pytest.mark.parametrize("loss, rollout_is, cap", [
    ("k1", "none", 10.0),  # the stale case of issue 44: no algorithm.rollout_is, trainer.async_training
    ("k3", "none", 10.0),
    ("k1", "token", 10.0),
    ("k1", "sequence", 10.0),
    ("k3", "sequence", 10.0),
    ("full", "token", 1.2),  # exact at its prefix: no token weight (a weight truncated at 1.2 would bias it)
    ("full", "sequence", 10.0),
])
def test_distillation_on_a_stale_sampler_is_corrected_as_the_rl_term(monkeypatch, loss, rollout_is, cap):
    """Samples from pi_rollout != pi_old; the target is the on-policy expectation at theta = theta_old, by
    enumeration from the formulas (Z's gradient at a position with student pi and teacher q):
        k1, full : d KL(pi || q) / dz = pi (log pi - log q - KL)   (the reverse KL, the OPD post / GKD beta = 1)
        k3       : E_{x ~ pi}[(1 - q / pi) d log pi(x) / dz] = pi - q   (the forward KL's gradient)
    position 1 gets it exactly; position 2's, for each first token a, is weighted by the prefix's probability:
    pi(a) with the sequence weight prod_t pi_old / pi_rollout (verl's rollout_is=sequence, verl/trainer/ppo/
    rollout_corr_helper.py@b178a3c L536-544: unbiased for every prefix), PR(a) at token level (the token weight
    pi_old / pi_rollout, L530-534, corrects the sampled token, not its prefix; `full` needs none). Issue 44: before
    the fix the term took no weight, so k1's position-1 gradient was [0.508, -0.262, -0.245] (the estimator's
    expectation over PR, the stale sampler) against the reverse KL's [0.456, -0.301, -0.155]."""
    def grad(z, q):
        pi = _softmax(z)
        if loss == "k3":
            return [p - qq for p, qq in zip(pi, q)]
        kl = sum(p * (math.log(p) - math.log(qq)) for p, qq in zip(pi, q))
        return [p * (math.log(p) - math.log(qq) - kl) for p, qq in zip(pi, q)]

    prefix = PI if rollout_is == "sequence" else PR
    g1, g2 = _expected_actor_grad(monkeypatch, loss, rollout_is, cap)
    assert g1 == pytest.approx(grad(Z, Q), abs=1e-9)
    assert g2 == pytest.approx([prefix[a] * g for a in range(3) for g in grad(Z2[a], Q2[a])], abs=1e-9)
