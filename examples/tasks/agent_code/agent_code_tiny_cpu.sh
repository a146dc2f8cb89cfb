#!/bin/bash
# agent code on this CPU: a tiny Qwen2-VL, synthetic MAT-Coding-shaped records (rllava.data.synthetic agent_code:
# an image turned, flipped or darkened; the question is about it upright), multi-turn SFT on the expert's turns,
# then GRPO over episodes with the sandboxed code tool and examples/reward_function/agent_code_f1.py (see
# ../tiny_cpu.sh). From the repository root:
#   bash examples/tasks/agent_code/agent_code_tiny_cpu.sh [key=value ...]   (OUT, SFT_STEPS, RL_STEPS override)
exec bash examples/tasks/tiny_cpu.sh agent_code agent_code "$@"
