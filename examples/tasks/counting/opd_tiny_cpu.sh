#!/bin/bash
# On-policy distillation on this CPU (the tiny twin of examples/algorithms/opd.sh): a tiny Qwen2-VL warmed with
# SFT_STEPS of SFT is the student; the same random model warmed TEACHER_STEPS (default 150) is the teacher; then
# pure distillation with the exact full-vocabulary reverse KL (the single-device engine) instead of GRPO, over
# 64 prompts x 1 sample a step in four mini-batches (GRPO's 64 completions; docs/proof.md). From the repository root:
#   bash examples/tasks/counting/opd_tiny_cpu.sh [key=value ...]   (OUT, SFT_STEPS, TEACHER_STEPS, RL_STEPS, TRAIN, VAL)
TEACHER_STEPS=${TEACHER_STEPS:-150} RL_NAME=opd exec bash examples/tasks/tiny_cpu.sh counting counting \
  algorithm.distill.use_reward=false data.train_batch_size=64 rollout.n=1 actor.ppo_mini_batch_size=16 "$@"
