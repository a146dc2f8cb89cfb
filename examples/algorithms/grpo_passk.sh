#!/bin/bash
# GRPO pass@k (arXiv:2503.19595, 2508.10751): only the best sample of a group is credited, so
# training optimises the chance that one of k samples is right.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/grpo_passk.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_grpo_passk} exec bash examples/algorithms/grpo.sh \
  algorithm.adv_estimator=grpo_passk \
  rollout.val_override_config.n=5 \
  rollout.val_override_config.temperature=1.0 \
  "$@"
