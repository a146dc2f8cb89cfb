#!/bin/bash
# GMPO (arXiv:2507.20673): geometric mean of the token ratios, clipped in log space with a wider band.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/gmpo.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_gmpo} exec bash examples/algorithms/grpo.sh \
  actor.policy_loss.loss_mode=gmpo \
  actor.clip_ratio_low=0.4 \
  actor.clip_ratio_high=0.4 \
  "$@"
