#!/bin/bash
# OVD (open-vocabulary detection, COCO / LVIS style): "Detect every <category>." -> a JSON list of
# {"bbox_2d": [x1, y1, x2, y2], "score": s}, integer coordinates on a 0-1000 grid of the image, s with two
# decimals; rewarded by (soft F1 of IoU-matched boxes + AP50) / 2, malformed output -0.5: rllava's reward and
# prompt (ovd_ap.py, ovd_json.jinja), not RLLaVA's script of this name (ovd.jinja, ovd.py: Visual-RFT's
# Position / Confidence lists, config_grounding.yaml).
# Records: {"images": [...], "problem": "<image>Detect every zebra.", "answer": [[x1, y1, x2, y2], ...]} with
# the true boxes on the same 0-1000 grid ([] when there is none).
# Run from the repository root (TRAIN_SET, VAL_SET, NPROC, MODEL_PATH, OUTPUT_DIR override):
#   TRAIN_SET=path/to/ovd/train.jsonl VAL_SET=path/to/ovd/val.jsonl bash examples/tasks/OVD/qwen2_5_vl_3b_ovd_online.sh
set -x
export PYTHONUNBUFFERED=1
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct}
TRAIN_SET=${TRAIN_SET:-data/ovd/train.jsonl}
VAL_SET=${VAL_SET:-data/ovd/val.jsonl}
OUTPUT_DIR=${OUTPUT_DIR:-outputs}  # the run writes ${OUTPUT_DIR}/<project_name>/<experiment_name>
export TENSORBOARD_DIR=${OUTPUT_DIR}

torchrun --nproc_per_node=${NPROC:-4} -m rllava.train.pipeline.rlvr \
  config=examples/config.yaml \
  data.train_files=${TRAIN_SET} \
  data.val_files=${VAL_SET} \
  data.format_prompt=./examples/format_prompt/ovd_json.jinja \
  data.prompt_key=problem \
  data.answer_key=answer \
  data.image_key=images \
  data.max_response_length=1024 \
  data.train_batch_size=128 \
  actor.ppo_mini_batch_size=64 \
  actor.model.model_path=${MODEL_PATH} \
  reward.reward_function=./examples/reward_function/ovd_ap.py:compute_score \
  algorithm.adv_estimator=grpo \
  trainer.experiment_name=qwen2_5_vl_3b_ovd_grpo \
  trainer.outputs_dir=${OUTPUT_DIR} \
  "$@"
