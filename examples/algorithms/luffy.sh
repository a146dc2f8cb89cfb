#!/bin/bash
# LUFFY (arXiv:2504.14945): one of each prompt's K responses is the expert's; GRPO advantages over the mixed
# group; expert tokens trained with the shaped ratio f(p) = p / (p + 0.1), no clip; Dr.GRPO aggregation (as
# RLLaVA's luffy script).
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. Geometry3K has no worked solutions, so the expert
# response is the bare answer (data.expert_template); point data.target_key at a field holding expert solutions
# (RLLaVA's OpenR1 data, a stronger model's traces) for real demonstrations. From the repository root:
#   bash examples/algorithms/luffy.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_luffy} exec bash examples/algorithms/grpo.sh \
  data.expert_template='<answer>{{ answer }}</answer>' \
  actor.policy_loss.loss_mode=luffy \
  algorithm.prefix_strategy=random \
  algorithm.min_prefix_ratio=1.0 \
  algorithm.max_prefix_ratio=1.0 \
  algorithm.n_prefix=1 \
  actor.off_policy_reshape=p_div_p_0.1 \
  actor.loss_remove_clip=true \
  actor.loss_agg_mode=seq-mean-token-sum-norm \
  algorithm.norm_adv_by_std_in_grpo=false \
  algorithm.use_kl_loss=false \
  "$@"
