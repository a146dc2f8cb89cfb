"""The learning check behind `make demo` (slow: ~8 minutes on 2 CPU cores; `make test-slow`)."""

import pytest

from rllava.commands.demo import report, run_demo


@pytest.mark.slow
def test_demo_grpo_lifts_held_out_accuracy(tmp_path):
    s = run_demo(str(tmp_path / "demo"))
    print(report(s))
    # The SFT warm-up leaves room to learn, and GRPO lifts held-out accuracy sampled at the rollout temperature
    # by >= 15 points (averaged over the last 3 evaluations; one evaluation's sampling noise is ~3 points).
    assert s["sampled_before"] < 60
    assert s["sampled_lift"] >= 15
    assert s["train_reward_last"] > s["train_reward_first"] + 0.05
