#!/bin/bash
# Decoupled PPO (AReaL, arXiv:2505.24298): the PPO clip is taken against the trainer's log-probs before the update
# (the proximal policy) and each token is weighted by pi_prox / pi_behav, the rollout engine's log-probs being the
# behaviour policy; tokens whose weight exceeds behav_imp_weight_cap are filtered out. Geo-RS (verl's
# seq_mean_k1 preset, 0.999_1.001) also drops sequences whose geometric-mean ratio is out of bounds.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/decoupled_ppo.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_decoupled_ppo} exec bash examples/algorithms/grpo.sh \
  actor.policy_loss.loss_mode=decoupled_ppo \
  actor.policy_loss.behav_imp_weight_cap=5.0 \
  algorithm.rollout_rs=seq_mean_k1 \
  algorithm.rollout_rs_threshold=0.999_1.001 \
  "$@"
