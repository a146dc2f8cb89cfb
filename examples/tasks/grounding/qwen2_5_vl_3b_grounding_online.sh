#!/bin/bash
# Grounding on Qwen2.5-VL-3B: qwen2_vl_2b_grounding_vllm_online.sh (rllava's grounding_iou.py reward) with another
# model and its box frame.
# Qwen2.5-VL writes boxes in pixels of the image *as its processor resized it* (multiples of 28 within min/max
# pixels), hence frame=qwen2_5_vl; the Reward role passes that size. Same records (boxes in pixels of the stored
# image). From the repository root (TRAIN_SET, VAL_SET, NPROC, OUTPUT_DIR override):
#   TRAIN_SET=path/to/refcoco/train.jsonl VAL_SET=path/to/refcoco/val.jsonl \
#     bash examples/tasks/grounding/qwen2_5_vl_3b_grounding_online.sh [key=value ...]
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct} EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_grounding_grpo} \
  exec bash examples/tasks/grounding/qwen2_vl_2b_grounding_vllm_online.sh \
  reward.reward_function_kwargs.frame=qwen2_5_vl \
  "$@"
