#!/bin/bash
# GRPO (arXiv:2402.03300): group-normalised rewards, PPO-clip loss, KL to the reference in the loss.
# Geometry3K on Qwen2.5-VL-3B; examples/config.yaml holds everything else. Every other script in this folder is
# this one plus its algorithm's keys (extra key=value arguments are passed on and win). From the repository root:
#   bash examples/algorithms/grpo.sh [key=value ...]   (NPROC, MODEL_PATH, EXPERIMENT, OUTPUT_DIR override)
set -x
export PYTHONUNBUFFERED=1
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct}
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_grpo}
OUTPUT_DIR=${OUTPUT_DIR:-outputs}  # the run writes ${OUTPUT_DIR}/<project_name>/<experiment_name>
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
  algorithm.adv_estimator=grpo \
  trainer.experiment_name=${EXPERIMENT} \
  trainer.outputs_dir=${OUTPUT_DIR} \
  "$@"
