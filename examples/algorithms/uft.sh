#!/bin/bash
# UFT (arXiv:2505.16984): each prompt's responses start with a hint, the first k of 5 chunks of the expert
# solution, k ~ Binomial(5, p(t)), p(t) cosine from 0.95 to 0.05 over the first 300 steps, no hint after; RL on the
# continuation, SFT (beta = 0.001) on the hint.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. Geometry3K has no worked solutions, so the expert
# response is the bare answer (data.expert_template); point data.target_key at a field holding expert solutions
# (RLLaVA's OpenR1 data, a stronger model's traces) for real demonstrations. From the repository root:
#   bash examples/algorithms/uft.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_uft} exec bash examples/algorithms/grpo.sh \
  data.expert_template='<answer>{{ answer }}</answer>' \
  actor.policy_loss.loss_mode=uft \
  algorithm.prefix_strategy=hint \
  algorithm.hint_steps=300 \
  algorithm.hint_chunks=5 \
  algorithm.max_prefix_ratio=0.95 \
  algorithm.min_prefix_ratio=0.05 \
  algorithm.prefix_share_across_samples=true \
  actor.sft_loss_coef=0.001 \
  "$@"
