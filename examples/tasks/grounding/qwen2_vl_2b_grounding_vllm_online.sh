#!/bin/bash
# Grounding (RefCOCO-style referring expressions): "Locate <expression>." -> <answer>[x1, y1, x2, y2]</answer>,
# rewarded by IoU with the ground-truth box: rllava's reward and prompt (grounding_iou.py, grounding_answer.jinja),
# not RLLaVA's script of this name (rec.jinja, grounding.py: IoU squared plus format, config_grounding.yaml; it runs
# here as RLLaVA wrote it, tests/config/test_rllava_scripts.py). Qwen2-VL writes boxes on a 0-1000 grid of the
# image, hence frame=qwen2_vl. Records: {"images": [...], "problem": "<image>Locate the man in red.",
# "answer": [x1, y1, x2, y2]} with the box in pixels of the stored image (RefCOCO's frame; convert COCO's
# [x, y, w, h] first).
# Run from the repository root (TRAIN_SET, VAL_SET, NPROC, MODEL_PATH, EXPERIMENT, OUTPUT_DIR override):
#   TRAIN_SET=path/to/refcoco/train.jsonl VAL_SET=path/to/refcoco/val.jsonl \
#     bash examples/tasks/grounding/qwen2_vl_2b_grounding_vllm_online.sh [key=value ...]
set -x
export PYTHONUNBUFFERED=1
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2-VL-2B-Instruct}
TRAIN_SET=${TRAIN_SET:-data/refcoco/train.jsonl}
VAL_SET=${VAL_SET:-data/refcoco/val.jsonl}
EXPERIMENT=${EXPERIMENT:-qwen2_vl_2b_grounding_grpo}
OUTPUT_DIR=${OUTPUT_DIR:-outputs}  # the run writes ${OUTPUT_DIR}/<project_name>/<experiment_name>
export TENSORBOARD_DIR=${OUTPUT_DIR}

torchrun --nproc_per_node=${NPROC:-2} -m rllava.train.pipeline.rlvr \
  config=examples/config.yaml \
  data.train_files=${TRAIN_SET} \
  data.val_files=${VAL_SET} \
  data.format_prompt=./examples/format_prompt/grounding_answer.jinja \
  data.prompt_key=problem \
  data.answer_key=answer \
  data.image_key=images \
  data.max_response_length=512 \
  data.train_batch_size=128 \
  actor.ppo_mini_batch_size=64 \
  actor.model.model_path=${MODEL_PATH} \
  rollout.name=vllm \
  reward.reward_function=./examples/reward_function/grounding_iou.py:compute_score \
  reward.reward_function_kwargs.frame=qwen2_vl \
  algorithm.adv_estimator=grpo \
  trainer.experiment_name=${EXPERIMENT} \
  trainer.outputs_dir=${OUTPUT_DIR} \
  "$@"
