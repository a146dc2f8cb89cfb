#!/bin/bash
# CHORD (arXiv:2508.11408): L = (1 - mu) L_GRPO + mu L_SFT over demonstration rows (20 % of each step's rows),
# mu warming up linearly to 0.9 and decaying (cosine) to 0.05 over 200 steps (the paper's mu variant).
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. Geometry3K has no worked solutions, so the expert
# response is the bare answer (data.expert_template); point data.target_key at a field holding expert solutions
# (RLLaVA's OpenR1 data, a stronger model's traces) for real demonstrations. From the repository root:
#   bash examples/algorithms/chord.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_chord} exec bash examples/algorithms/grpo.sh \
  data.expert_template='<answer>{{ answer }}</answer>' \
  actor.policy_loss.loss_mode=chord \
  algorithm.expert_data_ratio=0.2 \
  algorithm.mu_warmup_steps=0 \
  algorithm.mu_decay_steps=200 \
  algorithm.mu_peak=0.9 \
  algorithm.mu_valley=0.05 \
  "$@"
