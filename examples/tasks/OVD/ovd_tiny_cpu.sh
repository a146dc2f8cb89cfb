#!/bin/bash
# ovd on this CPU: a tiny Qwen3-VL (its vision tower's absolute position embeddings let a tiny model localise),
# synthetic COCO-detection-shaped records, SFT warm-up, then GRPO with examples/reward_function/ovd_ap.py
# (see ../tiny_cpu.sh). From the repository root:
#   bash examples/tasks/OVD/ovd_tiny_cpu.sh [key=value ...]   (OUT, ARCH, SFT_STEPS, RL_STEPS, TRAIN, VAL override)
ARCH=${ARCH:-qwen3_vl} exec bash examples/tasks/tiny_cpu.sh ovd OVD "$@"
