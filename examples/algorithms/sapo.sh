#!/bin/bash
# SAPO (arXiv:2511.20347): a smooth sigmoid gate on the importance ratio instead of PPO's hard clip, with a
# sharper gate (tau_neg) for negative advantages.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/sapo.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_sapo} exec bash examples/algorithms/grpo.sh \
  actor.policy_loss.loss_mode=sapo \
  actor.policy_loss.tau_pos=1.0 \
  actor.policy_loss.tau_neg=1.05 \
  "$@"
