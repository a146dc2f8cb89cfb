#!/bin/bash
# Clip-Cov (arXiv:2505.22617): tokens with a high covariance of advantage and log-prob get no
# gradient, to keep the policy's entropy from collapsing.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/clip_cov.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_clip_cov} exec bash examples/algorithms/grpo.sh \
  actor.policy_loss.loss_mode=clip_cov \
  actor.policy_loss.clip_cov_ratio=0.0002 \
  actor.policy_loss.clip_cov_lb=1.0 \
  actor.policy_loss.clip_cov_ub=5.0 \
  "$@"
