#!/bin/bash
# ovd on this CPU: a tiny Qwen2-VL, synthetic COCO-detection-shaped records, SFT warm-up, then GRPO with
# examples/reward_function/ovd.py (see ../tiny_cpu.sh). From the repository root:
#   bash examples/tasks/OVD/ovd_tiny_cpu.sh [key=value ...]   (OUT, SFT_STEPS, RL_STEPS, TRAIN, VAL override)
exec bash examples/tasks/tiny_cpu.sh ovd OVD "$@"
