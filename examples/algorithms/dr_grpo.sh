#!/bin/bash
# Dr.GRPO (arXiv:2503.20783): no std normalisation, no length bias in the loss aggregation, no KL.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/dr_grpo.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_dr_grpo} exec bash examples/algorithms/grpo.sh \
  algorithm.adv_estimator=dr_grpo \
  actor.loss_agg_mode=seq-mean-token-sum-norm \
  algorithm.use_kl_loss=false \
  "$@"
