#!/bin/bash
# DAPO (arXiv:2503.14476): clip-higher, dynamic sampling (groups whose rewards are all equal are
# dropped and more prompts drawn), token-level loss, soft overlong punishment, no KL.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/dapo.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_dapo} exec bash examples/algorithms/grpo.sh \
  actor.policy_loss.loss_mode=dapo \
  actor.clip_ratio_low=0.2 \
  actor.clip_ratio_high=0.28 \
  algorithm.online_filtering=true \
  algorithm.filter_key=overall \
  algorithm.use_kl_loss=false \
  reward.overlong_buffer.enable=true \
  reward.overlong_buffer.len=512 \
  reward.overlong_buffer.penalty_factor=1.0 \
  "$@"
