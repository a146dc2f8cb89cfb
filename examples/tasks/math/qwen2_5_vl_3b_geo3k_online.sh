#!/bin/bash
# Math (Geometry3K, as EasyR1's baseline: 3B GRPO 0.24 -> 0.38 on its test split): a diagram and a question;
# the final answer checked by math-verify. GRPO on Qwen2.5-VL-3B with a vLLM rollout. Run from the repository root:
#   bash examples/tasks/math/qwen2_5_vl_3b_geo3k_online.sh   (NPROC, MODEL_PATH, OUTPUT_DIR override)
set -x
export PYTHONUNBUFFERED=1
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct}
OUTPUT_DIR=${OUTPUT_DIR:-outputs/qwen2_5_vl_3b_geo3k_grpo}
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
  trainer.experiment_name=qwen2_5_vl_3b_geo3k_grpo \
  trainer.outputs_dir=${OUTPUT_DIR} \
  trainer.n_gpus_per_node=${NPROC:-8} \
  "$@"
