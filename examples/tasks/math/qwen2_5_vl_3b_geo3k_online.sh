#!/bin/bash
# Math (Geometry3K, EasyR1's baseline: 3B GRPO 0.24 -> 0.38 on its test split): a diagram and a question; the
# reasoning in <think> </think>, the final answer in \boxed{} checked by mathruler (RLLaVA's math reward). It is
# the algorithms' baseline, examples/algorithms/grpo.sh; swap the algorithm with any script beside it. From the repository root:
#   bash examples/tasks/math/qwen2_5_vl_3b_geo3k_online.sh [key=value ...]   (NPROC, MODEL_PATH, OUTPUT_DIR override)
exec bash examples/algorithms/grpo.sh "$@"
