#!/bin/bash
# GMPO (arXiv:2507.20673): geometric mean of the token ratios, clipped in log space with a wider band.
# The paper's objective is the mean over sequences of -A_i * (geometric mean of the clipped ratios); rllava's loss
# spreads each sequence's term over its tokens, so seq-mean-token-sum gives exactly that (the authors'
# train_zero_math_gmpo.py: one sequence per micro-batch, gradients averaged; verl's geo_mean: torch.mean over
# sequences). token-mean would divide the whole loss by the batch's mean response length, a factor that changes
# from batch to batch and changes what actor.max_grad_norm clips. The KL and entropy terms use the same
# aggregation, so their weight relative to the GMPO term is the same in both modes (the authors' script trains
# without KL, --beta 0; this one keeps grpo.sh's KL loss).
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/gmpo.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_gmpo} exec bash examples/algorithms/grpo.sh \
  actor.policy_loss.loss_mode=gmpo \
  actor.clip_ratio_low=0.4 \
  actor.clip_ratio_high=0.4 \
  actor.loss_agg_mode=seq-mean-token-sum \
  "$@"
