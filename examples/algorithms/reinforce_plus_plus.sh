#!/bin/bash
# REINFORCE++ (arXiv:2501.03262): KL to the reference as a per-token reward penalty,
# returns normalised over the batch; no critic, no group baseline.
# Geometry3K on Qwen2.5-VL-3B; examples/config.yaml holds everything else. Run from the repository root:
#   bash examples/algorithms/reinforce_plus_plus.sh   (NPROC, MODEL_PATH, OUTPUT_DIR override)
set -x
export PYTHONUNBUFFERED=1
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct}
OUTPUT_DIR=${OUTPUT_DIR:-outputs/qwen2_5_vl_3b_geo3k_reinforce_plus_plus}
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
  trainer.experiment_name=qwen2_5_vl_3b_geo3k_reinforce_plus_plus \
  trainer.outputs_dir=${OUTPUT_DIR} \
  trainer.n_gpus_per_node=${NPROC:-8} \
  algorithm.adv_estimator=reinforce_plus_plus \
  algorithm.use_kl_loss=false \
  algorithm.use_kl_in_reward=true \
  algorithm.kl_penalty=k3 \
  "$@"
