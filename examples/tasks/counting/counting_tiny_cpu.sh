#!/bin/bash
# counting on this CPU: a tiny Qwen2-VL, synthetic CLEVR-count-shaped records, SFT warm-up, then GRPO with
# examples/reward_function/counting.py (see ../tiny_cpu.sh). From the repository root:
#   bash examples/tasks/counting/counting_tiny_cpu.sh [key=value ...]   (OUT, SFT_STEPS, RL_STEPS, TRAIN, VAL override)
exec bash examples/tasks/tiny_cpu.sh counting counting "$@"
