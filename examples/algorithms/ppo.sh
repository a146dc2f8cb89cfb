#!/bin/bash
# PPO with GAE (arXiv:1707.06347, 1506.02438): a critic (the policy's backbone plus a value head)
# learns V(s); one sample per prompt; the critic is warmed up before the actor trains.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. From the repository root:
#   bash examples/algorithms/ppo.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_ppo} exec bash examples/algorithms/grpo.sh \
  algorithm.adv_estimator=gae \
  algorithm.gamma=1.0 \
  algorithm.lam=1.0 \
  rollout.n=1 \
  critic.model.model_path=${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct} \
  critic.strategy=fsdp2 \
  critic.optim.lr=1e-5 \
  critic.ppo_mini_batch_size=128 \
  critic.ppo_micro_batch_size=4 \
  trainer.critic_warmup=5 \
  "$@"
