import math

import pytest
import torch

from rllava.algorithms.advantage import grpo
from rllava.algorithms.registry import ADV_ESTIMATORS, lookup


def test_grpo_hand_computed():
    # groups: g0 = [1, 0], g1 = [1, 1] (no signal), g2 = [0.5] (singleton), g3 = [0, 0, 3]
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.0, 0.0, 3.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 7, 7, 7])  # ids need not be contiguous
    mask = torch.ones(8, 3)
    mask[0, 2] = 0  # a padded token stays 0
    adv = grpo(scores, groups, mask, eps=0.0 + 1e-6)
    # g0: mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / 0.70711 = +-0.70711
    # g1: std 0 -> 0;  g2: singleton -> r itself;  g3: mean 1, std sqrt(6 / 2) = 1.73205
    expected = [0.70711, -0.70711, 0.0, 0.0, 0.5, -1 / math.sqrt(3), -1 / math.sqrt(3), 2 / math.sqrt(3)]
    assert torch.allclose(adv[:, 0], torch.tensor(expected), atol=1e-4)
    assert torch.allclose(adv[:, 1], adv[:, 0])
    assert adv[0, 2] == 0


def test_dr_grpo_drops_std():
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 3.0])
    groups = torch.tensor([0, 0, 1, 1, 1, 1])
    adv = grpo(scores, groups, torch.ones(6, 1), norm_adv_by_std_in_grpo=False)
    assert torch.allclose(adv[:, 0], torch.tensor([0.5, -0.5, -0.75, -0.75, -0.75, 2.25]))


def test_unknown_estimator_lists_choices():
    with pytest.raises(ValueError, match=r"registered: .*grpo.*did you mean 'grpo'"):
        lookup(ADV_ESTIMATORS, "grop", "algorithm.adv_estimator")
