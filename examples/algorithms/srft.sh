#!/bin/bash
# SRFT (arXiv:2506.19767): LUFFY's expert sample in each group plus SFT on it weighted 0.5 exp(-H_i), the
# policy's correct rollouts (reward >= algorithm.success_reward_threshold, default 1) weighted 0.1 exp(H_i), its
# wrong ones pushed down; H_i each response's own mean token entropy.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. Geometry3K has no worked solutions, so the expert
# response is the bare answer (data.expert_template); point data.target_key at a field holding expert solutions
# (RLLaVA's OpenR1 data, a stronger model's traces) for real demonstrations. From the repository root:
#   bash examples/algorithms/srft.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_srft} exec bash examples/algorithms/grpo.sh \
  data.expert_template='<answer>{{ answer }}</answer>' \
  actor.policy_loss.loss_mode=srft \
  algorithm.prefix_strategy=random \
  algorithm.min_prefix_ratio=1.0 \
  algorithm.max_prefix_ratio=1.0 \
  algorithm.n_prefix=1 \
  algorithm.use_kl_loss=false \
  "$@"
