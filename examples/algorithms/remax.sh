#!/bin/bash
# ReMax (arXiv:2310.10505): the baseline is the reward of a greedy answer to the same prompt (one extra
# greedy rollout per prompt, made by the rollout stage).
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/remax.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_remax} exec bash examples/algorithms/grpo.sh \
  algorithm.adv_estimator=remax \
  "$@"
