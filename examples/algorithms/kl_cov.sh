#!/bin/bash
# KL-Cov (arXiv:2505.22617): a KL penalty on the tokens of highest advantage/log-prob covariance.
# Geometry3K on Qwen2.5-VL-3B; examples/config.yaml holds everything else. Run from the repository root:
#   bash examples/algorithms/kl_cov.sh   (NPROC, MODEL_PATH, OUTPUT_DIR override)
set -x
export PYTHONUNBUFFERED=1
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct}
OUTPUT_DIR=${OUTPUT_DIR:-outputs/qwen2_5_vl_3b_geo3k_kl_cov}
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
  trainer.experiment_name=qwen2_5_vl_3b_geo3k_kl_cov \
  trainer.outputs_dir=${OUTPUT_DIR} \
  trainer.n_gpus_per_node=${NPROC:-8} \
  algorithm.adv_estimator=grpo \
  actor.policy_loss.loss_mode=kl_cov \
  actor.policy_loss.kl_cov_ratio=0.0002 \
  actor.policy_loss.ppo_kl_coef=0.1 \
  "$@"
