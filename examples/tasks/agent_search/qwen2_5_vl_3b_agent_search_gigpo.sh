#!/bin/bash
# Agent search with GiGPO's per-turn credit (arXiv 2505.10978): qwen2_5_vl_3b_agent_search_online.sh plus the
# keys below. Each turn's advantage = the episode's group advantage + w x a step advantage among the group's turns
# written after the same observation (discounted returns, gamma = rollout.discount); a failed search call costs
# its turn 0.1. From the repository root:
#   bash examples/tasks/agent_search/qwen2_5_vl_3b_agent_search_gigpo.sh [key=value ...]
exec bash examples/tasks/agent_search/qwen2_5_vl_3b_agent_search_online.sh \
  trainer.experiment_name=qwen2_5_vl_3b_agent_search_gigpo \
  algorithm.adv_estimator=gigpo \
  algorithm.norm_adv_by_std_in_grpo=false \
  rollout.discount=0.95 \
  algorithm.step_advantage_w=1.0 \
  rollout.agent.invalid_call_penalty=-0.1 \
  trainer.experiment_name=qwen2_5_vl_3b_agent_search_gigpo \
  "$@"
