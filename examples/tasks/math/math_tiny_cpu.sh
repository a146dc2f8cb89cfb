#!/bin/bash
# math on this CPU: a tiny Qwen2-VL, synthetic Geometry3K-shaped records, SFT warm-up, then GRPO with
# examples/reward_function/math_answer.py (see ../tiny_cpu.sh). From the repository root:
#   bash examples/tasks/math/math_tiny_cpu.sh [key=value ...]   (OUT, SFT_STEPS, RL_STEPS, TRAIN, VAL override)
exec bash examples/tasks/tiny_cpu.sh math math "$@"
