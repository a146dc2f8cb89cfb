#!/bin/bash
# grounding on this CPU: a tiny Qwen2-VL, synthetic RefCOCO-shaped records, SFT warm-up, then GRPO with
# examples/reward_function/grounding.py (see ../tiny_cpu.sh). From the repository root:
#   bash examples/tasks/grounding/grounding_tiny_cpu.sh [key=value ...]   (OUT, SFT_STEPS, RL_STEPS, TRAIN, VAL override)
exec bash examples/tasks/tiny_cpu.sh grounding grounding "$@"
