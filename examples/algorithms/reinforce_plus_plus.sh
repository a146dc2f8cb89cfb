#!/bin/bash
# REINFORCE++ (arXiv:2501.03262): KL to the reference as a per-token reward penalty,
# returns normalised over the batch; no critic, no group baseline.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/reinforce_plus_plus.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_reinforce_plus_plus} exec bash examples/algorithms/grpo.sh \
  algorithm.adv_estimator=reinforce_plus_plus \
  algorithm.use_kl_loss=false \
  algorithm.use_kl_in_reward=true \
  algorithm.kl_penalty=k3 \
  "$@"
