#!/bin/bash
# RLOO (arXiv:2402.14740): each sample's baseline is the mean reward of the other samples of its group.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/rloo.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_rloo} exec bash examples/algorithms/grpo.sh \
  algorithm.adv_estimator=rloo \
  "$@"
