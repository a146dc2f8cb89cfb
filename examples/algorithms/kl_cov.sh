#!/bin/bash
# KL-Cov (arXiv:2505.22617): a KL penalty on the tokens of highest advantage/log-prob covariance.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/kl_cov.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_kl_cov} exec bash examples/algorithms/grpo.sh \
  actor.policy_loss.loss_mode=kl_cov \
  actor.policy_loss.kl_cov_ratio=0.0002 \
  actor.policy_loss.ppo_kl_coef=0.1 \
  "$@"
