#!/bin/bash
# PPO with GAE (arXiv:1707.06347, 1506.02438): a critic (the policy's backbone plus a value head)
# learns V(s); one sample per prompt; the critic is warmed up before the actor trains.
# Geometry3K on Qwen2.5-VL-3B; examples/config.yaml holds everything else. Run from the repository root:
#   bash examples/algorithms/ppo.sh   (NPROC, MODEL_PATH, OUTPUT_DIR override)
set -x
export PYTHONUNBUFFERED=1
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct}
OUTPUT_DIR=${OUTPUT_DIR:-outputs/qwen2_5_vl_3b_geo3k_ppo}
export TENSORBOARD_DIR=${OUTPUT_DIR}

torchrun --nproc_per_node=${NPROC:-8} -m rllava.train.pipeline.rlvr \
  config=examples/config.yaml \
  data.train_files=hiyouga/geometry3k@train \
  data.val_files=hiyouga/geometry3k@test \
  data.format_prompt=./examples/format_prompt/math.jinja \
  data.prompt_key=problem \
  data.answer_key=answer \
  data.image_key=images \
  actor.model.model_path=${MODEL_PATH} \
  reward.reward_function=./examples/reward_function/math.py:compute_score \
  trainer.experiment_name=qwen2_5_vl_3b_geo3k_ppo \
  trainer.outputs_dir=${OUTPUT_DIR} \
  trainer.n_gpus_per_node=${NPROC:-8} \
  algorithm.adv_estimator=gae \
  algorithm.gamma=1.0 \
  algorithm.lam=1.0 \
  rollout.n=1 \
  critic.model.model_path=${MODEL_PATH} \
  critic.strategy=fsdp2 \
  critic.optim.lr=1e-5 \
  critic.ppo_mini_batch_size=128 \
  critic.ppo_micro_batch_size=4 \
  trainer.critic_warmup=5 \
  "$@"
