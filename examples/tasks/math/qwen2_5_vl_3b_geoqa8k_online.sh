#!/bin/bash
# Math (GeoQA-8K, the R1-V geometry set): a diagram and a question; the final answer in <answer> </answer> (or
# \boxed{}) checked by math-verify. GRPO on Qwen2.5-VL-3B with a vLLM rollout. The set's `solution` field holds
# "<answer>...</answer>"; the reward reads the answer inside. The set has no test split: validation is off
# (data.val_files='' in quotes: a bare `key=` is null, and this key takes a string). Run from the repository root:
#   bash examples/tasks/math/qwen2_5_vl_3b_geoqa8k_online.sh   (NPROC, MODEL_PATH, OUTPUT_DIR override)
set -x
export PYTHONUNBUFFERED=1
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct}
OUTPUT_DIR=${OUTPUT_DIR:-outputs}  # the run writes ${OUTPUT_DIR}/<project_name>/<experiment_name>
export TENSORBOARD_DIR=${OUTPUT_DIR}

torchrun --nproc_per_node=${NPROC:-4} -m rllava.train.pipeline.rlvr \
  config=examples/config.yaml \
  data.train_files=leonardPKU/GEOQA_R1V_Train_8K@train \
  "data.val_files=''" \
  data.format_prompt=./examples/format_prompt/math_answer.jinja \
  data.prompt_key=problem \
  data.answer_key=solution \
  data.image_key=image \
  actor.model.model_path=${MODEL_PATH} \
  reward.reward_function=./examples/reward_function/math_answer.py:compute_score \
  algorithm.adv_estimator=grpo \
  trainer.experiment_name=qwen2_5_vl_3b_geoqa8k_grpo \
  trainer.outputs_dir=${OUTPUT_DIR} \
  trainer.val_freq=-1 \
  trainer.val_before_train=false \
  "$@"
