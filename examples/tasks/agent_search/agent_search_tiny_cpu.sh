#!/bin/bash
# agent search on this CPU: a tiny Qwen2-VL, synthetic MAT-Search-shaped records and corpus
# (rllava.data.synthetic agent_search), multi-turn SFT on the expert's turns, then GRPO over search episodes
# with examples/reward_function/agent_search_f1.py (see ../tiny_cpu.sh). From the repository root:
#   bash examples/tasks/agent_search/agent_search_tiny_cpu.sh [key=value ...]   (OUT, SFT_STEPS, RL_STEPS override)
exec bash examples/tasks/tiny_cpu.sh agent_search agent_search "$@"
