#!/bin/bash
# CISPO (arXiv:2506.13585): the importance weight is clipped and detached instead of the update, so
# every token keeps a gradient.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/cispo.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_cispo} exec bash examples/algorithms/grpo.sh \
  actor.policy_loss.loss_mode=cispo \
  actor.policy_loss.cispo_clip_ratio_high=0.28 \
  "$@"
