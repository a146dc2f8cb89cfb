#!/bin/bash
# OPO (arXiv:2505.23585): the group baseline weighted by response length (the optimal baseline
# for sequence-level rewards); strictly on-policy.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/opo.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_opo} exec bash examples/algorithms/grpo.sh \
  algorithm.adv_estimator=opo \
  "$@"
