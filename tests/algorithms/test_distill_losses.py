"""On-policy distillation's losses (`rllava.algorithms.distill`) against the reverse KL computed by hand from its
definition, KL(pi || q) = sum_v pi_v (log pi_v - log q_v), on a three-token vocabulary: its value and its gradient
with respect to the student's logits, d KL / d z_j = pi_j (log pi_j - log q_j - KL) (differentiate the sum), and
the sampled forms' expectations over the student's own tokens."""

import math

import pytest
import torch

from rllava.algorithms.distill import full, k1, k3
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
    kl = full(full_kl=full_kl_from_hidden(head, z, teacher_h, teacher_w, chunk_size=chunk))
    kl.sum().backward()
    assert kl.item() == pytest.approx(KL, abs=1e-6)
    assert z.grad[0].tolist() == pytest.approx(GRAD, abs=1e-6)


def test_k1_is_the_ops_advantage_and_its_expected_gradient_is_the_kl_gradient():
    """loss_t = -ratio * (log q - log pi_old): at the sampling policy its value is log pi - log q and its gradient
    in log pi is -(log q - log pi); averaged over the student's tokens (x ~ pi), d/dz equals d KL / d z."""
    z = torch.tensor(Z, requires_grad=True)
    logp = torch.log_softmax(z, -1)
    old, teacher = logp.detach(), torch.tensor([math.log(q) for q in Q])
    per_token = k1(logprobs=logp, old_logprobs=old, teacher_logprobs=teacher)
    assert per_token.tolist() == pytest.approx([math.log(p) - math.log(q) for p, q in zip(PI, Q)], abs=1e-6)
    (per_token * torch.tensor(PI)).sum().backward()  # E_{x ~ pi}, the weights held fixed (no grad)
    assert z.grad.tolist() == pytest.approx(GRAD, abs=1e-6)
    assert (torch.tensor(PI) * per_token.detach()).sum().item() == pytest.approx(KL, abs=1e-6)


def test_k3_value_gradient_and_expectation():
    """loss_t = exp(d) - 1 - d, d = log q - log pi: at pi = 0.5, q = 0.25 it is 0.5 - 1 + ln 2 = 0.1931 and its
    gradient in log pi is 1 - q / pi = 0.5; averaged over x ~ pi it is the reverse KL (unbiased)."""
    logp = torch.tensor([math.log(0.5)], requires_grad=True)
    loss = k3(logprobs=logp, teacher_logprobs=torch.tensor([math.log(0.25)]))
    loss.backward()
    assert loss.item() == pytest.approx(0.5 - 1 + math.log(2), abs=1e-6) and round(loss.item(), 4) == 0.1931
    assert logp.grad.item() == pytest.approx(0.5, abs=1e-6)
    per_token = k3(logprobs=torch.tensor([math.log(p) for p in PI]), teacher_logprobs=torch.tensor(
        [math.log(q) for q in Q]))
    assert (torch.tensor(PI) * per_token).sum().item() == pytest.approx(KL, abs=1e-6)
