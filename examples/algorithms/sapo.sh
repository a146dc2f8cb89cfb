#!/bin/bash
# SAPO (arXiv:2511.20347): a smooth sigmoid gate on the importance ratio instead of PPO's hard clip, with a
# sharper gate (tau_neg) for negative advantages.
# The paper's objective averages each sequence over its own tokens (1/|y_i|), then over the G sequences: that is
# seq-mean-token-mean, which verl's SAPO loss hard-codes (verl/trainer/ppo/core_algos.py, compute_policy_loss_sapo);
# The default token-mean (grpo.sh) would weigh every token alike instead, so long responses would count more.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/sapo.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_sapo} exec bash examples/algorithms/grpo.sh \
  actor.policy_loss.loss_mode=sapo \
  actor.policy_loss.tau_pos=1.0 \
  actor.policy_loss.tau_neg=1.05 \
  actor.loss_agg_mode=seq-mean-token-mean \
  "$@"
