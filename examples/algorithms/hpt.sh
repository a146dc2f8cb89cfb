#!/bin/bash
# HPT (arXiv:2509.04419): roll K per prompt; a prompt none of them solved trains SFT on its demonstration
# instead (its rollouts leave the loss); solved prompts train GRPO.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. Geometry3K has no worked solutions, so the expert
# response is the bare answer (data.expert_template); point data.target_key at a field holding expert solutions
# (RLLaVA's OpenR1 data, a stronger model's traces) for real demonstrations. actor.sft_loss_coef: 1.0 is the HPT
# authors' default (their note: 0.3 for a 1.5B model; RLLaVA's 1.5B script: 0.05); on a tiny model 1.0 pulled the
# sampled accuracy below GRPO's where GRPO can start, 0.3 did not (docs/proof.md). From the repository root:
#   bash examples/algorithms/hpt.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_hpt} exec bash examples/algorithms/grpo.sh \
  data.expert_template='<answer>{{ answer }}</answer>' \
  actor.policy_loss.loss_mode=hpt \
  algorithm.unify_strategy=switch \
  algorithm.switch_gate=0 \
  actor.sft_loss_coef=1.0 \
  "$@"
