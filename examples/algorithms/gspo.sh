#!/bin/bash
# GSPO (arXiv:2507.18071): sequence-level importance ratio (geometric mean over tokens), clipped in a
# narrow band.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/gspo.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_gspo} exec bash examples/algorithms/grpo.sh \
  actor.policy_loss.loss_mode=gspo \
  actor.clip_ratio_low=3e-4 \
  actor.clip_ratio_high=4e-4 \
  actor.loss_agg_mode=seq-mean-token-mean \
  "$@"
