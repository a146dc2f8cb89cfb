#!/bin/bash
# REINFORCE++-baseline (arXiv:2501.03262): group-mean baseline, then batch
# normalisation of the advantages.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/reinforce_plus_plus_baseline.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_reinforce_plus_plus_baseline} exec bash examples/algorithms/grpo.sh \
  algorithm.adv_estimator=reinforce_plus_plus_baseline \
  "$@"
