#!/bin/bash
# On-policy distillation (Thinking Machines' OPD; GKD arXiv:2306.13649 with beta = 1): the 3B student samples, the
# frozen 7B teacher (same tokenizer) scores every token it wrote, and the student minimises the per-token reverse
# KL to it, here as the sampled k1 advantage log q - log pi_old (the exact full-vocabulary KL, loss=full, needs the
# single-device engine: both LM heads whole). Pure distillation (no reward in the loss; it is logged); set
# algorithm.distill.use_reward=true to add the teacher's term to GRPO's. = grpo.sh (Geometry3K on Qwen2.5-VL-3B)
# plus the keys below; docs/algorithms.md has the formulas. From the repository root:
#   bash examples/algorithms/opd.sh [key=value ...]   (TEACHER_PATH overrides the teacher)
TEACHER_PATH=${TEACHER_PATH:-Qwen/Qwen2.5-VL-7B-Instruct}
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_opd} exec bash examples/algorithms/grpo.sh \
  algorithm.distill.teacher_path=${TEACHER_PATH} \
  algorithm.distill.loss=k1 \
  algorithm.distill.coef=1.0 \
  algorithm.distill.use_reward=false \
  algorithm.use_kl_loss=false \
  "$@"
