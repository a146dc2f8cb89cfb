#!/bin/bash
# Counting (CLEVR-count-70k, as R1-V / EasyR1): "How many items are there in the image?" -> <answer>N</answer>,
# exact integer match. GRPO on Qwen2.5-VL-3B with a vLLM rollout. Run from the repository root:
#   bash examples/tasks/counting/qwen2_5_vl_3b_clevr_online.sh   (NPROC, MODEL_PATH, OUTPUT_DIR override)
set -x
export PYTHONUNBUFFERED=1
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct}
OUTPUT_DIR=${OUTPUT_DIR:-outputs}  # the run writes ${OUTPUT_DIR}/<project_name>/<experiment_name>
export TENSORBOARD_DIR=${OUTPUT_DIR}

torchrun --nproc_per_node=${NPROC:-2} -m rllava.train.pipeline.rlvr \
  config=examples/config.yaml \
  data.train_files=BUAADreamer/clevr_count_70k@train \
  data.val_files=BUAADreamer/clevr_count_70k@test \
  data.format_prompt=./examples/format_prompt/counting.jinja \
  data.prompt_key=problem \
  data.answer_key=answer \
  data.image_key=images \
  data.max_response_length=1024 \
  data.train_batch_size=128 \
  actor.ppo_mini_batch_size=64 \
  actor.model.model_path=${MODEL_PATH} \
  reward.reward_function=./examples/reward_function/counting.py:compute_score \
  algorithm.adv_estimator=grpo \
  trainer.experiment_name=qwen2_5_vl_3b_clevr_grpo \
  trainer.outputs_dir=${OUTPUT_DIR} \
  trainer.total_epochs=2 \
  "$@"
