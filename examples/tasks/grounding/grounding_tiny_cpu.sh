#!/bin/bash
# The grounding task end to end on a CPU, in minutes: a tiny random Qwen2-VL (rllava.model.tiny) and synthetic
# refcoco-shaped records (rllava.data.synthetic grounding), an SFT warm-up on their `solution` targets, then GRPO
# with examples/reward_function/grounding.py. The same runs as the grounding row of `make proof`. Run from the
# repository root:   bash examples/tasks/grounding/grounding_tiny_cpu.sh   (OUT, SFT_STEPS, RL_STEPS, TRAIN, VAL override)
set -ex
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-outputs/tiny_cpu/grounding}

python -m rllava.model.tiny --arch qwen2_vl --size demo --out ${OUT}/model
python -m rllava.data.synthetic grounding --out ${OUT}/data --train ${TRAIN:-4000} --val ${VAL:-200}

python -m rllava.train.pipeline.sft \
  config=examples/tasks/grounding/tiny_cpu_sft.yaml \
  actor.model.model_path=${OUT}/model \
  data.train_files=${OUT}/data/train.jsonl \
  data.val_files=${OUT}/data/val.jsonl \
  trainer.outputs_dir=${OUT}/sft \
  ${SFT_STEPS:+trainer.max_steps=${SFT_STEPS}}

torchrun --standalone --nproc_per_node=1 -m rllava.train.pipeline.rlvr \
  config=examples/tasks/grounding/tiny_cpu.yaml \
  actor.model.model_path=${OUT}/sft/final \
  data.train_files=${OUT}/data/train.jsonl \
  data.val_files=${OUT}/data/val.jsonl \
  trainer.outputs_dir=${OUT}/grpo \
  ${RL_STEPS:+trainer.max_steps=${RL_STEPS}} \
  "$@"
