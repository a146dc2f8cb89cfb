#!/bin/bash
# GPG (arXiv:2504.02546): plain policy gradient -A log pi (no ratio, no clip, no KL), advantages
# rescaled by the share of groups that carry signal.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/gpg.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_gpg} exec bash examples/algorithms/grpo.sh \
  algorithm.adv_estimator=gpg \
  actor.policy_loss.loss_mode=gpg \
  algorithm.use_kl_loss=false \
  "$@"
