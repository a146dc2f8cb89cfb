#!/bin/bash
# ReMax (arXiv:2310.10505): the baseline is the reward of a greedy answer to the same prompt (one extra
# greedy rollout per prompt, made by the rollout stage).
# Geometry3K on Qwen2.5-VL-3B; examples/config.yaml holds everything else. Run from the repository root:
#   bash examples/algorithms/remax.sh   (NPROC, MODEL_PATH, OUTPUT_DIR override)
set -x
export PYTHONUNBUFFERED=1
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct}
OUTPUT_DIR=${OUTPUT_DIR:-outputs/qwen2_5_vl_3b_geo3k_remax}
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
  trainer.experiment_name=qwen2_5_vl_3b_geo3k_remax \
  trainer.outputs_dir=${OUTPUT_DIR} \
  trainer.n_gpus_per_node=${NPROC:-8} \
  algorithm.adv_estimator=remax \
  "$@"
